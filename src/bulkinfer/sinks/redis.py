"""Redis export: each row under a key made from its kept columns (``emb:{id}``), written by
pipelined batches; vectors as float32 bytes, several columns as a hash, or JSON.

Versioned publish (default): a run writes ``emb:<version>:<id>`` and, when the job
completes, one ``MULTI``/``EXEC`` sets ``emb:current`` to its version (and records it in
``emb:versions``), so a reader that resolves ``emb:current`` first sees the whole old
snapshot or the whole new one, never a mix. The version is the job's fingerprint: a
resumed run writes where the killed one did. Published versions beyond
``keep_versions`` are deleted after the switch.
"""

from __future__ import annotations

import string
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
import pyarrow as pa

from ..core.credentials import redact_url
from ..core.errors import ConfigError, OutputError
from .exports import is_vector, retrying, value_columns, vectors

if TYPE_CHECKING:
    from ..config import RedisExport
    from ..plan import JobPlan

__all__ = ["RedisTarget", "column_kind", "connect", "decode_value", "encode_fields", "parse_key"]


def parse_key(template: str, where: str) -> tuple[str, list[tuple[str, str | None]]]:
    """The literal prefix of a key template and its pieces (text, column or None)."""
    try:
        pieces = [(text, field) for text, field, _spec, _conv in string.Formatter().parse(template)]
    except ValueError as exc:
        raise ConfigError(f"{where}.key: {template!r} is not a key template ({exc})") from exc
    if any(f == "" for _t, f in pieces):
        raise ConfigError(f"{where}.key: {template!r}: name the column inside {{}}, e.g. emb:{{id}}")
    prefix = pieces[0][0] if pieces else ""
    return prefix, pieces


class RedisTarget:
    def __init__(self, spec: RedisExport, where: str) -> None:
        self.spec = spec
        self.where = where
        self.name = f"{where} (redis {redact_url(spec.url)})"
        self.prefix, self.pieces = parse_key(spec.key, where)
        if spec.versioned and not self.prefix:
            raise ConfigError(
                f"{where}.key: {spec.key!r} must start with literal text (e.g. 'emb:{{id}}') when versioned: "
                "the version and the 'current' pointer live under it"
            )
        self.client: Any = None
        self.version = ""
        self.kept: list[str] = []
        self._described = False

    # -- lifecycle -----------------------------------------------------------------
    def start(self, plan: JobPlan, kept: Sequence[str]) -> None:
        self.kept = list(kept)
        for _text, col in self.pieces:
            if col is not None and col not in kept:
                raise ConfigError(
                    f"{self.where}.key: {{{col}}} is not a kept input column ({', '.join(kept) or 'none kept'}); "
                    "set source.id_column or add it to sink.keep_columns"
                )
        self.version = plan.fingerprint[:16]
        self.client, self._errors, self._refused = connect(self.spec.url, self.name)

    def write(self, part: str, table: pa.Table) -> None:
        if not table.num_rows:
            return
        keys = self._keys(table)
        cols = value_columns(table, self.spec.columns, self.kept, self.where)
        values = self._values(table, cols)
        self._describe(table, cols)
        step = self.spec.batch_rows
        for lo in range(0, len(keys), step):
            chunk = range(lo, min(lo + step, len(keys)))

            def send(chunk: range = chunk) -> None:
                self._send(keys, values, chunk)

            try:
                retrying(send, f"{self.name}: writing {part}", self._errors)
            except self._refused as exc:  # e.g. OOM (maxmemory), WRONGTYPE, NOPERM
                raise OutputError(f"{self.name}: writing {part}: {exc}") from exc

    def complete(self) -> None:
        if not self.spec.versioned or self.client is None:
            return
        retrying(self._switch, f"{self.name}: switching {self.prefix}current", self._errors)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()

    # -- keys and values --------------------------------------------------------------
    def _keys(self, table: pa.Table) -> list[str]:
        n = table.num_rows
        parts: list[list[str]] = []
        for i, (text, col) in enumerate(self.pieces):
            if self.spec.versioned and i == 0:
                text = f"{text}{self.version}:"
            if text:
                parts.append([text] * n)
            if col is not None:
                parts.append([str(v) for v in table.column(col).to_pylist()])
        return ["".join(p) for p in zip(*parts, strict=True)]

    def _encoding(self, table: pa.Table, cols: list[str]) -> str:
        enc: str = self.spec.encoding
        if enc == "auto":
            enc = "hash" if len(cols) > 1 else ("float32" if is_vector(table.column(cols[0])) else "text")
        return enc

    def _describe(self, table: pa.Table, cols: list[str]) -> None:
        """``<prefix>schema:<version>``: how this version's values decode (``bulkinfer serve`` reads it)."""
        if self._described or not self.spec.versioned:
            return
        schema = {
            "key": self.spec.key,
            "encoding": self._encoding(table, cols),
            "columns": {c: column_kind(table.column(c)) for c in cols},
        }
        retrying(
            lambda: self.client.set(f"{self.prefix}schema:{self.version}", orjson.dumps(schema)),
            f"{self.name}: writing {self.prefix}schema:{self.version}",
            self._errors,
        )
        self._described = True

    def _values(self, table: pa.Table, cols: list[str]) -> list[Any]:
        enc = self._encoding(table, cols)
        if enc in ("float32", "text") and len(cols) != 1:
            raise OutputError(f"{self.where}.encoding: {enc} stores one column; {len(cols)} chosen ({', '.join(cols)})")
        if enc == "float32":
            col = table.column(cols[0])
            if not is_vector(col):
                raise OutputError(f"{self.where}.encoding: float32 needs a vector column; {cols[0]!r} is {col.type}")
            return [row.tobytes() for row in vectors(col)]
        if enc == "text":
            return [_scalar(v) for v in table.column(cols[0]).to_pylist()]
        if enc == "json":
            rows = table.select(cols).to_pylist()
            return [orjson.dumps(r, option=orjson.OPT_SERIALIZE_NUMPY) for r in rows]
        fields = encode_fields(table, cols)
        return [{c: fields[c][i] for c in cols} for i in range(table.num_rows)]

    def _send(self, keys: list[str], values: list[Any], rows: range) -> None:
        ttl = self.spec.ttl_s
        if not ttl and not isinstance(values[rows.start], dict):
            # one MSET per batch: one command to pack and parse, not one per row
            self.client.execute_command("MSET", *[x for i in rows for x in (keys[i], values[i])])
            return
        pipe = self.client.pipeline(transaction=False)
        for i in rows:
            value = values[i]
            if isinstance(value, dict):
                pipe.delete(keys[i])
                pipe.hset(keys[i], mapping=value)
                if ttl:
                    pipe.expire(keys[i], ttl)
            else:
                pipe.set(keys[i], value, ex=ttl)
        pipe.execute()

    # -- versions ---------------------------------------------------------------------
    def _switch(self) -> None:
        pointer, versions = f"{self.prefix}current", f"{self.prefix}versions"
        with self.client.pipeline(transaction=True) as pipe:  # MULTI ... EXEC
            pipe.set(pointer, self.version)
            pipe.zadd(versions, {self.version: time.time()})
            pipe.execute()
        published = [v.decode() for v in self.client.zrevrange(versions, 0, -1)]
        for old in published[self.spec.keep_versions :]:
            match = f"{self.prefix}{old}:*"
            batch: list[bytes] = []
            for key in self.client.scan_iter(match=match, count=1000):
                batch.append(key)
                if len(batch) >= 1000:
                    self.client.unlink(*batch)
                    batch = []
            if batch:
                self.client.unlink(*batch)
            self.client.unlink(f"{self.prefix}schema:{old}")
            self.client.zrem(versions, old)


def connect(url: str, name: str) -> tuple[Any, tuple[type[BaseException], ...], type[BaseException]]:
    """A checked client, the errors worth retrying and the server's refusals (one line if it is down)."""
    try:
        import redis
        from redis.backoff import ExponentialBackoff
        from redis.retry import Retry
    except ImportError as exc:
        raise ConfigError(f"{name}: the redis export needs redis-py: pip install 'bulkinfer[redis]'") from exc
    transient = (redis.ConnectionError, redis.TimeoutError, ConnectionResetError)
    client = redis.Redis.from_url(
        url,
        socket_connect_timeout=5,
        socket_timeout=30,
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 1),  # a blip; exports.retrying does the rest
        retry_on_error=list(transient),
    )
    try:
        client.ping()
    except (*transient, redis.ResponseError) as exc:
        raise OutputError(f"{name}: cannot reach it ({exc}); start it or fix the url") from exc
    return client, transient, redis.RedisError


def column_kind(col: pa.ChunkedArray) -> str:
    """How a column's Redis values decode: vector, int, float, bool, json (other nested values), or text."""
    t = col.type
    if is_vector(col):
        return "vector"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_nested(t):  # lists of ids, structs: written as JSON
        return "json"
    return "text"


def decode_value(kind: str, raw: bytes) -> Any:
    """A value :func:`encode_fields` wrote, back (an empty value is null)."""
    if kind == "vector":
        return np.frombuffer(raw, dtype=np.float32).tolist()
    if raw == b"":
        return None
    text = raw.decode()
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    if kind == "bool":
        return text == "1"
    if kind == "json":
        return orjson.loads(raw)
    return text


def encode_fields(table: pa.Table, cols: Sequence[str]) -> dict[str, list[str | bytes]]:
    """Each column as Redis values: vectors as float32 bytes, scalars as text."""
    out: dict[str, list[str | bytes]] = {}
    for c in cols:
        col = table.column(c)
        out[c] = [r.tobytes() for r in vectors(col)] if is_vector(col) else [_scalar(v) for v in col.to_pylist()]
    return out


def _scalar(value: Any) -> str | bytes:
    if value is None:
        return b""
    if isinstance(value, str | bytes):
        return value
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int | float):
        return repr(value)
    return orjson.dumps(value)
