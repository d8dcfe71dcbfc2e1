"""An instant model for bench/bench_scale.py: the output is the input column, copied (no model time)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from bulkinfer import Adapter


class Instant(Adapter):
    """``input_columns`` come from the job's --feature-columns."""

    def predict(self, batch: pa.Table) -> dict[str, Any]:
        return {"y": batch.column(self.input_columns[0])}
