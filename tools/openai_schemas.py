"""The OpenAI schemas the tests validate against, taken from OpenAI's published OpenAPI spec.

    python tools/openai_schemas.py [SPEC]          # writes tests/specs/openai.json
    python tools/openai_schemas.py [SPEC] --check  # exit 1 when tests/specs/openai.json differs

SPEC defaults to ../shared/specs/openai/openapi.yaml (OpenAI's openai-openapi, MIT). The named
schemas and every schema they reference are copied unchanged (``components.schemas``), with
the spec's version, so a test on a machine without the spec validates against the same text.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "specs" / "openai.json"
DEFAULT_SPEC = ROOT.parent / "shared" / "specs" / "openai" / "openapi.yaml"
NAMES = [
    "CreateModerationResponse", "CreateModerationRequest", "Error", "ErrorResponse",
    "OpenAIFile", "ListFilesResponse", "DeleteFileResponse", "Batch", "ListBatchesResponse",
    "CreateEmbeddingResponse", "CreateChatCompletionResponse", "CreateChatCompletionStreamResponse",
    "CreateCompletionResponse", "ListModelsResponse", "Model",
    "WebhookBatchCompleted", "WebhookBatchFailed", "WebhookBatchExpired", "WebhookBatchCancelled",
]  # fmt: skip
"""The schemas served or sent by bulkinfer that the tests check (and what they reference)."""


def _refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"].rsplit("/", 1)[1]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(_refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node))
    return set()


def extract(spec: dict[str, Any]) -> dict[str, Any]:
    schemas = spec["components"]["schemas"]
    todo, kept = list(NAMES), {}
    while todo:
        name = todo.pop()
        if name not in kept:
            kept[name] = schemas[name]
            todo.extend(_refs(schemas[name]))
    version = spec["info"]["version"]
    return {"openapi_version": version, "components": {"schemas": dict(sorted(kept.items()))}}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("spec", nargs="?", default=str(DEFAULT_SPEC))
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml where built: the spec is 3 MB
    made = json.dumps(extract(yaml.load(Path(args.spec).read_text(), Loader=loader)), indent=1, sort_keys=True) + "\n"
    if args.check:
        same = OUT.exists() and OUT.read_text() == made
        print(f"{OUT} {'matches' if same else 'differs from'} {args.spec}")
        return 0 if same else 1
    OUT.write_text(made)
    print(f"wrote {OUT} ({len(made)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
