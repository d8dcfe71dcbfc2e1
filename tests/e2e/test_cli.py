from __future__ import annotations

import json
import os

import pytest

from helpers import cli, read_output, tabular_table, train_classifier, write


@pytest.fixture()
def job(tmp_path):
    write(tabular_table(900), tmp_path / "data" / "a.parquet", row_group_size=100)
    train_classifier(tmp_path / "model.joblib")
    (tmp_path / "job.toml").write_text(
        '[source]\npaths = ["data/*.parquet"]\nid_column = "id"\nshard_rows = 300\n'
        '[model]\nname = "model.joblib"\n[runtime]\nbatch_size = 50\n[sink]\npath = "out"\n'
        "[cost]\ninstance_price_per_hour = 0.34\n"
    )
    return tmp_path


def test_run_from_config_with_set_then_inspect(job):
    proc = cli("run", "job.toml", "--set", "runtime.batch_size=64", "--keep-columns", "segment", cwd=job, check=True)
    assert "done: 900 rows written this run (0 already committed)" in proc.stdout
    assert "per million rows" in proc.stdout
    report = json.loads((job / "out" / "_bulkinfer" / "report.json").read_text())
    assert report["batch_size"] == 64 and report["rows_out"] == 900 and report["status"] == "complete"
    assert set(report["time_s"]) == {"read", "preprocess", "infer", "write"}
    assert report["cost"]["per_million_rows"] > 0
    assert read_output(job / "out").column_names == [
        "id", "segment", "prediction", "proba_no", "proba_yes", "_input_hash"
    ]  # fmt: skip
    info = json.loads(cli("inspect", "out", "--json", cwd=job, check=True).stdout)
    assert info["complete"] is True and info["running"] is False
    assert (info["shards_committed"], info["shards_planned"], info["rows_committed"], info["rows_remaining"]) == (
        3,
        3,
        900,
        0,
    )
    text = cli("inspect", "out", cwd=job, check=True).stdout
    assert "complete" in text and "3/3 committed" in text and info["job_fingerprint"] in text
    assert info["column_types"]["segment"] == "string" and info["column_types"]["id"] == "int64"
    (types_line,) = [line for line in text.splitlines() if line.startswith("  column types")]
    assert "id int64" in types_line and "segment string" in types_line
    again = cli("run", "job.toml", "--set", "runtime.batch_size=64", "--keep-columns", "segment", cwd=job, check=True)
    assert "done: 0 rows written this run (900 already committed)" in again.stdout


def _config_fields() -> set[str]:
    """Every ``section.field`` of the config, read off the pydantic models (export: each kind's)."""
    import typing

    from pydantic import BaseModel

    from bulkinfer.config import JobConfig

    def models(annotation) -> list[type[BaseModel]]:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return [annotation]
        return [m for arg in typing.get_args(annotation) for m in models(arg)]

    from bulkinfer.config import ModelConfig
    from bulkinfer.config.ensemble import MemberConfig

    fields = {
        f"{section}.{name}"
        for section, field in JobConfig.model_fields.items()
        if section != "models"
        for model in models(field.annotation)
        for name in model.model_fields
    }  # [models.<name>] tables: [model]'s fields (listed once, under model.) and their own
    return fields | {"models.<name>"} | {f"models.<name>.{n}" for n in MemberConfig.model_fields
                                         if n not in ModelConfig.model_fields}  # fmt: skip


def test_help_lists_every_config_field():
    out = cli("run", "--help", env={**os.environ, "COLUMNS": "200"}, check=True).stdout
    fields = _config_fields()
    assert len(fields) > 100 and {"source.shard_rows", "export.maxlen", "route.when"} <= fields
    assert sorted(f for f in fields if f"{f} = " not in out) == []
    assert "Rows sorted by length together" in out
    assert "Output format: parquet, jsonl, csv, openai-batch, delta, zarr." in " ".join(out.split()).replace("- ", "-")


def test_version_prints_the_packages_version():
    from bulkinfer import __version__

    assert cli("--version", check=True).stdout == f"bulkinfer {__version__}\n"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--set", "runtime.batchsize=3"], "runtime.batchsize: unknown field"),
        (["--set", "runtime.batch_size=0"], 'runtime.batch_size: expected a whole number >= 1 or "auto" (got 0)'),
        (["-i", "missing/*.parquet"], "missing/*.parquet: the pattern matches no file"),
        (["-m", "nope.joblib"], "model 'nope.joblib': no such file"),
        (
            ["--set", "source.id_column='ident'"],
            "/data/a.parquet (it has id, x1, x2, x3, segment); check the column name",
        ),
        (["--input-encoding", "utf-17"], "source.encoding: unknown text encoding 'utf-17'"),
        (["--input-encoding", "cp1252"], "source.encoding = 'cp1252' applies to CSV and JSONL files; the inputs are"),
    ],
)
def test_user_mistakes_are_one_line_errors(job, args, needle):
    proc = cli("run", "job.toml", *args, cwd=job)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("bulkinfer: error: ") and needle in lines[-1], proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_file_in_another_encoding_is_one_line_until_its_encoding_is_set(job):
    table = tabular_table(30)
    csv = "id,x1,x2,x3,segment\r\n" + "".join(
        f"{r['id']},{r['x1']},{r['x2']},{r['x3']},caf\u00e9 \u2013 {r['segment']}\r\n" for r in table.to_pylist()
    )
    (job / "win.csv").write_bytes(csv.encode("cp1252"))
    args = ("run", "job.toml", "-i", "win.csv", "--keep-columns", "segment", "-o")
    proc = cli(*args, "o1", cwd=job)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    at = csv.encode().index("\u00e9".encode())
    assert proc.stderr.strip().splitlines()[-1] == (
        f"bulkinfer: error: {job / 'win.csv'}: byte {at} (0xE9) is not UTF-8; set source.encoding (--input-encoding) to the "
        "file's encoding, e.g. cp1252, latin-1, utf-16 or shift_jis, or convert the file to UTF-8"
    )
    cli(*args, "o2", "--input-encoding", "cp1252", cwd=job, check=True)
    out = read_output(job / "o2")
    assert out["segment"].to_pylist() == [f"caf\u00e9 \u2013 {s}" for s in table["segment"].to_pylist()]
    assert json.loads((job / "o2" / "_bulkinfer" / "job.json").read_text())["identity"]["source.encoding"] == "cp1252"


def test_usage_error_exits_2(job):
    proc = cli("run", "job.toml", "--batch-size", "many", cwd=job)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr


def test_inspect_of_a_non_output_is_one_line(tmp_path):
    proc = cli("inspect", str(tmp_path))
    assert proc.returncode == 1
    assert (
        proc.stderr.strip()
        == f"bulkinfer: error: {tmp_path}: not a bulkinfer output directory (no _bulkinfer/job.json)"
    )


@pytest.mark.parametrize(
    ("settings", "needle"),
    [
        (
            ["runtime.engine=torch"],
            "sees 0 GPU(s) here; set runtime.device = cpu, or run where the GPU and a CUDA build",
        ),
        (["runtime.engine=onnxruntime"], "has no CUDA provider ("),
        (["runtime.tensorrt=true", "runtime.precision=fp16"], "has no TensorRT provider ("),
        (["runtime.precision=auto"], "sees 0 GPU(s) here"),  # not a calibration where every candidate fails
    ],
)
def test_a_gpu_job_on_a_machine_without_one_is_one_line_and_writes_nothing(tmp_path, settings, needle):
    from bulkinfer.core.hardware import gpu

    from helpers import make_catalog

    if gpu("cuda") is not None:
        pytest.skip("this machine has a GPU")
    write(make_catalog(20), tmp_path / "in.parquet")
    proc = cli("run", "-i", "in.parquet", "-m", "minilm", "--text-column", "description", "-o", "out",
               "--set", "runtime.device=cuda", *[a for x in settings for a in ("--set", x)], cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("bulkinfer: error: runtime.device = cuda: ") and needle in last, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list((tmp_path / "out").glob("part-*"))


def test_the_log_is_bulkinfers_lines_not_the_libraries_progress_chatter(tmp_path, tiny):
    """Building an int8 model drives onnxruntime's quantizer, which logs dozens of INFO lines
    (one per tensor); the job's log keeps bulkinfer's own lines and the libraries' warnings."""
    from helpers import make_catalog

    model = tiny
    write(make_catalog(40), tmp_path / "in.parquet")
    proc = cli("run", "-i", "in.parquet", "-m", str(model), "--text-column", "description", "--id-column", "id",
               "-o", "out", "--progress", "none", "--set", "runtime.precision=int8", "--set", "runtime.quality_floor=0.5",
               "--set", "runtime.quality_sample_rows=16", "--set", f"runtime.cache_dir={tmp_path / 'cache'}",
               cwd=tmp_path, check=True)  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert any("compiled the model for onnxruntime/int8" in line for line in lines), proc.stderr
    assert any(line.startswith("bulkinfer: quality gate") for line in lines), proc.stderr
    assert not [line for line in lines if "Quantization parameters" in line or "pre-processing" in line], proc.stderr
    assert all(line.startswith("bulkinfer: ") for line in lines), proc.stderr
    assert read_output(tmp_path / "out").num_rows == 40


def test_machine_says_what_runs_fast_here_and_what_tune_measured(tmp_path):
    from bulkinfer import load_config
    from bulkinfer.adapters import resolve_model
    from bulkinfer.core import hardware
    from bulkinfer.precision.tune import results_path

    found = json.loads(cli("machine", "--json", check=True).stdout)
    assert found["isa"] == hardware.isa_key() and found["cpu"]["features"] == hardware.cpu()["features"]
    verdicts = {(r["device"], r["precision"]): r["verdict"] for r in found["precisions"]}
    for precision in ("bf16", "fp16"):
        assert (verdicts[("cpu", precision)] == "emulated") == hardware.emulated("cpu", precision)
    assert verdicts[("cpu", "int8")] == ("weak kernels" if hardware.int8_scheme()["reduce_range"] else "native")
    if hardware.gpu("cuda") is None:
        assert found["gpu"] is None and verdicts[("cuda", "fp32/fp16/bf16")] == "unavailable"
    # with a model: the fastest candidate tune measured here that passed its gate (a faster failed one is not it)
    cache = tmp_path / "cache"
    cfg = load_config(sets=[f"runtime.cache_dir={cache}", "model.name=minilm"])
    path = results_path(cfg, resolve_model(cfg).digest)
    path.parent.mkdir(parents=True)
    measured = [("onnxruntime", "int8", 16, 420.5, False), ("onnxruntime", "int8", 32, 390.1, True),
                ("onnxruntime", "fp32", 16, 250.0, True)]  # fmt: skip
    path.write_text(json.dumps({"candidates": [
        {"engine": e, "precision": p, "batch_size": b, "rows_per_s": r, "passed": ok} for e, p, b, r, ok in measured
    ]}))  # fmt: skip
    proc = cli("machine", "-m", "minilm", "--set", f"runtime.cache_dir={cache}", check=True)
    assert "bulkinfer tune here (cpu): onnxruntime int8, batch 32: 390.1 rows/s" in proc.stdout
    assert f"machine kind {hardware.isa_key()}" in proc.stdout and "engines and precisions here" in proc.stdout
    other = cli("machine", "-m", "minilm", "--json", "--set", f"runtime.cache_dir={tmp_path / 'none'}", check=True)
    assert json.loads(other.stdout)["tune"]["cpu"] == "not measured (run bulkinfer tune on this machine)"


def test_a_table_job_counts_and_says_the_texts_it_truncated_or_refuses_them(tmp_path):
    """A text over the model's 256 tokens: embedded from its first tokens (as sentence-transformers
    does), counted in report.json and said in one line; with model.truncate = false an error row."""
    import pyarrow as pa

    write(pa.table({"id": [1, 2, 3], "t": ["short", "word " * 600, "also short"]}), tmp_path / "in.parquet")
    base = ["run", "-i", "in.parquet", "-m", "minilm", "--text-column", "t", "--id-column", "id", "--progress", "none"]
    proc = cli(*base, "-o", "cut", cwd=tmp_path, check=True)
    report = json.loads((tmp_path / "cut" / "_bulkinfer" / "report.json").read_text())
    assert report["rows_truncated"] == 1 and report["rows_out"] == 3
    (line,) = [x for x in proc.stderr.splitlines() if "over the model's limit" in x]
    assert line.startswith("bulkinfer: 1 row(s) had texts over the model's limit of 256 tokens")
    cli(*base, "-o", "refused", "--set", "model.truncate=false", "--set", "execution.max_errors=1", cwd=tmp_path,
        check=True)  # fmt: skip
    report = json.loads((tmp_path / "refused" / "_bulkinfer" / "report.json").read_text())
    assert report["rows_out"] == 2 and report["rows_failed"] == 1 and report["rows_truncated"] == 0
    (err,) = [
        json.loads(x) for p in (tmp_path / "refused" / "_errors").glob("*.jsonl") for x in p.read_text().splitlines()
    ]
    assert err["id"] == 2 and "the text has 602 tokens, over the model's limit of 256" in err["message"]
