"""Pictures: bulkinfer against what NudeNet's and RapidOCR's users write, same pictures, same
model, one run, ratios printed beside the CPU's flags.

    python bench/bench_images.py [N_PHOTOS] [--ocr-pages K] [--no-ray]

Photos: skimage's, re-encoded as JPEG at 1-2 megapixels (sizes vary), written once under
bench/_work/images. Anchors for NudeNet's detector (its own 320n.onnx in every row):
- a loop over ``NudeDetector().detect(path)``, what its users write;
- a PyTorch ``DataLoader(num_workers=2)`` decoding with NudeNet's own ``_read_image``, batches
  of 8 into one ONNX Runtime session;
- Ray Data's documented pattern: ``read_images`` + ``map_batches`` with the model in a class
  (the same preprocessing, the same session), ``take_all``;
- bulkinfer: ``run_job`` of ``--model nudenet`` into a fresh output (decode pool + batches).
OCR: a loop over ``RapidOCR()(path)`` against bulkinfer's ``--model ocr`` on drawn text pages,
texts compared. Each figure says which decode ran (all: exact, Pillow/OpenCV full size).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
WORK = HERE / "_work" / "images"
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "cat", "camera", "immunohistochemistry", "hubble_deep_field")


def make_photos(n: int) -> list[Path]:
    from PIL import Image

    from pictures import photo

    folder = WORK / f"photos-{n}"
    if folder.exists() and len(list(folder.glob("*.jpg"))) == n:
        return sorted(folder.glob("*.jpg"))
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    bases = [Image.fromarray(photo(p)) for p in PHOTOS]
    for i in range(n):
        base = bases[i % len(bases)]
        megapixels = rng.uniform(1.0, 2.0)
        k = (megapixels * 1e6 / (base.size[0] * base.size[1])) ** 0.5
        base.resize((int(base.size[0] * k), int(base.size[1] * k))).save(folder / f"{i:06d}.jpg", quality=90)
    return sorted(folder.glob("*.jpg"))


def loop_nudenet(paths: list[Path]) -> tuple[float, list]:
    from nudenet import NudeDetector

    det = NudeDetector()
    t0 = time.perf_counter()
    out = [det.detect(str(p)) for p in paths]
    return time.perf_counter() - t0, out


class _Files:
    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        from nudenet.nudenet import _read_image

        blob, *meta = _read_image(str(self.paths[i]), 320)
        return blob[0], np.array(meta, dtype=np.float64)


def dataloader_nudenet(paths: list[Path]) -> float:
    import onnxruntime as ort
    import torch
    from nudenet import nudenet as nn

    session = ort.InferenceSession(str(Path(nn.__file__).parent / "320n.onnx"))
    loader = torch.utils.data.DataLoader(_Files(paths), batch_size=8, num_workers=2)
    t0 = time.perf_counter()
    for blobs, metas in loader:
        out = session.run(None, {"images": blobs.numpy()})[0]
        for j, m in enumerate(metas.numpy()):
            x_ratio, y_ratio, x_pad, y_pad, w, h = m
            nn._postprocess([out[j : j + 1]], x_pad, y_pad, x_ratio, y_ratio, w, h, 320, 320)
    return time.perf_counter() - t0


class _RayModel:
    def __init__(self) -> None:
        import onnxruntime as ort
        from nudenet import nudenet as nn

        self.nn = nn
        self.session = ort.InferenceSession(str(Path(nn.__file__).parent / "320n.onnx"))

    def __call__(self, batch: dict) -> dict:
        import cv2

        blobs, metas = [], []
        for image in batch["image"]:
            blob, *meta = self.nn._read_image(cv2.cvtColor(image, cv2.COLOR_RGB2BGR), 320)
            blobs.append(blob)
            metas.append(meta)
        out = self.session.run(None, {"images": np.vstack(blobs)})[0]
        found = []
        for j, (x_ratio, y_ratio, x_pad, y_pad, w, h) in enumerate(metas):
            found.append(len(self.nn._postprocess([out[j : j + 1]], x_pad, y_pad, x_ratio, y_ratio, w, h, 320, 320)))
        return {"n": np.array(found)}


def ray_nudenet(folder: Path) -> float:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        t0 = time.perf_counter()
        ds = ray.data.read_images(str(folder), mode="RGB")
        ds.map_batches(_RayModel, batch_size=8, concurrency=1).take_all()
        return time.perf_counter() - t0
    finally:
        ray.shutdown()


def bulkinfer_run(paths_glob: str, model: str, out: Path, **sections: dict) -> tuple[float, dict]:
    from bulkinfer import load_config, run_job

    shutil.rmtree(out, ignore_errors=True)
    cfg = load_config(None, {"source": {"paths": [paths_glob], **sections.get("source", {})}, "model": {"name": model},
                             "sink": {"path": str(out)}, "execution": {"progress": "none"},
                             "runtime": sections.get("runtime", {})})  # fmt: skip
    t0 = time.perf_counter()
    result = run_job(cfg)
    return time.perf_counter() - t0, result.report


def ocr_pages(k: int) -> Path:
    from pictures import text_page

    folder = WORK / f"pages-{k}"
    if folder.exists() and len(list(folder.glob("*.png"))) == k:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    words = ["invoice", "total", "due", "batch", "inference", "exactly", "once", "resume", "shard", "ledger"]
    rng = np.random.default_rng(1)
    for i in range(k):
        lines = [" ".join(rng.choice(words, 3)) + f" {rng.integers(100, 9999)}" for _ in range(4)]
        text_page(lines, 32).save(folder / f"{i:05d}.png")
    return folder


def bench_ocr(k: int) -> None:
    import pyarrow.parquet as pq
    from rapidocr_onnxruntime import RapidOCR

    folder = ocr_pages(k)
    paths = sorted(folder.glob("*.png"))
    engine = RapidOCR()
    t0 = time.perf_counter()
    theirs = {p.name: "\n".join(r[1] for r in (engine(str(p))[0] or [])) for p in paths}
    loop = time.perf_counter() - t0
    seconds, _report = bulkinfer_run(str(folder / "*.png"), "ocr", WORK / "out-ocr")
    parts = sorted((WORK / "out-ocr").glob("part-*.parquet"))
    ours = {r["id"]: r["text"] for f in parts for r in pq.read_table(f).to_pylist()}
    same = sum(ours.get(name) == text for name, text in theirs.items())
    print(f"\nOCR, {k} drawn pages (exact decode):")
    print(f"  RapidOCR() loop          {k / loop:7.2f} pages/s  1.00x")
    print(f"  bulkinfer --model ocr    {k / seconds:7.2f} pages/s  {loop / seconds:.2f}x", end="")
    print(f"  (text identical on {same}/{k})")


def bench_bf16(paths: list[Path], loop: float, n: int) -> None:
    """bf16 twice into fresh outputs: the first run pays for the gate (its fp32 reference pass),
    the second finds the gate's verdict kept for this machine kind and runs without it."""
    for run in ("gate run here", "gate's verdict kept"):
        seconds, report = bulkinfer_run(str(paths[0].parent / "*.jpg"), "nudenet", WORK / "out-bf16",
                                        runtime={"precision": "bf16", "engine": "openvino"})  # fmt: skip
        q = report.get("quality") or {}
        label = f"bulkinfer bf16 on OpenVINO ({run})"
        print(
            f"  {label:38s} {n / seconds:7.1f} photos/s  {loop / seconds:.2f}x the loop  (gate: boxes_matched "
            f"{q.get('boxes_matched')} on {q.get('rows')} rows, passed {q.get('passed')}, {q.get('gate_s')} s)"
        )


def make_video(seconds: int) -> Path:
    import av

    path = WORK / f"video-{seconds}s.mp4"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(2)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = 1280, 720, "yuv420p"
        stream.codec_context.gop_size = 60
        base = rng.integers(0, 255, (720, 1280, 3), np.uint8)
        for i in range(seconds * 30):
            frame = np.roll(base, i * 8, axis=1)
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def pyav_loop(path: Path, fps: float) -> tuple[float, int]:
    """PyAV's bare seek-and-decode loop: for each sample time, seek, decode to it, take the frame."""
    import av

    t0 = time.perf_counter()
    n = 0
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        duration = float(stream.duration * stream.time_base)
        k = 0
        while k / fps < duration:
            t = k / fps
            container.seek(int(t / stream.time_base), stream=stream, backward=True, any_frame=False)
            for frame in container.decode(stream):
                if frame.time is not None and frame.time + 1e-3 >= t:
                    frame.to_ndarray(format="rgb24")
                    n += 1
                    break
            k += 1
    return time.perf_counter() - t0, n


def bench_video(seconds: int) -> None:
    path = make_video(seconds)
    (WORK / "clips").mkdir(exist_ok=True)
    link = WORK / "clips" / path.name
    if not link.exists():
        link.symlink_to(path)
    loop, n = pyav_loop(path, 1.0)
    ours, report = bulkinfer_run(str(WORK / "clips" / "*.mp4"), "bench_models:Nothing", WORK / "out-video",
                                 source={"video": {"fps": 1.0}, "shard_rows": 30})  # fmt: skip
    rows = report["rows_out"]
    print(f"\nVideo, {seconds} s of 1280x720 H.264 at 30 fps, sampled at 1 fps (a model that does nothing):")
    print(f"  PyAV seek-and-decode loop  {n / loop:7.1f} frames/s")
    print(f"  bulkinfer                  {rows / ours:7.1f} frames/s  {(rows / ours) / (n / loop):.2f}x  ({rows} rows)")


def bench_memory(n: int, big: int) -> None:
    """Peak memory (the process's VmHWM) of bulkinfer over n and over ``big`` photos, each in its own process."""
    import subprocess

    peaks = {}
    for count in (n, big):
        folder = make_photos(count)[0].parent
        code = (f"import sys; sys.argv=['bench']; sys.path.insert(0, {str(HERE)!r}); import bench_images as b; "
                f"b.bulkinfer_run({str(folder / '*.jpg')!r}, 'nudenet', b.WORK / 'out-mem'); "
                "print([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1])")  # fmt: skip
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        peaks[count] = int(out.split()[-1]) / 1024
    print(
        f"\nPeak memory: {n} photos {peaks[n]:.0f} MiB, {big} photos {peaks[big]:.0f} MiB "
        f"({peaks[big] / peaks[n] - 1:+.0%})"
    )


def main() -> None:
    from machine import describe

    parser = argparse.ArgumentParser()
    parser.add_argument("photos", type=int, nargs="?", default=2000)
    parser.add_argument("--ocr-pages", type=int, default=60)
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--bf16", action="store_true", help="also bf16 on OpenVINO (gated; CPUs with bf16 only)")
    parser.add_argument("--video-s", type=int, default=0, help="seconds of 720p video for the frame-sampling figure")
    parser.add_argument("--memory", type=int, default=0, help="peak memory at N photos and at this many")
    args = parser.parse_args()
    print(describe())
    paths = make_photos(args.photos)
    n = len(paths)
    print(f"{n} JPEG photos, 1-2 megapixels (skimage's, re-encoded); NudeNet 320n; decode: exact (full size)")
    loop, _ = loop_nudenet(paths)
    figures = {"NudeDetector.detect loop": loop, "DataLoader(num_workers=2)": dataloader_nudenet(paths)}
    if not args.no_ray:
        figures["Ray Data read_images + map_batches"] = ray_nudenet(paths[0].parent)
    ours, report = bulkinfer_run(str(paths[0].parent / "*.jpg"), "nudenet", WORK / "out-nudenet")
    figures["bulkinfer --model nudenet"] = ours
    for name, seconds in figures.items():
        print(f"  {name:38s} {n / seconds:7.1f} photos/s  bulkinfer is {seconds / ours:.2f}x this")
    busy = report["time_s"]["infer"] / report["run_s"]
    print(f"  bulkinfer time split: {report['time_share']} (model busy {busy:.0%} of the run)")
    if args.bf16:
        bench_bf16(paths, loop, n)
    if args.video_s:
        bench_video(args.video_s)
    if args.ocr_pages:
        bench_ocr(args.ocr_pages)
    if args.memory:
        bench_memory(n, args.memory)


if __name__ == "__main__":
    main()
