"""A finished output, read back: its committed parts in batches, its private files
(``report.json``, ``job.json``) and the checks that an earlier output can feed an incremental
run (``previous``). Below the run: the settle step and reuse read an earlier output through it,
and the commands over outputs (:mod:`bulkinfer.outputs`) read theirs."""
