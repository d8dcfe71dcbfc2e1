"""The report's pictures: for a job over pictures, WebDataset tars or video frames, the
highest-scored rows of each label and the error rows, each drawn small (at most
:data:`SIDE` pixels, JPEG) and embedded in the page as a ``data:`` URI, the scored
detection's box drawn on it. Pictures come back from the job's inputs as the job read them:
a file of a picture listing by its id, a tar's member by its key, a video's frame by its time.
An input the page cannot reach (moved, or a table's bytes column) is named instead."""

from __future__ import annotations

import base64
import heapq
import io
import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from ..core.media import from_raw_frame, labels_in
from ..core.storage import filesystem

__all__ = ["SIDE", "picture_rows", "thumbnail"]

SIDE = 160
"""The longest side of a thumbnail, in pixels."""
PER_LABEL = 4
"""Rows shown per label."""
LABELS = 12
"""Labels shown, the most frequent first."""
PICTURE_FORMATS = ("images", "webdataset", "video")


def _part_rows(where: str, name: str) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    fs, path = filesystem(f"{where}/{name}")
    if name.endswith(".parquet"):
        with fs.open(path, "rb") as fh:
            table = pq.read_table(fh)
        wanted = [c for c in table.column_names if c not in ("image", "embedding")]
        return list(table.select(wanted).to_pylist())
    if name.endswith(".jsonl"):
        return [json.loads(x) for x in fs.cat_file(path).decode().splitlines() if x.strip()]
    return []


def _box(row: Mapping[str, Any], label: str, score: float) -> list[int] | None:
    for value in row.values():
        if isinstance(value, list):
            for item in value:
                if isinstance(item, dict) and item.get("label") == label and item.get("score") == score:
                    box = item.get("box")
                    return (
                        list(box) if isinstance(box, list) and len(box) == 4 and not isinstance(box[0], list) else None
                    )
    return None


def picture_rows(where: str, job: Mapping[str, Any], parts: Sequence[str]) -> dict[str, list[dict[str, Any]]] | None:
    """Label -> its best rows (``id``, ``score``, ``box``, ``video_id``, ``timestamp_s``), the most
    frequent labels first; None when the job read no pictures."""
    if not any(f.get("format") in PICTURE_FORMATS for f in job.get("inputs", [])):
        return None
    best: dict[str, list[tuple[float, int, dict[str, Any]]]] = {}
    seen: dict[str, int] = {}
    n = 0
    for name in parts:
        for row in _part_rows(where, name):
            for label, score in dict(labels_in(row)).items():
                seen[label] = seen.get(label, 0) + 1
                keep = {k: row.get(k) for k in ("id", "video_id", "timestamp_s")} | {
                    "score": score, "box": _box(row, label, score)}  # fmt: skip
                heap = best.setdefault(label, [])
                n += 1
                (heapq.heappush if len(heap) < PER_LABEL else heapq.heappushpop)(heap, (score, n, keep))
    top = sorted(seen, key=lambda lab: (-seen[lab], lab))[:LABELS]
    return {lab: [r for _s, _n, r in sorted(best[lab], key=lambda x: (-x[0], x[1]))] for lab in top}


def _image_bytes(job: Mapping[str, Any], row: Mapping[str, Any]) -> bytes | None:
    """The picture the job read for ``row`` (an output row, or an error record's id and input)."""
    for f in job.get("inputs", []):
        fmt, uri = f.get("format"), f.get("uri", "")
        if fmt == "images":
            path = _picture_files(uri).get(str(row.get("id")))
            if path is not None:
                fs, p = filesystem(path)
                return bytes(fs.cat_file(p))
        elif fmt == "video" and uri.rsplit("/", 1)[-1] == row.get("video_id") and row.get("timestamp_s") is not None:
            return _frame(uri, float(row["timestamp_s"]))
        elif fmt == "webdataset":
            found = _tar_member(uri, str(row.get("id")))
            if found is not None:
                return found
    return None


@lru_cache(maxsize=8)
def _picture_files(uri: str) -> dict[str, str]:
    """A picture listing's files by id, listed once for the page's thumbnails."""
    from ..sources.images import list_images

    listing = list_images(uri)
    return dict(zip(listing.ids, listing.uris, strict=True))


def _frame(uri: str, t: float) -> bytes | None:
    from ..core.media import raw_frame
    from ..sources.video import open_video

    container, handle = open_video(uri)
    try:
        stream = container.streams.video[0]
        container.seek(int(t / stream.time_base), stream=stream, backward=True, any_frame=False)
        for frame in container.decode(stream):
            if float(frame.time or 0) + 1e-3 >= t:
                return raw_frame(frame.to_ndarray(format="rgb24"))
    finally:
        container.close()
        handle.close()
    return None


def _tar_member(uri: str, key: str) -> bytes | None:
    import tarfile

    from ..core.media import IMAGE_EXTENSIONS

    fs, path = filesystem(uri)
    with fs.open(path, "rb") as fh, tarfile.open(fileobj=fh, mode="r|") as tf:
        for m in tf:
            name = m.name.rsplit(".", 1)
            if m.isfile() and m.name.startswith(key + ".") and ("." + name[-1].lower()) in IMAGE_EXTENSIONS:
                data = tf.extractfile(m)
                return data.read() if data is not None else None
    return None


def thumbnail(job: Mapping[str, Any], row: Mapping[str, Any]) -> str | None:
    """``row``'s picture, small, as a ``data:image/jpeg`` URI (its box drawn); None where the
    picture cannot be had or drawn (a broken file: the error row says why)."""
    from PIL import Image, ImageDraw

    try:
        data = _image_bytes(job, row)
        if data is None:
            return None
        raw = from_raw_frame(data)
        img = Image.fromarray(raw) if raw is not None else Image.open(io.BytesIO(data))
        img.load()
        img = img.convert("RGB")
    except Exception:  # a broken picture (an error row's) or an input moved since: shown as text
        return None
    scale = SIDE / max(img.size)
    small = img.resize((max(1, round(img.width * scale)), max(1, round(img.height * scale))))
    box = row.get("box")
    if box:
        x, y, w, h = (v * scale for v in box)
        ImageDraw.Draw(small).rectangle([x, y, x + w, y + h], outline=(255, 64, 64), width=2)
    buf = io.BytesIO()
    small.save(buf, "JPEG", quality=70)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()
