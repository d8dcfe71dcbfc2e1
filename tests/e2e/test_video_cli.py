"""Videos: frames sampled at source.video.fps, each row's frame the one shown at its timestamp,
a long video over several shards, every frame once across a kill -9, the per-video summary
complete, and the broken videos of the issue as error records while the job completes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from helpers import BULKINFER, read_output
from pictures import write_audio_only, write_video

BAND = """
import numpy as np

from bulkinfer.adapters.image import ImageAdapter


class Band(ImageAdapter):
    # where the drawn band is (which frame this is), and a label for its half of the picture
    def predict(self, images):
        numbers = [int(np.argmax(im[:, :, 0].mean(axis=0) > 128) // 4) for im in images]
        labels = [[{"label": "left" if n * 4 < 80 else "right", "score": n / 100}] for n in numbers]
        return {"band": numbers, "labels": labels}
"""


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    root = tmp_path_factory.mktemp("video")
    (root / "band_adapter.py").write_text(BAND)
    write_video(root / "clips" / "long.mkv", 6.0)
    write_video(root / "clips" / "short.mkv", 2.0)
    (root / "clips" / "junk.mkv").write_text("not a video")
    write_audio_only(root / "clips" / "audio.mkv")
    whole = root / "tail.mkv"
    write_video(whole, 6.0)
    data = whole.read_bytes()
    (root / "clips" / "cut.mkv").write_bytes(data[: int(len(data) * 0.5)])  # the tail lost
    return root


def _run(root: Path, out: str, env: dict | None = None) -> subprocess.CompletedProcess:
    args = ["run", "--input", "clips/*.mkv", "--model", "band_adapter:Band", "--output", out,
            "--set", "source.video.fps=2", "--set", "source.shard_rows=4", "--set", "execution.max_errors=20"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(root), **(env or {})}
    return subprocess.run([*BULKINFER, *args], cwd=root, env=env, capture_output=True, text=True)


def test_frames_timestamps_and_summary(clips):
    proc = _run(clips, "out")
    assert proc.returncode == 0, proc.stderr
    rows = read_output(clips / "out").to_pylist()
    by_video: dict[str, list[dict]] = {}
    for r in rows:
        by_video.setdefault(r["video_id"], []).append(r)
    assert [r["timestamp_s"] for r in sorted(by_video["long.mkv"], key=lambda r: r["timestamp_s"])] == [
        k / 2 for k in range(12)
    ]
    assert len(by_video["short.mkv"]) == 4
    for r in rows:
        assert r["id"] == f"{r['video_id']}#{r['frame_index']}"
        assert r["frame_index"] == round(r["timestamp_s"] * 10)
        assert r["band"] == r["frame_index"] % 38  # the decoded frame is the one shown at that time
    cut = sorted(r["timestamp_s"] for r in by_video.get("cut.mkv", []))
    assert cut and cut == [k / 2 for k in range(len(cut))] and len(cut) < 12  # the frames before the break kept
    errors = [json.loads(x) for f in (clips / "out" / "_errors").iterdir() for x in f.read_text().splitlines()]
    assert any("junk.mkv: not a video FFmpeg can read" in e["message"] for e in errors)
    assert any(e["message"].endswith("audio.mkv: the file has no video stream") for e in errors)
    cut_errors = [e for e in errors if e["message"].startswith("cut.mkv at ")]
    assert len(cut_errors) == 12 - len(cut)
    summary = {(s["video_id"], s["label"]): s for s in pq.read_table(clips / "out" / "_videos.parquet").to_pylist()}
    for (video, label), s in summary.items():
        frames = [r for r in by_video[video] if r["labels"][0]["label"] == label]
        assert s["frames"] == len(frames) and s["video_frames"] == len(by_video[video])
        assert s["max_score"] == max(r["labels"][0]["score"] for r in frames)
        assert (s["first_s"], s["last_s"]) == (
            min(r["timestamp_s"] for r in frames),
            max(r["timestamp_s"] for r in frames),
        )
    assert {v for v, _ in summary} == set(by_video)


@pytest.mark.parametrize("point", ["part-temp-written:2", "exported:4"])
def test_kill_9_every_frame_once(clips, point):
    out = "killed-" + point.split(":")[0]
    first = _run(clips, out, {"BULKINFER_CRASH_AT": point})
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert not (clips / out / "_videos.parquet").exists()
    again = _run(clips, out)
    assert again.returncode == 0, again.stderr
    ids = read_output(clips / out).column("id").to_pylist()
    assert len(ids) == len(set(ids))
    reference = _run(clips, "reference")
    assert reference.returncode == 0
    assert sorted(ids) == sorted(read_output(clips / "reference").column("id").to_pylist())
    assert (clips / out / "_videos.parquet").read_bytes() == (clips / "reference" / "_videos.parquet").read_bytes()
