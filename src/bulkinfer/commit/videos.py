"""The per-video summary of a finished job over video frames: ``_videos.parquet`` beside the
frame rows (a ``_`` name: readers of the frames never mix it in), one row per video and label:
the label's highest score, the first and last time it was seen, the frames it was seen in, and
the video's frames in the output (a video in which no label was seen: one row, its label
null). Written by the finish step from the committed parts, after every video's last frame
committed, by one atomic write (a rerun of the finish writes the same file again, so it is
there once whatever was killed)."""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from ..core.media import labels_in
from .ledger import OutputLedger

__all__ = ["VIDEO_SUMMARY", "summarize_videos", "write_video_summary"]

VIDEO_SUMMARY = "_videos.parquet"
SCHEMA = pa.schema(
    [("video_id", pa.string()), ("label", pa.string()), ("max_score", pa.float64()), ("first_s", pa.float64()),
     ("last_s", pa.float64()), ("frames", pa.int64()), ("video_frames", pa.int64())]
)  # fmt: skip


def summarize_videos(rows: Iterable[dict[str, Any]]) -> pa.Table:
    """The summary of frame rows (each with ``video_id`` and ``timestamp_s``)."""
    seen: dict[tuple[str, str], list[Any]] = {}
    frames: dict[str, int] = {}
    for row in rows:
        video, t = row["video_id"], float(row["timestamp_s"])
        frames[video] = frames.get(video, 0) + 1
        best: dict[str, float] = {}
        for label, score in labels_in(row):
            best[label] = max(score, best.get(label, score))
        for label, score in best.items():
            s = seen.setdefault((video, label), [score, t, t, 0])
            s[0], s[1], s[2], s[3] = max(s[0], score), min(s[1], t), max(s[2], t), s[3] + 1
    out = [
        {"video_id": v, "label": lab, "max_score": s[0], "first_s": s[1], "last_s": s[2], "frames": s[3],
         "video_frames": frames[v]}
        for (v, lab), s in sorted(seen.items())
    ]  # fmt: skip
    labelled = {v for v, _ in seen}
    out += [{"video_id": v, "label": None, "frames": 0, "video_frames": n} for v, n in sorted(frames.items())
            if v not in labelled]  # fmt: skip
    return pa.Table.from_pylist(out, schema=SCHEMA)


def _rows(ledger: OutputLedger, part: str) -> list[dict[str, Any]]:
    data = ledger.read_part(part)
    if part.endswith(".parquet"):
        import pyarrow.parquet as pq

        return list(pq.read_table(io.BytesIO(data)).to_pylist())
    import json

    return [json.loads(line) for line in data.decode().splitlines() if line.strip()]


def write_video_summary(ledger: OutputLedger, parts: Iterable[str]) -> None:
    """``_videos.parquet`` from the committed ``parts`` (Parquet or JSONL)."""
    import pyarrow.parquet as pq

    table = summarize_videos(row for part in sorted(parts) for row in _rows(ledger, part))
    buf = io.BytesIO()
    pq.write_table(table, buf)
    ledger.write_file(VIDEO_SUMMARY, buf.getvalue())
