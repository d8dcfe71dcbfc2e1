"""Gridded arrays: a Zarr store and a NetCDF file of a smooth two-variable field, cut into tiles
with a halo equal to a 5 × 5 convolution's reach, give the same answer as the model run on the
whole grid at once (≤ 1e-5); without the halo the tile edges differ; bad tilings are one line."""

from __future__ import annotations

import numpy as np
import onnx
import pyarrow.parquet as pq
import pytest
from onnx import TensorProto, helper, numpy_helper

from bulkinfer import ConfigError, run_job

from helpers import job_config

xr = pytest.importorskip("xarray", reason="the science extra (xarray, zarr, netCDF4) is not installed")

T, Y, X, HALO = 3, 40, 52, 2
KERNEL = np.random.default_rng(5).normal(size=(1, 2, 5, 5)).astype(np.float32)


def _field() -> xr.Dataset:
    t, y, x = np.meshgrid(np.arange(T), np.linspace(0, 3, Y), np.linspace(0, 4, X), indexing="ij")
    return xr.Dataset(
        {"t2m": (("time", "y", "x"), (np.sin(x + t) * np.cos(y)).astype(np.float32), {"units": "K"}),
         "u10": (("time", "y", "x"), (x * y / 10 + t).astype(np.float32))},
        coords={"time": np.arange(T), "y": np.linspace(50.0, 40.0, Y), "x": np.linspace(-5.0, 8.0, X)},
        attrs={"title": "a smooth field"},
    )  # fmt: skip


def _conv(path, side: int) -> None:
    """A 5 × 5 convolution over both variables (zero padding inside: same size out)."""
    grid = helper.make_tensor_value_info("grid", TensorProto.FLOAT, ["N", 2, side, side])
    out = helper.make_tensor_value_info("corrected", TensorProto.FLOAT, ["N", 1, side, side])
    node = helper.make_node("Conv", ["grid", "K"], ["corrected"], pads=[2, 2, 2, 2])
    graph = helper.make_graph([node], "conv", [grid], [out], [numpy_helper.from_array(KERNEL, "K")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def _whole(ds: xr.Dataset, pad: str) -> np.ndarray:
    """The model's reference answer: the whole grid padded by the halo as the tiles are, one call."""
    import onnxruntime as ort

    stacked = np.stack([ds["t2m"].values, ds["u10"].values], axis=1)  # (time, 2, y, x)
    padded = np.pad(stacked, ((0, 0), (0, 0), (HALO, HALO), (HALO, HALO)), mode=pad)
    g = helper.make_tensor_value_info("grid", TensorProto.FLOAT, ["N", 2, None, None])
    o = helper.make_tensor_value_info("corrected", TensorProto.FLOAT, ["N", 1, None, None])
    graph = helper.make_graph([helper.make_node("Conv", ["grid", "K"], ["corrected"], pads=[2, 2, 2, 2])], "whole",
                              [g], [o], [numpy_helper.from_array(KERNEL, "K")])  # fmt: skip
    session = ort.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return session.run(None, {"grid": padded})[0][:, 0, HALO:-HALO, HALO:-HALO]


def _assembled(out) -> np.ndarray:
    table = pq.read_table(out)
    grid = np.full((T, Y, X), np.nan, np.float32)
    tiles = table["corrected"].combine_chunks().to_numpy_ndarray()
    for i, row in enumerate(table.select(["tile_index", "time_start", "y_start", "y_stop", "x_start", "x_stop"]).to_pylist()):
        h, w = row["y_stop"] - row["y_start"], row["x_stop"] - row["x_start"]
        grid[row["time_start"], row["y_start"] : row["y_stop"], row["x_start"] : row["x_stop"]] = tiles[i, 0, :h, :w]
    return grid


def _job(tmp_path, store, halo: int, **extra):
    _conv(tmp_path / "conv.onnx", 16 + 2 * halo)
    return job_config(tmp_path / f"out{halo}", [store], **{
        "model.name": str(tmp_path / "conv.onnx"), "model.options": {"inputs": {"grid": "tile"}},
        "source.variables": ["t2m", "u10"], "source.tile": {"time": 1, "y": 16, "x": 16},
        "source.halo": {"y": halo, "x": halo} if halo else None, "source.shard_rows": 5,
        "source.id_column": "tile_index", **extra})  # fmt: skip


@pytest.mark.parametrize("kind", ["zarr", "netcdf"])
def test_tiles_with_a_halo_equal_the_whole_grid_and_without_differ_at_edges(tmp_path, kind):
    ds = _field()
    store = tmp_path / ("field.zarr" if kind == "zarr" else "field.nc")
    ds.to_zarr(store) if kind == "zarr" else ds.to_netcdf(store)
    result = run_job(_job(tmp_path, store, HALO))
    assert result.report["rows_out"] == T * 3 * 4  # 40 / 16 and 52 / 16, rounded up: 3 × 4 tiles a time step
    got, expected = _assembled(tmp_path / f"out{HALO}"), _whole(ds, "reflect")
    assert np.abs(got - expected).max() <= 1e-5
    run_job(_job(tmp_path, store, 0))
    bare = np.abs(_assembled(tmp_path / "out0") - expected)
    assert bare[:, 16, :].max() > 1e-3  # a tile's first row: its neighbours above were not there
    assert bare[:, 5:11, 5:11].max() <= 1e-5  # far from any tile edge: the same


def test_edge_and_constant_padding_are_what_numpy_pads(tmp_path):
    ds = _field()
    ds.to_zarr(tmp_path / "field.zarr")
    for pad in ("edge", "constant"):
        cfg = _job(tmp_path, tmp_path / "field.zarr", HALO, **{"source.pad": pad, "sink.path": str(tmp_path / pad)})
        run_job(cfg)
        expected = _whole(ds, pad)
        assert np.abs(_assembled(tmp_path / pad) - expected).max() <= 1e-5


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"source.variables": ["t2m", "v10"]}, r"^source.variables: .*field.zarr has no variable 'v10'; it has t2m, u10$"),
        ({"source.tile": {"lat": 8}}, r"^source.tile: .*field.zarr's variables have no dimension 'lat'; they have time, y, x$"),
        ({"source.halo": {"y": 20, "x": 2}}, r"^source.halo: y = 20 is wider than its tile \(16\); tile y by at least 20$"),
    ],
)
def test_a_tiling_the_store_cannot_take_is_one_line_before_any_row(tmp_path, extra, says):
    _field().to_zarr(tmp_path / "field.zarr")
    with pytest.raises(ConfigError, match=says):
        run_job(_job(tmp_path, tmp_path / "field.zarr", HALO, **extra))
    assert not (tmp_path / f"out{HALO}" / "_bulkinfer" / "commits.log").exists() or not (
        tmp_path / f"out{HALO}" / "_bulkinfer" / "commits.log").read_text()  # fmt: skip


@pytest.mark.parametrize("policy", ["run", "error"])
def test_a_tile_of_nan_runs_or_is_an_error_row_as_configured(tmp_path, policy):
    import json

    ds = _field()
    ds["t2m"][1, 16:32, 16:32] = np.nan  # tile 1 of time step 1 (its own cells), both variables
    ds["u10"][1, 16:32, 16:32] = np.nan
    ds.to_zarr(tmp_path / "field.zarr")
    result = run_job(_job(tmp_path, tmp_path / "field.zarr", HALO, **{"source.nan_tiles": policy}))
    nan_tile = 12 + 1 * 4 + 1  # time 1, y tile 1, x tile 1
    table = pq.read_table(tmp_path / f"out{HALO}")
    if policy == "run":
        assert result.report["rows_out"] == T * 12 and result.report["rows_failed"] == 0
        row = table.filter(table["tile_index"].to_numpy() == nan_tile)  # the model's answer: NaN where its cells are
        assert np.isnan(row["corrected"].combine_chunks().to_numpy_ndarray()).any()
        return
    assert result.report["rows_out"] == T * 12 - 1 and result.report["rows_failed"] == 1
    assert nan_tile not in table["tile_index"].to_pylist()
    errors = [json.loads(line) for p in (tmp_path / f"out{HALO}" / "_errors").glob("part-*") for line in p.read_text().splitlines()]
    assert [e["row"] for e in errors] == [nan_tile]  # a tile's row is its tile_index
    assert errors[0]["message"] == f'tile {nan_tile} (time 1..2, y 16..32, x 16..32) holds only NaN (source.nan_tiles = "error")'
