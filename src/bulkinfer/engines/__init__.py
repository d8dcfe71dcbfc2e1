"""How a transformer runs: one module per engine, chosen by ``runtime.engine``.

An engine takes padded ``input_ids`` and ``attention_mask`` (numpy int64, shape
``(rows, tokens)``) and returns the last hidden state as float32 numpy. Pooling and
normalisation stay in the adapter, so every engine gives the same embeddings.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..errors import ConfigError

__all__ = ["TransformerEngine", "load_engine"]


class TransformerEngine(Protocol):
    """The seam between the text adapter and a runtime (torch today, ONNX Runtime next)."""

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray: ...


def load_engine(name: str, model_dir: str, *, device: str, threads: int, precision: str) -> TransformerEngine:
    """Load ``model_dir`` on the named engine."""
    if name == "torch":
        from .torch_engine import TorchEngine

        return TorchEngine(model_dir, device=device, threads=threads, precision=precision)
    raise ConfigError(f"runtime.engine: unknown engine {name!r}; choose torch")
