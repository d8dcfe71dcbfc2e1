"""Partial int8 through the quality gate, on a tiny random-weight BERT in sentence-transformers
layout built here (MiniLM's tokenizer, 2 layers of width 32: builds take a moment, so the
whole search runs): when full int8 fails the floor, the fewest most-sensitive blocks stay in
fp32 and the job runs; the choice is cached and the next job uses it without searching;
when only fp32 would pass, the job is refused with every build tried."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bulkinfer import QualityGateError, load_config, run_job
from bulkinfer.engines.int8 import OUTLIERS

from helpers import make_catalog, read_output, write


@pytest.fixture(scope="module")
def tiny_job(tmp_path_factory, tiny):
    d = tmp_path_factory.mktemp("tiny-job")
    model = tiny
    write(make_catalog(120, seed=4), d / "in.parquet")
    return d, model


def run(tiny_job, out, **extra):
    d, model = tiny_job
    cfg = load_config(overrides={
        "source.paths": [str(d / "in.parquet")], "model.name": str(model), "model.text_column": "description",
        "source.id_column": "id", "sink.path": str(d / out), "runtime.precision": "int8",
        "runtime.cache_dir": str(d / "cache"), "runtime.quality_sample_rows": 64, "execution.progress": "none",
        **extra,
    })  # fmt: skip
    return run_job(cfg)


def test_the_search_keeps_the_fewest_blocks_in_fp32_and_the_next_job_reuses_them(tiny_job):
    full = run(tiny_job, "full", **{"runtime.quality_floor": -1.0}).report["quality"]["mean_cosine"]
    floor = round(full + (1 - full) / 2, 6)  # halfway from full int8 to fp32
    first = run(tiny_job, "first", **{"runtime.quality_floor": floor})
    q = first.report["quality"]
    keep = q["int8_fp32_groups"]
    assert q["passed"] and q["mean_cosine"] >= floor and q["full_int8_mean_cosine"] == full
    # first the feed-forward blocks' outlier channels (unless they score no closer than full int8
    # on this machine's kernels: then dropped), then the most sensitive blocks
    dropped = q.get("int8_search_dropped", [])
    assert q["int8_search"][0]["groups"] == [OUTLIERS]
    assert (dropped == [OUTLIERS]) == (q["int8_search"][0]["mean_cosine"] <= full)
    blocks = [g for g in keep if g != OUTLIERS]
    assert (keep[0] == OUTLIERS) != bool(dropped) and 1 <= len(keep) < 7 and set(blocks) <= set(q["sensitivity"])
    order = sorted(q["sensitivity"], key=lambda g: -q["sensitivity"][g])
    assert blocks == order[: len(blocks)]
    fewer = [s for s in q["int8_search"] if s["fp32_groups"] < len(keep)]
    assert not any(s["passed"] for s in fewer)  # no smaller set passed (full int8 did not: full < floor)
    assert first.report["rows_out"] == 120
    second = run(tiny_job, "second", **{"runtime.quality_floor": floor})  # cached: no search
    assert "int8_search" not in second.report["quality"] and second.report["quality"]["passed"]
    assert second.report["quality"]["int8_fp32_groups"] == keep
    a, b = read_output(tiny_job[0] / "first").sort_by("id"), read_output(tiny_job[0] / "second").sort_by("id")
    assert a["embedding"].to_pylist() == b["embedding"].to_pylist()  # the same blocks kept in fp32


def test_int8_that_only_fp32_would_fix_is_refused_with_every_build_tried(tiny_job):
    with pytest.raises(QualityGateError) as err:
        run(tiny_job, "strict", **{"runtime.quality_floor": 0.99999999})
    msg = str(err.value)
    assert "even with its most sensitive parts kept in fp32" in msg and "floor 0.99999999" in msg
    steps = err.value.figures["int8_search"]
    # the outlier channels and 6 blocks: 7 groups, of which at most 6 in fp32 (the channels
    # dropped: 6 blocks, at most 5)
    counts = [1, 1, 2, 4, 5] if err.value.figures.get("int8_search_dropped") else [1, 2, 4, 6]
    assert [s["fp32_groups"] for s in steps] == counts and not any(s["passed"] for s in steps)
    assert "outlier channels in fp32: " in msg and "blocks in fp32: " in msg
    assert not list((tiny_job[0] / "strict").glob("part-*"))  # nothing written


def test_outlier_channels_that_buy_nothing_are_dropped_and_the_blocks_searched_alone(tiny_job, tmp_path, monkeypatch):
    """Where the outlier split scores no closer to fp32 than full int8 (measured on a real AVX2
    core for this tiny model), the search drops it: the blocks, ranked again with every channel
    in int8, are searched alone. Forced here: full int8 is taken to have scored 1.0."""
    from bulkinfer.engines import int8

    real = int8.search
    monkeypatch.setattr(int8, "search", lambda order, score, floor, baseline=None, without_first=None: real(
        order, score, floor, None if baseline is None else 1.0, without_first))  # fmt: skip
    from bulkinfer.precision import gate

    full = run(tiny_job, "full-2", **{"runtime.quality_floor": -1.0}).report["quality"]["mean_cosine"]
    floor = round(full + (1 - full) / 2, 6)
    fp32_passes = []  # the fp32 reference runs once: the search reuses the failed gate's
    real_run = gate.run_adapter
    monkeypatch.setattr(gate, "run_adapter", lambda *a, **k: fp32_passes.append(1) or real_run(*a, **k))
    got = run(tiny_job, "blocks", **{"runtime.quality_floor": floor, "runtime.cache_dir": str(tmp_path / "cache")})
    assert len(fp32_passes) == 1
    q = got.report["quality"]
    assert q["passed"] and q["mean_cosine"] >= floor and q["int8_search_dropped"] == [OUTLIERS]
    steps = q["int8_search"]
    assert steps[0]["groups"] == [OUTLIERS] and all(OUTLIERS not in s["groups"] for s in steps[1:])
    order = sorted(q["sensitivity"], key=lambda g: -q["sensitivity"][g])
    keep = q["int8_fp32_groups"]
    assert OUTLIERS not in keep and keep == order[: len(keep)] and steps[-1]["seconds"] > 0
    assert not any(s["passed"] for s in steps if len(s["groups"]) < len(keep) and OUTLIERS not in s["groups"])
    assert got.report["rows_out"] == 120 and got.report["reuse"]["rows_from_gate"] == 64
    # a fresh cache: the set-up's export and int8 build are reported, though the search reloaded the engine since
    assert {"export_s", "build_s"} <= set(got.report["setup_split"])


def test_tune_measures_the_partial_int8_and_precision_auto_runs_the_fastest_that_passed(tiny_job, caplog):
    """tune's int8 candidate is the partial int8 the gate's search finds (the blocks it keeps
    in fp32 named); precision = "auto" then runs the fastest candidate that passed."""
    import logging

    from bulkinfer.core.hardware import emulated
    from bulkinfer.precision.tune import PRECISIONS, results_path, tune

    d, model = tiny_job
    base = {
        "source.paths": [str(d / "in.parquet")],
        "model.name": str(model),
        "model.text_column": "description",
        "source.id_column": "id",
        "runtime.cache_dir": str(d / "cache-tune"),
        "execution.progress": "none",
    }
    full = run(tiny_job, "full-tune", **{"runtime.quality_floor": -1.0}).report["quality"]["mean_cosine"]
    floor = round(full + (1 - full) / 2, 6)
    cfg = load_config(overrides={**base, "runtime.quality_floor": floor})
    result = tune(cfg, 64, (16,), precisions=(("onnxruntime", "fp32"), ("onnxruntime", "int8")))
    fp32, int8 = result.candidates
    assert int8.passed and int8.int8_fp32_groups and int8.note.startswith(f"{len(int8.int8_fp32_groups)} block(s)")
    assert int8.quality["mean_cosine"] >= floor > int8.quality["full_int8_mean_cosine"]
    assert result.config.runtime.int8_fp32_groups == (int8.int8_fp32_groups if result.best is int8 else None)
    fastest = max(result.candidates, key=lambda c: c.rows_per_s)
    assert results_path(cfg, resolve(cfg)).exists()

    caplog.set_level(logging.INFO, logger="bulkinfer")
    auto = run_job(load_config(overrides={**base, "runtime.quality_floor": floor, "runtime.precision": "auto",
                                          "sink.path": str(d / "auto")}))  # fmt: skip
    assert (auto.report["engine"], auto.report["precision"]) == ("onnxruntime", fastest.precision)
    said = [r.getMessage() for r in caplog.records if "runtime.precision = auto" in r.getMessage()]
    emulated_here = sorted({p for _e, p in PRECISIONS if emulated("cpu", p)})  # this CPU's (fp16 on most)
    left = f"; {', '.join(emulated_here)} left out: emulated here" if emulated_here else ""
    assert said == [f"runtime.precision = auto: {fastest.precision} on onnxruntime ({fastest.rows_per_s} rows/s"
                    + (f" against fp32's {fp32.rows_per_s}" if fastest is int8 else "")
                    + f" (measured by bulkinfer tune, {results_path(cfg, resolve(cfg))}){left})"]  # fmt: skip
    assert auto.report["rows_out"] == 120
    # the search's choice is onnxruntime's: openvino's int8 (built whole) is neither built nor labelled with it
    _fp32, ov = tune(cfg, 64, (16,), precisions=(("openvino", "fp32"), ("openvino", "int8"))).candidates
    assert ov.precision == "int8" and ov.int8_fp32_groups is None and "block(s)" not in ov.note


def test_precision_auto_without_measurements_calibrates_once_and_keeps_them(tiny_job, caplog):
    import logging

    from bulkinfer.precision.tune import CALIBRATION_ROWS, results_path

    d, model = tiny_job
    caplog.set_level(logging.INFO, logger="bulkinfer")
    overrides = {"runtime.precision": "auto", "runtime.cache_dir": str(d / "cache-calibrate"),
                 "runtime.quality_floor": -1.0}  # fmt: skip
    first = run(tiny_job, "calibrated", **overrides)
    cfg = load_config(overrides={"model.name": str(model), "runtime.cache_dir": str(d / "cache-calibrate")})
    kept = json.loads(results_path(cfg, resolve(cfg)).read_text())["candidates"]
    measured = {(c["engine"], c["precision"]) for c in kept}
    assert {("onnxruntime", "fp32"), ("onnxruntime", "int8"), ("torch", "fp32")} <= measured
    assert all(c["batch_size"] == 16 for c in kept)  # the job's batch size, one size: a short calibration
    best = max((c for c in kept if c["passed"] and c["rows_per_s"]), key=lambda c: c["rows_per_s"])
    assert (first.report["engine"], first.report["precision"]) == (best["engine"], best["precision"])
    said = [r.getMessage() for r in caplog.records if "runtime.precision = auto" in r.getMessage()]
    assert len(said) == 2 and "calibrating" in said[0] and f"on {CALIBRATION_ROWS} rows" in said[0]
    assert f"calibrated now on {CALIBRATION_ROWS} rows" in said[1]
    caplog.clear()
    second = run(tiny_job, "again", **overrides)  # kept: no calibration the second time
    said = [r.getMessage() for r in caplog.records if "runtime.precision = auto" in r.getMessage()]
    assert len(said) == 1 and "measured by bulkinfer tune" in said[0]
    assert (second.report["engine"], second.report["precision"]) == (best["engine"], best["precision"])

    # a new tune picks another precision: the output already started keeps the one it was made with
    path = results_path(cfg, resolve(cfg))
    other = next(c for c in kept if (c["engine"], c["precision"]) != (best["engine"], best["precision"]))
    path.write_text(json.dumps({"candidates": [{**other, "passed": True, "rows_per_s": 1e9}]}))
    caplog.clear()
    rerun = run(tiny_job, "again", **overrides)  # the finished output: resumed, not refused as a changed job
    said = [r.getMessage() for r in caplog.records if "runtime.precision = auto" in r.getMessage()]
    assert said == [f"runtime.precision = auto: {best['precision']} on {best['engine']}, as chosen by the run this "
                    f"one resumes ({d / 'again'})"]  # fmt: skip
    latest = rerun.report["latest_run"]  # the rerun's own (the report keeps the figures of the run that did work)
    assert (latest["engine"], latest["precision"]) == (best["engine"], best["precision"])
    assert latest["rows_out"] == 0 and rerun.report["output_rows"] == 120
    fresh = run(tiny_job, "fresh", **overrides)  # a new output takes the new measurement
    assert (fresh.report["engine"], fresh.report["precision"]) == (other["engine"], other["precision"])


def resolve(cfg) -> str:
    from bulkinfer.adapters import resolve_model

    return resolve_model(cfg).digest


def test_a_passed_gate_is_kept_for_this_machine_kind_and_reused_only_for_the_same_model_settings_and_rows(
    tiny_job, tmp_path, caplog
):
    """The gate's verdict is cached per model, precision as built, floor, machine kind and the
    gate's sample rows: a rerun over the same data into a new output skips the gate (the same
    figures, and its time in report.json); another floor or other rows are gated again; a
    refused gate is never kept."""
    import logging

    caplog.set_level(logging.INFO, logger="bulkinfer")
    gates = tiny_job[0] / "cache" / "gates"
    before = set(gates.glob("*.json")) if gates.is_dir() else set()
    report = run(tiny_job, "kept-1", **{"runtime.quality_floor": -0.7}).report
    first = report["quality"]
    assert first["passed"] and first["cached"] is False and first["gate_s"] > 0
    split = report["setup_split"]  # where the set-up went, the gate's share among it
    # the export and the int8 build appear when this run made them (the module's first run did)
    assert {"plan_s", "load_s", "gate_s", "other_s", "first_commit_s"} <= set(split) <= {*split, "export_s", "build_s"}
    assert split["gate_s"] >= first["gate_s"]
    timed = sum(v for k, v in split.items() if k not in ("first_commit_s", "other_s"))  # each timed where it ran
    assert split["plan_s"] > 0 and timed <= report["setup_s"] + 0.01  # the parts fit in the set-up they are of
    assert split["other_s"] == pytest.approx(report["setup_s"] - timed, abs=0.01)
    assert report["setup_s"] <= split["first_commit_s"] <= report["wall_s"]
    # the gate's 64 sample rows are output rows: taken from the gate, not inferred again
    assert report["reuse"]["rows_from_gate"] == 64 and report["rows_out"] == 120
    assert report["reuse"]["rows_inferred"] == 120 - 64
    # the headline throughput counts the rows inferred in the run, not the gate's (once 120 / run_s)
    assert _per_run_s(report["rows_per_s"], 56, report["run_s"])
    assert _per_run_s(report["rows_written_per_s"], 120, report["run_s"])
    kept = set(gates.glob("*.json")) - before
    assert len(kept) == 1
    second = run(tiny_job, "kept-2", **{"runtime.quality_floor": -0.7}).report
    again = second["quality"]
    assert again["cached"] is True and again["gate_s"] < first["gate_s"]
    assert second["reuse"]["rows_from_gate"] == 0 and second["reuse"]["rows_inferred"] == 120  # no gate ran
    # the rows taken from the gate are its sample's (the first 64 of the one shard), each in its
    # place: against an fp32 run they give exactly the gate's figures
    run(tiny_job, "kept-fp32", **{"runtime.precision": "fp32"})
    a, ref = (read_output(tiny_job[0] / out).sort_by("id") for out in ("kept-1", "kept-fp32"))
    assert a["id"].to_pylist() == ref["id"].to_pylist() == list(range(120))
    x, y = (np.array(t["embedding"].to_pylist()[:64], dtype=np.float64) for t in (a, ref))
    cos = (x * y).sum(axis=1) / np.linalg.norm(x, axis=1) / np.linalg.norm(y, axis=1)
    assert (cos.mean(), cos.min()) == pytest.approx((first["mean_cosine"], first["min_cosine"]), abs=2e-6)
    assert {k: again[k] for k in ("rows", "mean_cosine", "min_cosine")} == {
        k: first[k] for k in ("rows", "mean_cosine", "min_cosine")
    }
    assert sum("passed on this machine kind" in r.getMessage() for r in caplog.records) == 1
    other_floor = run(tiny_job, "kept-3", **{"runtime.quality_floor": -0.8}).report["quality"]
    assert other_floor["cached"] is False
    write(make_catalog(120, seed=5), tmp_path / "other.parquet")
    other_rows = run(
        tiny_job, "kept-4", **{"runtime.quality_floor": -0.7, "source.paths": [str(tmp_path / "other.parquet")]}
    )
    assert other_rows.report["quality"]["cached"] is False
    assert len(set(gates.glob("*.json")) - before) == 3
    with pytest.raises(QualityGateError):
        run(tiny_job, "kept-5", **{"runtime.quality_floor": 0.999999, "runtime.int8_fp32_groups": []})
    assert len(set(gates.glob("*.json")) - before) == 3  # a refusal is not kept


def _per_run_s(figure: float, rows: int, run_s: float) -> bool:
    """``figure`` is ``rows`` over the run's seconds, which report.json rounds to the millisecond
    (on a fast machine the run is tens of ms, so the rounding alone moves the quotient by over 1%)."""
    return rows / (run_s + 0.0005) - 0.01 <= figure <= rows / max(run_s - 0.0005, 1e-9) + 0.01
