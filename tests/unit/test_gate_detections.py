"""The gate's measure for detectors: boxes matched by label and IoU >= 0.9, boxes lost and boxes
added both counted."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bulkinfer.precision.detections import compare_detections, iou


def _d(label: str, box: list[int], score: float = 0.5) -> dict:
    return {"label": label, "box": box, "score": score}


def test_iou():
    assert iou([0, 0, 10, 10], [0, 0, 10, 10]) == 1.0
    assert iou([0, 0, 10, 10], [5, 0, 10, 10]) == pytest.approx(50 / 150)
    assert iou([0, 0, 10, 10], [20, 20, 5, 5]) == 0.0


def test_matches_count_lost_added_and_relabelled_boxes():
    ref = [[_d("FACE", [10, 10, 100, 100]), _d("FEET", [200, 0, 50, 50])], [], [_d("FACE", [0, 0, 40, 40])]]
    same = compare_detections(ref, ref)
    assert same == {"boxes_matched": 1.0, "rows_identical": 1.0, "boxes_fp32": 3, "boxes": 3}
    nudged = [[_d("FACE", [11, 10, 100, 100], 0.51), _d("FEET", [200, 0, 50, 50])], [], [_d("FACE", [0, 0, 40, 40])]]
    assert compare_detections(ref, nudged)["boxes_matched"] == 1.0  # IoU 0.98: the same box
    assert compare_detections(ref, nudged)["rows_identical"] == pytest.approx(2 / 3)
    lost = [[_d("FACE", [10, 10, 100, 100])], [], [_d("FACE", [0, 0, 40, 40])]]
    assert compare_detections(ref, lost)["boxes_matched"] == pytest.approx(2 / 3)
    added = [*ref[:1], [_d("BELLY", [1, 1, 5, 5])], ref[2]]
    assert compare_detections(ref, added)["boxes_matched"] == pytest.approx(3 / 4)
    relabelled = [[_d("FACE", [10, 10, 100, 100]), _d("HAND", [200, 0, 50, 50])], [], ref[2]]
    assert compare_detections(ref, relabelled)["boxes_matched"] == pytest.approx(2 / 3)
    assert compare_detections([[], []], [[], []])["boxes_matched"] == 1.0


@given(
    st.lists(st.tuples(st.integers(0, 200), st.integers(0, 200), st.integers(1, 80), st.integers(1, 80)), max_size=6)
)
def test_a_row_matches_itself_whatever_its_boxes(boxes):
    row = [_d("X", list(b)) for b in boxes]
    assert compare_detections([row], [list(reversed(row))])["boxes_matched"] == 1.0
