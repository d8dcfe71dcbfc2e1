"""Several models in one job against one job per model: NudeNet, RapidOCR and a text classifier
over the OCR text, the same pictures, one run, wall times and pictures decoded printed beside
the CPU's flags.

    python bench/bench_ensemble.py [N_PHOTOS] [--pages K]

The three single-model jobs are what a user without [models] runs: NudeNet over the pictures,
OCR over the pictures, the classifier over the OCR job's output. The decode share is measured
too (the pictures decoded alone, in the same decode pool), so the saving can be held against
it: one job should save at least one decode pass of the pictures.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))
WORK = HERE / "_work" / "ensemble"

def make_inputs(photos: int, pages: int) -> Path:
    from bench_images import make_photos

    from pictures import TOXIC_CLASSIFIER, text_page

    folder = WORK / f"pics-{photos}-{pages}"
    if not folder.exists():
        folder.mkdir(parents=True)
        for p in make_photos(photos):
            shutil.copy(p, folder / p.name)
        for i in range(pages):
            text_page([f"page {i}: I hate spam" if i % 3 == 0 else f"page {i}: a calm day", "second line"]).save(
                folder / f"page-{i:04d}.png"
            )
    (WORK / "bench_toxic.py").write_text(TOXIC_CLASSIFIER)
    return folder


def run(overrides: dict[str, object]) -> tuple[float, dict]:
    from bulkinfer import load_config, run_job

    out = Path(str(overrides["sink.path"]))
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    result = run_job(load_config(overrides={"execution.progress": "none", **overrides}))
    return time.perf_counter() - t0, result.report


def decode_only(folder: Path) -> float:
    """The pictures decoded once in bulkinfer's decode pool (what one job saves per model)."""
    from bulkinfer.adapters.decode import DecodePool
    from bulkinfer.core.hardware import available_cpus

    paths = sorted(str(p) for p in folder.iterdir())
    pool = DecodePool(available_cpus(), 89_478_485, 512 << 20)
    t0 = time.perf_counter()
    pool.run(paths, paths, lambda image: image.shape)
    pool.close()
    return time.perf_counter() - t0


def main() -> None:
    from machine import describe

    ap = argparse.ArgumentParser()
    ap.add_argument("photos", type=int, nargs="?", default=120)
    ap.add_argument("--pages", type=int, default=30)
    args = ap.parse_args()
    folder = make_inputs(args.photos, args.pages)
    sys.path.insert(0, str(WORK))
    pics = {"source.paths": [str(folder)], "source.format": "images"}
    models = {
        "models": {"nudenet": {"name": "nudenet"}, "ocr": {"name": "ocr"},
                   "text": {"name": "bench_toxic:Toxic", "text_column": "ocr.text"}},
    }  # fmt: skip
    one_s, one = run({**pics, **models, "sink.path": str(WORK / "out-one")})
    nude_s, nude = run({**pics, "model.name": "nudenet", "sink.path": str(WORK / "out-nudenet")})
    ocr_s, ocr = run({**pics, "model.name": "ocr", "sink.path": str(WORK / "out-ocr")})
    text_s, _ = run({"source.paths": [str(WORK / "out-ocr")], "model.name": "bench_toxic:Toxic",
                     "model.text_column": "text", "sink.path": str(WORK / "out-text")})  # fmt: skip
    decode_s = decode_only(folder)
    rows = args.photos + args.pages
    three = nude_s + ocr_s + text_s
    print(describe())
    print(f"{rows} pictures ({args.photos} photos of 1-2 MP, {args.pages} drawn pages)")
    busy = ", ".join(f"{n} {m['share']:.0%}" for n, m in one["models"].items())
    print(f"one job, 3 models: {one_s:.1f} s, pictures decoded {one['pictures_decoded']}, busy: {busy}")
    print(f"three jobs: nudenet {nude_s:.1f} s + ocr {ocr_s:.1f} s + text {text_s:.1f} s = {three:.1f} s, "
          f"pictures decoded {nude['pictures_decoded'] + ocr['pictures_decoded']}")  # fmt: skip
    print(f"decode pass alone: {decode_s:.1f} s; saved {three - one_s:.1f} s "
          f"({(three - one_s) / decode_s:.2f} decode passes); three jobs / one job = {three / one_s:.2f}x")


if __name__ == "__main__":
    main()
