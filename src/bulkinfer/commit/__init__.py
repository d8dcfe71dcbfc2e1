"""The only code that decides what is done: the ``committer`` (a shard's parts, then its
commit record), the folder and object-store ledgers (``ledger``, ``objledger``), ``repair``,
routing of rows to outputs (``routing``), the cost guard (``spend``) and the ``finish`` step
(deleted ids, batch files, the video summary, ``_SUCCESS`` last)."""
