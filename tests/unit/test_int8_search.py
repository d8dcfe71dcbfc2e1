"""The partial-int8 search (keep the most sensitive groups in fp32 until the gate passes) and
the sensitivity pass, on a tiny BERT exported here."""

from __future__ import annotations

import numpy as np
import pytest

from bulkinfer.engines.int8 import OUTLIERS, group_of, layer_groups, search, sensitivities

ORDER = [f"g{i}" for i in range(18)]


@pytest.mark.parametrize("needed", [1, 3, 5, 8, 13, 17])
def test_search_keeps_the_fewest_groups_that_pass(needed):
    calls = []

    def score(keep):
        calls.append(len(keep))
        assert keep == ORDER[: len(keep)]  # always the most sensitive first
        return 0.99 + 0.001 * min(len(keep), needed) / needed

    found = search(ORDER, score, floor=0.991)
    assert found.keep_fp32 == ORDER[:needed]
    assert len(calls) == len(set(calls)) <= 2 * 5  # doubling then bisection: each count built once
    assert [s["passed"] for s in found.steps] == [c >= needed for c in calls]


def test_search_refuses_when_only_fp32_would_pass():
    found = search(ORDER, lambda keep: 0.99 + 0.0001 * len(keep), floor=0.9999)
    assert found.keep_fp32 is None
    assert [s["fp32_groups"] for s in found.steps] == [1, 2, 4, 8, 16, 17]  # 18 of 18 is fp32, not int8
    assert not any(s["passed"] for s in found.steps)


RANKED = [OUTLIERS, "b0", "b1", "b2", "b3", "b4"]


def test_a_first_group_that_buys_nothing_is_dropped_and_the_blocks_are_searched_alone():
    """The outlier channels scored no higher than full int8 here: the search starts again over
    the blocks as re-ranked without them, and never builds them with a block again."""
    scores = {(OUTLIERS,): 0.9950}  # full int8: 0.9955; the floor needs two blocks of the new order
    built = []

    def score(keep):
        built.append(keep)
        return scores.get(tuple(keep), 0.9955 + 0.0002 * len(keep))

    found = search(RANKED, score, floor=0.9959, baseline=0.9955, without_first=lambda: ["b3", "b0", "b1", "b2", "b4"])
    assert found.dropped == [OUTLIERS] and found.order == ["b3", "b0", "b1", "b2", "b4"]
    assert found.keep_fp32 == ["b3", "b0"]
    assert built[0] == [OUTLIERS] and all(OUTLIERS not in k for k in built[1:])
    assert [s["groups"] for s in found.steps] == built and [s["passed"] for s in found.steps] == [False, False, True]


@pytest.mark.parametrize(("first", "floor", "keep"), [
    (0.9960, 0.9958, [OUTLIERS]),  # it passes alone
    (0.9957, 0.9990, None),  # it helps (above full int8): kept first in every build; nothing passes
    (0.9957, 0.9959, [OUTLIERS, "b0"]),
])  # fmt: skip
def test_a_first_group_that_helps_is_kept(first, floor, keep):
    def score(keep):
        return first + 0.0002 * (len(keep) - 1) if keep[0] == OUTLIERS else 0.0

    found = search(RANKED, score, floor=floor, baseline=0.9955, without_first=lambda: pytest.fail("dropped"))
    assert found.keep_fp32 == keep and found.dropped == [] and found.order == RANKED
    assert all(s["groups"][0] == OUTLIERS for s in found.steps)
    assert len({tuple(s["groups"]) for s in found.steps}) == len(found.steps)  # each build once


def test_groups_and_sensitivities_of_an_exported_bert(tmp_path):
    import torch
    from transformers import BertConfig, BertModel

    class LastHidden(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=64, max_position_embeddings=32)).eval()  # fmt: skip
    ids = torch.randint(0, 50, (4, 12))
    path = tmp_path / "bert.onnx"
    torch.onnx.export(LastHidden(model), (ids, torch.ones_like(ids)), str(path), input_names=["input_ids", "attention_mask"],
                      output_names=["h"], dynamo=False, opset_version=17,
                      dynamic_axes={"input_ids": {0: "b", 1: "t"}, "attention_mask": {0: "b", 1: "t"}})  # fmt: skip
    groups = layer_groups(path)
    blocks = {f"layer.{i}/{b}" for i in range(2) for b in ("attention", "intermediate", "output")}
    assert set(groups) == blocks and len(groups["layer.0/attention"]) >= 4  # q, k, v, out (and the scores)
    batch = {"input_ids": ids.numpy(), "attention_mask": np.ones((4, 12), dtype=np.int64)}
    sens7 = sensitivities(path, [batch], reduce_range=True, threads=1)
    sens8 = sensitivities(path, [batch], reduce_range=False, threads=1)
    assert blocks <= set(sens7) and all(0 < sens7[g] < 0.2 for g in blocks)
    assert all(sens7[g] > sens8[g] for g in blocks)  # 7-bit weights lose more than 8-bit ones
    assert group_of("/inner/encoder/layer.3/output/dense/MatMul") == "layer.3/output"


def test_tunes_table_says_what_an_int8_candidate_keeps_in_fp32():
    from bulkinfer.engines.int8 import kept_in_words as _kept

    assert _kept([OUTLIERS]) == "outlier channels"
    assert _kept([OUTLIERS, "layer.3/intermediate", "layer.4/intermediate"]) == "outlier channels + 2 blocks"
    assert _kept(["layer.0/output"]) == "1 block" and _kept([]) == "nothing"
