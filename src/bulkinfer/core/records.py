"""The records a run keeps about rows: one :class:`ErrorRecord` per failed row (or per
unreadable range), written to ``_errors/`` as JSON lines and read back by
``--retry-errors``, ``inspect`` and the report."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

__all__ = ["ErrorRecord", "decode_records", "encode_records", "withheld"]


def withheld(message: str, error_type: str, redact: bool) -> str:
    """``message`` itself, or with ``redact`` (a job's or server's ``execution.redact``) only what
    caused the error: errors of readers, of type conversion and of models quote the values they
    choke on. Records keep their message in memory; each job withholds it where a record leaves
    the process (its error files, its plan, its log, a server's answer), by its own setting."""
    return f"{error_type} (the message is withheld: execution.redact)" if redact else message


@dataclass(frozen=True)
class ErrorRecord:
    """Why row ``row`` of ``input`` failed (``rows`` > 1: a range from ``row`` on, e.g. a file
    cut short mid-shard; ``row`` None: the whole file, at planning)."""

    input: str
    row: int | None
    stage: str
    error_type: str
    message: str
    rows: int = 1
    id: Any = None

    @classmethod
    def of(
        cls, uri: str, row: int | None, stage: str, exc: BaseException | str, *, row_id: Any = None, rows: int = 1
    ) -> ErrorRecord:
        """A record for ``exc`` (an exception, or a message from a reader)."""
        if isinstance(exc, BaseException):
            etype, message = type(exc).__name__, str(exc)
        else:
            etype, message = "Error", exc
        return cls(uri, row, stage, etype, " ".join(message.split())[:2000], rows, row_id)

    def withheld(self, redact: bool = True) -> ErrorRecord:
        """This record as it may leave the process under ``redact``."""
        return replace(self, message=withheld(self.message, self.error_type, redact)) if redact else self

    def headline(self) -> str:
        """One line for logs and budget messages."""
        return f"{self.input} row {self.row}: {self.error_type}: {self.message}"[:300]

    def row_numbers(self) -> range:
        start = self.row or 0
        return range(start, start + self.rows)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        return {k: data[k] for k in ("input", "row", "rows", "id", "stage", "error_type", "message")}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ErrorRecord:
        return cls(
            input=data["input"],
            row=data.get("row"),
            stage=data.get("stage", ""),
            error_type=data.get("error_type", "Error"),
            message=data.get("message", ""),
            rows=int(data.get("rows", 1)),
            id=data.get("id"),
        )


def encode_records(records: Iterable[ErrorRecord], redact: bool = False) -> bytes:
    """JSON lines of ``records`` (their messages withheld with ``redact``)."""
    return "".join(json.dumps(r.withheld(redact).to_json(), default=str) + "\n" for r in records).encode()


def decode_records(data: bytes | str) -> list[ErrorRecord]:
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    return [ErrorRecord.from_json(json.loads(line)) for line in text.splitlines() if line.strip()]
