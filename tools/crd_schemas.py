"""The custom resources' schemas the Kubernetes tests validate against, taken from their owners'
published CRDs (KubeRay's RayJob, Argo's Workflow).

    python tools/crd_schemas.py          # writes tests/specs/<kind>.schema.json.gz
    python tools/crd_schemas.py --check  # exit 1 when a written schema differs from its CRD

The CRDs are read from ../shared/specs/ (kuberay/ray.io_rayjobs.yaml, argo/argoproj.io_workflows.yaml,
both Apache-2.0, their licences beside the schemas): each served version's ``openAPIV3Schema``
is kept unchanged, gzipped (Argo's is megabytes of JSON), so a test on a machine without the
specs validates against the same text.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT.parent / "shared" / "specs"
OUT = ROOT / "tests" / "specs"
CRDS = {"rayjob": SPECS / "kuberay" / "ray.io_rayjobs.yaml", "workflow": SPECS / "argo" / "argoproj.io_workflows.yaml"}


def extract(crd: dict[str, Any]) -> dict[str, Any]:
    """``{"group", "kind", "versions": {name: openAPIV3Schema}}`` of a CustomResourceDefinition."""
    spec = crd["spec"]
    versions = {v["name"]: v["schema"]["openAPIV3Schema"] for v in spec["versions"] if v.get("served", True)}
    return {"group": spec["group"], "kind": spec["names"]["kind"], "versions": versions}


def made(path: Path) -> bytes:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml where built: Argo's CRD is 3 MB
    text = json.dumps(extract(yaml.load(path.read_text(), Loader=loader)), sort_keys=True, separators=(",", ":"))
    return gzip.compress(text.encode(), mtime=0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    differ = 0
    for name, crd in CRDS.items():
        out = OUT / f"{name}.schema.json.gz"
        data = made(crd)
        if args.check:
            same = out.exists() and gzip.decompress(out.read_bytes()) == gzip.decompress(data)
            print(f"{out} {'matches' if same else 'differs from'} {crd}")
            differ += not same
        else:
            out.write_bytes(data)
            print(f"wrote {out} ({len(data)} bytes)")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
