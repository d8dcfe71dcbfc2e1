"""Precomputed results from a Redis snapshot (``serve.results = "redis://..."``): what a
job's versioned Redis export published. Each lookup resolves ``<prefix>current`` first,
then reads ``<prefix><version>:<id>``, so an answer always comes from one whole snapshot,
and a job that publishes a new one is served from the next request on, without a restart.
The key template and the columns' types come from the job's ``[[export]]`` table and the
``<prefix>schema:<version>`` the export wrote beside its rows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from ..core.credentials import redact_url
from ..core.errors import ConfigError
from ..sinks.redis import connect, decode_value, parse_key

if TYPE_CHECKING:
    from ..config import JobConfig, RedisExport

__all__ = ["RedisResults"]


class RedisResults:
    """``id -> output row`` over the current snapshot of a versioned Redis export."""

    def __init__(self, url: str, cfg: JobConfig) -> None:
        if not cfg.source.id_column:
            raise ConfigError("serve.results: set source.id_column (--id-column) to the run's id column")
        self.id_column: str = cfg.source.id_column
        spec = _export_for(url, cfg)
        self.prefix, pieces = parse_key(spec.key, "serve.results")
        placeholders = [col for _text, col in pieces if col is not None]
        if placeholders != [self.id_column]:
            raise ConfigError(
                f"serve.results: the export's key {spec.key!r} must name only the id column "
                f"{{{self.id_column}}} to be looked up by id"
            )
        self.suffix = [(text, col) for text, col in pieces]
        self.suffix[0] = ("", self.suffix[0][1])  # the prefix, with the version after it, is added per lookup
        self.out_dir = f"{redact_url(url)} ({self.prefix}current)"
        self.client, _transient, _refused = connect(url, "serve.results")
        self._schemas: dict[str, dict[str, Any]] = {}
        if self.version() is None:
            raise ConfigError(
                f"serve.results: {self.out_dir} is not set: no run has published a snapshot there yet "
                "(a versioned export switches it when its job completes)"
            )

    def version(self) -> str | None:
        raw = self.client.get(f"{self.prefix}current")
        return raw.decode() if raw is not None else None

    def describe(self) -> str:
        return f"the snapshot {self.version()} of {self.out_dir}"

    def parse_id(self, key: str) -> Any:
        try:
            return int(key)
        except ValueError:
            return key

    def _schema(self, version: str) -> dict[str, Any]:
        if version not in self._schemas:
            raw = self.client.get(f"{self.prefix}schema:{version}")
            self._schemas[version] = orjson.loads(raw) if raw else {"encoding": "json", "columns": {}}
        return self._schemas[version]

    def get(self, key: str) -> dict[str, Any] | None:
        version = self.version()
        if version is None:
            return None
        name = f"{self.prefix}{version}:" + "".join(text + (key if col else "") for text, col in self.suffix)
        schema = self._schema(version)
        columns: dict[str, str] = schema["columns"]
        enc = schema["encoding"]
        if enc == "hash":
            fields = self.client.hgetall(name)
            if not fields:
                return None
            values = {c: decode_value(kind, fields.get(c.encode(), b"")) for c, kind in columns.items()}
        else:
            raw = self.client.get(name)
            if raw is None:
                return None
            if enc == "json":
                values = dict(orjson.loads(raw))
            else:
                ((col, kind),) = columns.items()
                values = {col: decode_value(kind, raw)}
        return {self.id_column: self.parse_id(key), **values}


def _export_for(url: str, cfg: JobConfig) -> RedisExport:
    """The job's versioned Redis export that wrote to ``url`` (or its only Redis export)."""
    from ..config import RedisExport

    redis_exports = [e for e in cfg.export if isinstance(e, RedisExport)]
    same = [e for e in redis_exports if e.url == url] or (redis_exports if len(redis_exports) == 1 else [])
    if not same:
        raise ConfigError(
            f'serve.results: {redact_url(url)}: the job has no [[export]] kind = "redis" with this url; serve with '
            "the job file that exported there (its key template says where the rows are)"
        )
    if not same[0].versioned:
        raise ConfigError("serve.results: the Redis export is not versioned; only a published snapshot can be served")
    return same[0]
