"""The GPU check of issue 18 (part 4): one prepared run that proves the CUDA path.

Usage: python bench/gpu/check.py --device cuda [--rows 100000] [--out DIR]
       (run through bench/gpu/check.sh, which sets up the GPU machine; ``--dry-run`` there runs
       the same steps on this CPU, small, to check the script before spending device time)

Steps, each timed and bounded, each going on when an earlier one failed:
1. the machine: CPU and flags, the GPU as bulkinfer sees it (report.json's machine.gpu), torch/CUDA,
   and ``bulkinfer machine``'s verdict per engine and precision;
2. the same 2,000 rows embedded by bulkinfer on the device and on the CPU, both fp32 (torch):
   per-row cosine, target min >= 0.9999;
3. the anchors on the device: the sentence-transformers script at batch 32 (what a user
   writes) and at batch 256 (a user who turned one knob);
4. bulkinfer on the device in fp32, fp16 and bf16 (the last two through the quality gate, its
   figures printed), and after ``bulkinfer tune`` on the device; rows/s and the ratio to each
   anchor, same run; target >= 2x the batch-32 script;
5. ``bench/bench_serve.py`` on the device: batching on and off at 1, 8 and 32 clients; target
   on/off >= 2x at 32 clients;
6. onnxruntime's CUDA provider (fp32) and TensorRT (fp16, gated) where this onnxruntime has
   them (the device's stock onnxruntime is the CPU build: then the providers it has are recorded);
7. generation on the device (a tiny random-weight Llama built by tests/tiny_lm.py): greedy
   completions on the device against the CPU's (the share identical; random weights have
   near-ties), bf16, and JSON-schema-constrained sampling (every completion valid JSON).
Figures go to OUT/gpu_check.json after every step (a timeout still returns what ran). The
whole check keeps within ``--budget-s`` (default 480 s, under the device tool's 540 s
command limit): a command that would run past it is cut, and the steps after it are skipped
with a line saying so.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("BULKINFER_SHARED_BENCH") or ROOT.parent / "shared" / "bench")
GPU_KNOBS = ["--set", "runtime.engine=torch", "--set", "runtime.batch_size=256", "--set", "runtime.sort_window=16384"]
EQUAL_ROWS = 2000


class Check:
    def __init__(self, args: argparse.Namespace) -> None:
        self.device, self.rows, self.out = args.device, args.rows, Path(args.out)
        self.serve_requests = args.serve_requests
        self.deadline = time.monotonic() + args.budget_s
        self.work = ROOT / "bench" / "_work" / "gpu"
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir(parents=True)
        self.corpus = self.work / "corpus.parquet"
        self.figures: dict[str, Any] = {"device": self.device, "rows": self.rows}
        self.out.mkdir(parents=True, exist_ok=True)
        exe = Path(sys.executable).parent / "bulkinfer"
        self.bulkinfer = [str(exe)] if exe.exists() else [sys.executable, "-m", "bulkinfer"]
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", "BULKINFER_CACHE": str(self.work / "cache")}

    def save(self) -> None:
        (self.out / "gpu_check.json").write_text(json.dumps(self.figures, indent=1, default=str))

    def step(self, name: str, fn: Any) -> None:
        print(f"\n== {name}", flush=True)
        if time.monotonic() > self.deadline - 10:
            self.figures.setdefault("skipped", []).append(name)
            print("skipped: the check's time budget is spent", flush=True)
            self.save()
            return
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as exc:  # one failed step must not cost the others' device time
            self.figures.setdefault("failed", {})[name] = f"{type(exc).__name__}: {exc}"[-2000:]
            print(f"FAILED: {type(exc).__name__}: {str(exc)[-2000:]}", flush=True)
        print(f"({name}: {time.perf_counter() - t0:.1f} s)", flush=True)
        self.save()

    def sh(self, *args: str, timeout: float = 300) -> str:
        left = self.deadline - time.monotonic()
        if left < 5:
            raise TimeoutError("the check's time budget is spent")
        proc = subprocess.run(args, capture_output=True, text=True, env=self.env, timeout=min(timeout, left))
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:4])}... exited {proc.returncode}: {proc.stderr[-1500:]}")
        return proc.stdout + proc.stderr

    # -- steps ---------------------------------------------------------------------------------
    def machine(self) -> None:
        import torch

        from bulkinfer.core.hardware import cpu, gpu, isa_key, survey

        c = cpu()
        info = {"cpu": c["model"], "cpus": c["cpus"], "cpu_flags": c["features"], "isa": isa_key(),
                "gpu": gpu(self.device), "torch": torch.__version__, "cuda": torch.version.cuda,
                "bulkinfer_machine": {f"{r['device']} {r['engine']} {r['precision']}": r["verdict"]
                                      for r in survey(self.device)["precisions"]}}  # fmt: skip
        if shutil.which("nvidia-smi"):
            q = "name,driver_version,memory.total,clocks.max.sm"
            info["nvidia_smi"] = self.sh("nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader").strip()
        self.figures["machine"] = info
        print(json.dumps(info, indent=1))
        self.sh(sys.executable, str(SHARED / "make_corpus.py"), str(self.corpus), str(self.rows))

    def run(self, name: str, extra: list[str], device: str | None = None) -> dict[str, Any]:
        out = self.work / re.sub(r"[^a-z0-9]+", "_", name.lower())
        shutil.rmtree(out, ignore_errors=True)
        log = self.sh(*self.bulkinfer, "run", "-i", str(self.corpus), "-m", "minilm", "--text-column", "description",
                      "--id-column", "id", "-o", str(out), "--progress", "none",
                      "--set", f"runtime.device={device or self.device}", *extra)  # fmt: skip
        rep = json.loads((out / "_bulkinfer" / "report.json").read_text())
        rep["_out"], rep["_log"] = str(out), [ln for ln in log.splitlines() if "quality gate" in ln or "warn" in ln]
        return rep

    def equal(self) -> None:
        import numpy as np
        import pyarrow.parquet as pq

        limit = ["--limit-rows", str(min(EQUAL_ROWS, self.rows)), "--set", "runtime.engine=torch"]
        gpu, cpu = self.run("equal device", limit), self.run("equal cpu", limit, device="cpu")

        def vectors(rep: dict[str, Any]) -> dict[int, np.ndarray]:
            t = pq.ParquetDataset(sorted(Path(rep["_out"]).glob("part-*.parquet"))).read()
            return dict(zip(t["id"].to_pylist(), t["embedding"].to_numpy(zero_copy_only=False), strict=True))

        a, b = vectors(gpu), vectors(cpu)
        assert a.keys() == b.keys() and len(a) == min(EQUAL_ROWS, self.rows), (len(a), len(b))
        ids = sorted(a)
        x, y = np.stack([a[i] for i in ids]), np.stack([b[i] for i in ids])
        cos = (x * y).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))
        fig = {"rows": len(ids), "min_cosine": float(cos.min()), "mean_cosine": float(cos.mean()),
               "max_abs_diff": float(np.abs(x - y).max()), "target_min_cosine": 0.9999,
               "passed": bool(cos.min() >= 0.9999), "engines": [gpu["engine"], cpu["engine"]]}  # fmt: skip
        self.figures["equal_to_cpu_fp32"] = fig
        print(f"{self.device} fp32 vs cpu fp32 on {len(ids)} rows: {json.dumps(fig)}")

    def anchors(self) -> None:
        for bs in (32, 256):
            text = self.sh(sys.executable, str(SHARED / "anchor_st.py"), str(self.corpus),
                           str(self.work / f"anchor_{bs}.parquet"), str(bs), self.device, timeout=600)  # fmt: skip
            rate = float(re.search(r"rows_per_s=([\d.]+)", text).group(1))  # type: ignore[union-attr]
            self.figures.setdefault("anchors", {})[f"sentence-transformers script, batch {bs}"] = rate
            print(f"sentence-transformers script on {self.device}, batch {bs}: {rate:.1f} rows/s")

    def variants(self) -> None:
        from bulkinfer.core.hardware import emulated

        anchors = self.figures.get("anchors", {})
        base = anchors.get("sentence-transformers script, batch 32")
        tuned = self.work / "tuned.toml"
        sizes = "64,128,256,512,1024" if self.device.startswith("cuda") else "16,32"
        try:
            pairs = ",".join(f"torch/{p}" for p in ("fp32", "fp16", "bf16") if not emulated(self.device, p))
            text = self.sh(*self.bulkinfer, "tune", "-i", str(self.corpus), "-m", "minilm", "--text-column",
                           "description", "--set", f"runtime.device={self.device}", "--set",
                           "runtime.sort_window=16384", "--candidates", pairs, "--batch-sizes", sizes,
                           "--sample-rows", "2048", "-o", str(tuned), timeout=400)  # fmt: skip
            print(text[-3000:])
        except Exception as exc:
            print(f"tune FAILED: {exc}")
        variants = {f"bulkinfer {p}, batch 256": [*GPU_KNOBS, "--set", f"runtime.precision={p}"]
                    for p in ("fp32", "fp16", "bf16")}  # fmt: skip
        if tuned.exists():
            variants["bulkinfer after tune"] = [str(tuned)]  # its engine, precision and batch size as tune chose
        results = self.figures.setdefault("bulkinfer", {})
        for name, extra in variants.items():
            precision = next((x.split("=")[1] for x in extra if x.startswith("runtime.precision=")), None)
            if precision and emulated(self.device, precision):
                print(f"{name}: skipped, emulated on {self.device} here")
                continue
            try:
                rep = self.run(name, extra)
            except Exception as exc:
                results[name] = {"failed": str(exc)[-1500:]}
                print(f"{name}: FAILED {str(exc)[-1500:]}")
                continue
            q = rep.get("quality") or {}
            results[name] = {
                "rows_per_s": rep["rows_per_s"], "ran": f"{rep['engine']} {rep['precision']} batch {rep['batch_size']}",
                "runs_on": rep.get("runs_on"),
                "vs_anchors": {k: round(rep["rows_per_s"] / v, 2) for k, v in anchors.items()},
                "time_share": rep["time_share"], "padding_ratio": rep["batches"]["padding_ratio"],
                "quality": {k: q[k] for k in ("mean_cosine", "min_cosine", "top10_overlap") if k in q} or None,
                "gpu": rep["machine"].get("gpu"), "log": rep["_log"],
            }  # fmt: skip
            ratio = f" = {rep['rows_per_s'] / base:.2f}x the batch-32 script" if base else ""
            print(f"{name}: {rep['rows_per_s']:.1f} rows/s{ratio}; {json.dumps(results[name])}")
        rates = [r["rows_per_s"] for r in results.values() if "rows_per_s" in r]
        if rates and base:
            self.figures["best_vs_script"] = {"ratio": round(max(rates) / base, 2), "target": 2.0}

    def generate(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        sys.path.insert(0, str(ROOT / "tests"))
        from tiny_lm import WORDS, tiny_lm

        model = tiny_lm(self.work / "tiny_llama", "llama", context=256)
        n = 256
        texts = [" ".join(WORDS[(i * 3) % 10 : (i * 3) % 10 + 1 + i % 9]) for i in range(n)]
        pq.write_table(pa.table({"id": list(range(n)), "text": texts}), self.work / "prompts.parquet")
        schema = {"type": "object", "required": ["label", "stars"], "additionalProperties": False,
                  "properties": {"label": {"enum": ["good", "bad"]},
                                 "stars": {"type": "integer", "minimum": 1, "maximum": 5}}}  # fmt: skip
        (self.work / "schema.json").write_text(json.dumps(schema))

        def completions(name: str, device: str, *extra: str) -> tuple[list[str], dict[str, Any]]:
            out = self.work / name
            shutil.rmtree(out, ignore_errors=True)
            self.sh(*self.bulkinfer, "run", "-i", str(self.work / "prompts.parquet"), "-m", str(model), "--id-column",
                    "id", "-o", str(out), "--progress", "none", "--prompt-template", "Review: {text}",
                    "--set", f"runtime.device={device}", "--set", "runtime.batch_size=64", *extra)  # fmt: skip
            t = pq.ParquetDataset(sorted(out.glob("part-*.parquet"))).read().sort_by("id")
            rep = json.loads((out / "_bulkinfer" / "report.json").read_text())
            return t["completion"].to_pylist(), rep

        greedy = ["--max-new-tokens", "16"]
        on_device, rep = completions("gen_device", self.device, *greedy)
        on_cpu, _ = completions("gen_cpu", "cpu", *greedy)
        same = sum(a == b for a, b in zip(on_device, on_cpu, strict=True)) / n
        fig: dict[str, Any] = {"rows": n, "greedy_identical_to_cpu": same, "rows_per_s": rep["rows_per_s"]}
        if not self._emulated("bf16"):
            # random weights: bf16 flips near-ties, so the gate (agreement with fp32) is reported, not enforced
            in_bf16, rep16 = completions("gen_bf16", self.device, *greedy, "--set", "runtime.precision=bf16",
                                         "--set", "runtime.quality_floor=-1")  # fmt: skip
            fig["bf16_gate"] = rep16.get("quality")
            fig["bf16_identical_to_fp32"] = sum(a == b for a, b in zip(in_bf16, on_device, strict=True)) / n
            fig["bf16_rows_per_s"] = rep16["rows_per_s"]
        constrained, _ = completions("gen_json", self.device, "--max-new-tokens", "120", "--json-schema",
                                     str(self.work / "schema.json"), "--set", "model.temperature=1.0")  # fmt: skip
        valid = 0
        for c in constrained:
            try:
                obj = json.loads(c)
                valid += obj["label"] in ("good", "bad") and obj["stars"] in range(1, 6) and len(obj) == 2
            except (ValueError, KeyError, TypeError):
                pass
        fig["json_valid"] = valid / n
        self.figures["generate"] = fig
        print(f"generation on {self.device}: {json.dumps(fig)}")

    def ort_providers(self) -> None:
        """onnxruntime on the device: its CUDA provider (fp32, against CPU fp32 like step 2) and
        TensorRT (fp16, through the gate), where the machine's onnxruntime has them; else the
        providers it has, recorded as the reason nothing ran."""
        import onnxruntime as ort

        have = ort.get_available_providers()
        fig: dict[str, Any] = {"onnxruntime": ort.__version__, "providers": have}
        self.figures["onnxruntime_gpu"] = fig
        base = self.figures.get("anchors", {}).get("sentence-transformers script, batch 32")
        runs = {"CUDAExecutionProvider": ("onnxruntime cuda fp32", ["--set", "runtime.precision=fp32"]),
                "TensorrtExecutionProvider": ("onnxruntime tensorrt fp16", ["--set", "runtime.precision=fp16",
                                              "--set", "runtime.tensorrt=true"])}  # fmt: skip
        knobs = ["--set", "runtime.engine=onnxruntime", "--set", "runtime.batch_size=256"]
        for provider, (name, extra) in runs.items():
            if provider not in have:
                fig[name] = f"skipped: this onnxruntime has no {provider}"
                continue
            rep = self.run(name, [*knobs, *extra])
            q = rep.get("quality") or {}
            fig[name] = {
                "rows_per_s": rep["rows_per_s"],
                "runs_on": rep.get("runs_on"),
                "vs_script_32": round(rep["rows_per_s"] / base, 2) if base else None,
                "quality": {k: q[k] for k in ("mean_cosine", "min_cosine") if k in q} or None,
            }
        print(f"onnxruntime on {self.device}: {json.dumps(fig)}")

    def _emulated(self, precision: str) -> bool:
        from bulkinfer.core.hardware import emulated

        return emulated(self.device, precision)

    def serve(self) -> None:
        bench = str(ROOT / "bench" / "bench_serve.py")
        text = self.sh(sys.executable, bench, "--device", self.device, "--no-litserve", "--repeat", "1",
                       "--requests", str(self.serve_requests), timeout=420)  # fmt: skip
        print(text)
        m = re.search(r"batching on / off = ([\d.]+)", text)
        self.figures["serve"] = {"on_off_at_32": float(m.group(1)) if m else None, "target": 2.0,
                                 "output": text[-3000:]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--serve-requests", type=int, default=640)
    ap.add_argument("--out", default=str(ROOT / "bench" / "_work" / "gpu_out"))
    ap.add_argument("--budget-s", type=float, default=480)
    check = Check(ap.parse_args())
    check.step("machine and corpus", check.machine)
    check.step("embeddings on the device equal the CPU's", check.equal)
    check.step("anchors on the device", check.anchors)
    check.step("bulkinfer on the device", check.variants)
    check.step("onnxruntime's GPU providers", check.ort_providers)
    check.step("serve: batching on/off", check.serve)
    check.step("generation on the device", check.generate)
    print("\n== summary")
    f = check.figures
    keys = ("machine", "equal_to_cpu_fp32", "anchors", "best_vs_script", "generate", "failed", "skipped")
    print(json.dumps({k: f.get(k) for k in keys},
                     indent=1))  # fmt: skip
    print(json.dumps({k: v.get("rows_per_s") for k, v in f.get("bulkinfer", {}).items()}, indent=1))
    print(json.dumps({"serve_on_off_at_32": (f.get("serve") or {}).get("on_off_at_32")}))


if __name__ == "__main__":
    main()
