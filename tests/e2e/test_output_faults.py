"""Disk full and read-only output, on real (tmpfs) filesystems mounted by the test."""

from __future__ import annotations

import subprocess
import textwrap

import pytest

from helpers import cli, read_output, tabular_table, write

WIDE = textwrap.dedent("""
    import numpy as np

    def wide(table):
        x = table["x1"].to_numpy()
        return {"vec": np.repeat(x[:, None], 64, axis=1).astype("float32") * np.arange(64, dtype="float32")}
""")


@pytest.fixture()
def tmpfs(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("needs root to mount a tmpfs")
    yield mnt
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
    full = cli("run", *args, "-o", str(tmpfs / "out"), cwd=tmp_path)
    assert full.returncode == 1
    last = full.stderr.strip().splitlines()[-1]
    assert last.startswith(f"bulkinfer: error: {tmpfs / 'out'}") and "No space left on device" in last, full.stderr
    assert "Traceback" not in full.stderr
    visible = [p for p in (tmpfs / "out").iterdir() if p.name.startswith("part-")]
    assert 0 < len(visible) < 8
    read_output(tmpfs / "out")  # what is visible is whole
    subprocess.run(["mount", "-o", "remount,size=64M", str(tmpfs)], check=True)
    cli("run", *args, "-o", str(tmpfs / "out"), cwd=tmp_path, check=True)
    cli("run", *args, "-o", "clean", cwd=tmp_path, check=True)
    got, clean = read_output(tmpfs / "out"), read_output(tmp_path / "clean")
    assert got["id"].to_pylist() == list(range(8000)) and got.equals(clean)


def test_read_only_output_is_a_clear_error(tmp_path, tmpfs):
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    proc = cli("run", *_job(tmp_path), "-o", str(tmpfs / "out"), cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        f"bulkinfer: error: {tmpfs / 'out'}: cannot create the output directory (Read-only file system)"
    )
