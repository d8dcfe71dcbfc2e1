"""The ONNX export's versions: part of every key that names something built from an export
(the compiled-model cache entry, the int8 search's plan, tune's measurements), so a change
here rebuilds and remeasures once instead of reusing what an older export made."""

from __future__ import annotations

__all__ = ["EXPORT", "OPSET"]

OPSET = 17
EXPORT = 3  # 2: BERT encoders fused (Attention, EmbedLayerNormalization...); 3: without SkipLayerNormalization
