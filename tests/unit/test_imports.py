"""Every import of our own modules resolves, at module level and inside functions (mypy runs
with ignore_missing_imports for third-party packages, so a wrong relative import in a lazy
import would pass it and fail only when that function runs)."""

from __future__ import annotations

import ast
import importlib
import shutil
from pathlib import Path

import bulkinfer

SRC = Path(bulkinfer.__file__).parent


def _module_name(path: Path, src: Path = SRC) -> str:
    parts = ["bulkinfer", *path.relative_to(src).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _own_imports(src: Path = SRC) -> list[tuple[str, int, str, str]]:
    found = []
    for path in sorted(src.rglob("*.py")):
        name = _module_name(path, src)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        typing_only = {  # names a TYPE_CHECKING block imports may be defined only for the type checker
            id(n)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
            for n in ast.walk(block)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                elif node.module and node.module.split(".")[0] == "bulkinfer":
                    target = node.module
                else:
                    continue
                for alias in node.names:
                    name = "" if id(node) in typing_only else alias.name
                    found.append((str(path.relative_to(src)), node.lineno, target, name))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "bulkinfer":
                        found.append((str(path.relative_to(src)), node.lineno, alias.name, ""))
    return found


def test_every_import_of_our_own_modules_resolves():
    imports = _own_imports()
    assert len(imports) > 300  # the walk found the package's imports (lazy ones included)
    broken = []
    for where, line, module, name in imports:
        if module.endswith("__main__"):
            continue
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            broken.append(f"{where}:{line}: {module} ({exc})")
            continue
        if name and name != "*" and not hasattr(mod, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                broken.append(f"{where}:{line}: {module} has no {name}")
    assert broken == []


# the total order of packages (docs/architecture.md), lowest first: a package imports only
# packages before it, at module level, inside functions and under TYPE_CHECKING alike
ORDER = [
    "_version", "core", "config", "sources", "engines", "llm", "adapters", "plan", "sinks",
    "finished", "report", "commit", "precision", "spark", "runners", "outputs",
    "job", "serve", "orchestrate", "cli", "airflow", "dagster", "__main__", "",
]  # fmt: skip


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def against_the_order(src: Path) -> list[str]:
    """Every import in ``src`` (the bulkinfer package or a copy of it) of a package that the
    order puts at or above the importer's own (a package's imports of itself excepted)."""
    rank = {name: i for i, name in enumerate(ORDER)}
    wrong = []
    for where, line, module, name in _own_imports(src):
        here = _package(".".join(["bulkinfer", *Path(where).with_suffix("").parts]).removesuffix(".__init__"))
        targets = [f"{module}.{name}"] if module == "bulkinfer" and name else [module]
        for t in targets:
            there = _package(t)
            if there not in rank or here not in rank:
                wrong.append(f"{where}:{line}: {t}: a package the order does not list")
            elif there != here and rank[there] > rank[here]:
                wrong.append(f"{where}:{line}: {here} -> {there}")
    return wrong


def test_every_package_is_in_the_order_and_imports_only_those_below_it():
    packages = {_package(_module_name(p)) for p in SRC.rglob("*.py")}
    assert packages == set(ORDER)
    assert against_the_order(SRC) == []


def test_the_order_check_fails_on_an_upward_import(tmp_path):
    copy = tmp_path / "bulkinfer"
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert against_the_order(copy) == []
    hashing = copy / "core" / "hashing.py"
    hashing.write_text(hashing.read_text() + "\n\ndef _up():\n    from ..outputs.html import load_run\n")
    sink = copy / "sinks" / "files.py"
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..commit.ledger import Ledger\n"
    sink.write_text(sink.read_text() + typed)
    found = against_the_order(copy)
    assert [f.split(": ", 1)[1] for f in found] == ["core -> outputs", "sinks -> commit"]
