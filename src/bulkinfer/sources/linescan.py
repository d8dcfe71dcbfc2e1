"""Finding records in line formats fast: a vectorised scan of line ends over big chunks, and
the cut of the records found into shards with their byte ranges. Planning a line-format
file must number every record (the ledger and error rows name rows), so it reads the bytes
once; this keeps that read near disk speed and its memory to one chunk, however long a line."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from .encoding import check_utf8
from .shard import MAX_RECORD_BYTES, Span

__all__ = ["CHUNK", "cut_spans", "line_ends", "next_lines", "skip_line"]

CHUNK = 1 << 24
_LF = 10
_WHITESPACE = np.array([9, 10, 11, 12, 13, 32], dtype=np.uint8)  # what bytes.strip() removes


def skip_line(fh: Any) -> tuple[int, int]:
    """Read on to the end of the current line: (bytes read, quotes among them). The bytes
    after the line end are put back (the file position is left just past it)."""
    size = quotes = 0
    while True:
        chunk = fh.read(1 << 20)
        if not chunk:
            return size, quotes
        at = chunk.find(b"\n")
        if at >= 0:
            fh.seek(at + 1 - len(chunk), 1)
            return size + at + 1, quotes + chunk.count(b'"', 0, at)
        size, quotes = size + len(chunk), quotes + chunk.count(b'"')


def next_lines(fh: Any, carry: bytes) -> tuple[bytes, bytes, np.ndarray, np.ndarray] | None:
    """The next chunk read, ``carry`` (the part line left by the last one) with it, those bytes
    as an array, and the offsets after each line end in them (after the last byte too at the
    end of the file); None when nothing is left."""
    chunk = fh.read(CHUNK)
    buf = carry + chunk
    if not buf:
        return None
    data = np.frombuffer(buf, dtype=np.uint8)
    stops = np.flatnonzero(data == _LF) + 1
    if not chunk and (not len(stops) or stops[-1] != len(buf)):  # last line without a line end
        stops = np.append(stops, len(buf))
    return chunk, buf, data, stops


def line_ends(fh: Any, limit: int = MAX_RECORD_BYTES, uri: str = "") -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Byte offsets after the lines that are not blank (whitespace only) and their sizes, a
    chunk at a time. A line over ``limit`` bytes is always yielded (blank or not: the
    planner makes it an error row), and one still open past ``limit`` is read on to its end
    without being held. A byte that is not UTF-8 (outside such a line) fails the file ``uri``."""
    base, carry = 0, b""
    while True:
        if len(carry) > limit:
            size = len(carry) + skip_line(fh)[0]
            base, carry = base + size, b""
            yield np.asarray([base], dtype=np.int64), np.asarray([size], dtype=np.int64)
            continue
        got = next_lines(fh, carry)
        if got is None:
            return
        chunk, buf, data, stops = got
        check_utf8(buf, base, uri, int(stops[-1]) if len(stops) else 0)
        begins = np.concatenate(([0], stops[:-1]))
        length = stops - begins
        keep = length <= limit
        # a blank line starts with whitespace; the few lines that do are checked one by one
        maybe = np.flatnonzero(np.isin(data[np.minimum(begins, len(buf) - 1)], _WHITESPACE) & keep)
        spans = zip(begins[maybe].tolist(), stops[maybe].tolist(), strict=True)
        keep[maybe] = [bool(buf[b:e].strip()) for b, e in spans]
        keep |= length > limit
        yield base + stops[keep], length[keep]
        done = int(stops[-1]) if len(stops) else 0
        base, carry = base + done, buf[done:]
        if not chunk:
            return


def cut_spans(
    chunks: Iterator[tuple[np.ndarray, np.ndarray]],
    shard_rows: int,
    max_record: int = MAX_RECORD_BYTES,
    header: bool = False,
) -> list[Span]:
    """Shards from the byte offsets after each record and the records' sizes (with
    ``header``, the first record is the header, in no shard). A record longer than
    ``max_record`` is a span of its own, ``oversized``."""
    spans: list[Span] = []
    rows = start_row = 0
    start_off = prev = -1 if header else 0

    def take(ends: np.ndarray) -> None:  # records of a normal size: cut every shard_rows
        nonlocal rows, start_row, start_off
        i = 0
        while len(ends) - i >= start_row + shard_rows - rows:
            i += start_row + shard_rows - rows
            rows, end = start_row + shard_rows, int(ends[i - 1])
            spans.append(Span(start_row, rows, start_off, end))
            start_row, start_off = rows, end
        rows += len(ends) - i

    for ends, sizes in chunks:
        if start_off < 0 and len(ends):  # the header
            start_off = prev = int(ends[0])
            ends, sizes = ends[1:], sizes[1:]
        if not len(ends):
            continue
        big = np.flatnonzero(sizes > max_record)
        i = 0
        for b in big.tolist():
            take(ends[i:b])
            before = int(ends[b - 1]) if b else prev
            if rows > start_row:
                spans.append(Span(start_row, rows, start_off, before))
            spans.append(Span(rows, rows + 1, int(ends[b] - sizes[b]), int(ends[b]), oversized=True))
            rows += 1
            start_row, start_off = rows, int(ends[b])
            i = b + 1
        take(ends[i:])
        prev = int(ends[-1])
    if rows > start_row:
        spans.append(Span(start_row, rows, start_off, prev))
    return spans
