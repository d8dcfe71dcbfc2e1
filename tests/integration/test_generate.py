"""Text generation over a table with tiny random-weight causal LMs built here (Llama- and
GPT-2-style, tokenizer trained locally): batched, left-padded greedy decoding equals
one-prompt-at-a-time ``model.generate``, token for token; prompts over the context are
error rows; stop strings and finish reasons."""

from __future__ import annotations

import pyarrow as pa
import pytest

from bulkinfer import load_config, run_job

from helpers import read_output, write
from tiny_lm import WORDS, tiny_lm


def one_at_a_time(path, prompts, max_new_tokens):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    out = []
    for p in prompts:
        ids = tok(p, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            gen = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )
        new = gen[0, ids.shape[1]:].tolist()  # fmt: skip
        if tok.eos_token_id in new:
            new = new[: new.index(tok.eos_token_id)]
        out.append(tok.decode(new, skip_special_tokens=True))
    return out


def prompts_table(n: int) -> pa.Table:
    texts = [" ".join(WORDS[(i * 3) % 10 : (i * 3) % 10 + 1 + i % 9]) for i in range(n)]
    return pa.table({"id": list(range(n)), "product": [f"item {i}" for i in range(n)], "text": texts})


@pytest.mark.parametrize("style", ["llama", "gpt2"])
def test_batched_greedy_equals_one_prompt_at_a_time(tmp_path, style):
    model = tiny_lm(tmp_path / style, style)
    t = prompts_table(30)
    write(t, tmp_path / "in.parquet")
    cfg = load_config(overrides={
        "source.paths": [str(tmp_path / "in.parquet")], "model.name": str(model), "source.id_column": "id",
        "model.prompt_template": "Review of {product}: {text}", "model.max_new_tokens": 12,
        "sink.path": str(tmp_path / "out"), "runtime.batch_size": 8, "execution.progress": "none",
    })  # fmt: skip
    result = run_job(cfg)
    assert result.report["model_kind"] == "generate" and result.report["rows_out"] == 30
    out = read_output(tmp_path / "out").sort_by("id")
    assert out.column_names == [
        "id", "completion", "finish_reason", "prompt_tokens", "completion_tokens", "_input_hash"
    ]  # fmt: skip
    prompts = [f"Review of {p}: {x}" for p, x in zip(t["product"].to_pylist(), t["text"].to_pylist(), strict=True)]
    assert out["completion"].to_pylist() == one_at_a_time(model, prompts, 12)
    assert set(out["finish_reason"].to_pylist()) <= {"stop", "length"}
    lengths = out["prompt_tokens"].to_pylist()
    assert len(set(lengths)) > 3  # prompts of many lengths were batched (left padding mattered)
    assert all(0 <= n <= 12 for n in out["completion_tokens"].to_pylist())


def test_prompts_over_the_context_are_error_rows_and_stop_strings_end_completions(tmp_path):
    model = tiny_lm(tmp_path / "llama", "llama")
    long = " ".join(WORDS * 6)  # far over the 64-token context
    t = pa.table({"id": [0, 1, 2, 3], "text": ["red running shoes", long, "", "the quick brown fox"]})
    write(t, tmp_path / "in.parquet")
    base = {"source.paths": [str(tmp_path / "in.parquet")], "model.name": str(model), "source.id_column": "id",
            "model.text_column": "text", "model.max_new_tokens": 10, "execution.progress": "none"}  # fmt: skip
    result = run_job(load_config(overrides={**base, "sink.path": str(tmp_path / "out")}))
    out = read_output(tmp_path / "out").sort_by("id")
    assert out["id"].to_pylist() == [0, 2, 3] and result.report["rows_failed"] == 1
    errors = (tmp_path / "out" / "_errors").read_text() if (tmp_path / "out" / "_errors").is_file() else "".join(
        p.read_text() for p in (tmp_path / "out" / "_errors").glob("*.jsonl"))  # fmt: skip
    assert '"id": 1' in errors and "over the model's context of 64" in errors and '"stage": "preprocess"' in errors
    empty = out.filter(pa.compute.equal(out["id"], 2))
    assert empty["prompt_tokens"].to_pylist() == [1]  # an empty prompt starts from BOS and is answered

    first = out["completion"].to_pylist()[0]
    cut = first[len(first) // 2 :][:3]
    assert cut  # a piece of the first completion, used as a stop string
    stopped = run_job(load_config(overrides={**base, "sink.path": str(tmp_path / "stopped"), "model.stop": [cut]}))
    s = read_output(tmp_path / "stopped").sort_by("id")
    assert s["completion"].to_pylist()[0] == first[: first.index(cut)]
    assert s["finish_reason"].to_pylist()[0] == "stop" and stopped.report["rows_out"] == 3


def test_sampling_is_per_row_reproducible_whatever_the_batch(tmp_path):
    model = tiny_lm(tmp_path / "llama", "llama")
    write(prompts_table(12), tmp_path / "in.parquet")

    def run(out, **extra):
        cfg = load_config(overrides={
            "source.paths": [str(tmp_path / "in.parquet")], "model.name": str(model), "source.id_column": "id",
            "model.text_column": "text", "model.max_new_tokens": 8, "model.temperature": 0.9, "model.top_p": 0.9,
            "sink.path": str(tmp_path / out), "execution.progress": "none", **extra,
        })  # fmt: skip
        run_job(cfg)
        return read_output(tmp_path / out).sort_by("id")["completion"].to_pylist()

    big, single = run("b8", **{"runtime.batch_size": 8}), run("b1", **{"runtime.batch_size": 1})
    assert big == single  # each row draws from its own generator: the batch it lands in does not matter
    other_seed = run("s7", **{"runtime.batch_size": 8, "model.seed": 7})
    greedy = run("g", **{"model.temperature": 0.0})
    assert other_seed != big and greedy != big


def test_chat_messages_with_a_json_schema_expand_into_typed_columns(tmp_path):
    import json

    import jsonschema
    from transformers import AutoTokenizer

    model = tiny_lm(tmp_path / "llama", "llama", context=256)
    schema = {
        "type": "object",
        "properties": {
            "sentiment": {"enum": ["positive", "negative", "neutral"]},
            "stars": {"type": "integer", "minimum": 1, "maximum": 5},
            "tags": {"type": "array", "items": {"enum": ["shoes", "fox", "dog"]}, "maxItems": 2},
            "spam": {"type": "boolean"},
        },
        "required": ["sentiment", "stars", "tags", "spam"],
        "additionalProperties": False,
    }
    t = prompts_table(16)
    write(t, tmp_path / "in.parquet")
    messages = [
        {"role": "system", "content": "Label reviews as JSON."},
        {"role": "user", "content": "{product}: {text}"},
    ]
    cfg = load_config(overrides={
        "source.paths": [str(tmp_path / "in.parquet")], "model.name": str(model), "source.id_column": "id",
        "model.messages": messages, "model.json_schema": schema, "model.expand_json": True,
        "model.max_new_tokens": 120, "model.temperature": 1.0, "sink.path": str(tmp_path / "out"),
        "execution.progress": "none", "runtime.batch_size": 6,
    })  # fmt: skip
    run_job(cfg)
    out = read_output(tmp_path / "out").sort_by("id")
    assert out.column_names == ["id", "completion", "finish_reason", "prompt_tokens", "completion_tokens",
                                "sentiment", "stars", "tags", "spam", "_input_hash"]  # fmt: skip
    assert [str(out.schema.field(c).type) for c in ("sentiment", "stars", "tags", "spam")] == [
        "string", "int64", "list<element: string>", "bool"]  # fmt: skip
    # random weights sampled at temperature 1, yet every completion is JSON valid against the schema
    assert out["finish_reason"].to_pylist() == ["stop"] * 16
    parsed = [json.loads(c) for c in out["completion"].to_pylist()]
    for obj in parsed:
        jsonschema.validate(obj, schema)
    assert out["stars"].to_pylist() == [o["stars"] for o in parsed]
    assert out["tags"].to_pylist() == [o["tags"] for o in parsed]
    tok = AutoTokenizer.from_pretrained(model)
    first = [{"role": "system", "content": "Label reviews as JSON."},
             {"role": "user", "content": f"{t['product'][0]}: {t['text'][0]}"}]  # fmt: skip
    prompt = tok.apply_chat_template(first, tokenize=False, add_generation_prompt=True)
    assert out["prompt_tokens"][0].as_py() == len(tok(prompt, add_special_tokens=False)["input_ids"])


def test_tokens_are_reported_and_max_cost_stops_the_job_cleanly(tmp_path):
    import json

    from bulkinfer.core.errors import CostLimitReached

    model = tiny_lm(tmp_path / "gpt2", "gpt2")
    write(prompts_table(40), tmp_path / "in.parquet")
    over = {"source.paths": [str(tmp_path / "in.parquet")], "model.name": str(model), "source.id_column": "id",
            "model.text_column": "text", "model.max_new_tokens": 6, "sink.path": str(tmp_path / "out"),
            "source.shard_rows": 5, "execution.progress": "none", "cost.instance_price_per_hour": 3600.0}  # fmt: skip
    with pytest.raises(CostLimitReached, match=r"projected cost [\d.]+ USD is over execution.max_cost = 0.01 USD"):
        run_job(load_config(overrides={**over, "execution.max_cost": 0.01}))  # a second of this machine costs 1
    first = json.loads((tmp_path / "out" / "_bulkinfer" / "report.json").read_text())
    assert first["status"] == "interrupted" and 0 < first["rows_out"] < 40
    done_first = set(read_output(tmp_path / "out")["id"].to_pylist())
    result = run_job(load_config(overrides=over))  # the rerun resumes: every row exactly once
    out = read_output(tmp_path / "out")
    assert sorted(out["id"].to_pylist()) == list(range(40))
    tokens, cost = result.report["tokens"], result.report["cost"]
    rerun = [r for r in out.to_pylist() if r["id"] not in done_first]  # the rows this run generated
    assert tokens["completion"] == sum(r["completion_tokens"] for r in rerun)
    assert tokens["prompt"] == sum(r["prompt_tokens"] for r in rerun)
    firsts = sum(r["completion_tokens"] for r in out.to_pylist() if r["id"] in done_first)
    assert first["tokens"]["completion"] >= firsts  # the first run's tokens, work lost to the stop included
    total = tokens["prompt"] + tokens["completion"]
    assert cost["per_million_tokens"] == pytest.approx(cost["run"] / total * 1e6, rel=1e-3)
    assert tokens["completion_per_s"] == pytest.approx(tokens["completion"] / result.report["run_s"], rel=1e-2)


def test_engine_choices_for_generation_models_are_one_line_errors(tmp_path):
    from bulkinfer.core.errors import ConfigError, ModelError

    model = tiny_lm(tmp_path / "llama", "llama")
    write(prompts_table(3), tmp_path / "in.parquet")
    base = {"source.paths": [str(tmp_path / "in.parquet")], "model.name": str(model), "model.text_column": "text",
            "sink.path": str(tmp_path / "out"), "execution.progress": "none"}  # fmt: skip
    with pytest.raises(ConfigError, match="generation models run on transformers"):
        run_job(load_config(overrides={**base, "runtime.engine": "onnxruntime"}))
    try:
        import vllm  # noqa: F401
    except ImportError:  # no vLLM here (CPU): the job says how to get it, nothing is written
        with pytest.raises(ModelError, match=r"vLLM is not installed .*pip install 'bulkinfer\[vllm\]'"):
            run_job(load_config(overrides={**base, "runtime.engine": "vllm"}))
        assert not list((tmp_path / "out").glob("part-*"))


def test_the_grammar_mask_follows_the_logits_device_and_a_padded_vocabulary(tmp_path):
    """On a GPU the logits live on the device: the mask (and the padding past the tokenizer's
    vocabulary) must be made there too. The meta device stands in for CUDA here: mixing devices
    raises the same error."""
    import torch
    from transformers import AutoTokenizer

    from bulkinfer.llm.constrain import Grammars, schema_grammar

    tok = AutoTokenizer.from_pretrained(tiny_lm(tmp_path / "llama", "llama"))
    padded = tok.vocab_size + 13  # logits wider than the vocabulary the grammar knows
    matcher = Grammars(tok, tok.vocab_size).matcher(
        schema_grammar({"type": "object", "properties": {"a": {"enum": ["x"]}}})
    )
    assert matcher.mask(torch.zeros(padded, device="meta")).device.type == "meta"
    masked = matcher.mask(torch.zeros(padded))
    allowed = torch.isfinite(masked)
    assert 0 < int(allowed.sum()) < tok.vocab_size and not allowed[tok.vocab_size :].any()
    assert tok.decode([int(i) for i in allowed.nonzero().flatten()]).strip().startswith("{")
