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
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Search", "cached_plan", "group_of", "layer_groups", "node_groups", "save_plan", "search", "sensitivities"]

_LAYER = re.compile(r"layer[._](\d+)[./](attention|intermediate|output)")


def group_of(node_name: str) -> str:
    """``/encoder/layer.0/attention/self/query/MatMul`` -> ``layer.0/attention``; other names
    go by their path (what the exporter named the module)."""
    m = _LAYER.search(node_name)
    return f"layer.{m.group(1)}/{m.group(2)}" if m else node_name.rsplit("/", 1)[0] or node_name


QUANTIZED = ("MatMul", "Attention")


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
    fp32_path: Path, batches: Sequence[dict[str, np.ndarray]], reduce_range: bool, threads: int
) -> dict[str, float]:
    """Each group's worst relative output error of its MatMuls (and fused Attention nodes' QKV
    products) under int8, on ``batches``."""
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
    quantized = {name: _fake_quant_weight(w.astype(np.float64), bits) for name, _, w in nodes}
    worst: dict[str, float] = {}
    for batch in batches:
        values = dict(zip(exposed, session.run(exposed, batch), strict=True))
        for name, x_name, w in nodes:
            x = values[x_name].astype(np.float64)
            y = x @ w
            err = float(np.linalg.norm(_fake_quant_activation(x) @ quantized[name] - y)) / max(
                float(np.linalg.norm(y)), 1e-12
            )
            g = group[name]
            worst[g] = max(worst.get(g, 0.0), float(err))
    return worst


@dataclass
class Search:
    """The outcome: the groups kept in fp32 (None: no int8 passes), and every build tried."""

    keep_fp32: list[str] | None
    steps: list[dict[str, Any]] = field(default_factory=list)


def search(order: Sequence[str], score: Callable[[list[str]], float], floor: float) -> Search:
    """Keep the first k groups of ``order`` (most sensitive first) in fp32 for the smallest k
    whose build scores at least ``floor`` (``score(groups) -> mean cosine``): k = 1, 2, 4, ...
    (at most all but one) until one passes, then bisection between the last failing and the
    first passing k.
    Keeping every group is not int8: when only that would pass, no setting does."""
    result = Search(None)
    tried: dict[int, float] = {}

    def passes(k: int) -> bool:
        if k not in tried:
            tried[k] = score(list(order[:k]))
            result.steps.append({"fp32_groups": k, "mean_cosine": tried[k], "passed": tried[k] >= floor})
        return tried[k] >= floor

    n = len(order)
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
    result.keep_fp32 = list(order[:good])
    return result


def _plan_path(cache_dir: Path, model_digest: str, floor: float) -> Path:
    import hashlib
    import json

    from ..hardware import int8_scheme, isa_key
    from .ort_engine import EXPORT

    key = json.dumps(
        {"model": model_digest, "export": EXPORT, "isa": isa_key(), **int8_scheme(), "floor": floor}, sort_keys=True
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
