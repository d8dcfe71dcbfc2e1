"""``[runtime]``: how the model runs (engine, precision, device, batching)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from ..core.errors import ConfigError
from .section import Section


class RuntimeConfig(Section):
    engine: Literal["auto", "torch", "onnxruntime", "openvino", "vllm"] = "auto"
    """Inference engine for neural models: onnxruntime (exported once, cached on disk), torch, openvino
    (CPU, fp32 and int8; pip install bulkinfer[openvino]), or auto: onnxruntime on CPU in fp32/int8, torch
    for bf16 and on GPUs. Generation models: transformers, or vllm (GPU; pip install bulkinfer[vllm])."""
    precision: Literal["fp32", "bf16", "fp16", "int8", "auto"] = "fp32"
    """fp32; bf16 (torch engine, CPUs with bf16 or GPUs from compute capability 8.0); fp16 (torch engine,
    GPUs); int8 (onnxruntime: dynamic, per-channel weights; openvino: NNCF int8 weights); auto: the
    fastest precision whose quality gate passed in `bulkinfer tune`'s measurements for this model on this
    kind of machine (a short calibration on the job's rows the first time, kept), never one emulated here."""
    cache_dir: str | None = None
    """Where compiled models are cached; default $BULKINFER_CACHE or ~/.cache/bulkinfer."""
    int8_fp32_groups: list[str] | None = None
    """int8: the transformer's groups kept in fp32 (layer.0/output, layer.2/attention..., and
    "outlier-channels": each feed-forward block's largest channels); None: full int8, or when that fails the
    quality gate, the outlier channels then the fewest most-sensitive blocks that pass it, found on the job's
    rows and cached per model, machine kind and floor."""
    quality_floor: float = Field(default=0.99, ge=-1, le=1)
    """A lowered precision must keep the mean cosine to fp32 on the job's own rows at least this high (a
    detector: the share of boxes it finds as fp32 does, same label and IoU >= 0.9)."""
    quality_sample_rows: int = Field(default=512, ge=2)
    """Rows of the job's input the quality gate compares on (taken from across the input)."""
    device: str = "cpu"
    """Torch device: 'cpu', 'cuda', 'cuda:1'."""
    tensorrt: bool = False
    """onnxruntime on a GPU: run through ONNX Runtime's TensorRT execution provider (pip install
    onnxruntime-gpu tensorrt), precision fp32 or fp16; its engines are built once per GPU, precision and
    batch shape and cached under cache_dir."""
    batch_size: int | Literal["auto"] = 16
    """Maximum rows per model call; "auto": the fastest size `bulkinfer tune` measured for this
    model, engine and precision on this machine (when it has not been run: the model's own default,
    65536 for tabular models, else 16)."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Token budget per model call (rows x padded length) for text models; None: rows only."""
    dedupe: bool | Literal["auto"] = False
    """Infer rows with identical model inputs once and fan the result out (auto: on when the first rows
    read hold at least 2% duplicates)."""
    dedupe_cache_rows: int = Field(default=100_000, ge=0)
    """Results kept for dedupe across windows of rows, by input hash (least recently used go first)."""
    sort_window: int = Field(default=2048, ge=1)
    """Rows sorted by length together to cut padding; order is restored before writing."""
    threads: int | None = Field(default=None, ge=1)
    """Intra-op threads; default: the CPUs this process may use (os.sched_getaffinity, at most its cgroup CPU quota)."""
    prefetch_batches: int = Field(default=8, ge=1)
    """Bounded queue depth between reading/tokenizing and inference."""
    batch_timeout_s: float | None = Field(default=None, gt=0)
    """A model call running longer is abandoned and retried on smaller batches, then its rows fail."""

    @field_validator("batch_size", mode="before")
    @classmethod
    def _batch_size(cls, value: Any) -> Any:
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return value
        raise ValueError('expected a whole number >= 1 or "auto"')

    @field_validator("tensorrt")
    @classmethod
    def _tensorrt(cls, value: bool, info: ValidationInfo) -> bool:
        device, engine, precision = (info.data.get(k) for k in ("device", "engine", "precision"))
        if value and not str(device).startswith("cuda"):
            raise ValueError(
                f"TensorRT runs on an NVIDIA GPU, not runtime.device = {device}; set runtime.device = cuda, "
                "or runtime.tensorrt = false"
            )
        if value and (engine not in ("auto", "onnxruntime") or precision not in ("fp32", "fp16")):
            raise ValueError(
                f"TensorRT runs the onnxruntime engine in fp32 or fp16, not {engine}/{precision}; "
                "set runtime.precision = fp16 (or fp32), or runtime.tensorrt = false"
            )
        return value

    @property
    def rows_per_call(self) -> int:
        """``batch_size`` once "auto" has been resolved (``run_job`` does that first)."""
        if self.batch_size == "auto":
            raise ConfigError('runtime.batch_size = "auto" was not resolved; run the job through run_job')
        return self.batch_size
