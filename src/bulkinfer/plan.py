"""The job's plan: what is read, how it is cut, with which types, and the identity that
says whether an output holds this job. :class:`JobPlan` is ``_bulkinfer/job.json``; the
ledger, the runners, ``inspect`` and a resume read it, never a dict.

Planning is deterministic (same inputs and config, same plan), so a resume on another
machine finds the same shards.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .config import JobConfig
from .core.credentials import scrub
from .core.errors import SourceError
from .core.records import ErrorRecord
from .core.schema import type_name
from .core.storage import concurrently
from .sources import (
    InputFile,
    Shard,
    ShardTable,
    check_columns,
    head_schema,
    list_inputs,
    plan_shards,
    settle_types,
)
from .sources.encoding import LINE_FORMATS
from .sources.parquet import forget_footers

if TYPE_CHECKING:
    from .adapters import Adapter, ResolvedModel

__all__ = ["SHARDS_LINE", "JobPlan", "describe_change", "job_identity", "make_plan", "plan_fields"]

SHARDS_LINE = ' "shards":[\n'
"""The line of ``job.json`` after which its shards follow, one a line (earlier versions wrote
``"shards": [`` with a space, and each shard over several lines)."""


def plan_fields(data: bytes) -> dict[str, Any]:
    """``job.json``'s fields without its shards (what readers of the job's identity, config and
    model need), parsed without the shards' part of the file."""
    at = data.find(b"\n" + SHARDS_LINE.encode())
    if at < 0:  # the layout of earlier versions: one document
        fields = dict(json.loads(data))
        fields.pop("shards", None)
        return fields
    return dict(json.loads(data[:at].rstrip().removesuffix(b",") + b"}"))


log = logging.getLogger("bulkinfer")

# Fields that change what is written. The others (batch size, threads, progress...) may
# change between a crash and its resume.
_IDENTITY_FIELDS = {
    "source": ("format", "id_column", "shard_rows", "column_types"),
    "model": ("kind", "text_column", "feature_columns", "max_seq_length", "options"),
    "runtime": ("engine", "precision"),
    "sink": ("format", "keep_columns", "preserve_order", "compression"),
    "execution": ("limit_rows",),
}


class PlannedStarts(Mapping[int, int]):
    """Shard index -> its planned first row, read from the list of shards: a shard numbered as
    its place in the list is found there; any other lookup builds the full map once."""

    def __init__(self, shards: Sequence[Shard]) -> None:
        self._shards = shards
        self._map: dict[int, int] | None = None

    def __getitem__(self, index: int) -> int:
        if 0 <= index < len(self._shards) and self._shards[index].index == index:
            return self._shards[index].start
        if self._map is None:
            self._map = {s.index: s.start for s in self._shards}
        return self._map[index]

    def __iter__(self) -> Iterator[int]:
        return (s.index for s in self._shards)

    def __len__(self) -> int:
        return len(self._shards)


@dataclass(frozen=True)
class JobPlan:
    """Everything a run decided before reading a row; ``to_json`` / ``from_json`` is ``job.json``."""

    fingerprint: str
    identity: dict[str, Any]
    model_kind: str
    model_location: str
    model_digest: str
    inputs: list[InputFile]
    config: dict[str, Any]
    shards: Sequence[Shard]  # a ShardTable when planned or read: columns, not a million objects
    input_errors: list[ErrorRecord] = field(default_factory=list)
    column_types: dict[str, str] | None = None  # None: planned by a version that did not settle types
    created: float = 0.0
    bulkinfer_version: str = __version__

    @property
    def rows(self) -> int:
        return self.shards.rows() if isinstance(self.shards, ShardTable) else sum(s.num_rows for s in self.shards)

    @property
    def planned_starts(self) -> Mapping[int, int]:
        """Each shard's first row as planned (a tail of it names its file by its own start),
        looked up in the plan's list (shards are numbered in order), not copied into a dict."""
        return PlannedStarts(self.shards)

    def to_json(self, shards: bool = True) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "bulkinfer_version": self.bulkinfer_version,
            "created": self.created,
            "identity": self.identity,
            "model": {"kind": self.model_kind, "location": self.model_location},
            "model_digest": self.model_digest,
            "inputs": [f.to_json() for f in self.inputs],
            "config": self.config,
            "input_errors": [e.to_json() for e in self.input_errors],
            **({} if self.column_types is None else {"column_types": self.column_types}),
            **({"shards": [s.to_json() for s in self.shards]} if shards else {}),
        }

    def json_chunks(self) -> Iterator[str]:
        """``job.json`` as written: the plan's fields, then its shards last, one a line (after the
        line :data:`SHARDS_LINE`), so a reader takes the fields without the shards, and the
        shards one at a time, and a writer never holds the document (a million shards: 250 MB)."""
        head = json.dumps(self.to_json(shards=False), indent=1)
        yield head[: -len("\n}")] + ",\n" + SHARDS_LINE
        last = len(self.shards) - 1
        for i, s in enumerate(self.shards):
            yield json.dumps(s.to_json(), separators=(",", ":")) + (",\n" if i < last else "\n")
        yield "]}\n"

    @classmethod
    def from_lines(cls, lines: Iterable[str]) -> JobPlan:
        """The plan in ``job.json``'s lines, shard by shard (:meth:`json_chunks`); a file in the
        layout of earlier versions (one JSON document) is read whole."""
        head: list[str] = []
        it = iter(lines)
        for line in it:
            if line == SHARDS_LINE:
                shards = ShardTable()
                for row in it:
                    if row.startswith("]"):
                        break
                    shards.append(Shard.from_json(json.loads(row.rstrip().removesuffix(","))))
                return cls.from_json(json.loads("".join(head).rstrip().removesuffix(",") + "}"), shards)
            head.append(line)
        return cls.from_json(json.loads("".join(head)))

    @classmethod
    def from_json(cls, data: dict[str, Any], shards: Sequence[Shard] | None = None) -> JobPlan:
        model = data.get("model") or {}
        return cls(
            fingerprint=data["fingerprint"],
            identity=data.get("identity", {}),
            model_kind=model.get("kind", ""),
            model_location=model.get("location", ""),
            model_digest=data.get("model_digest", ""),
            inputs=[InputFile.from_json(f) for f in data.get("inputs", [])],
            config=data.get("config", {}),
            shards=shards if shards is not None else ShardTable(Shard.from_json(s) for s in data.get("shards", [])),
            input_errors=[ErrorRecord.from_json(e) for e in data.get("input_errors", [])],
            column_types=data.get("column_types"),
            created=data.get("created", 0.0),
            bulkinfer_version=data.get("bulkinfer_version", ""),
        )


_IDENTITY_UNLESS_DEFAULT: dict[str, tuple[Any, ...]] = {
    # the snapshot of a Delta or Iceberg source
    "source.version": (None,),
    "source.snapshot_id": (None,),
    "source.as_of": (None,),
    "source.catalog": (None, "", {}),
    "runtime.int8_fp32_groups": (None,),
    "source.decode": ("exact",),  # pictures decoded smaller: other answers
    "source.encoding": ("auto",),
    # what an incremental run reuses, and the output's shape
    "source.previous": (None, ""),
    "sink.input_hash": (None, False),
    "sink.mode": ("snapshot",),
    "sink.top_k": (None,),  # each shard's part holds its best K: another K is another job
    # a molecule job's features (docs/science.md#molecules)
    "model.featurize": (None,),
    "model.smiles_column": ("smiles",),
    "model.morgan_radius": (2,),
    "model.morgan_bits": (2048,),
    # a grid's tiling (docs/science.md#gridded-arrays); its input carries it too
    "source.variables": ([],),
    "source.tile": ({},),
    "source.halo": ({},),
    "source.pad": ("reflect",),
    "source.pad_value": (0.0,),
    "source.nan_tiles": ("run",),
    # features read from Feast (docs/feature-store.md); the views' definitions are in the identity too
    "source.kind": ("files",),
    "source.feast_repo": ("",),
    "source.features": ([],),
    "source.feature_service": ("",),
    "source.timestamp_column": ("event_timestamp",),
}
"""Settings in a job's identity only when set away from their defaults, so that the identity
(and the fingerprint) of a job that does not use them stays what it was before they existed."""


def job_identity(cfg: JobConfig) -> dict[str, Any]:
    dumped = cfg.model_dump(mode="json")
    identity = {f"{sec}.{k}": dumped[sec][k] for sec, keys in _IDENTITY_FIELDS.items() for k in keys}
    if dumped["export"]:  # where earlier shards were exported (absent: the identity of jobs without exports)
        identity["export"] = dumped["export"]
    if dumped["route"]:  # where rows were routed (absent: the identity of jobs without routes)
        identity["route"] = dumped["route"]
    if dumped["model"]["prompt_template"] is not None or dumped["model"]["kind"] == "generate":
        generation = ("prompt_template", "max_new_tokens", "stop", "temperature", "top_p", "seed")
        identity.update({f"model.{k}": dumped["model"][k] for k in generation})
        later = ("messages", "chat_template", "json_schema", "expand_json", "ignore_eos", "served_name")
        identity.update({f"model.{k}": dumped["model"][k] for k in later if dumped["model"][k]})  # absent at defaults
    for name, defaults in _IDENTITY_UNLESS_DEFAULT.items():
        section, _, key = name.partition(".")
        value = dumped[section][key]
        if value not in defaults:
            identity[name] = value
    return identity


def _fingerprint(identity: dict[str, Any], model_digest: str, inputs: list[InputFile]) -> str:
    records = [f.to_json() for f in inputs]
    body = json.dumps({"identity": identity, "model": model_digest, "inputs": records}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:32]


def _retry_fingerprint(existing: JobPlan, draft: JobPlan) -> str:
    """A retry may run a fixed model (new code or options) over the failed rows, never other inputs."""
    same_inputs = [f.to_json() for f in existing.inputs] == [f.to_json() for f in draft.inputs]
    old_identity = {k: v for k, v in existing.identity.items() if k != "model.options"}
    new_identity = {k: v for k, v in draft.identity.items() if k != "model.options"}
    if not same_inputs or old_identity != new_identity:
        return draft.fingerprint  # begin() refuses it and says what changed
    if (
        existing.model_digest != draft.model_digest
        or existing.identity.get("model.options") != draft.identity["model.options"]
    ):
        log.warning("the model changed since these rows failed: retried rows use the new model, the others keep theirs")
    return existing.fingerprint


def _limit(shards: ShardTable, limit: int | None) -> ShardTable:
    if limit is None:
        return shards
    out, left = ShardTable(), limit
    for s in shards:
        if left <= 0:
            break
        out.append(replace(s, stop=min(s.stop, s.start + left)) if s.num_rows > left else s)
        left -= s.num_rows
    return out


def make_plan(
    cfg: JobConfig,
    model: ResolvedModel,
    adapter: Adapter,
    existing: JobPlan | None = None,
    *,
    retry_errors: bool = False,
) -> JobPlan:
    """Plan the job ``cfg`` describes; when ``existing`` (the output's plan) is this job,
    keep its shards and types, so a resume reads what the first run planned.

    Refuses up front (``SourceError``) when a needed column is in no input file, and when
    no input file could be planned at all.
    """
    try:
        return _make_plan(cfg, model, adapter, existing, retry_errors)
    finally:
        forget_footers()  # the footers fingerprinting kept for this plan


def _make_plan(
    cfg: JobConfig, model: ResolvedModel, adapter: Adapter, existing: JobPlan | None, retry_errors: bool
) -> JobPlan:
    columns = list(dict.fromkeys([*adapter.input_columns, *cfg.passthrough_columns]))
    known = existing.inputs if existing is not None else ()
    inputs = list_inputs(cfg.source.paths, cfg.source.format, cfg.source, columns, known)
    if cfg.source.encoding != "auto" and inputs and not any(f.format in LINE_FORMATS for f in inputs):
        raise SourceError(
            f"source.encoding = {cfg.source.encoding!r} applies to CSV and JSONL files; the inputs are "
            f"{inputs[0].format} ({inputs[0].uri}...); leave it unset",
            inputs[0].uri,
        )
    identity = scrub(job_identity(cfg))  # a password changed between a crash and its resume changes nothing written
    identity.update(adapter.identity)  # what the adapter read elsewhere (a Feast view's definitions)
    draft = JobPlan(
        fingerprint=_fingerprint(identity, model.digest, inputs),
        identity=identity,
        model_kind=model.kind,
        model_location=model.location,
        model_digest=model.digest,
        inputs=inputs,
        config=scrub(cfg.model_dump(mode="json")),  # job.json sits beside the output: no credentials in it
        shards=[],
        created=time.time(),
    )
    if retry_errors and existing is not None and existing.fingerprint != draft.fingerprint:
        draft = replace(draft, fingerprint=_retry_fingerprint(existing, draft))
    same = existing is not None and existing.fingerprint == draft.fingerprint
    if same and existing is not None and existing.column_types is not None:
        # a resume: the inputs are the ones planned (their fingerprints say so), and job.json
        # holds their shards and types, so no footer or head is read again
        return replace(
            draft, shards=existing.shards, input_errors=existing.input_errors, column_types=existing.column_types
        )
    uris = [f.uri for f in inputs]
    heads = dict(zip(uris, concurrently(head_schema, inputs, uris), strict=True))
    check_columns(heads, columns)
    if same:
        assert existing is not None
        shards, input_errors = existing.shards, existing.input_errors
    else:
        problems: list[SourceError] = []
        planned = plan_shards(inputs, cfg.source.shard_rows, problems, cfg.source.max_record_bytes)
        shards = _limit(planned, cfg.execution.limit_rows)
        # job.json keeps them, and the resume writes them to _errors/: withheld as the job says
        input_errors = [ErrorRecord.of(p.uri or "", None, "plan", p).withheld(cfg.execution.redact) for p in problems]
        if problems and not shards:
            raise _none_readable(problems, len(inputs))
    # the types the planned files start with; a file skipped at planning has no say
    settled = settle_types((heads[uri] for uri in _uris(shards)), columns)
    column_types = {**{c: n for c, t in settled.items() if (n := type_name(t))}, **cfg.source.column_types}
    return replace(draft, shards=shards, input_errors=input_errors, column_types=column_types)


def _uris(shards: Sequence[Shard]) -> list[str]:
    """The files the shards read, in order, each once."""
    if isinstance(shards, ShardTable):
        return shards.uris()
    return list(dict.fromkeys(s.uri for s in shards))


def _none_readable(problems: list[SourceError], n_inputs: int) -> SourceError:
    """Every input failed at planning: one line naming each file (up to three) and why."""
    if len(problems) == 1 and n_inputs == 1:
        return problems[0]
    named = "; ".join(str(p) for p in problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
    return SourceError(f"none of the {n_inputs} input files could be read: {named}", problems[0].uri)


def describe_change(old: JobPlan, new: JobPlan) -> str:
    """What differs between the job an output holds and the one asked for, in a few words."""
    if old.model_digest != new.model_digest:
        return "the model changed"
    changed = sorted(k for k in set(old.identity) | set(new.identity) if old.identity.get(k) != new.identity.get(k))
    old_inputs = {f.uri: f.to_json() for f in old.inputs}
    new_inputs = {f.uri: f.to_json() for f in new.inputs}
    for uri in sorted(set(old_inputs) | set(new_inputs)):
        a, b = old_inputs.get(uri), new_inputs.get(uri)
        if a == b:
            continue
        if a and b and changed and {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)} == {"encoding"}:
            continue  # only how it is read changed, with the config (a grid's tiling): said below
        return f"input {uri} changed" if a and b else f"input set changed at {uri}"
    return f"config changed: {', '.join(changed)}" if changed else "its fingerprint differs"
