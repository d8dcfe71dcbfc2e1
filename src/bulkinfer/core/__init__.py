"""The leaves every stage uses, importing nothing of bulkinfer's above them: the one exception
hierarchy (``errors``), error records (``records``), column types (``schema``), routing
expressions (``expr``), rows into calls (``batching``), input hashes (``hashing``), the machine
(``hardware``), credentials, crash points for tests (``faults``), storage I/O by URI
(``storage``), threads that carry a job's context (``threads``), locks, media helpers and the
names of an output's layout (``layout``)."""
