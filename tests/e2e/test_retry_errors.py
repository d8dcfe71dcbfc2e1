"""`bulkinfer run --retry-errors out/`: only the failed rows run again, once the cause is fixed."""

from __future__ import annotations

import json
import textwrap

from helpers import cli, read_output, tabular_table, write

ADAPTER = textwrap.dedent('''
    import json
    from pathlib import Path
    from bulkinfer import Adapter

    class Fragile(Adapter):
        """Fails on the ids listed in broken.json: an outside cause the user can fix."""
        input_columns = ("id", "x1")

        def predict(self, batch):
            broken = set(json.loads(Path("broken.json").read_text())) if Path("broken.json").exists() else set()
            with open("calls.log", "a") as fh:
                fh.write(f"{batch.num_rows}\\n")
            if broken & set(batch["id"].to_pylist()):
                raise RuntimeError("upstream service refused")
            return {"y": batch["x1"]}
''')


def _errors(out):
    return sorted(
        json.loads(line)["row"] for f in (out / "_errors").glob("*.jsonl") for line in f.read_text().splitlines()
    )


def test_retry_errors_fixes_rows_in_place_exactly_once(tmp_path):
    (tmp_path / "fragile.py").write_text(ADAPTER)
    (tmp_path / "broken.json").write_text("[5, 77, 150]")
    write(tabular_table(300), tmp_path / "in.parquet")
    args = [
        "run",
        "-i",
        "in.parquet",
        "-m",
        "fragile:Fragile",
        "--id-column",
        "id",
        "-o",
        "out",
        "--shard-rows",
        "100",
        "--progress",
        "none",
        "--set",
        "execution.max_error_rate=0.05",
    ]
    cli(*args, cwd=tmp_path, check=True)
    assert _errors(tmp_path / "out") == [5, 77, 150]
    (tmp_path / "broken.json").write_text("[77]")  # partly fixed
    (tmp_path / "calls.log").unlink()
    first = cli("run", "--retry-errors", "out", "--progress", "none", cwd=tmp_path, check=True)
    assert "done: 2 rows written this run" in first.stdout
    assert sum(int(x) for x in (tmp_path / "calls.log").read_text().split()) <= 3 + 2  # only the failed rows ran
    assert _errors(tmp_path / "out") == [77]
    assert sorted(p.name for p in (tmp_path / "out" / "_errors").iterdir()) == ["part-00000.retry-1.jsonl"]
    # the ledger is lost: --repair rebuilds it from the parts and the error file in force
    (tmp_path / "out" / "_bulkinfer" / "commits.log").write_text("")
    repaired = cli(*args, "--repair", cwd=tmp_path, check=True)
    assert "done: 0 rows written this run (300 already committed)" in repaired.stdout
    info = json.loads(cli("inspect", "out", "--json", cwd=tmp_path, check=True).stdout)
    assert (info["rows_committed"], info["error_records"], info["rows_remaining"]) == (299, 1, 0)
    (tmp_path / "broken.json").unlink()  # fixed
    cli("run", "--retry-errors", "out", "--progress", "none", cwd=tmp_path, check=True)
    assert _errors(tmp_path / "out") == []
    out = read_output(tmp_path / "out")
    assert sorted(out["id"].to_pylist()) == list(range(300))  # every row exactly once
    manifest = json.loads((tmp_path / "out" / "_SUCCESS").read_text())
    assert manifest["rows"] == 300 and manifest["rows_failed"] == 0 and manifest["error_files"] == []
    # the job is complete: a plain rerun and a retry with nothing to retry do nothing
    again = cli(*args, cwd=tmp_path, check=True)
    assert "done: 0 rows written this run (300 already committed)" in again.stdout
    info = json.loads(cli("inspect", "out", "--json", cwd=tmp_path, check=True).stdout)
    assert info["rows_committed"] == 300 and info["error_records"] == 0 and info["complete"]
