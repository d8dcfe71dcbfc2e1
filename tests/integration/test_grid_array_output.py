"""The array output of a grid job (``sink.format = "zarr"``), with the docs' example: every
region written once, equal to the whole-grid answer, with the input's coordinates and
attributes; after a SIGKILL while regions are written or at a commit, the rerun's store equals a
clean run's, array for array."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from helpers import BULKINFER

xr = pytest.importorskip("xarray", reason="the science extra (xarray, zarr, netCDF4) is not installed")

from test_grid_tiles import HALO, T, X, Y, _conv, _field, _whole  # noqa: E402

SCIENCE = Path(__file__).resolve().parents[2] / "docs" / "science.md"


def _example(tmp_path: Path) -> Path:
    """The docs' grid job over this test's store and model (tiles of 16, the 5 × 5 model's halo)."""
    job = re.search(r"<!-- grid-example -->\n```toml\n(.*?)```", SCIENCE.read_text(), re.S).group(1)
    job = (job.replace("era5.zarr", "field.zarr").replace("y = 256, x = 256", "y = 16, x = 16")
           .replace("y = 16, x = 16 }      # the model", f"y = {HALO}, x = {HALO} }}      # the model")
           .replace("downscale.onnx", "conv.onnx").replace("shard_rows = 64", "shard_rows = 5"))  # fmt: skip
    assert f"halo = {{ y = {HALO}, x = {HALO} }}" in job and "tile = { time = 1, y = 16, x = 16 }" in job
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "job.toml").write_text(job + '\n[execution]\nprogress = "none"\n')
    _field().to_zarr(tmp_path / "field.zarr")
    _conv(tmp_path / "conv.onnx", 16 + 2 * HALO)
    return tmp_path


def _run(cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([*BULKINFER, "run", "job.toml"], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})})  # fmt: skip


def test_the_docs_grid_job_writes_every_region_once_with_the_inputs_coordinates(tmp_path):
    cwd = _example(tmp_path)
    proc = _run(cwd)
    assert proc.returncode == 0, proc.stderr
    out = xr.open_zarr(cwd / "corrected" / "array.zarr")
    field = _field()
    assert out["corrected"].dims == ("corrected_0", "time", "y", "x")
    assert out["corrected"].shape == (1, T, Y, X)
    assert out["corrected"].encoding["chunks"] == (1, 1, 16, 16)
    assert np.abs(out["corrected"].values[0] - _whole(field, "reflect")).max() <= 1e-5
    np.testing.assert_array_equal(out["y"].values, field["y"].values)
    np.testing.assert_array_equal(out["x"].values, field["x"].values)
    assert out.attrs["title"] == "a smooth field" and out.attrs["bulkinfer_model"].endswith("conv.onnx")
    success = json.loads((cwd / "corrected" / "_SUCCESS").read_text())
    assert success["array"] == "array.zarr" and success["rows"] == T * 3 * 4
    parts = sorted((cwd / "corrected").glob("part-*.parquet"))
    import pyarrow.parquet as pq

    rows = pq.read_table(parts)
    assert "corrected" not in rows.column_names and sorted(rows["tile_index"].to_pylist()) == list(range(T * 12))


@pytest.mark.parametrize("point", ["exported:3", "part-renamed:2", "success-temp-written"])
def test_a_killed_grid_job_ends_with_the_clean_runs_arrays(tmp_path, point):
    clean = _example(tmp_path / "clean")
    assert _run(clean).returncode == 0
    killed = _example(tmp_path / "killed")
    proc = _run(killed, {"BULKINFER_CRASH_AT": point})
    assert proc.returncode == -9, proc.stderr
    proc = _run(killed)
    assert proc.returncode == 0, proc.stderr
    a = xr.open_zarr(clean / "corrected" / "array.zarr")
    b = xr.open_zarr(killed / "corrected" / "array.zarr")
    np.testing.assert_array_equal(a["corrected"].values, b["corrected"].values)
    assert not np.isnan(b["corrected"].values).any()  # every region written


def test_another_tiling_over_the_same_output_is_one_line_and_keeps_the_array(tmp_path):
    cwd = _example(tmp_path)
    assert _run(cwd).returncode == 0
    before = xr.open_zarr(cwd / "corrected" / "array.zarr")["corrected"].values
    (cwd / "job.toml").write_text((cwd / "job.toml").read_text().replace("y = 16, x = 16 }", "y = 8, x = 8 }"))
    proc = _run(cwd)
    assert proc.returncode == 1, proc.stderr
    assert "source.tile" in proc.stderr.splitlines()[-1] and "Traceback" not in proc.stderr, proc.stderr
    after = xr.open_zarr(cwd / "corrected" / "array.zarr")
    assert after["corrected"].encoding["chunks"] == (1, 1, 16, 16)
    np.testing.assert_array_equal(after["corrected"].values, before)
