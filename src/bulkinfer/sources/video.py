"""Videos as rows of sampled frames (PyAV, whose wheels carry FFmpeg).

Sampling (``source.video``): ``fps`` frames a second (row ``k`` is the first frame shown at or
after ``k / fps`` seconds), or ``keyframes = true`` (row ``k`` is the ``k``-th keyframe). Planning
opens each video once (its length, frame rate and, for keyframes, its packets: nothing
decoded) and cuts its rows into shards of ``source.shard_rows``, so a long video spans several
shards by time range; each shard seeks to its first time and decodes forward.

Each row: ``id`` (``<video id>#<frame index>``), ``video_id`` (the file's name), ``timestamp_s``,
``frame_index`` (the frame's number in the video at its average rate) and ``image`` (the decoded
frame, raw RGB: :func:`~bulkinfer.core.media.raw_frame`). A video without a video stream fails at
planning (an input error; the others run); frames a broken tail keeps from being decoded are
error rows naming the video and the time, and the frames before them are kept.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from functools import lru_cache
from typing import Any

import pyarrow as pa

from ..core.errors import SourceError
from ..core.media import VIDEO_EXTENSIONS, raw_frame
from ..core.storage import filesystem, listed_version
from .shard import BATCH_BYTES, MAX_RECORD_BYTES, ROW, BadRow, InputFile, Shard, Span

__all__ = ["VideoFormat", "open_video", "sampling_spec"]

SCHEMA = pa.schema(
    [("id", pa.string()), ("video_id", pa.string()), ("timestamp_s", pa.float64()), ("frame_index", pa.int64()),
     ("image", pa.binary())]
)  # fmt: skip


def sampling_spec(fps: float, keyframes: bool) -> str:
    """How a video's rows are sampled, as its input and shards carry it (``fps=2.0``, ``keyframes``)."""
    return "keyframes" if keyframes else f"fps={fps!r}"


def _fps(spec: str | None) -> float | None:
    if spec == "keyframes":
        return None
    if spec and spec.startswith("fps="):
        return float(spec[4:])
    raise SourceError(f"the video's sampling {spec!r} is not known; plan the job again")


def open_video(uri: str) -> tuple[Any, Any]:
    import av

    fs, path = filesystem(uri)
    handle = fs.open(path, "rb")
    try:
        container = av.open(handle)
    except (av.error.FFmpegError, ValueError) as exc:
        handle.close()
        raise SourceError(f"{uri}: not a video FFmpeg can read ({exc})", uri) from None
    if not container.streams.video:
        container.close()
        handle.close()
        raise SourceError(f"{uri}: the file has no video stream", uri)
    return container, handle


@lru_cache(maxsize=64)
def _probe(uri: str, version: str, spec: str) -> tuple[float, float, tuple[float, ...]]:
    """Duration (s), average frame rate, and the sample times (``version``: the file's, so a
    rewritten file is probed again)."""
    container, handle = open_video(uri)
    try:
        stream = container.streams.video[0]
        rate = float(stream.average_rate or stream.guessed_rate or 0) or 25.0
        if stream.duration is not None and stream.time_base is not None:
            duration = float(stream.duration * stream.time_base)
        else:
            duration = (container.duration or 0) / 1e6
        fps = _fps(spec)
        if fps is None:
            packets = container.demux(stream)
            times = sorted({float(p.pts * p.time_base) for p in packets if p.is_keyframe and p.pts is not None})
            return duration, rate, tuple(times)
        if fps > rate + 1e-6:
            raise SourceError(
                f"{uri}: source.video.fps = {fps} is over the video's own {rate:g} frames a second "
                "(rows would repeat frames); lower it",
                uri,
            )
        n = max(1, math.ceil(duration * fps - 1e-9)) if duration > 0 else 0
        return duration, rate, tuple(k / fps for k in range(n))
    finally:
        container.close()
        handle.close()


class VideoFormat:
    """Sampled video frames (see the module's docstring)."""

    name = "video"
    extensions: tuple[str, ...] = VIDEO_EXTENSIONS

    def plan(self, f: InputFile, shard_rows: int, max_record: int = MAX_RECORD_BYTES) -> list[Span]:
        _duration, _rate, times = _probe(f.uri, f.version, f.encoding or "")
        return [Span(start, min(start + shard_rows, len(times))) for start in range(0, len(times), shard_rows)]

    def head_schema(self, f: InputFile) -> pa.Schema:
        return SCHEMA

    def read(
        self, shard: Shard, columns: Sequence[str], batch_rows: int, bad: BadRow, types: Mapping[str, pa.DataType]
    ) -> Iterator[pa.RecordBatch]:
        video_id = shard.uri.rstrip("/").rsplit("/", 1)[-1]
        rows: list[dict[str, Any]] = []
        size = 0
        for row, frame in _frames(shard, bad, video_id):
            rows.append({**frame, ROW: row})
            size += len(frame["image"])
            if len(rows) >= batch_rows or size >= BATCH_BYTES:  # a raw 1080p frame is 6 MB
                yield _batch(rows, columns)
                rows, size = [], 0
        if rows:
            yield _batch(rows, columns)


def _frames(shard: Shard, bad: BadRow, video_id: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """The shard's sampled frames: (row, columns), in order; rows not reached are reported to ``bad``."""
    import av

    _duration, rate, times = _probe(shard.uri, _version(shard.uri), shard.encoding or "")
    targets = list(enumerate(times[shard.start : shard.stop], start=shard.start))
    if not targets:  # a split shard's empty tail
        return
    container, handle = open_video(shard.uri)
    at = 0
    try:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        container.seek(int(targets[0][1] / stream.time_base), stream=stream, backward=True, any_frame=False)
        for frame in container.decode(stream):
            t = float(frame.time or 0.0)
            if at < len(targets) and t + 1e-3 >= targets[at][1]:
                index = round(t * rate)
                rgb = frame.to_ndarray(format="rgb24")
                columns = {"id": f"{video_id}#{index}", "video_id": video_id, "timestamp_s": round(t, 6),
                           "frame_index": index, "image": raw_frame(rgb)}  # fmt: skip
                while at < len(targets) and t + 1e-3 >= targets[at][1]:
                    yield targets[at][0], columns
                    at += 1
            if at >= len(targets):
                return
        why = "the video ends before it"
    except av.error.FFmpegError as exc:
        why = f"the video cannot be decoded there ({exc})"
    finally:
        container.close()
        handle.close()
    for row, t in targets[at:]:
        bad(row, f"{video_id} at {t:.3f}s: {why}")


def _version(uri: str) -> str:
    fs, path = filesystem(uri)
    return listed_version(fs.info(path))


def _batch(rows: list[dict[str, Any]], columns: Sequence[str]) -> pa.RecordBatch:
    data = {c: pa.array([r[c] for r in rows], SCHEMA.field(c).type) for c in columns if c in SCHEMA.names}
    data[ROW] = pa.array([r[ROW] for r in rows], pa.int64())
    return pa.RecordBatch.from_pydict(data)
