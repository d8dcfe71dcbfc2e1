"""Text encodings of the line formats (CSV, JSONL, batch files).

A file is UTF-8 unless a byte-order mark (UTF-8, UTF-16, UTF-32) or ``source.encoding``
says otherwise. UTF-8 files are planned and read as they are, and a byte that is not UTF-8
fails the file with one line naming it. A file in another encoding is planned over a UTF-8
copy made while scanning it (a temporary local file, with each line's offset in both), and
its shards keep the original file's byte ranges: a shard's bytes are decoded when read.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import IO, Any

import numpy as np
import pyarrow as pa

from ..core.errors import SourceError
from ..core.storage import filesystem

__all__ = [
    "LINE_FORMATS",
    "Utf8Stream",
    "check_utf8",
    "codec_of",
    "decoded",
    "not_in_encoding",
    "open_text_head",
    "scan_stream",
]

LINE_FORMATS = ("csv", "jsonl", "openai-batch")
"""The formats whose bytes are text in an encoding (Parquet's strings are UTF-8 by its spec)."""

_CHUNK = 1 << 22

# longest first: UTF-32-LE's mark begins with UTF-16-LE's
_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
# a declared encoding that leaves the byte order to the mark; without one, little-endian (as Windows writes)
_ORDERLESS = {"utf-16": "utf-16-le", "utf-32": "utf-32-le", "utf-8-sig": "utf-8"}


def _bom(head: bytes) -> tuple[str | None, int]:
    for mark, codec in _BOMS:
        if head.startswith(mark):
            return codec, len(mark)
    return None, 0


def codec_of(head: bytes, declared: str, uri: str = "") -> str | None:
    """The codec a file is read with, from its first bytes and ``source.encoding``
    (``declared``: "auto" or a Python codec's name): None for UTF-8, read as is; else a
    codec without a byte order left open. A mark that contradicts ``declared`` gives the
    declared codec (:func:`scan_stream` and the readers then refuse the file in one line).
    A file read as UTF-8 whose head has the zeros of UTF-16 or UTF-32 without a mark is refused
    in one line naming the encoding to declare (its NULs are valid UTF-8: it would read as text)."""
    marked, _ = _bom(head)
    name = codecs.lookup(declared).name if declared != "auto" else None
    if name is None:
        if marked is None and (wide := _unmarked_wide(head)) is not None:
            raise SourceError(
                f"{uri}: the file looks like {wide.upper()} without a byte-order mark (its bytes are "
                f"{'every other' if '16' in wide else 'three in four'} 0); read it with --input-encoding {wide} "
                f'(source.encoding = "{wide}")',
                uri,
            )
        return None if marked in (None, "utf-8") else marked
    name = _ORDERLESS.get(name, name)
    if marked is not None and name.split("-")[:2] == marked.split("-")[:2]:
        name = marked  # utf-16 with a big-endian mark: utf-16-be
    return None if name == "utf-8" else name


def _unmarked_wide(head: bytes) -> str | None:
    """UTF-16 or UTF-32 (with its byte order) when the zeros of ``head``'s first 4 KiB fall
    where ASCII text in that encoding puts them (9 in 10 of those places, hardly any elsewhere)."""
    data = np.frombuffer(head[:4096], dtype=np.uint8)
    data = data[: len(data) - len(data) % 4]
    if len(data) < 8:
        return None
    zero = data == 0
    for codec, period, at in (("utf-32-le", 4, (1, 2, 3)), ("utf-32-be", 4, (0, 1, 2)),
                              ("utf-16-le", 2, (1,)), ("utf-16-be", 2, (0,))):  # fmt: skip
        where = np.isin(np.arange(len(data)) % period, at)
        if zero[where].mean() >= 0.9 and zero[~where].mean() <= 0.1:
            return codec
    return None


def _start(head: bytes, codec: str | None, uri: str) -> int:
    """Where the text begins (after a byte-order mark of ``codec``); a mark of another
    encoding is refused."""
    marked, size = _bom(head)
    if marked is None or marked == (codec or "utf-8"):
        return size
    raise SourceError(
        f"{uri}: the file begins with a {marked.upper()} byte-order mark but source.encoding says "
        f'{codec or "utf-8"}; set source.encoding = "auto" (or {marked}) or convert the file',
        uri,
    )


_FIX = (
    "set source.encoding (--input-encoding) to the file's encoding, e.g. cp1252, latin-1, utf-16 or shift_jis, "
    "or convert the file to UTF-8"
)


def not_in_encoding(uri: str, offset: int, byte: int | None, codec: str | None) -> SourceError:
    """The one line for a file whose bytes are not in the encoding it is read with."""
    what = f"byte {offset}" + (f" (0x{byte:02X})" if byte is not None else "")
    if codec is None:
        return SourceError(f"{uri}: {what} is not UTF-8; {_FIX}", uri)
    return SourceError(f"{uri}: {what} is not {codec}; {_FIX}", uri)


_ARROW_CHECK = 1 << 16
"""From this many bytes Arrow's validator is worth its set-up (~10 µs); a line is decoded (~0.1 µs)."""


def check_utf8(data: bytes | memoryview, base: int, uri: str, end: int | None = None) -> None:
    """Raise :func:`not_in_encoding` for the first byte of ``data[:end]`` that is not UTF-8
    (``base``: the file offset of ``data[0]``). ``end`` must fall between characters (a line end)."""
    view = memoryview(data)[:end] if end is not None else memoryview(data)
    if view.nbytes >= _ARROW_CHECK:
        offsets = pa.array([0, view.nbytes], pa.int64()).buffers()[1]
        try:  # a planner's chunk: Arrow's validation, several times faster than decoding
            pa.Array.from_buffers(pa.large_binary(), 1, [None, offsets, pa.py_buffer(view)]).cast(pa.large_string())
            return
        except pa.ArrowInvalid:
            pass  # the decode below finds the byte
    try:
        codecs.utf_8_decode(view, "strict", True)
    except UnicodeDecodeError as exc:
        raise not_in_encoding(uri, base + exc.start, view[exc.start], None) from None


class Utf8Stream(io.RawIOBase):
    """The UTF-8 bytes of ``raw`` (a binary file at the start of its text) in ``codec``,
    decoded as they are read. With ``record``, the offsets after every line in both encodings
    are kept, so offsets found in the UTF-8 bytes map back to the file (:meth:`to_source`)."""

    def __init__(self, raw: IO[bytes], codec: str, uri: str, start: int, record: bool = False) -> None:
        super().__init__()
        self.raw, self.codec, self.uri = raw, codec, uri
        self.decoder = codecs.getincrementaldecoder(codec)("strict")
        self.consumed = start  # file bytes handed to the decoder
        self.pending = b""  # UTF-8 bytes decoded, not yet read
        self.record = record
        self.carry = ""  # the current line's text so far (record)
        self.u8_pos, self.src_pos = 0, start
        self.u8_ends: list[np.ndarray] = [np.asarray([0], dtype=np.int64)]
        self.src_ends: list[np.ndarray] = [np.asarray([start], dtype=np.int64)]
        self.done = False

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self.pending and not self.done:
            self._fill()
        n = min(len(b), len(self.pending))
        b[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n

    def _fill(self) -> None:
        chunk = self.raw.read(_CHUNK)
        held = len(self.decoder.getstate()[0])
        try:
            text = self.decoder.decode(chunk, final=not chunk)
        except UnicodeDecodeError as exc:
            at = self.consumed - held + exc.start
            bad = exc.object[exc.start] if exc.start < len(exc.object) else None
            raise not_in_encoding(self.uri, at, bad, self.codec) from None
        self.consumed += len(chunk)
        self.done = not chunk
        self.pending += text.encode("utf-8")
        if self.record:
            self._note_lines(text)

    def _note_lines(self, text: str) -> None:
        parts = (self.carry + text).split("\n")
        last, self.carry = parts.pop(), ""
        ends = [line + "\n" for line in parts]
        if not self.done:
            self.carry = last
        elif last:
            ends.append(last)  # the last line has no line end
        if not ends:
            self._check_whole()
            return
        u8 = np.cumsum([len(s.encode("utf-8")) for s in ends], dtype=np.int64) + self.u8_pos
        src = np.cumsum([len(s.encode(self.codec)) for s in ends], dtype=np.int64) + self.src_pos
        self.u8_pos, self.src_pos = int(u8[-1]), int(src[-1])
        self.u8_ends.append(u8)
        self.src_ends.append(src)
        self._check_whole()

    def _check_whole(self) -> None:
        if self.done and self.src_pos != self.consumed:
            raise SourceError(
                f"{self.uri}: {self.codec} does not map the file's text back to its bytes one for one "
                f"({self.src_pos} of {self.consumed} bytes); convert the file to UTF-8",
                self.uri,
            )

    def to_source(self) -> Callable[[int], int]:
        """Maps an offset after a line of the UTF-8 bytes to the file's offset there."""
        u8 = np.concatenate(self.u8_ends)
        src = np.concatenate(self.src_ends)

        def at(offset: int) -> int:
            i = int(np.searchsorted(u8, offset))
            if i >= len(u8) or u8[i] != offset:
                raise AssertionError(f"offset {offset} is not after a line")
            return int(src[i])

        return at


@contextlib.contextmanager
def scan_stream(uri: str, codec: str | None) -> Iterator[tuple[IO[bytes], Callable[[int], int]]]:
    """The file's text as UTF-8 for a planner's scan (seekable; offsets count from the
    stream's position at the start), and the map of an offset after one of its lines back to
    the file's. A UTF-8 file is itself after any byte-order mark; another encoding is copied
    to a temporary UTF-8 file first."""
    fs, path = filesystem(uri)
    with fs.open(path, "rb") as raw:
        start = _start(raw.read(4), codec, uri)
        raw.seek(start)
        if codec is None:
            yield raw, lambda offset: offset + start
            return
        stream = Utf8Stream(raw, codec, uri, start, record=True)
        with tempfile.TemporaryFile(prefix="bulkinfer-utf8-") as tmp:
            shutil.copyfileobj(stream, tmp, _CHUNK)
            tmp.seek(0)
            yield tmp, stream.to_source()


@contextlib.contextmanager
def open_text_head(uri: str, codec: str | None) -> Iterator[IO[bytes]]:
    """The file from its first character as UTF-8 bytes, for reading its head (CSV column
    names, a JSONL file's first records); a byte-order mark is skipped."""
    fs, path = filesystem(uri)
    with fs.open(path, "rb") as raw:
        start = _start(raw.read(4), codec, uri)
        raw.seek(start)
        if codec is None:
            yield raw
            return
        yield io.BufferedReader(Utf8Stream(raw, codec, uri, start), _CHUNK)


def decoded(data: bytes, codec: str | None, uri: str, offset: int) -> bytes:
    """A shard's bytes (from ``offset`` in the file) as UTF-8."""
    if codec is None:
        return data
    try:
        return data.decode(codec).encode("utf-8")
    except UnicodeDecodeError as exc:
        raise not_in_encoding(uri, offset + exc.start, data[exc.start], codec) from None
