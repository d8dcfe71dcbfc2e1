"""Redis stream export (``kind = "redis_stream"``): each row one entry (``XADD``), its kept
input columns and chosen output columns as fields — a queue that reviewers or a worker
group (``XREADGROUP``) consume. Used mostly as a route's target (rows to human review).

Exactly once: a part's entries are added by one Lua script that first adds the part's name
to ``<stream>:bulkinfer-parts`` and adds nothing if it was there. A script runs atomically
on the server, so a replayed part (a crash before its ledger line, or a reply lost to a
dropped connection and retried) finds its name and changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..core.credentials import redact_url
from ..core.errors import OutputError
from .exports import retrying, value_columns
from .redis import connect, encode_fields

if TYPE_CHECKING:
    from ..config import RedisStreamExport
    from ..plan import JobPlan

__all__ = ["RedisStreamTarget"]

# KEYS: stream, parts set. ARGV: part, field count n, maxlen ("" for none), n names, then values row by row.
_ADD_PART = """
if redis.call('SADD', KEYS[2], ARGV[1]) == 0 then return -1 end
local n = tonumber(ARGV[2])
local first = 4 + n
local rows = (#ARGV - first + 1) / n
for r = 0, rows - 1 do
  local entry = {}
  for i = 1, n do
    entry[2 * i - 1] = ARGV[3 + i]
    entry[2 * i] = ARGV[first + r * n + i - 1]
  end
  if ARGV[3] ~= '' then
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[3], '*', unpack(entry))
  else
    redis.call('XADD', KEYS[1], '*', unpack(entry))
  end
end
return rows
"""


class RedisStreamTarget:
    def __init__(self, spec: RedisStreamExport, where: str) -> None:
        self.spec = spec
        self.where = where
        self.name = f"{where} (redis stream {spec.stream} at {redact_url(spec.url)})"
        self.client: Any = None
        self.kept: list[str] = []
        self.version = ""

    def start(self, plan: JobPlan, kept: Sequence[str]) -> None:
        self.kept = list(kept)
        self.version = plan.fingerprint[:16]
        self.client, self._errors, self._refused = connect(self.spec.url, self.name)
        self._script = self.client.register_script(_ADD_PART)

    def write(self, part: str, table: pa.Table) -> None:
        if not table.num_rows:
            return
        cols = list(dict.fromkeys([*self.kept, *value_columns(table, self.spec.columns, self.kept, self.where)]))
        fields = encode_fields(table, cols)
        values = [v for i in range(table.num_rows) for v in (fields[c][i] for c in cols)]
        maxlen = str(self.spec.maxlen) if self.spec.maxlen else ""
        args = [f"{self.version}:{part}", len(cols), maxlen, *cols, *values]
        keys = [self.spec.stream, f"{self.spec.stream}:bulkinfer-parts"]
        try:
            retrying(lambda: self._script(keys=keys, args=args), f"{self.name}: writing {part}", self._errors)
        except self._refused as exc:
            raise OutputError(f"{self.name}: writing {part}: {exc}") from exc

    def complete(self) -> None:
        """Nothing to switch: entries are visible as they are added."""

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
