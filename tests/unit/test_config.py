from __future__ import annotations

import pytest

from bulkinfer.config import JobConfig, field_docs, load_config
from bulkinfer.core.errors import ConfigError


def test_toml_then_overrides_then_set(tmp_path):
    f = tmp_path / "job.toml"
    f.write_text(
        '[source]\npaths = ["a.parquet"]\n[model]\nname = "minilm"\ntext_column = "t"\n'
        '[runtime]\nbatch_size = 8\n[sink]\npath = "out"\n'
    )
    cfg = load_config(
        f, {"runtime.batch_size": 32, "sink.path": None}, ["runtime.sort_window=64", "sink.keep_columns=['a','b']"]
    )
    assert cfg.runtime.batch_size == 32
    assert cfg.runtime.sort_window == 64
    assert cfg.sink.keep_columns == ["a", "b"]
    assert cfg.sink.path == "out"
    assert cfg.model.text_column == "t"


def test_unknown_field_is_one_line_naming_it(tmp_path):
    f = tmp_path / "job.toml"
    f.write_text("[runtime]\nbatchsize = 8\n")
    with pytest.raises(ConfigError) as err:
        load_config(f)
    msg = str(err.value)
    assert "\n" not in msg
    assert "runtime.batchsize" in msg and "unknown field" in msg and str(f) in msg


def test_wrong_type_names_field_and_value():
    with pytest.raises(ConfigError) as err:
        load_config(sets=["runtime.batch_size=lots"])
    assert "runtime.batch_size" in str(err.value) and "'lots'" in str(err.value)


def test_set_needs_key_value():
    with pytest.raises(ConfigError, match="expected key=value"):
        load_config(sets=["runtime.batch_size"])


def test_bad_toml_is_reported(tmp_path):
    f = tmp_path / "job.toml"
    f.write_text("[runtime\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(f)


def test_config_is_frozen():
    cfg = JobConfig()
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="frozen_instance"):
        cfg.runtime.batch_size = 3  # type: ignore[misc]
    assert cfg.runtime.batch_size == JobConfig().runtime.batch_size


def test_every_field_is_documented():
    docs = list(field_docs())
    assert len(docs) > 25
    undocumented = [name for name, _default, doc in docs if not doc]
    assert undocumented == []


def test_require_runnable_names_missing_field():
    with pytest.raises(ConfigError, match="source.paths"):
        JobConfig().require_runnable()


def test_an_unknown_output_scheme_is_refused_not_written_to_a_local_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = {"source.paths": ["in.parquet"], "model.name": "minilm"}
    with pytest.raises(ConfigError) as err:
        load_config(overrides={**base, "sink.path": "nosuch://bucket/out"}).require_runnable()
    assert str(err.value) == "sink.path: nosuch://bucket/out: no filesystem knows nosuch:// (fsspec has none)"
    load_config(overrides={**base, "sink.path": "s3://bucket/out"}).require_runnable()
    load_config(overrides={**base, "sink.path": f"file://{tmp_path}/out"}).require_runnable()
    assert not (tmp_path / "nosuch:").exists() and not (tmp_path / "s3:").exists()


@pytest.mark.parametrize(
    ("sets", "says"),
    [
        (["runtime.tensorrt=true"], "runs on an NVIDIA GPU, not runtime.device = cpu"),
        (["runtime.tensorrt=true", "runtime.device=cuda", "runtime.precision=int8"], "not auto/int8"),
        (["runtime.tensorrt=true", "runtime.device=cuda", "runtime.precision=auto"], "not auto/auto"),
        (["runtime.tensorrt=true", "runtime.device=cuda", "runtime.engine=torch", "runtime.precision=fp16"],
         "not torch/fp16"),
    ],
)  # fmt: skip
def test_tensorrt_is_refused_where_it_cannot_run_in_one_line(sets, says):
    with pytest.raises(ConfigError) as err:
        load_config(sets=sets)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("config: runtime.tensorrt: TensorRT runs") and says in msg
    assert "runtime.tensorrt = false" in msg


def test_tensorrt_runs_the_onnxruntime_engine_in_fp32_or_fp16():
    from bulkinfer.adapters import _tensorrt_rows
    from bulkinfer.engines import choose_engine

    for precision in ("fp32", "fp16"):
        rt = load_config(
            sets=["runtime.tensorrt=true", "runtime.device=cuda:1", f"runtime.precision={precision}"]
        ).runtime
        assert choose_engine(rt.engine, rt.precision, rt.device, rt.tensorrt) == "onnxruntime"
    # tune's torch candidates of a TensorRT job stay torch; without TensorRT, fp16 is torch's
    assert choose_engine("torch", "fp16", "cuda", True) == "torch"
    with pytest.raises(ConfigError, match="fp16 runs on the torch engine"):
        choose_engine("onnxruntime", "fp16", "cuda", False)
    # the engine's optimization profile: the batch size when set, tune's largest for auto, else the GPU default
    gpu = ["runtime.tensorrt=true", "runtime.device=cuda"]
    assert _tensorrt_rows(load_config(sets=gpu).runtime) == 256
    assert _tensorrt_rows(load_config(sets=[*gpu, "runtime.batch_size=64"]).runtime) == 64
    assert _tensorrt_rows(load_config(sets=[*gpu, 'runtime.batch_size="auto"']).runtime) == 1024
    assert _tensorrt_rows(load_config(sets=["runtime.device=cuda"]).runtime) is None


def _flags_inside_tables() -> list[str]:
    """The `run` command's flags that set a field inside a table-valued field (model.options.k ...),
    read from the command's own table of flags, so a new one is tested too."""
    from bulkinfer.cli.run import FLAG_FIELDS

    return [k for k in FLAG_FIELDS.values() if k.count(".") >= 2]


def test_every_flag_inside_a_table_merges_with_a_set_of_that_table(tmp_path):
    flags = _flags_inside_tables()
    assert "model.options.k" in flags
    for key in flags:
        table, _, field = key.rpartition(".")
        cfg = load_config(overrides={key: 3}, sets=[f"{table}={{other = 'x'}}"])
        section, name = table.split(".", 1)
        assert getattr(getattr(cfg, section), name) == {field: 3, "other": "x"}, key


def test_a_set_of_a_table_merges_into_the_files_table_and_a_clash_with_a_flag_is_refused(tmp_path):
    f = tmp_path / "job.toml"
    f.write_text('[model]\nname = "items.index"\noptions = {exclude_self = false, k = 5}\n')
    cfg = load_config(f, {"model.options.k": None}, ["model.options={k_column = 'k'}"])
    assert cfg.model.options == {"exclude_self": False, "k": 5, "k_column": "k"}
    cfg = load_config(f, {"model.options.k": 3}, ["model.options={k = 3}"])  # the same value twice: fine
    assert cfg.model.options["k"] == 3
    with pytest.raises(
        ConfigError, match=r"^model\.options\.k: a flag sets 3 and --set model\.options sets 7; give it once$"
    ):
        load_config(f, {"model.options.k": 3}, ["model.options={k = 7}"])
    with pytest.raises(ConfigError, match=r"^runtime\.batch_size: a flag sets 32 and --set runtime\.batch_size sets 8"):
        load_config(f, {"runtime.batch_size": 32}, ["runtime.batch_size=8"])
