"""Partial int8: which parts of a transformer stay in fp32 so that int8 passes the quality gate.

The quantizable nodes of an exported transformer (its MatMuls, and in a fused graph its
Attention nodes, whose Q, K and V product int8 turns into QAttention: ONNX Runtime's dynamic
int8 leaves the embedding tables' Gathers in fp32) are grouped by layer and block
(``layer.0/attention``, ``layer.0/intermediate``, ``layer.0/output``...; a fused Attention
node goes with the block of the MatMul that reads its output). Each group's
sensitivity is measured on the job's own rows in one pass: the fp32 model runs with every
MatMul's input exposed, and each MatMul is replayed in numpy with the weights and the
activations quantized exactly as ONNX Runtime's dynamic int8 does (per-channel weights, 7
bits where the machine's kernels need it; per-call uint8 activations): a group's figure is
its worst relative output error. :func:`search` then keeps the most sensitive groups in
fp32 — 1, 2, 4... of them, then bisecting back — until a real int8 build passes the
gate, so the floor becomes the search's target and the most speed is kept.

Before any block, the search tries :data:`OUTLIERS`: in each feed-forward block (MatMul ->
BiasGelu -> MatMul, as the fused export has it) the few intermediate channels with the
largest activations (0.5%: 8 of MiniLM's 1536, found on a fixed probe of random tokens,
so the build needs no data and is the same for every job) go through a small fp32 path
beside the int8 rest. One such channel sets the per-call uint8 scale of the whole
activation, so the rest is quantized far more finely without it: on MiniLM on AVX2 kernels
the int8 mean cosine goes from 0.990 to 0.994 for about 3% of int8's speed (bare engine),
about what one whole block kept in fp32 costs for a quarter of the gain. Where their build
scores no closer to fp32 than full int8 (a real AVX2 core's 7-bit weights, on the suite's tiny
model), the search drops them and ranks the blocks again without them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "OUTLIERS",
    "Search",
    "cached_plan",
    "ffn_blocks",
    "group_of",
    "kept_in_words",
    "layer_groups",
    "node_groups",
    "outlier_channels",
    "save_plan",
    "search",
    "sensitivities",
    "split_outliers",
]

log = logging.getLogger(__name__)
_LAYER = re.compile(r"layer[._](\d+)[./](attention|intermediate|output)")


def group_of(node_name: str) -> str:
    """``/encoder/layer.0/attention/self/query/MatMul`` -> ``layer.0/attention``; other names
    go by their path (what the exporter named the module)."""
    m = _LAYER.search(node_name)
    return f"layer.{m.group(1)}/{m.group(2)}" if m else node_name.rsplit("/", 1)[0] or node_name


QUANTIZED = ("MatMul", "Attention")
OUTLIERS = "outlier-channels"
"""The group that is no block: each feed-forward block's largest intermediate channels in fp32."""
SEARCH = 3
"""The search's version, part of its cache key: a better search gets its chance (2: outlier channels
first; 3: dropped where they score no higher than full int8)."""
OUTLIER_SHARE = 192
"""One intermediate channel in this many goes the fp32 way (at least one per block)."""


def kept_in_words(groups: Sequence[str]) -> str:
    """What an int8 build keeps in fp32, in a few words: "outlier channels + 2 blocks"
    ("nothing": full int8)."""
    blocks = [g for g in groups if g != OUTLIERS]
    words = ["outlier channels"] if OUTLIERS in groups else []
    if blocks:
        words.append(f"{len(blocks)} block{'s' if len(blocks) > 1 else ''}")
    return " + ".join(words) or "nothing"


def node_groups(graph: Any) -> dict[str, str]:
    """Each quantizable node's group, in graph order (an ONNX ``GraphProto``). A fused Attention
    node (named ``Attention_0``...) takes the group of the MatMul that reads its output."""
    readers: dict[str, str] = {}
    for node in graph.node:
        if node.op_type == "MatMul":
            readers.setdefault(node.input[0], node.name)
    out: dict[str, str] = {}
    for node in graph.node:
        if node.op_type in QUANTIZED:
            name = readers.get(node.output[0], node.name) if node.op_type == "Attention" else node.name
            out[node.name] = group_of(name)
    return out


def layer_groups(onnx_path: Path) -> dict[str, list[str]]:
    """Each group's quantizable nodes, in graph order."""
    import onnx

    groups: dict[str, list[str]] = {}
    for node, group in node_groups(onnx.load(str(onnx_path), load_external_data=False).graph).items():
        groups.setdefault(group, []).append(node)
    return groups


def _fake_quant_weight(w: np.ndarray, bits: int) -> np.ndarray:
    qmax = 2 ** (bits - 1) - 1
    scale = np.maximum(np.abs(w).max(axis=0, keepdims=True), 1e-12) / qmax  # per output channel
    return np.clip(np.round(w / scale), -qmax, qmax) * scale


def _fake_quant_activation(x: np.ndarray) -> np.ndarray:
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    scale = (hi - lo) / 255.0 or 1e-12
    zero = round(-lo / scale)
    return (np.clip(np.round(x / scale) + zero, 0, 255) - zero) * scale


def sensitivities(
    fp32_path: Path,
    batches: Sequence[dict[str, np.ndarray]],
    reduce_range: bool,
    threads: int,
    exact: dict[str, list[int]] | None = None,
) -> dict[str, float]:
    """Each group's worst relative output error of its MatMuls (and fused Attention nodes' QKV
    products) under int8, on ``batches``; ``exact``: input channels per MatMul that stay in fp32
    (:func:`outlier_channels`), out of the quantized rest and of its scale."""
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    model = onnx.load(str(fp32_path))
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    group = node_groups(model.graph)
    nodes = [(n.name, n.input[0], weights[n.input[1]]) for n in model.graph.node
             if n.op_type in QUANTIZED and n.input[1] in weights and weights[n.input[1]].ndim == 2]  # fmt: skip
    exposed = list(dict.fromkeys(x for _, x, _ in nodes))
    known = {o.name for o in model.graph.output}
    for name in exposed:
        if name not in known:
            model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep the exposed tensors
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    bits = 7 if reduce_range else 8
    rest = {name: np.setdiff1d(np.arange(w.shape[0]), (exact or {}).get(name, [])) for name, _, w in nodes}
    quantized = {name: _fake_quant_weight(w[rest[name]].astype(np.float64), bits) for name, _, w in nodes}
    worst: dict[str, float] = {}
    for batch in batches:
        values = dict(zip(exposed, session.run(exposed, batch), strict=True))
        for name, x_name, w in nodes:
            x = values[x_name].astype(np.float64)
            y = x @ w
            keep = np.asarray((exact or {}).get(name, []), dtype=np.int64)
            got = _fake_quant_activation(x[..., rest[name]]) @ quantized[name] + x[..., keep] @ w[keep]
            err = float(np.linalg.norm(got - y)) / max(float(np.linalg.norm(y)), 1e-12)
            g = group[name]
            worst[g] = max(worst.get(g, 0.0), float(err))
    return worst


def ffn_blocks(graph: Any) -> list[tuple[Any, Any, Any]]:
    """Each feed-forward block of a fused graph, in order: named (MatMul, BiasGelu, MatMul) whose
    weights and bias are initializers and whose intermediate outputs feed only the next node."""
    weights = {t.name for t in graph.initializer}
    made = {o: n for n in graph.node for o in n.output}
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    out = []
    for gelu in graph.node:
        if gelu.op_type != "BiasGelu" or gelu.input[1] not in weights:
            continue
        first, after = made.get(gelu.input[0]), readers.get(gelu.output[0], [])
        if (first is not None and first.op_type == "MatMul" and first.input[1] in weights and len(after) == 1
                and all((first.name, gelu.name, after[0].name))
                and after[0].op_type == "MatMul" and after[0].input[1] in weights
                and len(readers.get(first.output[0], [])) == 1):  # fmt: skip
            out.append((first, gelu, after[0]))
    return out


def _probe_rows(model_dir: str, rows: int = 64) -> list[list[int]]:
    """Random-token rows of 8 to 64 tokens (fixed seed) framed as the tokenizer frames text;
    empty when the model's vocabulary size is unknown."""
    import json

    try:
        vocab = int(json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return []
    rng = np.random.default_rng(0)
    special: set[int] = set()
    head: list[int] = []
    tail: list[int] = []
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    except (OSError, ValueError):
        pass
    else:  # [CLS] ... [SEP] for BERT, <s> ... </s> for RoBERTa: the tokens outliers often sit on
        special = set(tok.all_special_ids)
        head = [i for i in (tok.cls_token_id if tok.cls_token_id is not None else tok.bos_token_id,) if i is not None]
        tail = [i for i in (tok.sep_token_id if tok.sep_token_id is not None else tok.eos_token_id,) if i is not None]
    pool = np.array([i for i in range(vocab) if i not in special])
    return [head + [int(t) for t in rng.choice(pool, int(rng.integers(8, 65)))] + tail for _ in range(rows)]


_FOUND: dict[tuple[str, int, str], dict[str, list[int]]] = {}  # (fp32 file, its mtime, model dir) -> channels


def outlier_channels(fp32_path: Path, model_dir: str, threads: int = 1) -> dict[str, list[int]]:
    """Each feed-forward block's intermediate channels with the largest activation (one in
    :data:`OUTLIER_SHARE`), by the name of the MatMul that reads them, measured on a fixed
    probe: empty for a graph without fused feed-forward blocks. Found once per fp32 file in
    a process: the gate's search asks, then each of its int8 builds."""
    key = (str(fp32_path), Path(fp32_path).stat().st_mtime_ns, model_dir)
    if key not in _FOUND:
        _FOUND[key] = _find_outliers(fp32_path, model_dir, threads)
    return {name: list(c) for name, c in _FOUND[key].items()}


def _find_outliers(fp32_path: Path, model_dir: str, threads: int) -> dict[str, list[int]]:
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(fp32_path))
    blocks = ffn_blocks(model.graph)
    rows = _probe_rows(model_dir)
    if not blocks or not rows:
        return {}
    for _, gelu, _ in blocks:
        model.graph.output.append(onnx.helper.make_tensor_value_info(gelu.output[0], onnx.TensorProto.FLOAT, None))
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    names = [gelu.output[0] for _, gelu, _ in blocks]
    peak: dict[str, np.ndarray] = {}
    try:
        session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        for start in range(0, len(rows), 16):
            part = rows[start : start + 16]
            ids = np.zeros((len(part), max(map(len, part))), dtype=np.int64)
            mask = np.zeros_like(ids)
            for r, seq in enumerate(part):
                ids[r, : len(seq)], mask[r, : len(seq)] = seq, 1
            for name, value in zip(names, session.run(names, {"input_ids": ids, "attention_mask": mask}), strict=True):
                top = np.abs(value[mask.astype(bool)]).max(axis=0)
                peak[name] = np.maximum(peak.get(name, top), top)
    except Exception as exc:  # onnxruntime's own errors (inputs this graph does not take...): no split
        log.warning("int8 outlier channels: the probe could not run (%s: %s); nothing split", type(exc).__name__, exc)
        return {}
    out = {}
    for (_, _, second), name in zip(blocks, names, strict=True):
        k = max(1, len(peak[name]) // OUTLIER_SHARE)
        out[second.name] = sorted(int(c) for c in np.argsort(-peak[name], kind="stable")[:k])
    return out


def split_outliers(model: Any, channels: dict[str, list[int]]) -> list[str]:
    """Rewrite ``model`` (an ONNX ``ModelProto``) so that each feed-forward block named in
    ``channels`` (by its second MatMul) runs those intermediate channels as a separate small
    MatMul -> BiasGelu -> MatMul whose output is added to the rest's: the same function, in
    float arithmetic. The main path keeps its node names (and so its group); returns the
    names of the new path's MatMuls, which stay in fp32."""
    from onnx import helper, numpy_helper

    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    rewritten: dict[str, list[Any]] = {}  # the first MatMul's output -> the nodes replacing the block
    dropped: set[str] = set()  # the other two nodes' outputs
    stale: set[str] = set()  # the replaced weights (an optimizer may share one between blocks)
    fp32: list[str] = []
    for first, gelu, second in ffn_blocks(graph):
        if second.name not in channels:
            continue
        w1, b1, w2 = (numpy_helper.to_array(weights[n]) for n in (first.input[1], gelu.input[1], second.input[1]))
        keep = np.asarray(channels[second.name], dtype=np.int64)
        rest = np.setdiff1d(np.arange(w1.shape[1]), keep)
        p = f"{second.name}/outliers"
        for suffix, array in (("w1", w1[:, rest]), ("b1", b1[rest]), ("w2", w2[rest]),
                              ("w1_fp32", w1[:, keep]), ("b1_fp32", b1[keep]), ("w2_fp32", w2[keep])):  # fmt: skip
            graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(array), f"{p}/{suffix}"))
        h, y = first.input[0], second.output[0]
        rewritten[first.output[0]] = [
            helper.make_node("MatMul", [h, f"{p}/w1"], [f"{p}/x"], name=first.name),
            helper.make_node("BiasGelu", [f"{p}/x", f"{p}/b1"], [f"{p}/g"], name=gelu.name, domain="com.microsoft"),
            helper.make_node("MatMul", [f"{p}/g", f"{p}/w2"], [f"{p}/y"], name=second.name),
            helper.make_node("MatMul", [h, f"{p}/w1_fp32"], [f"{p}/x_fp32"], name=f"{p}/MatMul_in"),
            helper.make_node(
                "BiasGelu",
                [f"{p}/x_fp32", f"{p}/b1_fp32"],
                [f"{p}/g_fp32"],
                name=f"{p}/BiasGelu",
                domain="com.microsoft",
            ),
            helper.make_node("MatMul", [f"{p}/g_fp32", f"{p}/w2_fp32"], [f"{p}/y_fp32"], name=f"{p}/MatMul_out"),
            helper.make_node("Add", [f"{p}/y", f"{p}/y_fp32"], [y], name=f"{p}/Add"),
        ]
        fp32 += [f"{p}/MatMul_in", f"{p}/MatMul_out"]
        dropped |= {gelu.output[0], second.output[0]}
        stale |= {first.input[1], gelu.input[1], second.input[1]}
    nodes = []
    for node in graph.node:
        if node.output[0] in rewritten:
            nodes += rewritten[node.output[0]]
        elif node.output[0] not in dropped:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for node in nodes for name in node.input}
    for name in stale - used:
        graph.initializer.remove(weights[name])
    return fp32


@dataclass
class Search:
    """The outcome: the groups kept in fp32 (None: no int8 passes), every build tried, the
    order searched last, and the groups dropped from it for buying nothing."""

    keep_fp32: list[str] | None
    steps: list[dict[str, Any]] = field(default_factory=list)
    order: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)


def search(
    order: Sequence[str],
    score: Callable[[list[str]], float],
    floor: float,
    baseline: float | None = None,
    without_first: Callable[[], Sequence[str]] | None = None,
) -> Search:
    """Keep the first k groups of ``order`` (most sensitive first) in fp32 for the smallest k
    whose build scores at least ``floor`` (``score(groups) -> mean cosine``): k = 1, 2, 4, ...
    (at most all but one) until one passes, then bisection between the last failing and the
    first passing k.
    Keeping every group is not int8: when only that would pass, no setting does.

    With ``baseline`` (full int8's score) and ``without_first``: when the first group alone
    fails and scores no higher than ``baseline``, it buys nothing on this machine and model
    (the outlier split on kernels whose 7-bit weights it does not help), so it is dropped and
    the search starts again over ``without_first()`` (the other groups, ranked without it)
    instead of carrying its cost in every later build."""
    result = Search(None, order=list(order))
    tried: dict[tuple[str, ...], float] = {}

    def passes(k: int) -> bool:
        keep = tuple(result.order[:k])
        if keep not in tried:
            tried[keep] = score(list(keep))
            result.steps.append(
                {"fp32_groups": k, "groups": list(keep), "mean_cosine": tried[keep], "passed": tried[keep] >= floor}
            )
        return tried[keep] >= floor

    # the first group built alone (the loop below reuses that build), dropped if it buys nothing
    if (
        baseline is not None
        and without_first is not None
        and len(order) > 1
        and not passes(1)
        and tried[tuple(result.order[:1])] <= baseline
    ):
        result.dropped = result.order[:1]
        result.order = list(without_first())
    n = len(result.order)
    bad, k = 0, 1
    while True:  # k = 1, 2, 4, ... at most n - 1 (n groups in fp32 is fp32)
        if k >= n:
            return result
        if passes(k):
            break
        if k == n - 1:
            return result
        bad, k = k, min(2 * k, n - 1)
    good = k
    while good - bad > 1:
        mid = (good + bad) // 2
        if passes(mid):
            good = mid
        else:
            bad = mid
    result.keep_fp32 = result.order[:good]
    return result


def _plan_path(cache_dir: Path, model_digest: str, floor: float) -> Path:
    import hashlib
    import json

    from ..core.hardware import int8_scheme, isa_key
    from .versions import EXPORT

    key = json.dumps(
        {"model": model_digest, "export": EXPORT, "isa": isa_key(), **int8_scheme(), "floor": floor, "search": SEARCH},
        sort_keys=True,
    )
    return cache_dir / "int8-plans" / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


def cached_plan(cache_dir: Path, model_digest: str, floor: float) -> list[str] | None:
    """The groups an earlier search kept in fp32 for this model, machine kind and floor."""
    import json

    path = _plan_path(cache_dir, model_digest, floor)
    try:
        groups = json.loads(path.read_text())["fp32_groups"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return [str(g) for g in groups] if isinstance(groups, list) else None


def save_plan(cache_dir: Path, model_digest: str, floor: float, figures: dict[str, Any]) -> None:
    import json
    import os

    path = _plan_path(cache_dir, model_digest, floor)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(figures, indent=1))
    os.replace(tmp, path)
