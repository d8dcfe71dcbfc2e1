"""Image files as rows: a folder, glob or fsspec URI of pictures is one input whose rows are its
files, sorted by path, one picture a row.

The input's fingerprint is a hash of its listing (each file's relative path, size and version),
so a picture added, removed or changed is a new job, and a resume finds the same rows. A shard
is a range of that listing: reading it lists the input again (once per process, kept) and
checks the listing still hashes the same, then reads the shard's files. Each row has ``id``
(the path relative to the input's root), ``path`` (the file's URI) and ``image`` (its bytes);
decoding is the model's, beside inference (:mod:`bulkinfer.adapters.decode`).

A file that cannot be read (gone since planning, no permission) is an error row naming it.
"""

from __future__ import annotations

import glob as _glob
import hashlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..core.errors import SourceError
from ..core.media import IMAGE_EXTENSIONS
from ..core.storage import filesystem, listed_version, open_binary, store_trouble
from .expand import expand, qualify
from .shard import BATCH_BYTES, MAX_RECORD_BYTES, ROW, BadRow, InputFile, Shard, Span

__all__ = ["ImageFilesFormat", "Listing", "image_inputs", "list_images"]

SCHEMA = pa.schema([("id", pa.string()), ("path", pa.string()), ("image", pa.binary())])


@dataclass(frozen=True)
class Listing:
    """An input's pictures, sorted: relative paths (the rows' ids), URIs, sizes, and the hash."""

    root: str
    ids: tuple[str, ...]
    uris: tuple[str, ...]
    sizes: tuple[int, ...]
    digest: str


def _root(fs: Any, path: str) -> str:
    """The folder row ids are relative to: the folder itself, a glob's fixed part, a file's folder."""
    if _glob.has_magic(path):
        fixed = path[: min(path.find(c) for c in "*?[" if c in path)]
        return fixed.rsplit("/", 1)[0] if "/" in fixed else ""
    if fs.isdir(path):
        return path.rstrip("/")
    return path.rsplit("/", 1)[0] if "/" in path else ""


def list_images(pattern: str) -> Listing:
    """The pictures ``pattern`` (a folder, glob, file or URI) names, sorted, and their hash."""
    found = expand(pattern, IMAGE_EXTENSIONS)
    try:
        fs, path = filesystem(pattern)
        root = qualify(fs, _root(fs, path))
    except Exception as exc:  # the store's client raised it: any library, any kind
        raise store_trouble(pattern, exc) from exc
    ids, uris, sizes = [], [], []
    h = hashlib.sha256()
    for uri in sorted(found):
        info = found[uri]
        rel = uri[len(root) + 1 :] if root and uri.startswith(root + "/") else uri.rsplit("/", 1)[-1] if root else uri
        size = int(info.get("size") or 0)
        h.update(f"{rel}\t{size}\t{listed_version(info)}\n".encode())
        ids.append(rel)
        uris.append(uri)
        sizes.append(size)
    return Listing(root, tuple(ids), tuple(uris), tuple(sizes), h.hexdigest()[:32])


def image_inputs(patterns: Sequence[str]) -> list[InputFile]:
    """One input per pattern, its rows the pictures it names (see :func:`list_images`)."""
    inputs = []
    for pattern in dict.fromkeys(patterns):
        listing = list_images(pattern)
        _remember(pattern, listing)
        inputs.append(
            InputFile(
                uri=pattern,
                format="images",
                size=sum(listing.sizes),
                version=str(len(listing.ids)),
                digest=listing.digest,
                encoding=listing.digest,  # carried into each shard: its reader checks the listing against it
            )
        )
    return inputs


_LISTINGS: dict[tuple[str, str], Listing] = {}
_LOCK = threading.Lock()


def _remember(pattern: str, listing: Listing) -> None:
    with _LOCK:
        _LISTINGS[(pattern, listing.digest)] = listing


def _listing_of(uri: str, digest: str) -> Listing:
    """The planned listing of ``uri``: listed once per process, refused when it changed."""
    with _LOCK:
        known = _LISTINGS.get((uri, digest))
    if known is not None:
        return known
    listing = list_images(uri)
    if listing.digest != digest:
        raise SourceError(
            f"{uri}: the pictures changed since the job was planned (added, removed or rewritten); "
            "rerun to plan the new set into a new output, or restore them",
            uri,
        )
    _remember(uri, listing)
    return listing


def _read_file(uri: str) -> bytes:
    with open_binary(uri) as f:
        data: bytes = f.read()
    return data


class ImageFilesFormat:
    """Pictures as rows (see the module's docstring)."""

    name = "images"
    extensions: tuple[str, ...] = ()  # a picture is never a table's file: chosen by source.format or paths

    def plan(self, f: InputFile, shard_rows: int, max_record: int = MAX_RECORD_BYTES) -> list[Span]:
        n = int(f.version)
        return [Span(start, min(start + shard_rows, n)) for start in range(0, n, shard_rows)]

    def head_schema(self, f: InputFile) -> pa.Schema:
        return SCHEMA

    def read(
        self, shard: Shard, columns: Sequence[str], batch_rows: int, bad: BadRow, types: Mapping[str, pa.DataType]
    ) -> Iterator[pa.RecordBatch]:
        listing = _listing_of(shard.uri, _digest_of(shard))
        rows: list[int] = []
        images: list[bytes] = []
        size = 0
        for row in range(shard.start, shard.stop):
            try:
                images.append(_read_file(listing.uris[row]) if "image" in columns else b"")
            except OSError as exc:
                bad(row, f"{listing.ids[row]}: cannot read the file ({exc.strerror or exc})")
                continue
            rows.append(row)
            size += len(images[-1])
            if len(rows) >= batch_rows or size >= BATCH_BYTES:  # pictures are large: batches kept small
                yield _batch(listing, rows, images, columns)
                rows, images, size = [], [], 0
        if rows:
            yield _batch(listing, rows, images, columns)


def _batch(listing: Listing, rows: list[int], images: list[bytes], columns: Sequence[str]) -> pa.RecordBatch:
    data = {
        "id": pa.array([listing.ids[r] for r in rows], pa.string()),
        "path": pa.array([listing.uris[r] for r in rows], pa.string()),
        "image": pa.array(images, pa.binary()),
        ROW: pa.array(rows, pa.int64()),
    }
    return pa.RecordBatch.from_pydict({c: data[c] for c in [*columns, ROW] if c in data})


def _digest_of(shard: Shard) -> str:
    """The listing's hash the plan holds for the shard's input: a file's ``encoding`` slot (a line
    format's codec) carries it for a listing of pictures, which has no codec."""
    if not shard.encoding:
        raise SourceError(f"{shard.uri}: the shard carries no listing hash; plan the job again", shard.uri)
    return shard.encoding
