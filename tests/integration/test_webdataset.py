"""WebDataset tars: one row per key with its sidecar's fields as columns, a large tar read by
several shards (each its own byte range), a key without a picture one error row, and the same
answers as the pictures run one by one."""

from __future__ import annotations

import json

from bulkinfer.sources import list_inputs, plan_shards, read_shard

from helpers import cli, read_output
from pictures import write_photos, write_webdataset


def test_a_tar_is_cut_into_member_ranges_each_key_once(tmp_path):
    write_photos(tmp_path / "photos", 3, scale=0.1)
    keys = [f"{i:05d}" for i in range(23)]
    write_webdataset(tmp_path / "a.tar", keys, tmp_path / "photos", missing_image="00007")
    shards = plan_shards(list_inputs([str(tmp_path / "a.tar")]), 5)
    assert [(s.start, s.stop) for s in shards] == [(0, 5), (5, 10), (10, 15), (15, 20), (20, 23)]
    bad: list[tuple[int, str]] = []
    rows = [
        r
        for s in shards
        for b in read_shard(s, ["id", "text", "width", "image"], on_bad_row=lambda r, m: bad.append((r, m)))
        for r in b.to_pylist()
    ]
    assert [r["id"] for r in rows] == [k for k in keys if k != "00007"]
    assert rows[8]["text"] == "caption 9" and rows[8]["width"] == 109
    assert bad == [(7, "00007: the sample has no picture member (has json, txt)")]
    whole = (tmp_path / "photos" / sorted(p.name for p in (tmp_path / "photos").iterdir())[0]).read_bytes()
    assert rows[0]["image"] == whole


def test_run_over_tars_matches_the_folder_run(tmp_path):
    names = write_photos(tmp_path / "photos", 6, scale=0.4)
    keys = [n.removesuffix(".jpg") for n in names]
    write_webdataset(tmp_path / "shards" / "00000.tar", keys[:4], tmp_path / "photos")
    write_webdataset(
        tmp_path / "shards" / "00001.tar", [*keys[4:], "nopic"], tmp_path / "photos", missing_image="nopic"
    )
    # the first tar's key i holds the folder's photo i
    run = cli("run", "--input", "shards/*.tar", "--model", "nudenet", "--output", "out", "--keep-columns", "url",
              "--set", "source.shard_rows=2", cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr
    folder = cli("run", "--input", "photos/*.jpg", "--model", "nudenet", "--output", "ref", cwd=tmp_path)
    assert folder.returncode == 0, folder.stderr
    got = {r["id"]: r for r in read_output(tmp_path / "out").to_pylist()}
    ref = {r["id"].removesuffix(".jpg"): r["detections"] for r in read_output(tmp_path / "ref").to_pylist()}
    assert {k: got[k]["detections"] for k in keys[:4]} == {k: ref[k] for k in keys[:4]}
    assert got[keys[0]]["url"] == f"https://example.com/{keys[0]}"
    errors = [json.loads(x) for f in (tmp_path / "out" / "_errors").iterdir() for x in f.read_text().splitlines()]
    assert [e["message"] for e in errors] == ["nopic: the sample has no picture member (has json, txt)"]


def test_a_resumed_tail_of_a_tar_shard_reads_its_own_rows(tmp_path):
    from dataclasses import replace

    write_photos(tmp_path / "photos", 2, scale=0.1)
    write_webdataset(tmp_path / "a.tar", [f"k{i}" for i in range(8)], tmp_path / "photos")
    (first, second) = plan_shards(list_inputs([str(tmp_path / "a.tar")]), 4)
    tail = replace(second, start=6)  # rows 4 and 5 committed before a stop: the shard resumes at row 6
    rows = [r for b in read_shard(tail, ["id"]) for r in b.to_pylist()]
    assert [r["id"] for r in rows] == ["k6", "k7"] and second.base == 4 and first.base == 0


def test_video_frame_batches_are_cut_by_bytes(tmp_path):
    from bulkinfer.config import SourceConfig
    from bulkinfer.sources.shard import BATCH_BYTES

    from pictures import write_video

    write_video(tmp_path / "v.mkv", 5.0, rate=10, size=(640, 480))
    cfg = SourceConfig(paths=[str(tmp_path / "v.mkv")], video={"fps": 10})
    (shard,) = plan_shards(list_inputs(cfg.paths, cfg.format, cfg), 1000)
    batches = list(read_shard(shard, ["id", "image"], batch_rows=4096))
    assert sum(b.num_rows for b in batches) == 50 and len(batches) >= 2  # 50 raw frames of 0.9 MB
    assert all(b.column("image").nbytes <= BATCH_BYTES + 640 * 480 * 3 + 64 for b in batches)
