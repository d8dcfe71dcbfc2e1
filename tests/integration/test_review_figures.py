"""The rule against its reviewers: ``bulkinfer review --audit N`` adds a fixed sample of the
published rows to the queue, and ``bulkinfer compare OUT --reviews ROUTE`` (and ``review
--summary``) turn the decisions into the rule's precision, miss rate and recall, gated by
``--fail-if``."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from bulkinfer import load_config, run_job
from bulkinfer.outputs.compare import id_hashes
from bulkinfer.outputs.review_rows import AUDIT_RULE
from bulkinfer.serve import review_queue

from ensemble_job import PUBLISH, REVIEW, job
from helpers import cli


def lowest_hashes(ids: set[int], n: int) -> set[str]:
    ordered = sorted(ids)
    hashes = id_hashes(pa.array(ordered, pa.int64()))
    return {str(ordered[i]) for i in np.argsort(hashes, kind="stable")[:n]}


def test_an_audit_of_published_rows_gives_the_rules_recall(tmp_path, monkeypatch):
    job(tmp_path, monkeypatch)
    run_job(load_config(tmp_path / "job.toml"))
    queue = review_queue("out", "review", audit=5)
    audited = set(queue.rows.audited)
    assert audited == lowest_hashes(PUBLISH, 5)  # published rows only, the 5 lowest id hashes
    assert sorted(queue.ids, key=int) == sorted({str(i) for i in REVIEW} | audited, key=int)
    assert min(queue.ids.index(i) for i in audited) < len(queue.ids) // 3  # spread, not all last
    assert queue.row(next(iter(audited)))["rule"] == AUDIT_RULE
    sent = [i for i in queue.ids if i not in audited]
    for n, row_id in enumerate(sent[:4]):  # 3 of 4 sent rows rejected: precision 0.75
        queue.store.decide(row_id, "alice", "approve" if n == 0 else "reject")
    for n, row_id in enumerate(sorted(audited)):  # 1 of 5 published rows rejected: miss rate 0.2
        queue.store.decide(row_id, "bob", "reject" if n == 0 else "approve")
    queue.store.close()
    larger = review_queue("out", "review", audit=8)
    assert audited < set(larger.rows.audited) and len(larger.rows.audited) == 8  # the same 5, and 3 more
    larger.store.close()

    result = json.loads(cli("compare", "out", "--reviews", "review", "--json", cwd=tmp_path, check=True).stdout)
    caught, missed = len(REVIEW) * 0.75, len(PUBLISH) * 0.2
    assert (result["precision"], result["miss_rate"], result["published"]) == (0.75, 0.2, len(PUBLISH))
    assert result["recall"] == round(caught / (caught + missed), 4)
    assert result["figures"] == {"precision": 0.75, "recall": result["recall"], "miss_rate": 0.2, "reviewed": 4,
                                 "audited": 5, "pending": len(REVIEW) - 4}  # fmt: skip
    assert (result["sent"]["rows"], result["audit"]["rejected"], result["audit"]["approved"]) == (len(REVIEW), 1, 4)
    assert sum(r["rows"] for r in result["rules"].values()) == len(REVIEW)
    assert json.loads(cli("review", "out", "--summary", "--json", cwd=tmp_path, check=True).stdout) == {
        k: v for k, v in result.items() if k != "figures"
    }
    gated = cli("compare", "out", "--reviews", "review", "--fail-if", "recall < 0.99", cwd=tmp_path)
    assert gated.returncode == 1, gated.stderr
    assert f"recall = {result['recall']}" in gated.stderr and "rule: precision 0.75" in gated.stdout
    passed = cli("compare", "out", "--reviews", "review", "--fail-if", "precision < 0.5", cwd=tmp_path, check=True)
    assert "gate passed" in passed.stdout


def test_recall_is_not_measured_without_an_audit_and_a_gate_on_it_fails(tmp_path, monkeypatch):
    job(tmp_path, monkeypatch)
    run_job(load_config(tmp_path / "job.toml"))
    queue = review_queue("out", "review")
    assert queue.rows.audited == frozenset() and len(queue.ids) == len(REVIEW)
    queue.store.decide(queue.ids[0], "alice", "reject")
    queue.store.close()
    text = cli("review", "out", "--summary", cwd=tmp_path, check=True).stdout
    assert "rule: precision 1.00  recall -  miss rate -  (recall: review --audit N published rows)" in text
    gated = cli("compare", "out", "--reviews", "review", "--fail-if", "recall < 0.9", cwd=tmp_path)
    assert gated.returncode == 1 and "recall = not measured" in gated.stderr


def test_compare_takes_a_candidate_or_reviews_and_says_so(tmp_path, monkeypatch):
    job(tmp_path, monkeypatch)
    run_job(load_config(tmp_path / "job.toml"))
    for args in (["out"], ["out", "out", "--reviews", "review"]):
        proc = cli("compare", *args, cwd=tmp_path)
        assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
            "bulkinfer: error: compare: give a candidate output NEW, or --reviews ROUTE, not both"
        ]
    proc = cli("compare", "out", "--reviews", "nope", cwd=tmp_path)
    assert proc.returncode == 1 and "--route nope: the job has no such route" in proc.stderr
    proc = cli("review", "out", "--audit", "-1", cwd=tmp_path)
    assert proc.returncode == 1 and "--audit -1: a number of published rows" in proc.stderr
