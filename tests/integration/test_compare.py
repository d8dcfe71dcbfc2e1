"""``bulkinfer compare``: every figure against a brute-force computation over the two outputs
read whole; the bucketed join equals the one-bucket join; the sample takes the same ids on
both sides; the gate's exit codes."""

from __future__ import annotations

import json
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pytest

from bulkinfer import load_config, run_job
from bulkinfer.outputs.compare import CompareSpec, compare_outputs, gate, id_hashes

from helpers import cli, read_output, tabular_table, write

MODELS = textwrap.dedent("""
    import numpy as np
    from bulkinfer import Adapter

    class Emb(Adapter):
        input_columns = ("id", "x1", "x2", "x3")

        def __init__(self, noise=0.0, dim=8, fail_ids=()):
            self.noise, self.dim, self.fail_ids = noise, dim, set(fail_ids)

        def predict(self, batch):
            ids = batch["id"].to_numpy()
            if self.fail_ids & set(ids.tolist()):
                raise ValueError("a row this model cannot take")
            x = np.column_stack([batch[c].to_numpy().astype(float) for c in ("x1", "x2", "x3")])
            w = np.random.default_rng(0).normal(size=(3, self.dim))
            jitter = np.sin(np.outer(ids + 1.0, np.arange(1, self.dim + 1)))  # per row, not per batch
            emb = x @ w + 0.3 * np.cos(np.outer(ids, np.arange(self.dim))) + self.noise * jitter
            score = x[:, 0] + self.noise * np.sin(ids * 7.0)
            return {"embedding": emb.astype(np.float32), "label": np.where(score > 0, "yes", "no"), "score": score}
""")


@pytest.fixture
def outputs(tmp_path, monkeypatch):
    (tmp_path / "cmpmodels.py").write_text(MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    write(tabular_table(180, seed=4), tmp_path / "old.parquet")
    new = pa.concat_tables([tabular_table(170, seed=4), tabular_table(15, seed=9, start=1000)])  # ids 170-179 gone
    write(new, tmp_path / "new.parquet")

    def run(name, inp, **options):
        cfg = load_config(overrides={
            "source.paths": [str(tmp_path / inp)], "model.name": "cmpmodels:Emb", "model.options": options,
            "source.id_column": "id", "sink.keep_columns": ["segment"], "sink.path": str(tmp_path / name),
            "source.shard_rows": 40, "runtime.batch_size": 1, "execution.progress": "none",
        })  # fmt: skip
        run_job(cfg)
        return tmp_path / name

    yield run("old", "old.parquet"), run("new", "new.parquet", noise=0.6, fail_ids=[7])
    sys.modules.pop("cmpmodels", None)


def brute_psi(base, cur):
    edges = np.unique(np.quantile(base, [i / 10 for i in range(1, 10)], method="inverted_cdf"))
    b = np.maximum(np.diff([0.0, *[(base <= e).mean() for e in edges], 1.0]), 1e-4)
    c = np.maximum(np.diff([0.0, *[(cur <= e).mean() for e in edges], 1.0]), 1e-4)
    return float(((c - b) * np.log(c / b)).sum())


def test_figures_equal_a_brute_force_computation(outputs):
    from scipy.stats import ks_2samp

    old_dir, new_dir = outputs
    result = compare_outputs(old_dir, new_dir, CompareSpec(k=5, queries=20))
    old, new = read_output(old_dir).sort_by("id"), read_output(new_dir).sort_by("id")
    ids = sorted(set(old["id"].to_pylist()) & set(new["id"].to_pylist()))
    assert len(ids) == 169  # 170 shared ids, less the one that failed in NEW
    assert (result["rows_compared"], result["only_in_old"], result["only_in_new"]) == (169, 11, 15)
    assert (result["failed_old"], result["failed_new"], result["newly_failed"]) == (0, 1, 1)
    assert set(result["columns"]) == {"embedding", "label", "score"}  # not the id, not the kept segment
    a = old.filter(pa.compute.is_in(old["id"], pa.array(ids)))
    b = new.filter(pa.compute.is_in(new["id"], pa.array(ids)))

    ea = np.stack(a["embedding"].to_numpy(zero_copy_only=False)).astype(np.float64)
    eb = np.stack(b["embedding"].to_numpy(zero_copy_only=False)).astype(np.float64)
    ua, ub = ea / np.linalg.norm(ea, axis=1, keepdims=True), eb / np.linalg.norm(eb, axis=1, keepdims=True)
    cos = (ua * ub).sum(axis=1)
    emb = result["columns"]["embedding"]
    assert emb["cosine"]["mean"] == pytest.approx(cos.mean(), abs=1e-9)
    assert emb["cosine"]["min"] == pytest.approx(cos.min(), abs=1e-9)
    for name, q in (("p1", 0.01), ("p5", 0.05), ("p50", 0.5)):  # under 200 rows the sketch is exact
        assert emb["cosine"][name] == pytest.approx(np.quantile(cos, q, method="inverted_cdf"), abs=1e-9)
    # top-5 overlap of the 20 rows with the lowest id hash, neighbours among all compared rows
    h = id_hashes(a["id"].combine_chunks())
    queries = np.argsort(h)[:20]
    overlap = []
    for q in queries:
        sa, sb = ua @ ua[q], ub @ ub[q]
        sa[q] = sb[q] = -np.inf
        overlap.append(len(set(np.argsort(-sa)[:5]) & set(np.argsort(-sb)[:5])) / 5)
    assert emb["topk_overlap"] == pytest.approx(np.mean(overlap)) and 0 < emb["topk_overlap"] < 1
    assert result["figures"]["cosine.p5"] == emb["cosine"]["p5"]
    assert result["figures"]["embedding.topk_overlap"] == emb["topk_overlap"]

    la, lb = a["label"].to_pylist(), b["label"].to_pylist()
    lab = result["columns"]["label"]
    assert lab["agreement"] == pytest.approx(np.mean([x == y for x, y in zip(la, lb, strict=True)]))
    assert lab["confusion"]["yes"]["no"] == sum(x == "yes" and y == "no" for x, y in zip(la, lb, strict=True))
    assert lab["flips"]["no"] == {"left": lab["confusion"]["no"]["yes"], "joined": lab["confusion"]["yes"]["no"]}

    sa_, sb_ = a["score"].to_numpy(), b["score"].to_numpy()
    sc = result["columns"]["score"]
    assert sc["mean_shift"] == pytest.approx(sb_.mean() - sa_.mean(), abs=1e-12)
    assert sc["mean_abs_diff"] == pytest.approx(np.abs(sb_ - sa_).mean(), abs=1e-12)
    assert sc["ks"] == pytest.approx(ks_2samp(sa_, sb_).statistic, abs=1e-12)
    assert sc["psi"] == pytest.approx(brute_psi(sa_, sb_), abs=1e-9)


def test_buckets_and_samples(outputs):
    old_dir, new_dir = outputs
    whole = compare_outputs(old_dir, new_dir, CompareSpec(k=5, queries=20))
    bucketed = compare_outputs(old_dir, new_dir, CompareSpec(k=5, queries=20, bucket_rows=16))
    for key in ("rows_compared", "only_in_old", "only_in_new"):
        assert bucketed[key] == whole[key]
    assert bucketed["columns"]["label"] == whole["columns"]["label"]
    assert bucketed["columns"]["embedding"]["topk_overlap"] == pytest.approx(
        whole["columns"]["embedding"]["topk_overlap"]
    )
    assert bucketed["columns"]["score"]["ks"] == pytest.approx(whole["columns"]["score"]["ks"])

    sampled = compare_outputs(old_dir, new_dir, CompareSpec(sample=60, k=5, queries=20))
    ids = np.asarray(read_output(old_dir)["id"].to_pylist())
    biggest = max(sampled["rows_old"], sampled["rows_new"])
    kept = ids[id_hashes(pa.array(ids)) < np.uint64(int(60 / biggest * 2**64))]
    assert sampled["sample"] == 60 and sampled["rows_sampled_old"] == len(kept)
    assert 30 <= sampled["rows_compared"] <= 90


def test_gate_exit_codes_and_messages(outputs):
    old_dir, new_dir = outputs
    ok = cli("compare", str(old_dir), str(old_dir), "--fail-if", "cosine.p5 < 0.95 or topk_overlap < 0.8")
    assert ok.returncode == 0, ok.stderr
    assert "gate passed" in ok.stdout and "cosine mean 1.0000" in ok.stdout
    bad = cli("compare", str(old_dir), str(new_dir), "--fail-if", "cosine.p5 < 0.95 or agreement < 0.99", "--json")
    assert bad.returncode == 1
    line = bad.stderr.strip().splitlines()[-1]
    assert line.startswith("bulkinfer: error: compare:") and "cosine.p5 = " in line and "agreement = " in line
    report = json.loads(bad.stdout)
    assert report["gate"]["failed"] is True and report["gate"]["figures"]["agreement"] < 0.99
    unknown = cli("compare", str(old_dir), str(new_dir), "--fail-if", "cosine.p3 < 0.9")
    assert unknown.returncode == 1 and "no figure 'cosine.p3'" in unknown.stderr and "cosine.p5" in unknown.stderr
    assert "Traceback" not in unknown.stderr
    none = cli("compare", str(old_dir), str(old_dir.parent / "nowhere"))
    assert none.returncode == 1 and "no _SUCCESS" in none.stderr


def test_a_figure_that_was_not_measured_fails_the_gate():
    failed, read = gate("cosine.p5 < 0.95", {"cosine.p5": None, "agreement": 1.0})
    assert failed and read == {"cosine.p5": None}
    assert gate("agreement < 0.9", {"agreement": 0.95}) == (False, {"agreement": 0.95})
    assert gate("agreement < 0.9 or only_in_new > 10", {"agreement": 0.95, "only_in_new": 11})[0]
