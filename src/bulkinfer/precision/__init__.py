"""How a job runs, decided before it runs: the settle step (``settle``: every automatic or
derived setting, once), what informs it (``tune``: engines, precisions and batch sizes measured
here; ``measure``: processes against threads), and the quality gate that a lowered precision or
a reduced decode must pass against fp32 (``gate``, ``detections`` for boxes)."""
