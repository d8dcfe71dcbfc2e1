"""Folder export (``kind = "folder"``): each committed part's rows written to another
folder or object-store prefix under the part's own name, atomically (a folder: temporary
file and rename; an object store: one PUT). Writing the same part again replaces it with
the same rows, so a replay changes nothing. Used mostly as a route's target."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from .files import EXTENSIONS, serialize, write_bytes

if TYPE_CHECKING:
    from ..config import FolderExport
    from ..plan import JobPlan
    from .objects import ObjectStore

__all__ = ["FolderTarget"]


class FolderTarget:
    def __init__(self, spec: FolderExport, where: str) -> None:
        from ..core.errors import ConfigError
        from ..core.storage import is_remote

        if not spec.path:
            raise ConfigError(f"{where}.path: no folder given")
        self.spec = spec
        self.where = where
        self.name = f"{where} (folder {spec.path})"
        self.remote = is_remote(spec.path)
        self.store: ObjectStore | None = None

    def start(self, plan: JobPlan, kept: Sequence[str]) -> None:
        if self.remote:
            from .objects import ObjectStore

            self.store = ObjectStore(self.spec.path, self.spec.storage_options)
            self.store.check_writable()
        else:
            from ..core.errors import OutputError

            folder = Path(self.spec.path.removeprefix("file://")).expanduser()
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise OutputError(f"{self.name}: cannot create it ({exc.strerror or exc})") from exc

    def write(self, part: str, table: pa.Table) -> None:
        if not table.num_rows:
            return
        name = _base(part) + EXTENSIONS[self.spec.format]
        data = serialize(table, self.spec.format, "zstd")
        if self.store is not None:
            self.store.put(name, data)
        else:
            folder = Path(self.spec.path.removeprefix("file://")).expanduser()
            write_bytes(folder, name, data, table.num_rows, crash_at=None, what=f"{self.where}'s part")

    def complete(self) -> None:
        """Nothing: every part is in place when written."""

    def close(self) -> None:
        """Nothing held."""


def _base(part: str) -> str:
    """``part-00003`` of ``part-00003.parquet`` (an export names a part with its output extension)."""
    for ext in EXTENSIONS.values():
        if part.endswith(ext):
            return part.removesuffix(ext)
    return part
