"""The OpenAI schemas the tests validate against (tests/specs/openai.json) are OpenAI's own:
what tools/openai_schemas.py takes from the published OpenAPI spec, unchanged."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT.parent / "shared" / "specs" / "openai" / "openapi.yaml"


@pytest.mark.skipif(not SPEC.is_file(), reason=f"OpenAI's OpenAPI spec is not beside the checkout ({SPEC})")
def test_the_vendored_schemas_are_the_published_specs():
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "openai_schemas.py"), str(SPEC), "--check"],
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_changed_schema_is_caught(tmp_path):
    """The check can fail: a spec whose moderation response lost a field differs from the vendored one."""
    import json

    import yaml

    vendored = json.loads((ROOT / "tests" / "specs" / "openai.json").read_text())
    schemas = vendored["components"]["schemas"]
    del schemas["CreateModerationResponse"]["properties"]["model"]
    spec = {"info": {"version": vendored["openapi_version"]}, "components": {"schemas": schemas}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "openai_schemas.py"), str(tmp_path / "spec.yaml"),
                           "--check"], capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 1 and "differs from" in proc.stdout
