"""The quality gate's measure for detection models: how many boxes a lowered precision finds
as fp32 does. A box of the reference is matched by a box of the candidate with the same label
and an intersection over union of at least :data:`MIN_IOU` (each used once, best first); the
share matched counts the boxes either side found, so boxes lost and boxes added both lower it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["MIN_IOU", "compare_detections", "iou"]

MIN_IOU = 0.9


def iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union of two ``[x, y, width, height]`` boxes."""
    ax2, ay2, bx2, by2 = a[0] + a[2], a[1] + a[3], b[0] + b[2], b[1] + b[3]
    w = max(0.0, min(ax2, bx2) - max(a[0], b[0]))
    h = max(0.0, min(ay2, by2) - max(a[1], b[1]))
    inter = w * h
    union = a[2] * a[3] + b[2] * b[3] - inter
    return inter / union if union > 0 else float(a == b)


def _matched(ref: Sequence[dict[str, Any]], got: Sequence[dict[str, Any]]) -> int:
    pairs = sorted(
        (
            (iou(r["box"], g["box"]), i, j)
            for i, r in enumerate(ref)
            for j, g in enumerate(got)
            if r["label"] == g["label"]
        ),
        reverse=True,
    )
    used_r: set[int] = set()
    used_g: set[int] = set()
    for overlap, i, j in pairs:
        if overlap < MIN_IOU:
            break
        if i not in used_r and j not in used_g:
            used_r.add(i)
            used_g.add(j)
    return len(used_r)


def compare_detections(ref: Sequence[Any], got: Sequence[Any]) -> dict[str, float]:
    """``boxes_matched`` (matched boxes over the larger of the two counts, 1.0 with no box at all),
    ``rows_identical`` (rows whose labels and boxes are all the same) and the box counts."""
    matched = total_ref = total_got = same = 0
    for r, g in zip(ref, got, strict=True):
        r, g = ([] if r is None else list(r)), ([] if g is None else list(g))
        matched += _matched(r, g)
        total_ref, total_got = total_ref + len(r), total_got + len(g)
        same += [(d["label"], list(d["box"])) for d in r] == [(d["label"], list(d["box"])) for d in g]
    most = max(total_ref, total_got)
    return {
        "boxes_matched": round(matched / most, 6) if most else 1.0,
        "rows_identical": round(same / len(ref), 6) if len(ref) else 1.0,
        "boxes_fp32": total_ref,
        "boxes": total_got,
    }
