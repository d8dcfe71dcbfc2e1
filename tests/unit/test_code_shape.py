"""Functions that fit on a screen: none in src/ over 60 lines (decorators to the last line).
Their complexity (mccabe, at most 12) is ruff's C901, on in pyproject.toml for src/."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import bulkinfer

SRC = Path(bulkinfer.__file__).parent
ROOT = SRC.parent.parent
MAX_LINES = 60


def long_functions(src: Path, limit: int = MAX_LINES) -> list[str]:
    found = []
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                lines = (node.end_lineno or node.lineno) - first + 1
                if lines > limit:
                    found.append(f"{path.relative_to(src)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_in_src_is_over_60_lines():
    assert long_functions(SRC) == []


def test_the_length_check_finds_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    (tmp_path / "long.py").write_text(f"def short():\n    return 1\n\n\nasync def long():\n{body}\n")
    assert long_functions(tmp_path) == ["long.py:5 long (61 lines)"]


def test_ruff_holds_complexity_12_on_src():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert "C901" in config["select"]
    assert config["mccabe"]["max-complexity"] == 12
    assert not any("C901" in rules for glob, rules in config["per-file-ignores"].items() if glob.startswith("src"))
