"""Issue 35's CPU targets against the figures bench/cpu_targets.sh took: one line each, met or
not, for the machine kind the figures came from.

Usage: .venv/bin/python bench/targets.py [DIR]   (default bench/_work/targets)

Reads DIR/run-12000.json and DIR/run-3000.json (bench_run.py --json) and DIR/cold-3000.json
(bench_cold.py --json). The kind is read from the CPU line the scripts printed: VNNI (or AMX)
present is the AVX-512/VNNI kind (target ≥ 4x the sentence-transformers script at 12,000
rows), else the AVX2 kind (≥ 1.8x at 12,000 rows, ≥ 1.6x at 3,000). Both kinds: int8's first
committed row ≤ 1.3x its engine's fp32 cold and ≤ 1.1x warm; the Ray backend ≥ 1.8x the Ray
Data pattern. "Gate-passing best" is the fastest variant whose gate passed (fp32 has none).
Figures taken under bench/as_avx2.py (the CPU line says which flags were hidden) are
simulated: printed, never counted as met.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ANCHOR, RAY_DATA, RAY = "anchor", "ray data pattern", "ray backend (1 worker x 2 CPUs)"


def kind_of(cpu: str) -> tuple[str, bool]:
    """("avx512-vnni" or "avx2", simulated) from a bench CPU line (bench/machine.py describe())."""
    flags, _, hidden = cpu.partition("(/proc/cpuinfo also lists")
    vnni = any(f in flags.split() for f in ("avx512_vnni", "avx_vnni", "amx_int8"))
    return ("avx512-vnni" if vnni else "avx2"), bool(hidden)


def best_passing(run: dict) -> tuple[str, float]:
    """The fastest bulkinfer variant whose gate passed, and its ratio to the script."""
    rates = {k: v for k, v in run["rows_per_s"].items() if k in run["passed"] and run["passed"][k]}
    name = max(rates, key=lambda k: rates[k])
    return name, rates[name] / run["rows_per_s"][ANCHOR]


def lines(folder: Path) -> list[tuple[str, str, bool | None]]:
    """(target, what was measured, met: True/False, None when not measured)."""
    out: list[tuple[str, str, bool | None]] = []

    def read(name: str) -> dict | None:
        path = folder / name
        return json.loads(path.read_text()) if path.is_file() else None

    kinds = set()
    for rows, targets in ((12000, {"avx2": 1.8, "avx512-vnni": 4.0}), (3000, {"avx2": 1.6})):
        run = read(f"run-{rows}.json")
        if run is None:
            out.append((f"gate-passing best at {rows:,} rows", f"not measured (no run-{rows}.json)", None))
            continue
        kinds.add(kind_of(run["cpu"]))
        kind, _ = kind_of(run["cpu"])
        if run["rows"] != rows:
            out.append((f"targets at {rows:,} rows", f"run-{rows}.json was measured on {run['rows']:,} rows", None))
            continue
        if kind in targets:
            name, ratio = best_passing(run)
            goal = targets[kind]
            out.append((f"gate-passing best ≥ {goal}x the script at {rows:,} rows",
                        f"{ratio:.2f}x ({name})", ratio >= goal))  # fmt: skip
        if RAY in run["rows_per_s"] and RAY_DATA in run["rows_per_s"]:
            ratio = run["rows_per_s"][RAY] / run["rows_per_s"][RAY_DATA]
            out.append((f"Ray backend ≥ 1.8x the Ray Data pattern ({rows:,} rows)", f"{ratio:.2f}x", ratio >= 1.8))
    cold = read("cold-3000.json")
    if cold is None:
        out.append(("int8's first committed row", "not measured (no cold-3000.json)", None))
    else:
        kinds.add(kind_of(cold["cpu"]))
        seconds = cold["first_commit_s"] if cold["rows"] == 3000 else {}
        if cold["rows"] != 3000:
            out.append(("int8's first committed row", f"cold-3000.json was measured on {cold['rows']:,} rows", None))
        for name, by_kind in seconds.items():
            fp32 = seconds.get(name.replace("int8", "fp32"))
            if "int8" not in name or not fp32:
                continue
            for when, goal in (("cold", 1.3), ("warm", 1.1)):
                ratio = by_kind[when] / fp32[when]
                out.append((f"{name}: first row ≤ {goal}x fp32's, {when}", f"{ratio:.2f}x", ratio <= goal))
    if any(simulated for _, simulated in kinds):
        out = [(target, f"{measured} (simulated)", None) for target, measured, _ in out]
    return out


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "bench" / "_work" / "targets"
    cpus = {json.loads(p.read_text())["cpu"] for p in folder.glob("*.json")}
    for cpu in sorted(cpus):
        kind, simulated = kind_of(cpu)
        print(f"{cpu}\n  -> the {kind} kind{' (SIMULATED: figures count for no target)' if simulated else ''}")
    for target, measured, met in lines(folder):
        mark = {True: "met", False: "NOT MET", None: "-"}[met]
        print(f"  {mark:8s} {target}: {measured}")


if __name__ == "__main__":
    main()
