"""The ``done:`` line says what its throughput counts: rows the model ran per second, and rows
written per second with the rows reused where some were written without running it (the
quality gate's sample once made 613 rows/s show where about 300 were inferred per second)."""

from __future__ import annotations

from bulkinfer.cli.run import _rates


def test_the_rate_is_rows_inferred_and_the_written_rate_appears_with_the_rows_reused():
    plain = {"rows_per_s": 300.04, "rows_written_per_s": 300.04, "reuse": {"rows_from_gate": 0}}
    assert _rates(plain) == "300.0 rows/s inferred"
    gated = {"rows_per_s": 301.0, "rows_written_per_s": 613.2,
             "reuse": {"rows_from_gate": 512, "rows_deduplicated": 0, "rows_from_previous": 0}}  # fmt: skip
    assert _rates(gated) == "301.0 rows/s inferred (613.2 rows/s written, 512 rows reused)"
    old = {"rows_per_s": 12.0}  # a report from before the split
    assert _rates(old) == "12.0 rows/s inferred"
