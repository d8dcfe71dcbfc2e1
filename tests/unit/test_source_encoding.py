"""Text encodings of line-format inputs: a byte-order mark or ``source.encoding`` says how a
file is read, and a file whose bytes are not in that encoding fails with one line naming
the file, the first such byte's offset and the setting to use, wherever the byte is."""

from __future__ import annotations

import json

import pydantic
import pytest

import bulkinfer.sources.encoding as text_encoding
import bulkinfer.sources.linescan as linescan
from bulkinfer.config.source import SourceConfig
from bulkinfer.core.errors import SourceError
from bulkinfer.sources import Shard, head_schema, list_inputs, plan_shards, read_shard

FIX = (
    "set source.encoding (--input-encoding) to the file's encoding, e.g. cp1252, latin-1, utf-16 or shift_jis, "
    "or convert the file to UTF-8"
)


def _plan(path, encoding="auto", fmt="auto"):
    source = SourceConfig(encoding=encoding, format=fmt)
    files = list_inputs([str(path)], fmt, source)
    for f in files:
        head_schema(f)
    return plan_shards(files, 3)


def _rows(shards, columns):
    out = []
    for s in shards:
        for batch in read_shard(Shard.from_json(json.loads(json.dumps(s.to_json()))), columns):
            out.extend(batch.select(columns).to_pylist())
    return out


BODY = "id,text\n1,plain\n2,caf\u00e9\n3,\u00fcber\n"


@pytest.mark.parametrize(
    ("name", "data", "offset", "byte"),
    [
        # a CSV's body: the vectorised scan
        ("body.csv", BODY.encode("latin-1"), BODY.encode().index(b"caf") + 3, 0xE9),
        # its header: the column names
        ("header.csv", "id,pr\u00e9nom\n1,x\n".encode("latin-1"), 5, 0xE9),
        # after a quoted value holding a line break: the csv module's scan
        ("quoted.csv", b'id,text\n1,"two\nlines"\n2,caf\xe9\n', 27, 0xE9),
        # a JSONL line
        ("lines.jsonl", b'{"id": 1, "text": "ok"}\n{"id": 2, "text": "caf\x92"}\n', 46, 0x92),
        # a UTF-8 sequence cut short
        ("cut.jsonl", b'{"id": 1, "text": "\xe2\x82"}\n', 19, 0xE2),
    ],
)
def test_a_byte_that_is_not_utf8_fails_the_file_in_one_line_naming_it(tmp_path, name, data, offset, byte):
    (tmp_path / name).write_bytes(data)
    with pytest.raises(SourceError) as err:
        _plan(tmp_path / name)
    assert str(err.value) == f"{tmp_path / name}: byte {offset} (0x{byte:02X}) is not UTF-8; {FIX}"


def test_the_byte_is_found_exactly_across_scan_chunks(tmp_path, monkeypatch):
    """Chunks of 7 bytes cut the file everywhere: the offset is the file's, whatever the cut."""
    monkeypatch.setattr(linescan, "CHUNK", 7)
    lines = [f'{{"id": {i}, "text": "r\u00e9sum\u00e9 {i}"}}\n'.encode() for i in range(40)]
    lines[33] = lines[33].replace("\u00e9".encode(), b"\xe9", 1)
    (tmp_path / "a.jsonl").write_bytes(b"".join(lines))
    at = sum(map(len, lines[:33])) + lines[33].index(b"\xe9")
    with pytest.raises(SourceError, match=rf"a\.jsonl: byte {at} \(0xE9\) is not UTF-8; "):
        _plan(tmp_path / "a.jsonl")


def test_a_batch_file_is_checked_too(tmp_path):
    line = '{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"input": "caf\u00e9"}}\n'
    data = line.encode() + line.replace('"a"', '"b"').encode("latin-1")
    (tmp_path / "b.jsonl").write_bytes(data)
    with pytest.raises(SourceError) as err:
        _plan(tmp_path / "b.jsonl", fmt="openai-batch")
    assert str(err.value).endswith(f"b.jsonl: byte {len(line.encode()) + line.index('é')} (0xE9) is not UTF-8; {FIX}")


@pytest.mark.parametrize(
    ("codec", "declared"),
    [("utf-16", "auto"), ("utf-32", "auto"), ("utf-8-sig", "auto"), ("utf-16-be", "utf-16-be"),
     ("utf-16-le", "utf-16"), ("cp1252", "cp1252"), ("shift_jis", "shift_jis")],
)  # fmt: skip
def test_files_in_other_encodings_read_the_same_text_in_any_shard(tmp_path, codec, declared):
    texts = ["plain", "caf\u00e9 \u20ac", "\u3053\u3093\u306b\u3061\u306f", "x" * 10, "last"]
    if codec not in ("cp1252", "shift_jis"):
        texts.append("clef \U0001d11e")  # a surrogate pair in UTF-16
    if codec == "cp1252":
        texts[2] = "na\u00efve"
    if codec == "shift_jis":
        texts[1] = "\u30ab\u30d5\u30a7"  # no euro sign in Shift JIS
    expect = [{"id": i, "text": t} for i, t in enumerate(texts)]
    # the codec each shard is decoded with: UTF-8 (with or without a mark) is read as it is
    read_as = {"utf-8-sig": None, "utf-16": "utf-16-le", "utf-32": "utf-32-le"}.get(codec, codec)
    csv = "id,text\r\n" + "".join(f'{r["id"]},"{r["text"]}"\r\n' for r in expect)
    jsonl = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in expect)
    (tmp_path / "a.csv").write_bytes(csv.encode(codec))
    (tmp_path / "a.jsonl").write_bytes(jsonl.encode(codec))
    for name in ("a.csv", "a.jsonl"):
        shards = _plan(tmp_path / name, declared)
        assert len(shards) == 2 and {s.encoding for s in shards} == {read_as}
        assert _rows(shards, ["id", "text"]) == expect, (name, codec)
        assert shards[-1].end == (tmp_path / name).stat().st_size  # byte ranges are the file's


@pytest.mark.parametrize(
    ("declared", "data", "message"),
    [
        ("utf-16-le", "id,text\n1,ok\n".encode("utf-16-le") + b"\x00", "byte 26 (0x00) is not utf-16-le"),
        ("cp1252", b"id,text\n1,\x81\n", "byte 10 (0x81) is not cp1252"),
        ("utf-16", "id,text\n1,\ud800".encode("utf-16-le", "surrogatepass") + "x\n".encode("utf-16-le"),
         "byte 20 (0x00) is not utf-16-le"),
    ],
)  # fmt: skip
def test_a_byte_not_in_the_declared_encoding_fails_the_file_in_one_line(tmp_path, declared, data, message):
    (tmp_path / "a.csv").write_bytes(data)
    with pytest.raises(SourceError) as err:
        _plan(tmp_path / "a.csv", declared)
    assert str(err.value) == f"{tmp_path / 'a.csv'}: {message}; {FIX}"


def test_a_byte_order_mark_that_contradicts_the_setting_is_refused(tmp_path):
    (tmp_path / "a.csv").write_bytes("id,text\n1,ok\n".encode("utf-16"))
    with pytest.raises(SourceError) as err:
        _plan(tmp_path / "a.csv", "cp1252")
    assert str(err.value) == (
        f"{tmp_path / 'a.csv'}: the file begins with a UTF-16-LE byte-order mark but source.encoding says cp1252; "
        'set source.encoding = "auto" (or utf-16-le) or convert the file'
    )


def test_the_setting_is_checked_up_front():
    with pytest.raises(pydantic.ValidationError, match="unknown text encoding 'utf-17'"):
        SourceConfig(encoding="utf-17")
    with pytest.raises(pydantic.ValidationError, match="'rot13' is not a text encoding"):
        SourceConfig(encoding="rot13")
    with pytest.raises(pydantic.ValidationError, match="encoding applies to CSV and JSONL inputs, not to format"):
        SourceConfig(encoding="cp1252", format="parquet")
    assert SourceConfig(encoding="Latin-1").encoding == "Latin-1"


def test_decoding_a_shard_names_the_byte_in_the_file():
    with pytest.raises(SourceError, match=r"^f\.csv: byte 105 \(0x81\) is not cp1252; "):
        text_encoding.decoded(b"abcde\x81", "cp1252", "f.csv", 100)


def test_a_batch_file_in_utf16_is_recognised_and_its_requests_read(tmp_path):
    from bulkinfer.sources.openai_batch import looks_like_batch

    lines = [
        {"custom_id": f"r{i}", "method": "POST", "url": "/v1/embeddings", "body": {"input": f"caf\u00e9 {i}"}}
        for i in range(5)
    ]
    path = tmp_path / "b.jsonl"
    path.write_bytes("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines).encode("utf-16"))
    assert looks_like_batch(str(path))
    rows = _rows(_plan(path, fmt="openai-batch"), ["custom_id", "body"])
    assert [(r["custom_id"], json.loads(r["body"])) for r in rows] == [(x["custom_id"], x["body"]) for x in lines]


@pytest.mark.parametrize("codec", ["utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be"])
@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_wide_encoding_without_a_mark_is_one_line_naming_the_encoding_to_set(tmp_path, codec, suffix):
    """ASCII in UTF-16/32 without a byte-order mark is valid UTF-8 (its zeros are NULs): read as
    UTF-8 it made a header of "i\\0d\\0" and rows that failed one by one. It is refused, naming
    the encoding; declared, it reads."""
    text = BODY if suffix == ".csv" else "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in
                                                 [(1, "plain"), (2, "caf\u00e9"), (3, "\u00fcber")])  # fmt: skip
    path = tmp_path / f"wide{suffix}"
    path.write_bytes(text.encode(codec))
    with pytest.raises(SourceError) as caught:
        _plan(path)
    assert str(caught.value) == (
        f"{path}: the file looks like {codec.upper()} without a byte-order mark (its bytes are "
        f"{'every other' if '16' in codec else 'three in four'} 0); read it with --input-encoding {codec} "
        f'(source.encoding = "{codec}")'
    )
    assert [r["text"] for r in _rows(_plan(path, codec), ["id", "text"])] == ["plain", "caf\u00e9", "\u00fcber"]


def test_a_utf8_file_with_a_nul_byte_is_not_taken_for_a_wide_encoding():
    assert text_encoding.codec_of(b"id,text\n1,a\x00b\n2,plain text here\n", "auto", "f.csv") is None
    assert text_encoding.codec_of("id\n".encode("utf-16-le"), "auto", "f.csv") is None  # 6 bytes: too few to tell
