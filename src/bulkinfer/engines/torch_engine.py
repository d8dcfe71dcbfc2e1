"""The torch engine: a Hugging Face transformer in inference mode, on a CPU or a GPU.

On a GPU the batch's token ids go up from pinned host memory without blocking the host,
pooling and normalisation run on the device, and only the sentence vectors (rows x
dimension, float32) come back: the hidden states (rows x tokens x dimension) never cross
the bus. :meth:`TorchEngine.embed` is that path; it runs the same code on a CPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.errors import ModelError

__all__ = ["TorchEngine"]


class TorchEngine:
    """Runs ``AutoModel`` from a local directory; never touches the network."""

    def __init__(self, model_dir: str, *, device: str, threads: int, precision: str) -> None:
        import torch
        from transformers import AutoModel
        from transformers.utils import logging as hf_logging

        from ..core.hardware import require_device

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()

        require_device(device)
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
        self.runs_on = f"torch {device}"  # what report.json says ran
        self._gpu = self._device.type == "cuda"
        self._model = model.to(self._device).eval()

    def _inputs(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> tuple[Any, Any]:
        """The batch on the device: from pinned memory, asynchronously, on a GPU."""
        ids, mask = self._torch.from_numpy(input_ids), self._torch.from_numpy(attention_mask)
        if self._gpu:
            ids, mask = ids.pin_memory(), mask.pin_memory()
        return ids.to(self._device, non_blocking=True), mask.to(self._device, non_blocking=True)

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        with self._torch.inference_mode():
            ids, mask = self._inputs(input_ids, attention_mask)
            out = self._model(input_ids=ids, attention_mask=mask).last_hidden_state
            return out.float().cpu().numpy()

    def embed(self, input_ids: np.ndarray, attention_mask: np.ndarray, pooling: str, normalize: bool) -> np.ndarray:
        """Sentence vectors (float32), pooled and normalised where the model ran, the way
        ``adapters.text.pool`` does it in numpy."""
        torch = self._torch
        with torch.inference_mode():
            ids, mask = self._inputs(input_ids, attention_mask)
            hidden = self._model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
            m = mask.unsqueeze(-1).to(hidden.dtype)
            if pooling == "cls_token":
                vectors = hidden[:, 0]
            elif pooling == "max_tokens":
                vectors = hidden.masked_fill(m == 0, torch.finfo(hidden.dtype).min).amax(dim=1)
            elif pooling == "lasttoken":
                last = mask.sum(dim=1) - 1
                vectors = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
            else:
                summed = (hidden * m).sum(dim=1)
                counts = m.sum(dim=1).clamp(min=1e-9)
                vectors = summed / (counts.sqrt() if pooling == "mean_sqrt_len_tokens" else counts)
            if normalize:
                vectors = torch.nn.functional.normalize(vectors, p=2.0, dim=1, eps=1e-12)
            return vectors.cpu().numpy()
