"""Disk full and read-only output, on real (tmpfs) filesystems mounted by the test. Where
no tmpfs can be mounted (not root, a container without the capability), the same OS errors
are injected at the write boundary (``BULKINFER_IO_ERROR``), and a warning says so: the
coverage never vanishes silently."""

from __future__ import annotations

import os
import subprocess
import textwrap
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import cli, read_output, tabular_table, write

WIDE = textwrap.dedent("""
    import numpy as np

    def wide(table):
        x = table["x1"].to_numpy()
        return {"vec": np.repeat(x[:, None], 64, axis=1).astype("float32") * np.arange(64, dtype="float32")}
""")


@dataclass
class Disk:
    """A 1 MiB filesystem (a real tmpfs), or a folder where the OS error is injected instead."""

    path: Path
    real: bool

    def run_env(self, error: str) -> dict[str, str]:
        """The environment of a run that meets ``error`` (ENOSPC on writes, EROFS on mkdir)."""
        if self.real:
            return dict(os.environ)
        point = "part-write:ENOSPC:4" if error == "ENOSPC" else "output-mkdir:EROFS"
        return {**os.environ, "BULKINFER_IO_ERROR": point}

    def grow(self) -> None:
        if self.real:
            subprocess.run(["mount", "-o", "remount,size=64M", str(self.path)], check=True)

    def read_only(self) -> None:
        if self.real:
            subprocess.run(["mount", "-o", "remount,ro", str(self.path)], check=True)


@pytest.fixture()
def tmpfs(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    no_mount = os.environ.get("BULKINFER_TEST_NO_MOUNT")  # to exercise the fallback where mounting works
    mount = ["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(mnt)]
    if no_mount or subprocess.run(mount, capture_output=True).returncode:
        warnings.warn("no tmpfs could be mounted here: the OS error is injected at the write boundary", stacklevel=1)
        yield Disk(mnt, real=False)
        return
    yield Disk(mnt, real=True)
    subprocess.run(["umount", str(mnt)], check=True)


def _job(tmp_path):
    (tmp_path / "widemodel.py").write_text(WIDE)
    write(tabular_table(8000), tmp_path / "in.parquet", row_group_size=1000)
    return [
        "-i",
        "in.parquet",
        "-m",
        "widemodel:wide",
        "--feature-columns",
        "x1",
        "--id-column",
        "id",
        "--shard-rows",
        "1000",
        "--progress",
        "none",
        "--set",
        "sink.compression='none'",
    ]


def test_disk_full_is_a_clear_error_and_a_rerun_completes(tmp_path, tmpfs):
    args = _job(tmp_path)
    disk, tmpfs = tmpfs, tmpfs.path
    full = cli("run", *args, "-o", str(tmpfs / "out"), cwd=tmp_path, env=disk.run_env("ENOSPC"))
    assert full.returncode == 1
    last = full.stderr.strip().splitlines()[-1]
    assert last.startswith(f"bulkinfer: error: {tmpfs / 'out'}") and "No space left on device" in last, full.stderr
    assert "Traceback" not in full.stderr
    visible = [p for p in (tmpfs / "out").iterdir() if p.name.startswith("part-")]
    assert 0 < len(visible) < 8
    read_output(tmpfs / "out")  # what is visible is whole
    disk.grow()
    cli("run", *args, "-o", str(tmpfs / "out"), cwd=tmp_path, check=True)
    cli("run", *args, "-o", "clean", cwd=tmp_path, check=True)
    got, clean = read_output(tmpfs / "out"), read_output(tmp_path / "clean")
    assert got["id"].to_pylist() == list(range(8000)) and got.equals(clean)


def test_read_only_output_is_a_clear_error(tmp_path, tmpfs):
    disk, tmpfs = tmpfs, tmpfs.path
    disk.read_only()
    proc = cli("run", *_job(tmp_path), "-o", str(tmpfs / "out"), cwd=tmp_path, env=disk.run_env("EROFS"))
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        f"bulkinfer: error: {tmpfs / 'out'}: cannot create the output directory (Read-only file system)"
    )
