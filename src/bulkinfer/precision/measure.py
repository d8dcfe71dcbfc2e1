"""How fast a model runs in one process and in several, measured on a sample of the job's
rows: ``bulkinfer tune`` for models precisions do not apply to (tabular, custom). A model
that uses one core however many there are (a scikit-learn estimator without ``n_jobs``, a
Python loop) runs faster as one process per core (the Ray backend with ``num_cpus = 1``);
one that already uses every core does not. Both are measured, never assumed."""

from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..adapters import SetupContext, build_adapter, predict_table

if TYPE_CHECKING:
    from ..adapters import ResolvedModel
    from ..config import JobConfig

__all__ = ["Throughput", "measure"]


@dataclass(frozen=True)
class Throughput:
    processes: int
    rows_per_s: float
    cpu_per_wall: float
    """CPU seconds per wall second over the timed calls: ~1 for a model that uses one core."""


def _timed(adapter: Any, sample: pa.Table, batch_size: int, seconds: float) -> tuple[int, float, float]:
    """Rows predicted, wall seconds and CPU seconds (every thread of this process) over calls
    on ``sample`` repeated until ``seconds`` have passed (once at least)."""
    rows, t0, c0 = 0, time.perf_counter(), time.process_time()
    while True:
        predict_table(adapter, sample, batch_size)
        rows += sample.num_rows
        if time.perf_counter() - t0 >= seconds:
            return rows, time.perf_counter() - t0, time.process_time() - c0


def _ready(cfg: JobConfig, model: ResolvedModel, sample: pa.Table, batch_size: int, threads: int) -> Any:
    """The model's adapter set up with ``threads`` and warmed up on one call."""
    adapter = build_adapter(cfg, model)
    adapter.setup(SetupContext(threads=threads))
    predict_table(adapter, sample.slice(0, batch_size), batch_size)
    return adapter


def _worker(cfg: dict[str, Any], model: tuple[str, str, str], sample: bytes, batch_size: int, seconds: float,
            start: Any, results: Any) -> None:  # fmt: skip
    """One process of a parallel measurement: set up with one thread, wait for the others, time."""
    from ..adapters import ResolvedModel
    from ..config import JobConfig

    table = pa.ipc.open_stream(sample).read_all()
    adapter = _ready(JobConfig.model_validate(cfg), ResolvedModel(*model), table, batch_size, threads=1)
    start.wait()
    results.put(_timed(adapter, table, batch_size, seconds))
    adapter.close()


def measure(
    cfg: JobConfig, model: ResolvedModel, sample: pa.Table, batch_size: int, processes: int, seconds: float = 1.0
) -> Throughput:
    """Rows/s of ``processes`` processes running the model on ``sample`` at once (one thread
    each; with 1, this process with every CPU it may use), after each set up and warmed up."""
    if processes == 1:
        from ..core.hardware import available_cpus

        adapter = _ready(cfg, model, sample, batch_size, threads=cfg.runtime.threads or available_cpus())
        try:
            rows, wall, cpu = _timed(adapter, sample, batch_size, seconds)
        finally:
            adapter.close()
        return Throughput(1, round(rows / wall, 1), round(cpu / wall, 2))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, sample.schema) as writer:
        writer.write_table(sample)
    ctx = mp.get_context("spawn")  # a clean interpreter: no threads or locks inherited from this one
    start, results = ctx.Barrier(processes), ctx.Queue()
    args = (cfg.model_dump(mode="json"), (model.kind, model.location, model.digest), sink.getvalue().to_pybytes(),
            batch_size, seconds, start, results)  # fmt: skip
    procs = [ctx.Process(target=_worker, args=args, daemon=True) for _ in range(processes)]
    for p in procs:
        p.start()
    try:
        timings = [results.get(timeout=300) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    rate = sum(rows / wall for rows, wall, _cpu in timings)
    return Throughput(processes, round(rate, 1), round(sum(cpu / wall for _r, wall, cpu in timings), 2))
