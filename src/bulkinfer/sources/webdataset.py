"""WebDataset tar shards (img2dataset's output) as rows: each key's members (``key.jpg`` beside
``key.json`` and ``key.txt``) are one row: ``id`` (the key), ``image`` (the picture's bytes),
``text`` (the ``.txt`` member) and the ``.json`` member's top-level fields as columns.

Planning reads the tar's headers only (each member's name and offset, no data) and cuts the
keys into spans of ``source.shard_rows``, each span the byte range of its members, so a large
tar is read by several shards, each seeking to its own range. A key is a member's path up to
the first dot of its file name (WebDataset's rule). A key without a picture member is an error
row naming the key.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from ..core.errors import SourceError
from ..core.media import IMAGE_EXTENSIONS
from ..core.storage import filesystem
from .shard import BATCH_BYTES, MAX_RECORD_BYTES, ROW, BadRow, InputFile, Shard, Span

__all__ = ["WebDatasetFormat"]

_IMAGE_SUFFIXES = tuple(e.lstrip(".") for e in IMAGE_EXTENSIONS)


def _split(name: str) -> tuple[str, str]:
    """``dir/key.ext.ext2`` -> (``dir/key``, ``ext.ext2``)."""
    folder, _, base = name.rpartition("/")
    stem, _, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext.lower()


def _keys(f: InputFile) -> list[tuple[str, int]]:
    """Each key of the tar, in order, with its first member's header offset."""
    fs, path = filesystem(f.uri)
    keys: list[tuple[str, int]] = []
    try:
        with fs.open(path, "rb") as fh, tarfile.open(fileobj=fh, mode="r:") as tf:
            for member in tf:
                if not member.isfile():
                    continue
                key, _ext = _split(member.name)
                if not keys or keys[-1][0] != key:
                    keys.append((key, member.offset))
    except tarfile.TarError as exc:
        raise SourceError(f"{f.uri}: not a readable tar ({exc})", f.uri) from None
    return keys


class WebDatasetFormat:
    """WebDataset tars (see the module's docstring)."""

    name = "webdataset"
    extensions: tuple[str, ...] = (".tar",)

    def plan(self, f: InputFile, shard_rows: int, max_record: int = MAX_RECORD_BYTES) -> list[Span]:
        keys = _keys(f)
        spans = []
        for start in range(0, len(keys), shard_rows):
            stop = min(start + shard_rows, len(keys))
            end = keys[stop][1] if stop < len(keys) else f.size
            spans.append(Span(start, stop, keys[start][1], end))
        return spans

    def head_schema(self, f: InputFile) -> pa.Schema:
        fields = {"id": pa.string(), "image": pa.binary(), "text": pa.string()}
        sample = next(self._samples(f.uri, 0, f.size), None)
        parsed = json.loads(sample[1]["json"]) if sample is not None and "json" in sample[1] else None
        if isinstance(parsed, dict):
            sidecar = pa.Table.from_pylist([parsed]).schema
            fields.update({n: t for n, t in zip(sidecar.names, sidecar.types, strict=True) if n not in fields})
        return pa.schema(list(fields.items()))

    def _samples(self, uri: str, offset: int, end: int) -> Iterator[tuple[str, dict[str, Any]]]:
        """(key, {extension: bytes}) of the members in ``[offset, end)``, in order."""
        fs, path = filesystem(uri)
        with fs.open(path, "rb") as fh:
            fh.seek(offset)
            key, parts = None, {}
            with tarfile.open(fileobj=fh, mode="r|") as tf:
                for member in tf:
                    if offset + member.offset >= end:
                        break
                    if not member.isfile():
                        continue
                    name, ext = _split(member.name)
                    if name != key and key is not None:
                        yield key, parts
                        parts = {}
                    key = name
                    data = tf.extractfile(member)
                    parts[ext] = data.read() if data is not None else b""
            if key is not None:
                yield key, parts

    def read(
        self, shard: Shard, columns: Sequence[str], batch_rows: int, bad: BadRow, types: Mapping[str, pa.DataType]
    ) -> Iterator[pa.RecordBatch]:
        rows: list[dict[str, Any]] = []
        numbers: list[int] = []
        size = 0
        assert shard.offset is not None and shard.end is not None
        first = shard.start if shard.base is None else shard.base  # a resumed tail starts after its span's first row
        for i, (key, parts) in enumerate(self._samples(shard.uri, shard.offset, shard.end)):
            row = first + i
            if row < shard.start:
                continue
            if row >= shard.stop:
                break
            record = _record(key, parts, row, bad)
            if record is None:
                continue
            rows.append(record)
            numbers.append(row)
            size += len(record["image"])
            if len(rows) >= batch_rows or size >= BATCH_BYTES:
                yield _batch(rows, numbers, columns, types)
                rows, numbers, size = [], [], 0
        if rows:
            yield _batch(rows, numbers, columns, types)


def _record(key: str, parts: dict[str, Any], row: int, bad: BadRow) -> dict[str, Any] | None:
    image = next((parts[e] for e in parts if e.rsplit(".", 1)[-1] in _IMAGE_SUFFIXES), None)
    if image is None:
        bad(row, f"{key}: the sample has no picture member (has {', '.join(sorted(parts)) or 'nothing'})")
        return None
    record: dict[str, Any] = {"id": key, "image": image}
    if "txt" in parts:
        record["text"] = parts["txt"].decode("utf-8", "replace")
    if "json" in parts:
        try:
            sidecar = json.loads(parts["json"])
        except ValueError as exc:
            bad(row, f"{key}.json: not JSON ({exc})")
            return None
        if isinstance(sidecar, dict):
            record.update({k: v for k, v in sidecar.items() if k not in ("id", "image", "text")})
    return record


def _batch(
    rows: list[dict[str, Any]], numbers: list[int], columns: Sequence[str], types: Mapping[str, pa.DataType]
) -> pa.RecordBatch:
    defaults = {"id": pa.string(), "image": pa.binary(), "text": pa.string()}
    data = {}
    for c in columns:
        values = [r.get(c) for r in rows]
        kind = types.get(c) or defaults.get(c)
        data[c] = pa.array(values, kind) if kind is not None else pa.array(values)
    data[ROW] = pa.array(numbers, pa.int64())
    return pa.RecordBatch.from_pydict(data)
