"""A gridded correction, side by side, one run: V variables over T × S × S float32 cells (default
4 × 8 × 2048 × 2048) in a Zarr store, a small CNN (a 5 × 5 convolution, V channels in and out)
with a 16-cell halo, the answer written to Zarr.

Usage: .venv/bin/python bench/bench_grid.py [S] [--times T] [--scale F]

The anchor is the pattern a scientist writes: ``xarray.open_zarr`` (dask chunks of one time step
× 256 × 256), the variables stacked, ``dask.array.map_overlap`` with a depth of 16 and the edge
value repeated beyond the grid (dask's ``nearest``; bulkinfer's ``pad = "edge"``) calling the
same ONNX Runtime session on each block, ``to_zarr``. bulkinfer runs the
same model with ``source.tile`` / ``source.halo`` and ``sink.format = "zarr"`` (sharded,
resumable, each region exactly once). Both run as child processes; the figures are cells/s end to
end (read, infer, write) and peak resident memory, for T and for ``--scale`` times T time steps
(default 4: memory flat means the two peaks differ by little). Each side's output is checked
against the other's (max abs difference).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from bench_tabular import run_child, run_job_file

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "bench" / "_work" / "grid"
HALO, TILE = 16, 256

ANCHOR = r"""
import sys, time
import dask, dask.array as da, numpy as np, onnxruntime as ort, xarray as xr
store, model, out = sys.argv[1], sys.argv[2], sys.argv[3]
so = ort.SessionOptions(); so.intra_op_num_threads = 1
session = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
t0 = time.perf_counter()
ds = xr.open_zarr(store)
names = sorted(ds.data_vars)
stack = da.stack([ds[v].data for v in names], axis=1)  # (time, V, y, x), chunks (1, 1, 256, 256) per variable
stack = stack.rechunk((1, len(names), 256, 256))
def run(block):
    return session.run(None, {"grid": np.ascontiguousarray(block, np.float32)})[0]
result = da.map_overlap(run, stack, depth={2: 16, 3: 16}, boundary="nearest", trim=True, dtype=np.float32)
xr.Dataset({"corrected": (("time", "channel", "y", "x"), result)}).to_zarr(out, mode="w")
cells = ds.sizes["time"] * ds.sizes["y"] * ds.sizes["x"]
print(f"cells_per_s={cells / (time.perf_counter() - t0):.1f}")
"""


def store_path(side: int, times: int, variables: int = 4) -> Path:
    return WORK / f"grid_{variables}x{times}x{side}.zarr"


def make_store(side: int, times: int, variables: int = 4) -> Path:
    import numpy as np
    import xarray as xr

    store = store_path(side, times, variables)
    if store.exists():
        return store
    axis = np.linspace(0, 1, side, dtype=np.float32)
    y, x = np.meshgrid(axis * 6, axis * 8, indexing="ij")
    data = {f"v{i}": (("time", "y", "x"), np.stack([np.sin(x * (i + 1) + t) * np.cos(y) for t in range(times)]))
            for i in range(variables)}  # fmt: skip
    xr.Dataset(data, coords={"time": np.arange(times)}).chunk({"time": 1, "y": TILE, "x": TILE}).to_zarr(store)
    return store


def make_model(variables: int = 4) -> Path:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    path = WORK / "cnn.onnx"
    grid = helper.make_tensor_value_info("grid", TensorProto.FLOAT, ["N", variables, None, None])
    out = helper.make_tensor_value_info("corrected", TensorProto.FLOAT, ["N", variables, None, None])
    kernel = np.random.default_rng(1).normal(0, 0.05, (variables, variables, 5, 5)).astype(np.float32)
    node = helper.make_node("Conv", ["grid", "K"], ["corrected"], pads=[2, 2, 2, 2])
    graph = helper.make_graph([node], "cnn", [grid], [out], [numpy_helper.from_array(kernel, "K")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _in_child(*args: str) -> str:
    """This script run again in a child process for ``args`` (a store made, outputs compared): the
    parent stays small, and a child's peak memory (ru_maxrss, which a fork inherits) is its own."""
    return run_child([sys.executable, __file__, *args])[0]


def one_size(side: int, times: int, script: Path, model: Path) -> dict[str, float]:
    store = Path(_in_child("--store", str(side), str(times)).strip())
    anchor_out = WORK / "anchor_out.zarr"
    shutil.rmtree(anchor_out, ignore_errors=True)
    out, anchor_rss = run_child([sys.executable, str(script), str(store), str(model), str(anchor_out)])
    report, rss, wall = _ours(store, model, HALO)
    return {"anchor": float(out.split("cells_per_s=")[1]), "anchor_mib": anchor_rss,
            "ours": times * side * side / report["run_s"], "ours_mib": rss, "wall": wall,
            "diff": float(_in_child("--difference", str(anchor_out), str(WORK / "bulkinfer_out" / "array.zarr")))}


def _ours(store: Path, model: Path, halo: int) -> tuple[dict, float, float]:
    dest = WORK / "bulkinfer_out"
    job = (f'[source]\npaths = ["{store}"]\ntile = {{ time = 1, y = {TILE}, x = {TILE} }}\n'
           + (f'halo = {{ y = {halo}, x = {halo} }}\n' if halo else "") + 'pad = "edge"\nshard_rows = 16\n'
           f'[model]\nname = "{model}"\noptions = {{ inputs = {{ grid = "tile" }} }}\n'
           f'[sink]\npath = "{dest}"\nformat = "zarr"\n')  # fmt: skip
    return run_job_file(WORK / "grid.toml", job, dest)


def without_halo(side: int, times: int, model: Path) -> tuple[float, float]:
    """The answer without a halo against the anchor's (the last run's): the largest difference
    on the cells along tile edges, and elsewhere."""
    _ours(store_path(side, times), model, 0)
    edge, inside = _in_child("--edges", str(side)).split()
    return float(edge), float(inside)


def _edges(side: int) -> tuple[float, float]:
    import numpy as np
    import xarray as xr

    a = xr.open_zarr(WORK / "anchor_out.zarr")["corrected"].values
    b = np.moveaxis(xr.open_zarr(WORK / "bulkinfer_out" / "array.zarr")["corrected"].values, 0, 1)
    edge = np.zeros(a.shape[-2:], bool)
    for k in [*range(0, side, TILE), side]:  # each tile's first and last cells, the grid's end included
        edge[max(k - 2, 0) : k + 2, :] = edge[:, max(k - 2, 0) : k + 2] = True
    diff = np.abs(a - b)
    return float(diff[..., edge].max()), float(diff[..., ~edge].max())


def _difference(anchor: Path, ours: Path) -> float:
    import numpy as np
    import xarray as xr

    a = xr.open_zarr(anchor)["corrected"].values  # (time, channel, y, x)
    b = xr.open_zarr(ours)["corrected"].values  # (channel, time, y, x)
    return float(np.abs(a - np.moveaxis(b, 0, 1)).max())


def main() -> None:
    from machine import describe  # bench/ is on the path of a script run from it

    if "--store" in sys.argv:  # a child's work (see _in_child)
        at = sys.argv.index("--store")
        print(make_store(int(sys.argv[at + 1]), int(sys.argv[at + 2])))
        return
    if "--difference" in sys.argv:
        at = sys.argv.index("--difference")
        print(_difference(Path(sys.argv[at + 1]), Path(sys.argv[at + 2])))
        return
    if "--edges" in sys.argv:
        print(*_edges(int(sys.argv[sys.argv.index("--edges") + 1])))
        return
    print(describe())
    side = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 2048
    times = int(sys.argv[sys.argv.index("--times") + 1]) if "--times" in sys.argv else 8
    scale = int(sys.argv[sys.argv.index("--scale") + 1]) if "--scale" in sys.argv else 4
    WORK.mkdir(parents=True, exist_ok=True)
    script = WORK / "anchor_grid.py"
    script.write_text(ANCHOR)
    model = make_model()
    sizes = {t: one_size(side, t, script, model) for t in (times, times * scale)}
    for t, f in sizes.items():
        print(f"4 x {t} x {side} x {side}: xarray + dask map_overlap {f['anchor'] / 1e6:.2f} Mcells/s, "
              f"peak {f['anchor_mib']:.0f} MiB; bulkinfer {f['ours'] / 1e6:.2f} Mcells/s (wall {f['wall']:.0f} s), "
              f"peak {f['ours_mib']:.0f} MiB; ratio {f['ours'] / f['anchor']:.2f}x; "
              f"max abs difference {f['diff']:.2e}")  # fmt: skip
    edge, inside = without_halo(side, times * scale, model)  # the last anchor run was over this grid
    print(f"without the halo: max abs difference {edge:.2e} on the cells within 2 of a tile edge, "
          f"{inside:.2e} elsewhere")
    a, b = sizes[times], sizes[times * scale]
    print(f"peak memory {times} -> {times * scale} time steps: "
          f"bulkinfer {a['ours_mib']:.0f} -> {b['ours_mib']:.0f} MiB "
          f"({b['ours_mib'] / a['ours_mib']:.2f}x); map_overlap {a['anchor_mib']:.0f} -> {b['anchor_mib']:.0f} MiB "
          f"({b['anchor_mib'] / a['anchor_mib']:.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
