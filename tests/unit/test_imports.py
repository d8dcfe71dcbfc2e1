"""Every import of our own modules resolves, at module level and inside functions (mypy runs
with ignore_missing_imports for third-party packages, so a wrong relative import in a lazy
import would pass it and fail only when that function runs)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import bulkinfer

SRC = Path(bulkinfer.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _own_imports(runtime_only: bool = False) -> list[tuple[str, int, str, str]]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        typing_only = {  # names a TYPE_CHECKING block imports may be defined only for the type checker
            id(n)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
            for n in ast.walk(block)
        }
        for node in ast.walk(tree):
            if runtime_only and id(node) in typing_only:
                continue
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
                    found.append((str(path.relative_to(SRC)), node.lineno, target, name))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "bulkinfer":
                        found.append((str(path.relative_to(SRC)), node.lineno, alias.name, ""))
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


# the one direction imports run (docs/architecture.md): a package imports only from its own
# layer or below; within a layer, the circle check (tools/circles.py) keeps it one way
LAYERS = {
    "core": 0, "config": 0, "_version": 0,
    "sources": 1,
    "engines": 2, "llm": 2,
    "adapters": 3,
    "plan": 4, "sinks": 4,
    "precision": 5, "runners": 5, "commit": 5, "report": 5, "outputs": 5, "spark": 5,
    "job": 6, "serve": 6, "orchestrate": 6,
    "cli": 7, "airflow": 7, "dagster": 7,
    "__main__": 8, "": 8,
}  # fmt: skip


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS[parts[1] if len(parts) > 1 else ""]


def test_imports_run_one_way_from_the_cli_down_to_core():
    upward = []
    for where, line, module, name in _own_imports(runtime_only=True):
        here = ".".join(["bulkinfer", *Path(where).with_suffix("").parts]).removesuffix(".__init__")
        targets = [f"{module}.{name}"] if module == "bulkinfer" and name else [module]
        upward += [f"{where}:{line}: {here} -> {t}" for t in targets if _layer(t) > _layer(here)]
    assert upward == []
