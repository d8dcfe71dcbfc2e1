from __future__ import annotations

import dataclasses

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bulkinfer.sources.encoding as text_encoding
import bulkinfer.sources.linescan as linescan
from bulkinfer.config.source import SourceConfig
from bulkinfer.core.errors import SourceError
from bulkinfer.sources import ROW, list_inputs, plan_shards, read_shard

from helpers import tabular_table, write


def _ids_by_shards(files, shard_rows):
    shards = plan_shards(files, shard_rows)
    ids = []
    for s in shards:
        got = pa.Table.from_batches(list(read_shard(s, ["id"], batch_rows=7)))
        assert got.num_rows == s.num_rows
        ids.extend(got["id"].to_pylist())
    return shards, ids


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(1, 300),
    rg=st.integers(1, 120),
    shard_rows=st.integers(1, 150),
    fmt=st.sampled_from(["parquet", "csv", "jsonl"]),
)
def test_shards_cover_every_row_exactly_once(tmp_path_factory, n, rg, shard_rows, fmt):
    d = tmp_path_factory.mktemp("src")
    write(tabular_table(n), d / f"data.{fmt}", row_group_size=rg)
    files = list_inputs([str(d)])
    shards, ids = _ids_by_shards(files, shard_rows)
    assert ids == list(range(n))
    assert [s.index for s in shards] == list(range(len(shards)))
    if fmt != "parquet":
        assert all(s.num_rows <= shard_rows for s in shards)


def test_parquet_shards_follow_row_groups(tmp_path):
    write(tabular_table(1000), tmp_path / "a.parquet", row_group_size=100)
    shards = plan_shards(list_inputs([str(tmp_path / "a.parquet")]), 250)
    assert [(s.start, s.stop) for s in shards] == [(0, 200), (200, 400), (400, 600), (600, 800), (800, 1000)]


def test_planning_is_deterministic_and_globs_dirs_dedupe(tmp_path):
    for i in range(3):
        write(tabular_table(50, start=i * 50), tmp_path / f"p{i}.parquet")
    (tmp_path / "_ignored.parquet").write_text("x")
    (tmp_path / "notes.txt").write_text("x")
    a = list_inputs([str(tmp_path)])
    b = list_inputs([str(tmp_path / "p*.parquet"), str(tmp_path / "p1.parquet")])
    assert [f.uri for f in a] == [f.uri for f in b] == [str(tmp_path / f"p{i}.parquet") for i in range(3)]
    assert plan_shards(a, 20) == plan_shards(b, 20)


def test_fingerprint_changes_with_content(tmp_path):
    p = write(tabular_table(50), tmp_path / "a.parquet")
    before = list_inputs([str(p)])[0]
    write(tabular_table(50, seed=9), p)
    after = list_inputs([str(p)])[0]
    assert before.digest != after.digest


def test_memory_filesystem_uri():
    fs = fsspec.filesystem("memory")
    with fs.open("/bulk/in/a.parquet", "wb") as fh:
        pq.write_table(tabular_table(30), fh)
    with fs.open("/bulk/in/b.jsonl", "wb") as fh:
        fh.write(b'{"id": 100}\n{"id": 101}\n')
    files = list_inputs(["memory://bulk/in"])
    assert [f.uri for f in files] == ["memory:///bulk/in/a.parquet", "memory:///bulk/in/b.jsonl"]
    _shards, ids = _ids_by_shards(files, 8)
    assert ids == [*range(30), 100, 101]


def test_missing_path_and_column_errors_name_the_file(tmp_path):
    with pytest.raises(SourceError, match="no such file"):
        list_inputs([str(tmp_path / "nope.parquet")])
    with pytest.raises(SourceError, match="matches no file"):
        list_inputs([str(tmp_path / "*.csv")])
    p = write(tabular_table(5), tmp_path / "a.csv")
    shard = plan_shards(list_inputs([str(p)]), 10)[0]
    with pytest.raises(SourceError) as err:
        list(read_shard(shard, ["id", "text"]))
    assert str(p) in str(err.value) and "'text'" in str(err.value)


def test_unknown_extension_asks_for_format(tmp_path):
    (tmp_path / "a.dat").write_text("id\n1\n")
    with pytest.raises(SourceError, match="source.format"):
        list_inputs([str(tmp_path / "a.dat")])
    assert list_inputs([str(tmp_path / "a.dat")], "csv")[0].format == "csv"


ENCODINGS = {
    # name: (the codec the file is written in, source.encoding, a word in it)
    "utf-8": ("utf-8", "auto", "h\u00e9llo \U0001d11e"),
    "utf-8, marked": ("utf-8-sig", "auto", "h\u00e9llo \U0001d11e"),
    "utf-16, marked": ("utf-16", "auto", "h\u00e9llo \U0001d11e"),
    "utf-16-be, declared": ("utf-16-be", "utf-16-be", "h\u00e9llo \U0001d11e"),
    "utf-32, marked": ("utf-32", "auto", "h\u00e9llo \U0001d11e"),
    "cp1252, declared": ("cp1252", "cp1252", "h\u00e9llo \u20ac"),
}


def _size(text: str, codec: str) -> int:
    """The bytes ``text`` takes in the file (without a byte-order mark)."""
    return len(text.encode({"utf-16": "utf-16-le", "utf-32": "utf-32-le", "utf-8-sig": "utf-8"}.get(codec, codec)))


def _plan_and_read(
    d, records: int, shard_rows: int, chunk: int | None, encoding: str = "auto"
) -> tuple[list[int], list[tuple[int, str]]]:
    """Plan ``d``'s file in shards (records over 40 bytes oversized; scan and decode chunks
    of ``chunk`` bytes), check the shards cover every record once, read them: the ids read
    and the (row, message) of each bad row."""
    with pytest.MonkeyPatch.context() as mp:
        if chunk:
            mp.setattr(linescan, "CHUNK", chunk)
            mp.setattr(text_encoding, "_CHUNK", chunk)
        source = SourceConfig(encoding=encoding)
        shards = plan_shards(list_inputs([str(d)], source=source), shard_rows, max_record=40)
    if records == 0:
        assert shards == []
        return [], []
    assert (shards[0].start, shards[-1].stop) == (0, records)
    assert all(s.num_rows <= shard_rows for s in shards)
    good: list[int] = []
    bad: list[tuple[int, str]] = []
    for s in shards:
        for batch in read_shard(s, ["id"], batch_rows=5, on_bad_row=lambda row, msg: bad.append((row, msg))):
            ids = batch.column("id").to_pylist()
            assert batch.column(ROW).to_pylist() == ids  # the row number is the record's
            good.extend(ids)
    return good, bad


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kinds=st.lists(
        st.sampled_from(
            ["ok", "ok", "ok", "more", "fewer", "blank", "quoted", "multiline", "inch", "long", "longquoted", "accent"]
        ),
        max_size=120,
    ),
    shard_rows=st.integers(1, 40),
    chunk=st.sampled_from([None, 7, 64]),
    newline=st.sampled_from(["\n", "\r\n"]),
    encoding=st.sampled_from(list(ENCODINGS)),
)
def test_csv_records_are_read_or_reported_once_numbered_in_place(
    tmp_path_factory, kinds, shard_rows, chunk, newline, encoding
):
    """Every record is either read (with its own number) or reported bad, exactly once, in
    any sharding: ragged ones (too many or too few fields) become error rows, empty lines
    are not records, a quoted value may hold line breaks, commas and doubled quotes, a
    quote inside an unquoted value is a character, a record over the size limit (40 bytes
    here) is an error row naming its exact size. Small scan chunks cut records at chunk
    edges and make the scan skip over-long lines. In every encoding (``ENCODINGS``), with
    or without a byte-order mark, the same: sizes are the file's bytes."""
    d = tmp_path_factory.mktemp("csv")
    codec, declared, word = ENCODINGS[encoding]
    lines, expect_good, expect_bad, record = ["id,x1"], [], {}, 0
    for kind in kinds:
        if kind == "blank":
            lines.append("")
            continue
        lines.append(
            {
                "ok": f"{record},1.5",
                "more": f"{record},1,extra",
                "fewer": f"{record}",
                "quoted": f'{record},"a, ""b"""',
                "accent": f'{record},"{word}, {word}"',
                "multiline": f'{record},"a{newline}b, c"',
                "inch": f'{record},27" screen',  # a quote inside a value is a character
                "long": f"{record},{'z' * 50}",
                "longquoted": f'{record},"{"y" * 30}{newline}{"y" * 30}"',
            }[kind]
        )
        if kind in ("more", "fewer", "long", "longquoted"):
            expect_bad[record] = kind if kind in ("more", "fewer") else _size(lines[-1] + newline, codec)
        else:
            expect_good.append(record)
        record += 1
    (d / "a.csv").write_bytes((newline.join(lines) + newline).encode(codec))
    good, bad = _plan_and_read(d, record, shard_rows, chunk, declared)
    if record == 0:
        return
    assert good == expect_good
    assert sorted(r for r, _m in bad) == sorted(expect_bad)
    for row, msg in bad:
        if isinstance(expect_bad[row], int):
            assert (
                msg
                == f"the record is {expect_bad[row]} bytes, over source.max_record_bytes; split it or raise the limit"
            )
        else:
            assert msg.startswith("CSV row has ") and ", expected 2: " in msg
            assert msg.endswith((f": {row},1,extra", f": {row}"))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kinds=st.lists(
        st.sampled_from(["ok", "ok", "ok", "blank", "spaces", "indented", "invalid", "long", "accent"]), max_size=120
    ),
    shard_rows=st.integers(1, 40),
    chunk=st.sampled_from([None, 5, 64]),
    newline=st.sampled_from(["\n", "\r\n"]),
    last_newline=st.booleans(),
    encoding=st.sampled_from(list(ENCODINGS)),
)
def test_jsonl_records_are_read_or_reported_once_numbered_in_place(
    tmp_path_factory, kinds, shard_rows, chunk, newline, last_newline, encoding
):
    """The vectorised scan of line ends numbers JSONL records as a line-by-line reading
    would: blank and whitespace-only lines are not records, an indented object is one, an
    invalid line is an error row, a line over the limit (40 bytes here) is an error row
    naming its size (the file's bytes, in every encoding of ``ENCODINGS``); small chunks cut
    lines at chunk edges and make the scan skip long ones."""
    d = tmp_path_factory.mktemp("jsonl")
    codec, declared, word = ENCODINGS[encoding]
    lines, expect_good, expect_bad, record = [], [], {}, 0
    for kind in kinds:
        if kind in ("blank", "spaces"):
            lines.append("" if kind == "blank" else " \t ")
            continue
        lines.append(
            {
                "ok": f'{{"id": {record}}}',
                "indented": f'  {{"id": {record}}}',
                "accent": f'{{"id": {record}, "t": "{word}"}}',
                "invalid": f'{{"id": {record},',
                "long": f'{{"id": {record}, "t": "{"z" * 50}"}}',
            }[kind]
        )
        if kind in ("invalid", "long"):
            expect_bad[record] = _size(lines[-1] + newline, codec) if kind == "long" else kind
        else:
            expect_good.append(record)
        record += 1
    text = newline.join(lines) + (newline if last_newline else "")
    if not last_newline and kinds and kinds[-1] == "long":  # the size counts the line end it has
        expect_bad[record - 1] -= _size(newline, codec)
    (d / "a.jsonl").write_bytes(text.encode(codec))
    good, bad = _plan_and_read(d, record, shard_rows, chunk, declared)
    if record == 0:
        return
    assert good == expect_good
    assert sorted(r for r, _m in bad) == sorted(expect_bad)
    for row, msg in bad:
        if isinstance(expect_bad[row], int):
            assert msg == (
                f"the record is {expect_bad[row]} bytes, over source.max_record_bytes; split it or raise the limit"
            )


def test_a_resumed_csv_shard_skips_the_rows_before_it(tmp_path):
    (tmp_path / "a.csv").write_text("id,x1\n0,1\n1,2,3\n\n2,3\n3,4\n4\n5,6\n")
    (shard,) = plan_shards(list_inputs([str(tmp_path / "a.csv")]), 100)
    tail = dataclasses.replace(shard, start=2, stop=5)  # rows 0-1 committed; a split took 5 on
    bad = []
    got = pa.Table.from_batches(list(read_shard(tail, ["id"], on_bad_row=lambda r, m: bad.append(r))))
    assert got["id"].to_pylist() == [2, 3] and [r for r in bad] == [4]


def test_a_quote_inside_a_value_does_not_hide_a_quoted_line_break(tmp_path):
    # the first quote is a character (mid-value), so counting quotes would call the break
    # inside "p\nq" a record end; the planner must read this file with the csv module
    (tmp_path / "a.csv").write_text('id,a,b,c\n0,5" x,"p\nq",7" y\n1,y,z,w\n')  # four quotes: even
    shards = plan_shards(list_inputs([str(tmp_path / "a.csv")]), 1)
    got = pa.Table.from_batches([b for s in shards for b in read_shard(s, ["id", "b"])])
    assert [(s.start, s.stop) for s in shards] == [(0, 1), (1, 2)]
    assert got["id"].to_pylist() == [0, 1] and got["b"].to_pylist() == ["p\nq", "z"]


def test_lone_carriage_returns_end_lines_only_inside_quotes(tmp_path):
    (tmp_path / "mac.csv").write_bytes(b"id,x1\r0,1\r1,2\r")
    with pytest.raises(SourceError, match=r"mac.csv: near byte \d+ a line ends with a lone carriage return"):
        plan_shards(list_inputs([str(tmp_path / "mac.csv")]), 10)
    (tmp_path / "ok.csv").write_bytes(b'id,t\r\n0,"a\rb"\r\n1,c\r\n')
    (shard,) = plan_shards(list_inputs([str(tmp_path / "ok.csv")]), 10)
    assert pa.Table.from_batches(list(read_shard(shard, ["t"])))["t"].to_pylist() == ["a\rb", "c"]


def test_planning_work_runs_on_threads_for_object_stores_in_order_with_the_first_error():
    import threading

    from bulkinfer.core.storage import concurrently

    seen: set[str] = set()

    def work(i: int) -> int:
        seen.add(threading.current_thread().name)
        if i == 7:
            raise SourceError(f"file {i}: unreadable", str(i))
        return i * i

    uris = [f"s3://bucket/f{i}.parquet" for i in range(20)]
    assert concurrently(work, list(range(7)), uris[:7]) == [i * i for i in range(7)]
    assert any(name != threading.current_thread().name for name in seen)  # threads were used
    with pytest.raises(SourceError, match="file 7"):
        concurrently(work, list(range(20)), uris)
    seen.clear()
    assert concurrently(work, [1, 2, 3, 4, 5], ["/local/a.parquet"] * 5) == [1, 4, 9, 16, 25]
    assert seen == {threading.current_thread().name}  # local files: this thread only
