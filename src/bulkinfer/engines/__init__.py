"""How a transformer runs: one module per engine, chosen by ``runtime.engine``.

An engine takes padded ``input_ids`` and ``attention_mask`` (numpy int64, shape
``(rows, tokens)``) and returns the last hidden state as float32 numpy. Pooling and
normalisation stay in the adapter, so every engine gives the same embeddings.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from ..core.errors import ConfigError, ModelError

__all__ = ["TransformerEngine", "choose_engine", "default_cache_dir", "load_engine"]


class TransformerEngine(Protocol):
    """The seam between the text adapter and a runtime (torch today, ONNX Runtime next)."""

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray: ...


def load_engine(
    name: str,
    model_dir: str,
    *,
    device: str,
    threads: int,
    precision: str,
    model_digest: str = "",
    cache_dir: Path | None = None,
    spin: bool = True,
    keep_fp32: Sequence[str] = (),
    tensorrt: tuple[int, int] | None = None,
) -> TransformerEngine:
    """Load ``model_dir`` on the named engine (``torch``, ``onnxruntime`` or ``openvino``). ``spin``:
    let the engine's threads busy-wait between calls (onnxruntime; off for serving).
    ``tensorrt``: onnxruntime through TensorRT, for batches of up to (rows, tokens)."""
    if name == "torch":
        from .torch_engine import TorchEngine

        return TorchEngine(model_dir, device=device, threads=threads, precision=precision)
    if name == "onnxruntime":
        from .ort_engine import OrtEngine

        try:
            return OrtEngine(
                model_dir,
                device=device,
                threads=threads,
                precision=precision,
                model_digest=model_digest,
                cache_dir=cache_dir or default_cache_dir(),
                spin=spin,
                keep_fp32=keep_fp32,
                tensorrt=tensorrt,
            )
        except ImportError as exc:
            raise ModelError(
                f"runtime.engine: onnxruntime cannot be imported ({exc}); pip install onnxruntime onnx, "
                "or set runtime.engine=torch"
            ) from exc
    if name == "openvino":
        _openvino_runs(device, precision)
        try:
            from .ov_engine import OpenVinoEngine
        except ImportError as exc:
            raise ModelError(
                f"runtime.engine: openvino cannot be imported ({exc}); pip install 'bulkinfer[openvino]', "
                "or set runtime.engine=onnxruntime"
            ) from exc
        return OpenVinoEngine(
            model_dir,
            threads=threads,
            model_digest=model_digest,
            cache_dir=cache_dir or default_cache_dir(),
            precision=precision,
        )
    raise ConfigError(f"runtime.engine: unknown engine {name!r}; choose torch, onnxruntime or openvino")


def choose_engine(engine: str, precision: str, device: str, tensorrt: bool = False) -> str:
    """Resolve ``runtime.engine = auto`` and refuse combinations no engine runs."""
    if engine == "vllm":
        raise ConfigError("runtime.engine: vllm runs generation models; embeddings run on torch or onnxruntime")
    if tensorrt and engine in ("auto", "onnxruntime"):  # its precisions are checked with the config
        return "onnxruntime"
    if engine == "auto":
        engine = "torch" if precision in ("bf16", "fp16") or not device.startswith("cpu") else "onnxruntime"
    if engine == "torch" and precision == "int8":
        raise ConfigError(
            "runtime.precision: int8 runs on the onnxruntime engine (torch's dynamic int8 is per-tensor "
            "and too lossy); set runtime.engine=onnxruntime"
        )
    if engine == "openvino":
        _openvino_runs(device, precision)
    if engine == "onnxruntime" and precision in ("bf16", "fp16"):
        raise ConfigError(
            f"runtime.precision: {precision} runs on the torch engine (fp16 also on onnxruntime through TensorRT); "
            "set runtime.engine=torch"
        )
    return engine


def _openvino_runs(device: str, precision: str) -> None:
    """Refuse what the openvino engine does not run: a GPU, a precision but fp32 and int8."""
    if not device.startswith("cpu"):
        raise ConfigError(f"runtime.engine: openvino runs on the CPU, not {device}; set runtime.device = cpu")
    if precision not in ("fp32", "int8"):
        raise ConfigError(
            f"runtime.precision: {precision} is not built for openvino (fp32 and int8 are); "
            "use runtime.engine = torch for bf16 and fp16"
        )


def default_cache_dir() -> Path:
    """``$BULKINFER_CACHE``, else ``$XDG_CACHE_HOME/bulkinfer``, else ``~/.cache/bulkinfer``."""
    if os.environ.get("BULKINFER_CACHE"):
        return Path(os.environ["BULKINFER_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bulkinfer"
