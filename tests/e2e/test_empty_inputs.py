"""An input file of 0 bytes (a truncated upload looks exactly like this) adds no rows, and the
run says so: one warning line naming each such file, and ``report.json``'s ``empty_inputs``."""

from __future__ import annotations

import json

import pytest

from helpers import cli, read_output, tabular_table, train_classifier, write


@pytest.mark.parametrize("suffix", ["parquet", "csv", "jsonl"])
def test_an_empty_input_file_is_named_in_a_warning_and_in_the_report(tmp_path, suffix):
    model = train_classifier(tmp_path / "m.joblib")
    write(tabular_table(30, seed=2), tmp_path / f"good.{suffix}")
    (tmp_path / f"empty.{suffix}").write_bytes(b"")
    args = ["run", "-i", f"good.{suffix}", "-i", f"empty.{suffix}", "-m", str(model), "--id-column", "id",
            "-o", "out", "--progress", "none"]  # fmt: skip
    proc = cli(*args, cwd=tmp_path, check=True)
    empty = str(tmp_path / f"empty.{suffix}")
    warned = [line for line in proc.stderr.splitlines() if "the file is empty" in line]
    assert warned == [f"bulkinfer: {empty}: the file is empty (0 bytes): it adds no rows; check the upload if rows "
                      "were expected"]  # fmt: skip
    report = json.loads((tmp_path / "out" / "_bulkinfer" / "report.json").read_text())
    assert report["empty_inputs"] == [empty] and report["rows_out"] == 30
    assert read_output(tmp_path / "out").num_rows == 30
