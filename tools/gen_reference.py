"""Write docs/reference.md: every config field with its default and meaning, from the config's
own docstrings (the text ``bulkinfer run --help`` shows). ``--check``: exit 1 when the
committed page differs from what the config says (the test suite runs this).

    .venv/bin/python tools/gen_reference.py [--check]
"""

from __future__ import annotations

import sys
from pathlib import Path

from bulkinfer.config import field_docs

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference.md"

HEAD = """# Configuration reference

Generated from the config's docstrings by `tools/gen_reference.py` (do not edit by hand).
Every field can be set in the job's TOML file, by `--set section.field=value`, and many by a
flag of their own (`bulkinfer run --help`); a `--set` of a table merges into the table the
file and the flags give, and a `--set` that contradicts a flag is refused.
Unknown fields and wrong types are refused with one line naming the field.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    out = [HEAD]
    section = None
    for name, default, doc in field_docs():
        head, _, field = name.partition(".")
        if head != section:
            section = head
            table = f"[[{head}]]" if head in ("export", "route") else f"[{head}]"
            out.append(f"\n## `{table}`\n\n| field | default | meaning |\n| --- | --- | --- |")
        out.append(f"| `{field}` | `{_cell(default)}` | {_cell(doc)} |")
    return "\n".join(out) + "\n"


def main() -> None:
    text = render()
    if "--check" in sys.argv[1:]:
        if not PAGE.exists() or PAGE.read_text() != text:
            sys.exit(f"{PAGE} is out of date with the config: run .venv/bin/python tools/gen_reference.py")
        return
    PAGE.write_text(text)


if __name__ == "__main__":
    main()
