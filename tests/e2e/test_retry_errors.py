"""`bulkinfer run --retry-errors out/`: only the failed rows run again, once the cause is fixed."""

from __future__ import annotations

import json
import os
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


def _parts(out, marker):
    """{file name: {id: y}} of the output's parts whose name holds ``marker``."""
    import pyarrow.parquet as pq

    return {
        p.name: dict(zip(*pq.read_table(p, columns=["id", "y"]).to_pydict().values(), strict=True))
        for p in sorted(out.glob("part-*.parquet"))
        if marker in p.name
    }


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
    x1 = dict(zip(range(300), tabular_table(300)["x1"].to_pylist(), strict=True))
    assert _parts(tmp_path / "out", ".retry-") == {
        "part-00000.retry-1.parquet": {5: x1[5]}, "part-00001.retry-1.parquet": {150: x1[150]}
    }  # fmt: skip
    # the inputs may not change between a run and its retry: refused, naming the file, nothing written
    original, st = (tmp_path / "in.parquet").read_bytes(), (tmp_path / "in.parquet").stat()
    write(tabular_table(300, seed=9), tmp_path / "in.parquet")
    changed = cli("run", "--retry-errors", "out", "--progress", "none", cwd=tmp_path)
    assert changed.returncode == 1 and "in.parquet changed" in changed.stderr, changed.stderr
    assert "Traceback" not in changed.stderr and _errors(tmp_path / "out") == [77]
    (tmp_path / "in.parquet").write_bytes(original)  # put back as it was, time stamp included
    os.utime(tmp_path / "in.parquet", ns=(st.st_atime_ns, st.st_mtime_ns))
    # the ledger is lost: --repair rebuilds it from the parts and the error file in force
    (tmp_path / "out" / "_bulkinfer" / "commits.log").write_text("")
    repaired = cli(*args, "--repair", cwd=tmp_path, check=True)
    assert "done: 0 rows written this run (300 already committed)" in repaired.stdout
    info = json.loads(cli("inspect", "out", "--json", cwd=tmp_path, check=True).stdout)
    assert (info["rows_committed"], info["error_records"], info["rows_remaining"]) == (299, 1, 0)
    (tmp_path / "broken.json").unlink()  # fixed
    cli("run", "--retry-errors", "out", "--progress", "none", cwd=tmp_path, check=True)
    assert _errors(tmp_path / "out") == []
    assert _parts(tmp_path / "out", ".retry-2") == {"part-00000.retry-2.parquet": {77: x1[77]}}
    out = read_output(tmp_path / "out")
    assert dict(zip(out["id"].to_pylist(), out["y"].to_pylist(), strict=True)) == x1  # the retried values too
    assert sorted(out["id"].to_pylist()) == list(range(300))  # every row exactly once
    manifest = json.loads((tmp_path / "out" / "_SUCCESS").read_text())
    assert manifest["rows"] == 300 and manifest["rows_failed"] == 0 and manifest["error_files"] == []
    # the job is complete: a plain rerun and a retry with nothing to retry do nothing
    again = cli(*args, cwd=tmp_path, check=True)
    assert "done: 0 rows written this run (300 already committed)" in again.stdout
    info = json.loads(cli("inspect", "out", "--json", cwd=tmp_path, check=True).stdout)
    assert info["rows_committed"] == 300 and info["error_records"] == 0 and info["complete"]
