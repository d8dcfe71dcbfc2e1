"""A job's shards held as columns: a million shards in about 60 MB rather than the ~450 bytes
each a list of :class:`Shard` objects took (an object, its integers, and the allocator's
fragments between them). A :class:`Shard` is built when one is read (indexing, iterating); the
table is the plan's, a resume's work left, and what ``job.json`` is read into."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np

from .shard import Shard

__all__ = ["ShardTable"]

_NONE = -1  # offset, end and base are byte offsets and row numbers: never negative


class ShardTable(Sequence[Shard]):
    """Shards as integer columns (index, start, stop, offset, end, base, file) with the rare
    fields (``repeats``, ``oversized``) kept aside by position, and each distinct file (uri,
    format, encoding) once."""

    def __init__(self, shards: Iterable[Shard] = ()) -> None:
        self._index, self._start, self._stop = array("q"), array("q"), array("q")
        self._offset, self._end, self._base = array("q"), array("q"), array("q")
        self._file = array("i")
        self._files: list[tuple[str, str, str | None]] = []
        self._file_ids: dict[tuple[str, str, str | None], int] = {}
        self._repeats: dict[int, tuple[int, ...]] = {}
        self._oversized: set[int] = set()
        self.extend(shards)

    def append(self, s: Shard) -> None:
        key = (s.uri, s.format, s.encoding)
        fid = self._file_ids.get(key)
        if fid is None:
            fid = self._file_ids[key] = len(self._files)
            self._files.append(key)
        at = len(self._index)
        self._index.append(s.index)
        self._start.append(s.start)
        self._stop.append(s.stop)
        self._offset.append(_NONE if s.offset is None else s.offset)
        self._end.append(_NONE if s.end is None else s.end)
        self._base.append(_NONE if s.base is None else s.base)
        self._file.append(fid)
        if s.repeats:
            self._repeats[at] = tuple(s.repeats)
        if s.oversized:
            self._oversized.add(at)

    def extend(self, shards: Iterable[Shard]) -> None:
        for s in shards:
            self.append(s)

    def _shard(self, i: int) -> Shard:
        uri, fmt, encoding = self._files[self._file[i]]
        offset, end, base = self._offset[i], self._end[i], self._base[i]
        return Shard(
            self._index[i], uri, fmt, self._start[i], self._stop[i],
            None if offset == _NONE else offset, None if end == _NONE else end, None if base == _NONE else base,
            self._repeats.get(i, ()), i in self._oversized, encoding,
        )  # fmt: skip

    def __len__(self) -> int:
        return len(self._index)

    @overload
    def __getitem__(self, i: int) -> Shard: ...
    @overload
    def __getitem__(self, i: slice) -> list[Shard]: ...
    def __getitem__(self, i: int | slice) -> Shard | list[Shard]:
        if isinstance(i, slice):
            return [self._shard(j) for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(i)
        return self._shard(i % n)

    def __iter__(self) -> Iterator[Shard]:
        return (self._shard(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ShardTable({len(self)} shards over {len(self._files)} file(s))"

    def indexes(self) -> np.ndarray:
        """Every shard's index, in order (no :class:`Shard` built)."""
        return _column(self._index)

    def uris(self) -> list[str]:
        """The files the shards read, in order, each once."""
        return list(dict.fromkeys(uri for uri, _, _ in self._files))

    def rows(self) -> int:
        """The rows of every shard together."""
        return int((_column(self._stop) - _column(self._start)).sum())

    def __reduce__(self) -> tuple[Any, ...]:
        return (ShardTable, (list(self),))


def _column(values: array[int]) -> np.ndarray:
    """A copy (a view would pin the array: it could not grow while the view lives)."""
    return np.frombuffer(values, dtype=np.int64).copy() if len(values) else np.zeros(0, np.int64)
