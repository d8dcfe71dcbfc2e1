"""The batch service's files (``/v1/files``): uploads and the batches' output and error files,
kept in ``<serve.batches>/files/`` as ``<id>.data`` beside ``<id>.json`` (the OpenAI File
object and who owns it). A file is written aside and renamed into place, so a crash never
leaves half a file under an id; a file past its ``expires_at`` is gone, as OpenAI has it."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from .validation import ApiError

__all__ = ["FileStore", "StoredFile", "link_or_copy", "new_file_id", "page", "write_json"]


@dataclass(frozen=True)
class StoredFile:
    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    owner: str | None  # the API key id that created it (None: the server has no keys)
    expires_at: int | None = None
    created_ns: int = 0  # orders files made within one second (created_at is whole seconds, as OpenAI's)

    def public(self) -> dict[str, Any]:
        """The OpenAI File object."""
        return {
            "id": self.id, "object": "file", "bytes": self.bytes, "created_at": self.created_at,
            "filename": self.filename, "purpose": self.purpose, "status": "processed",
            "expires_at": self.expires_at, "status_details": None,
        }  # fmt: skip


def write_json(path: Path, data: Any) -> None:
    """``data`` as JSON at ``path``, written aside, synced and renamed into place."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def link_or_copy(src: Path, dst: Path) -> None:
    """``dst`` as a hard link to ``src`` (no copy of a large file), a copy where links fail."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def page(items: list[dict[str, Any]], after: str | None, limit: int) -> dict[str, Any]:
    """A cursor page of ``items`` (already in order): those after the one with id ``after``."""
    if after is not None:
        ids = [i["id"] for i in items]
        if after not in ids:
            raise ApiError(400, f"after: no object with id {after!r} in this list", "invalid_request", param="after")
        items = items[ids.index(after) + 1 :]
    data = items[:limit]
    return {
        "object": "list", "data": data, "has_more": len(items) > limit,
        "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None,
    }  # fmt: skip


class FileStore:
    """Files by id, each visible to its owner only."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "files"
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._files: dict[str, StoredFile] = {}
        for meta in sorted(self.dir.glob("file-*.json")):
            if (self.dir / f"{meta.stem}.data").is_file():
                self._files[meta.stem] = StoredFile(**json.loads(meta.read_text()))

    def path(self, f: StoredFile) -> Path:
        return self.dir / f"{f.id}.data"

    def upload(
        self, src: IO[bytes], *, filename: str, purpose: str, owner: str | None, max_bytes: int,
        expires_at: int | None = None,
    ) -> StoredFile:  # fmt: skip
        """Copy ``src`` in; over ``max_bytes`` it is refused (413) and nothing is kept."""
        fid = new_file_id()
        tmp = self.dir / f".{fid}.part"
        size = 0
        try:
            with open(tmp, "wb") as out:
                while chunk := src.read(1 << 20):
                    size += len(chunk)
                    if size > max_bytes:
                        raise ApiError(
                            413, f"file: {filename} is over {max_bytes} bytes (serve.max_file_bytes); split it",
                            "invalid_request", param="file",
                        )  # fmt: skip
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            now = time.time_ns()
            stored = StoredFile(fid, size, now // 10**9, filename, purpose, owner, expires_at, now)
            return self._keep(tmp, stored)
        finally:
            tmp.unlink(missing_ok=True)

    def adopt(
        self, path: Path, *, fid: str, filename: str, purpose: str, owner: str | None, expires_at: int | None
    ) -> StoredFile:
        """A file written elsewhere (a batch's output), kept under ``fid`` (a hard link when it
        can); adopted under that id already (a restart finishing a batch): the file kept then."""
        with self._lock:
            if fid in self._files:
                return self._files[fid]
        tmp = self.dir / f".{fid}.part"
        try:
            link_or_copy(path, tmp)
            now = time.time_ns()
            stored = StoredFile(fid, tmp.stat().st_size, now // 10**9, filename, purpose, owner, expires_at, now)
            return self._keep(tmp, stored)
        finally:
            tmp.unlink(missing_ok=True)

    def _keep(self, data: Path, f: StoredFile) -> StoredFile:
        os.replace(data, self.path(f))
        write_json(self.dir / f"{f.id}.json", asdict(f))
        with self._lock:
            self._files[f.id] = f
        return f

    def get(self, fid: str, owner: str | None) -> StoredFile:
        """The file ``fid`` when ``owner`` may see it; a 404 otherwise (another key's file is not there)."""
        with self._lock:
            f = self._files.get(fid)
        if f is None or f.owner != owner or _expired(f, time.time()):
            raise ApiError(404, f"no file {fid!r}", "not_found", param="file_id")
        return f

    def owned_by(self, owner: str | None, purpose: str | None = None, ascending: bool = False) -> list[StoredFile]:
        now = time.time()
        with self._lock:
            files = [f for f in self._files.values() if f.owner == owner and not _expired(f, now)]
        files = [f for f in files if purpose is None or f.purpose == purpose]
        return sorted(files, key=lambda f: (f.created_at, f.created_ns, f.id), reverse=not ascending)

    def held_bytes(self, owner: str | None) -> int:
        return sum(f.bytes for f in self.owned_by(owner))

    def delete(self, fid: str, owner: str | None) -> None:
        self.remove([self.get(fid, owner)])

    def remove(self, files: Iterable[StoredFile]) -> None:
        for f in files:
            with self._lock:
                self._files.pop(f.id, None)
            (self.dir / f"{f.id}.json").unlink(missing_ok=True)
            self.path(f).unlink(missing_ok=True)

    def sweep(self) -> int:
        """Remove the files past their ``expires_at``; how many."""
        now = time.time()
        with self._lock:
            gone = [f for f in self._files.values() if _expired(f, now)]
        self.remove(gone)
        return len(gone)


def _expired(f: StoredFile, now: float) -> bool:
    return f.expires_at is not None and now >= f.expires_at


def new_file_id() -> str:
    return "file-" + secrets.token_hex(12)
