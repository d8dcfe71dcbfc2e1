"""The documentation's marked examples run as written (on small data made here): the README
(the front page) first, then the docs site's pages in the order of mkdocs.yml's nav."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import typing
from pathlib import Path

import pyarrow as pa
import pytest

from bulkinfer.config import field_docs, load_config

from helpers import cli, make_catalog, read_output, write

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
BLOCK = re.compile(r"<!-- readme-test: (\w+) ?([\w.]*) -->\n```\w+\n(.*?)```", re.S)


def pages() -> list[Path]:
    """README.md, then every page mkdocs.yml's nav names, in that order."""
    nav = re.findall(r":\s*([\w-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    return [README, *(DOCS / name for name in nav)]


def _blocks() -> list[tuple[str, str, str]]:
    return [b for page in pages() for b in BLOCK.findall(page.read_text())]


def _commands(body: str) -> list[list[str]]:
    joined = body.replace("\\\n", " ")
    return [shlex.split(line) for line in joined.splitlines() if line.strip().startswith("bulkinfer ")]


def test_every_page_is_in_the_nav_and_every_nav_page_exists():
    listed = {p.name for p in pages()[1:]}
    assert listed == {p.name for p in DOCS.glob("*.md")}
    assert all(p.exists() for p in pages())


def test_the_docs_index_lists_every_page():
    listed = set(re.findall(r"^\| \[[^]]+\]\(([\w-]+\.md)\) \|", (DOCS / "index.md").read_text(), re.M))
    assert listed == {p.name for p in pages()[1:]} - {"index.md"}


def test_marked_examples_run(tmp_path):
    write(make_catalog(40, seed=5), tmp_path / "data" / "catalog.parquet")
    reviews = ["good value", "broke in a week", "I love it", "meh", "great great great"]
    write(pa.table({"id": list(range(5)), "review": reviews}), tmp_path / "reviews.jsonl")
    kinds = []
    for kind, arg, body in _blocks():
        kinds.append(kind)
        if kind == "file":
            (tmp_path / arg).write_text(body)
        elif kind == "toml":
            (tmp_path / arg).write_text(body)
            cfg = load_config(tmp_path / arg)
            assert cfg.model.name == "minilm"
            again = cli("run", arg, "--progress", "none", cwd=tmp_path, check=True)
            assert "(40 already committed)" in again.stdout  # the same job as the CLI example above
        elif kind == "run":
            for argv in _commands(body):
                assert argv[0] == "bulkinfer"
                cli(*argv[1:], cwd=tmp_path, check=True)
        else:
            pytest.fail(f"unknown readme-test kind {kind}")
    assert kinds == ["run", "toml", "run", "toml", "file", "run", "run", "run"]
    out = read_output(tmp_path / "out")
    assert out.column_names == ["id", "category", "embedding", "_input_hash"] and out.num_rows == 40
    assert (tmp_path / "report.html").read_text().count('<svg role="img"') >= 5
    candidate = json.loads((tmp_path / "out-candidate" / "_bulkinfer" / "report.json").read_text())
    assert candidate["drift"]["status"] == "ok" and candidate["cost"]["labels"]["team"] == "search"
    on_ray = read_output(tmp_path / "out-ray")
    assert on_ray.sort_by("id")["id"].to_pylist() == out.sort_by("id")["id"].to_pylist()
    sentiment = [json.loads(x) for x in (tmp_path / "sentiment" / "part-00000.jsonl").read_text().splitlines()]
    assert [r["positive"] for r in sentiment] == [True, False, True, False, True]


def test_the_jobs_page_names_every_config_field():
    text = (DOCS / "jobs.md").read_text()
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \| (.*) \|$", text, re.M)}
    missing = [
        name for name, _d, _doc in field_docs() if f"`{name.split('.')[1]}`" not in rows.get(name.split(".")[0], "")
    ]
    assert missing == []


def _section_model(annotation: object) -> type | None:
    """The pydantic model a section's annotation holds (``X``, ``X | None``, ``list[X]``, ``dict[str, X]``)."""
    if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
        return annotation
    return next((m for a in typing.get_args(annotation) if (m := _section_model(a)) is not None), None)


def _choices(annotation: object) -> list[str]:
    if typing.get_origin(annotation) is typing.Literal:
        return [c for c in typing.get_args(annotation) if isinstance(c, str)]
    return [c for a in typing.get_args(annotation) for c in _choices(a)]


def test_the_jobs_pages_lists_of_choices_are_whole():
    """Where docs/jobs.md lists a field's choices (`format` (auto/parquet/...)), every choice the
    config takes is among them: runtime.engine once lacked openvino, source.format webdataset."""
    from bulkinfer.config import JobConfig

    text = (DOCS / "jobs.md").read_text()
    checked, missing = 0, []
    for section, row in re.findall(r"^\| `(\w+)` \| (.*) \|$", text, re.M):
        model = _section_model(JobConfig.model_fields[section].annotation) if section in JobConfig.model_fields else None
        for field, listed in re.findall(r"`(\w+)` \(([^()]*?/[^()]*)\)", row):
            if model is None or field not in model.model_fields:
                continue
            checked += 1
            missing += [f"{section}.{field}: {c}" for c in _choices(model.model_fields[field].annotation)
                        if not re.search(rf"(?<![\w-]){re.escape(c)}(?![\w-])", listed)]  # fmt: skip
    assert checked >= 12 and missing == []


def test_the_configuration_reference_is_generated_from_the_config():
    """docs/reference.md is what tools/gen_reference.py makes of the config's docstrings now."""
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_reference.py"), "--check"], capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()
    text = (DOCS / "reference.md").read_text()
    assert all(f"| `{name.split('.', 1)[1]}` | `{default}` |" in text for name, default, _ in field_docs())


def test_demo_flow_on_a_small_catalog(tmp_path):
    """What `make demo` runs, on 300 rows instead of 20,000."""
    import shutil

    subprocess.run(
        [sys.executable, str(ROOT / "examples" / "make_catalog.py"), "demo/catalog.parquet", "300"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    shutil.copy(ROOT / "examples" / "catalog.toml", tmp_path / "catalog.toml")
    proc = cli("run", "catalog.toml", "--progress", "none", cwd=tmp_path, check=True)
    assert "done: 300 rows written" in proc.stdout
    out = read_output(tmp_path / "demo" / "embeddings")
    assert out.column_names == ["id", "category", "embedding", "_input_hash"] and out["id"].to_pylist() == list(
        range(300)
    )
    assert "complete" in cli("inspect", "demo/embeddings", cwd=tmp_path, check=True).stdout


def test_the_readmes_links_resolve():
    """The front page links into docs/ (mkdocs checks the pages' own links; the README is not a page)."""
    links = re.findall(r"\]\(([^)#:]+)(?:#[\w-]+)?\)", README.read_text())
    assert len(links) >= 10
    assert [link for link in links if not (ROOT / link).exists()] == []
