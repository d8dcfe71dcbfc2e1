"""The text adapter's tokenizer (tokenizers, from tokenizer.json) gives transformers' token ids, and
a text job runs without importing transformers or torch (seconds and hundreds of MB per process)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import pytest

from bulkinfer.adapters.tokenizer import FastTokenizer, load_tokenizer

from helpers import make_catalog, write

TEXTS = ["", "a", "héllo wörld 🙂 " * 200, "x" * 5000, "日本語のテキスト", "  spaced\tout\n", "[CLS] [SEP] [PAD]"]


def test_the_same_ids_as_transformers(minilm_path):
    from transformers import AutoTokenizer

    ref = AutoTokenizer.from_pretrained(str(minilm_path), local_files_only=True)
    tok = load_tokenizer(minilm_path)
    assert isinstance(tok, FastTokenizer)
    texts = TEXTS + make_catalog(300, seed=7)["description"].to_pylist()
    for limit in (513, 129, 9, 3):
        want = ref(texts, truncation=True, max_length=limit, padding=False, return_attention_mask=False,
                   return_token_type_ids=False)["input_ids"]  # fmt: skip
        assert tok(texts, truncation=True, max_length=limit)["input_ids"] == want
    for text in TEXTS:
        assert tok(text)["input_ids"] == ref(text, truncation=False, return_attention_mask=False)["input_ids"]
    assert tok.all_special_ids == sorted(ref.all_special_ids) and tok.pad_token_id == ref.pad_token_id == 0
    assert tok.model_max_length == ref.model_max_length == 512
    with pytest.raises(ValueError, match="ids only"):
        tok(TEXTS, padding=True)


def test_a_folder_without_tokenizer_json_gets_transformers_and_a_bad_one_is_refused(tmp_path, minilm_path):
    slow = tmp_path / "slow"
    shutil.copytree(minilm_path, slow)
    (slow / "tokenizer.json").unlink()
    tok = load_tokenizer(slow)
    assert not isinstance(tok, FastTokenizer)
    assert tok(["a blue shirt"])["input_ids"] == FastTokenizer(minilm_path)(["a blue shirt"])["input_ids"]
    (slow / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a tokenizer file"):
        load_tokenizer(slow)


def test_a_text_job_imports_neither_transformers_nor_torch(tmp_path):
    write(make_catalog(20, seed=1), tmp_path / "in.parquet")
    script = textwrap.dedent(f"""
        import sys
        from bulkinfer import load_config, run_job
        run_job(load_config(overrides={{"source.paths": [{str(tmp_path / "in.parquet")!r}], "model.name": "minilm",
                "model.text_column": "description", "sink.path": {str(tmp_path / "out")!r},
                "execution.progress": "none"}}))
        print(sorted(m for m in ("torch", "transformers") if m in sys.modules))
    """)
    # the first run may export the model to ONNX (torch's exporter) into this session's cache; a run
    # with the export cached, as every run after the first on a machine is, imports neither
    for out in ("first", "cached"):
        proc = subprocess.run([sys.executable, "-c", script.replace("/out'", f"/{out}'")], capture_output=True,
                              text=True, timeout=300)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"
