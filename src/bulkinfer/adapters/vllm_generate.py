"""The vLLM engine for generation models (``runtime.engine = "vllm"``, GPU, ``pip install
bulkinfer[vllm]``): the same adapter as transformers' — the same prompts, chat templates,
requests, seeds, stop strings, schemas and output columns — with vLLM's offline
``LLM.generate`` as the model call, which schedules a whole batch of prompts by itself
(continuous batching, paged KV cache). bulkinfer hands it large batches
(``runtime.batch_size`` defaults to 1024 here) and keeps what vLLM's own ``run_batch``
lacks: shard commits, resume, SIGTERM, error rows, Ray.

Only this module imports vllm; it runs only where vLLM and a GPU are.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..core.errors import ModelError
from .generate import GenerateAdapter, Prompts
from .protocol import SetupContext

__all__ = ["VllmGenerateAdapter"]


class VllmGenerateAdapter(GenerateAdapter):
    batch_size_hint = 1024

    def setup(self, ctx: SetupContext) -> None:
        try:
            from vllm import LLM
        except ImportError as exc:
            raise ModelError(
                f"runtime.engine = vllm: vLLM is not installed ({exc}); pip install 'bulkinfer[vllm]' on a GPU machine"
            ) from exc
        self.load_tokenizer()
        try:
            self.model = LLM(model=self.model_path, tokenizer=self.model_path, seed=self.seed,
                             dtype={"bf16": "bfloat16", "fp16": "float16"}.get(self.precision, "auto"))  # fmt: skip
        except Exception as exc:  # vLLM raises many kinds (no GPU, out of memory, unsupported architecture)
            raise ModelError(f"model {self.model_path}: vLLM could not load it ({type(exc).__name__}: {exc})") from exc
        config = self.model.llm_engine.model_config
        self.context = int(getattr(config, "max_model_len", 0) or 0)
        self.engine_name = "vllm"

    def predict(self, batch: Prompts) -> Mapping[str, Any]:
        from ..llm.decode import Generated

        prompts = [{"prompt_token_ids": ids} for ids in batch.ids]
        results = self.model.generate(prompts, [_params(p) for p in batch.params], use_tqdm=False)
        out = []
        for r in results:
            o = r.outputs[0]
            tokens = list(o.token_ids)
            reason = "length" if o.finish_reason == "length" else "stop"
            out.append(Generated(tokens, o.text, reason, len(tokens)))
        return self.columns(batch, out)


def _params(p: Any) -> Any:
    """vLLM's SamplingParams for one row's ``llm.decode.Sampling``."""
    from vllm import SamplingParams

    extra: dict[str, Any] = {}
    if p.schema is not None:
        try:  # vLLM >= 0.10
            from vllm.sampling_params import StructuredOutputsParams

            extra["structured_outputs"] = StructuredOutputsParams(json=json.loads(p.schema))
        except ImportError:
            from vllm.sampling_params import GuidedDecodingParams

            extra["guided_decoding"] = GuidedDecodingParams(json=json.loads(p.schema))
    return SamplingParams(
        max_tokens=p.max_tokens, temperature=p.temperature, top_p=p.top_p, seed=p.seed if p.temperature > 0 else None,
        stop=list(p.stop) or None, ignore_eos=p.ignore_eos, **extra,
    )  # fmt: skip
