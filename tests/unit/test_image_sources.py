"""Pictures as rows: a folder, glob or file names a sorted listing; ids are paths relative to the
input's root; shards cover each picture once; a changed listing is refused, never misread."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bulkinfer.config import SourceConfig
from bulkinfer.core.errors import SourceError
from bulkinfer.sources import list_inputs, plan_shards, read_shard
from bulkinfer.sources.images import image_inputs, list_images


def _tree(root: Path) -> None:
    for rel in ("b.jpg", "a.PNG", "sub/c.webp", "sub/deep/d.gif", "notes.txt", "_hidden.jpg", ".dot.jpg"):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rel.encode())


def test_folder_lists_pictures_sorted_with_relative_ids(tmp_path):
    _tree(tmp_path / "photos")
    listing = list_images(str(tmp_path / "photos"))
    assert listing.ids == ("a.PNG", "b.jpg", "sub/c.webp", "sub/deep/d.gif")
    assert listing.uris[2] == str(tmp_path / "photos" / "sub" / "c.webp")


def test_glob_ids_are_relative_to_its_fixed_part(tmp_path):
    _tree(tmp_path / "photos")
    listing = list_images(str(tmp_path / "photos" / "sub" / "**" / "*.*"))
    assert set(listing.ids) == {"c.webp", "deep/d.gif"}
    one = list_images(str(tmp_path / "photos" / "b.jpg"))
    assert one.ids == ("b.jpg",)


def test_listing_hash_follows_content_and_names(tmp_path):
    _tree(tmp_path / "p")
    before = list_images(str(tmp_path / "p")).digest
    assert list_images(str(tmp_path / "p")).digest == before
    (tmp_path / "p" / "e.jpg").write_bytes(b"new")
    assert list_images(str(tmp_path / "p")).digest != before


def test_reading_refuses_a_listing_changed_since_planning(tmp_path):
    _tree(tmp_path / "p")
    (f,) = image_inputs([str(tmp_path / "p")])
    (shard,) = plan_shards([f], 100)
    from bulkinfer.sources import images

    images._LISTINGS.clear()  # another process: it lists again
    (tmp_path / "p" / "aa.jpg").write_bytes(b"inserted before b.jpg")
    with pytest.raises(SourceError, match="changed since the job was planned"):
        list(read_shard(shard, ["id", "image"]))


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 40), shard_rows=st.integers(1, 12))
def test_shards_cover_every_picture_once_in_order(tmp_path_factory, n, shard_rows):
    root = tmp_path_factory.mktemp("pics")
    for i in range(n):
        (root / f"{i:03d}.jpg").write_bytes(bytes([i]))
    shards = plan_shards(image_inputs([str(root)]), shard_rows)
    rows = [r for s in shards for b in read_shard(s, ["id", "image"]) for r in b.to_pylist()]
    assert [r["id"] for r in rows] == [f"{i:03d}.jpg" for i in range(n)]
    assert [r["image"] for r in rows] == [bytes([i]) for i in range(n)]
    assert all(s.num_rows <= shard_rows for s in shards)


def test_a_file_gone_after_listing_is_a_row_error(tmp_path):
    _tree(tmp_path / "p")
    (f,) = image_inputs([str(tmp_path / "p")])
    (shard,) = plan_shards([f], 100)
    (tmp_path / "p" / "b.jpg").unlink()  # this process keeps the planned listing: the read finds it gone
    bad: list[tuple[int, str]] = []
    rows = [
        r for b in read_shard(shard, ["id", "image"], on_bad_row=lambda r, m: bad.append((r, m))) for r in b.to_pylist()
    ]
    assert [r["id"] for r in rows] == ["a.PNG", "sub/c.webp", "sub/deep/d.gif"]
    assert len(bad) == 1 and bad[0][0] == 1 and "b.jpg: cannot read the file" in bad[0][1]


def test_config_reads_picture_paths_as_images_with_id():
    cfg = SourceConfig(paths=["photos/*.jpg", "more/*.PNG"])
    assert cfg.format == "images" and cfg.id_column == "id"
    assert SourceConfig(paths=["t.parquet"]).format == "auto"
    assert SourceConfig(paths=["dir/"], format="images", id_column="path").id_column == "path"


def test_a_folder_of_pictures_without_format_says_what_to_set(tmp_path):
    _tree(tmp_path / "p")
    with pytest.raises(SourceError, match="it holds pictures: pass --set source.format=images"):
        list_inputs([str(tmp_path / "p")])


def test_video_settings_on_other_inputs_are_refused():
    with pytest.raises(ValueError, match="video applies to video inputs, not to format 'parquet'"):
        SourceConfig(paths=["t.parquet"], format="parquet", video={"fps": 2})
    assert SourceConfig(paths=["c/*.mp4"], video={"fps": 2}).format == "video"


def test_an_fsspec_uri_lists_and_reads_like_a_folder():
    import fsspec

    fs = fsspec.filesystem("memory")
    for name in ("b.jpg", "a.png", "sub/c.gif"):
        fs.pipe(f"/pics-uri/{name}", name.encode())
    (f,) = image_inputs(["memory://pics-uri"])
    rows = [r for s in plan_shards([f], 2) for b in read_shard(s, ["id", "path", "image"]) for r in b.to_pylist()]
    assert [(r["id"], r["image"]) for r in rows] == [
        ("a.png", b"a.png"),
        ("b.jpg", b"b.jpg"),
        ("sub/c.gif", b"sub/c.gif"),
    ]
    assert rows[0]["path"] == "memory:///pics-uri/a.png"


def test_a_linked_picture_or_table_is_listed_as_its_target(tmp_path):
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "real.jpg").write_bytes(b"12345")
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "linked.jpg").symlink_to(tmp_path / "store" / "real.jpg")
    (tmp_path / "p" / "plain.jpg").write_bytes(b"x")
    assert list_images(str(tmp_path / "p")).ids == ("linked.jpg", "plain.jpg")
    assert list_images(str(tmp_path / "p" / "*.jpg")).sizes == (5, 1)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1]}), tmp_path / "store" / "t.parquet")
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "t.parquet").symlink_to(tmp_path / "store" / "t.parquet")
    assert [f.uri for f in list_inputs([str(tmp_path / "tables")])] == [str(tmp_path / "tables" / "t.parquet")]
    assert [f.uri for f in list_inputs([str(tmp_path / "tables" / "*.parquet")])] == [
        str(tmp_path / "tables" / "t.parquet")
    ]


def test_picture_batches_are_cut_by_bytes_not_only_by_rows(tmp_path):
    from bulkinfer.sources.shard import BATCH_BYTES

    (tmp_path / "big").mkdir()
    for i in range(10):
        (tmp_path / "big" / f"{i}.jpg").write_bytes(bytes([i]) * (8 << 20))
    (shard,) = plan_shards(image_inputs([str(tmp_path / "big")]), 100)
    batches = list(read_shard(shard, ["id", "image"], batch_rows=4096))
    assert sum(b.num_rows for b in batches) == 10 and len(batches) >= 3  # 4,096 rows a batch would be one of 80 MB
    assert all(b.column("image").nbytes <= BATCH_BYTES + (8 << 20) for b in batches)


def test_the_video_summary_has_every_video_and_label():
    from bulkinfer.commit.videos import summarize_videos

    rows = [
        {"video_id": "a.mp4", "timestamp_s": 0.0, "detections": [{"label": "FACE", "score": 0.4}]},
        {
            "video_id": "a.mp4",
            "timestamp_s": 0.5,
            "detections": [{"label": "FACE", "score": 0.9}, {"label": "FACE", "score": 0.2}],
        },
        {"video_id": "a.mp4", "timestamp_s": 1.0, "detections": []},
        {"video_id": "b.mp4", "timestamp_s": 0.0, "detections": []},
    ]
    table = summarize_videos(rows).to_pylist()
    assert table == [
        {
            "video_id": "a.mp4",
            "label": "FACE",
            "max_score": 0.9,
            "first_s": 0.0,
            "last_s": 0.5,
            "frames": 2,
            "video_frames": 3,
        },
        {
            "video_id": "b.mp4",
            "label": None,
            "max_score": None,
            "first_s": None,
            "last_s": None,
            "frames": 0,
            "video_frames": 1,
        },
    ]
