"""The torch engine: a Hugging Face transformer in inference mode."""

from __future__ import annotations

import numpy as np

from ..errors import ModelError

__all__ = ["TorchEngine"]


class TorchEngine:
    """Runs ``AutoModel`` from a local directory; never touches the network."""

    def __init__(self, model_dir: str, *, device: str, threads: int, precision: str) -> None:
        import torch
        from transformers import AutoModel
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()

        if device == "cpu":
            torch.set_num_threads(threads)
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        if dtype is None:
            raise ModelError(f"runtime.precision: {precision!r} is not supported by the torch engine")
        try:
            model = AutoModel.from_pretrained(model_dir, local_files_only=True, dtype=dtype)
        except (OSError, ValueError) as exc:
            raise ModelError(f"{model_dir}: cannot load the transformer ({exc})") from exc
        self._torch = torch
        self._device = torch.device(device)
        self._model = model.to(self._device).eval()

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        torch = self._torch
        with torch.inference_mode():
            ids = torch.from_numpy(input_ids).to(self._device)
            mask = torch.from_numpy(attention_mask).to(self._device)
            out = self._model(input_ids=ids, attention_mask=mask).last_hidden_state
            return out.float().cpu().numpy()
