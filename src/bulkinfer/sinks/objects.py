"""The object-store sink: ``sink.path = "s3://bucket/prefix"`` (or any fsspec filesystem:
``gs://``, ``az://``, ...), with ``sink.storage_options`` for the endpoint, credentials
and retries. The layout is a local output's: parts, ``_SUCCESS``, ``_errors/``,
``_bulkinfer/``.

Object stores have no rename. A shard's part is uploaded whole (a PUT is atomic: nobody
ever sees half an object) to ``_temporary/<sha256>/<name>``, hidden from any reader that
skips ``_``/``.`` names. The ledger's commit record is written next, and only then is the
part copied server-side to its final key (:meth:`ObjectSink.reveal`; no data passes
through the driver) and the temporary object deleted. So a visible part always has its
commit record; a crash between the record and the copy is rolled forward by the next run
(the record names the part and its checksum, which names the staged object). Error files
live under ``_errors/``, hidden anyway, and are copied before the record.
"""

from __future__ import annotations

import errno
import hashlib
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import fsspec

from ..core.errors import ConfigError, OutputError
from ..core.faults import crash_point
from ..core.layout import ERRORS
from ..core.records import encode_records
from ..sources.shard import ShardOutput
from .files import EXTENSIONS, part_name, serialize
from .lifecycle import Part, Published, Staged, StagedOutput

__all__ = ["TEMPORARY", "ObjectSink", "ObjectStore", "staged_key"]

TEMPORARY = "_temporary"
T = TypeVar("T")


def _defaults(protocol: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """S3 defaults: botocore's standard retries (5xx, SlowDown, connection resets) with more tries."""
    opts = dict(options)
    if protocol in ("s3", "s3a"):
        config = dict(opts.get("config_kwargs") or {})
        config.setdefault("retries", {"max_attempts": 8, "mode": "standard"})
        config.setdefault("connect_timeout", 5)
        opts["config_kwargs"] = config
    return opts


class ObjectStore:
    """Keys under one prefix of an fsspec filesystem, every failure one :class:`OutputError`
    naming the key and why."""

    def __init__(self, uri: str, options: Mapping[str, Any]) -> None:
        protocol = uri.split("://", 1)[0]
        self.uri = uri.rstrip("/")
        opts = _defaults(protocol, options)
        retries = opts.pop("retries", None)
        try:
            self.fs, path = fsspec.core.url_to_fs(self.uri, **opts)
        except ImportError as exc:
            raise ConfigError(
                f"sink.path: {self.uri}: {exc}; install it (for s3://: pip install 'bulkinfer[s3]')"
            ) from exc
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"sink.storage_options: {self.uri}: {exc}") from exc
        if retries is not None:  # s3fs's own retries of SlowDown and timeouts, around botocore's
            self.fs.retries = int(retries)
        self.root = path.rstrip("/")
        self.conditional = protocol in ("s3", "s3a")  # If-None-Match / If-Match PUTs

    def path(self, key: str) -> str:
        return f"{self.root}/{key}" if key else self.root

    def url(self, key: str = "") -> str:
        return f"{self.uri}/{key}" if key else self.uri

    def call(self, key: str, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except (FileExistsError, FileNotFoundError):
            raise
        except PermissionError as exc:
            raise OutputError(
                f"{self.url(key)}: cannot {what}: permission denied ({_why(exc)}); fix the credentials or policy"
            ) from exc
        except OSError as exc:
            raise OutputError(
                f"{self.url(key)}: cannot {what} ({_why(exc)}); committed shards are kept, rerun to resume"
            ) from exc
        except Exception as exc:  # what the store's client raised, of any kind (no credentials, a bad endpoint)
            raise OutputError(f"{self.url(key)}: cannot {what} ({_trouble(exc)})") from exc

    # -- whole objects --------------------------------------------------------------
    def put(self, key: str, data: bytes) -> None:
        self.call(key, "write it", lambda: self.fs.pipe_file(self.path(key), data))

    def _put_tagged(self, key: str, data: bytes, **conditions: Any) -> str:
        """PUT ``key``; the new version's ETag, from the store's answer (a HEAD only if it has none)."""
        answer = self.call(key, "write it", lambda: self.fs.pipe_file(self.path(key), data, **conditions))
        etag = answer.get("ETag") if isinstance(answer, dict) else None
        return str(etag) if etag else (self.etag(key) or "")

    def put_new(self, key: str, data: bytes) -> str | None:
        """Create ``key`` only if it does not exist (first writer wins): its ETag, or None if it existed."""
        if self.conditional:
            try:
                return self._put_tagged(key, data, mode="create")
            except FileExistsError:
                return None
        if self.exists(key):  # a store without conditional writes: check, then write
            return None
        return self._put_tagged(key, data)

    def put_if(self, key: str, data: bytes, etag: str) -> str | None:
        """Replace ``key`` only if it is still the version ``etag``: the new ETag, or None if it changed."""
        if not self.conditional:
            return self._put_tagged(key, data)
        try:
            return self._put_tagged(key, data, IfMatch=etag)
        except (FileExistsError, FileNotFoundError):
            return None
        except OutputError as exc:
            if isinstance(exc.__cause__, OSError) and exc.__cause__.errno == errno.EINVAL:
                return None  # 412 Precondition Failed: someone else wrote it
            raise

    def get(self, key: str) -> bytes | None:
        try:
            data: bytes = self.call(key, "read it", lambda: self.fs.cat_file(self.path(key)))
        except FileNotFoundError:
            return None
        return data

    def etag(self, key: str) -> str | None:
        try:
            info = self.call(key, "read it", lambda: self.fs.info(self.path(key), refresh=True))
        except FileNotFoundError:
            return None
        return str(info.get("ETag") or info.get("etag") or "")

    def get_many(self, keys: list[str]) -> dict[str, bytes]:
        if not keys:
            return {}
        paths = [self.path(k) for k in keys]
        got = self.call(keys[0], "read it", lambda: self.fs.cat(paths, on_error="omit"))
        return {k: got[p] for k, p in zip(keys, paths, strict=True) if p in got}

    def exists(self, key: str) -> bool:
        return bool(self.call(key, "look it up", lambda: self.fs.exists(self.path(key))))

    def ls(self, prefix: str = "") -> list[str]:
        """Keys directly under ``prefix`` (files only), relative to the root."""
        try:
            entries = self.call(prefix, "list it", lambda: self.fs.ls(self.path(prefix), detail=True, refresh=True))
        except FileNotFoundError:
            return []
        return [e["name"][len(self.root) + 1 :] for e in entries if e.get("type") == "file"]

    def find(self, prefix: str) -> list[str]:
        """Every key under ``prefix``, at any depth."""
        try:
            self.fs.invalidate_cache(self.path(prefix))
            found = self.call(prefix, "list it", lambda: self.fs.find(self.path(prefix)))
        except FileNotFoundError:
            return []
        return [p[len(self.root) + 1 :] for p in found]

    def delete(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        if keys:
            paths = [self.path(k) for k in keys]
            self.call(keys[0], "delete it", lambda: self.fs.rm(paths))

    def copy(self, src: str, dst: str) -> None:
        self.call(dst, "copy it into place", lambda: self.fs.copy(self.path(src), self.path(dst)))

    def check_writable(self) -> None:
        """One line up front when the bucket is missing or not writable, before any inference."""
        probe = f"_bulkinfer/.probe-{uuid.uuid4().hex[:8]}"
        bucket = self.root.split("/", 1)[0]
        try:
            self.fs.invalidate_cache()
            self.fs.ls(bucket)
        except FileNotFoundError as exc:
            raise OutputError(f"{self.uri}: the bucket {bucket!r} does not exist; create it or fix sink.path") from exc
        except PermissionError as exc:
            raise OutputError(
                f"{self.uri}: permission denied listing {bucket!r} ({_why(exc)}); fix the credentials"
            ) from exc
        except OSError as exc:
            raise OutputError(f"{self.uri}: cannot reach the store ({_why(exc)}); check sink.storage_options") from exc
        except Exception as exc:  # the client's own errors: no credentials, a malformed endpoint...
            raise OutputError(f"{self.uri}: cannot reach the store ({_trouble(exc)})") from exc
        self.put(probe, b"")
        self.delete([probe])


def staged_key(name: str, sha256: str, folder: str = "") -> str:
    """Where a file waits for its commit: named by its checksum, so a commit record (which
    holds both) finds it again, and every attempt that produced the same bytes shares it."""
    return f"{TEMPORARY}/{sha256[:32]}/{folder}{name}"


class ObjectSink:
    """Parts under an object-store prefix (see the module docstring for how they are published)."""

    def __init__(
        self,
        uri: str,
        fmt: str = "parquet",
        compression: str = "zstd",
        options: Mapping[str, Any] | None = None,
        redact: bool = False,
    ) -> None:
        self.store = ObjectStore(uri, options or {})
        self.redact = redact  # error files withhold the rows' values (execution.redact)
        self.out_dir = self.store.uri
        self.format = fmt
        self.compression = compression

    def start(self) -> None:
        self.store.check_writable()

    def _stage(self, name: str, folder: str, data: bytes, rows: int) -> Staged:
        part = Part(name=name, rows=rows, bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
        temp = staged_key(name, part.sha256, folder)
        self.store.put(temp, data)
        return Staged(temp, part)

    def stage(self, out: ShardOutput, start: int | None, tag: str = "", name: str | None = None) -> StagedOutput:
        shard = out.shard
        errors = part = None
        if out.errors:
            errors_name = f"{name}.jsonl" if name else part_name(shard.index, "jsonl", start)
            errors = self._stage(errors_name, f"{ERRORS}/", encode_records(out.errors, self.redact), len(out.errors))
        if out.table.num_rows:
            data = serialize(out.table, self.format, self.compression)
            final = name + EXTENSIONS[self.format] if name else part_name(shard.index, self.format, start)
            part = self._stage(final, "", data, out.table.num_rows)
        first = out.errors[0].withheld(self.redact).headline() if out.errors else None
        unit = name or part_name(shard.index, self.format, start).removesuffix(EXTENSIONS[self.format])
        return StagedOutput(shard, part, errors, out.failed, first, unit)

    def publish(self, staged: StagedOutput) -> Published:
        """The error file into ``_errors/`` (hidden from readers); the part waits for its record."""
        error_file = None
        if staged.errors:
            self.store.copy(staged.errors.temp, f"{ERRORS}/{staged.errors.part.name}")
            error_file = staged.errors.part.name
        crash_point("part-temp-written")
        return Published(staged.part.part if staged.part else None, error_file)

    def publish_many(self, staged: Sequence[StagedOutput]) -> list[Published]:
        done: list[tuple[StagedOutput, Published]] = []
        try:
            for s in staged:
                done.append((s, self.publish(s)))
        except BaseException:
            for s, p in done:
                self.withdraw(s, p)
            raise
        return [p for _, p in done]

    def reveal(self, staged: StagedOutput) -> None:
        """The committed part copied into place, then its staged objects deleted."""
        if staged.part:
            crash_point("part-committed")
            self.store.copy(staged.part.temp, staged.part.part.name)
            crash_point("part-renamed")
        self.store.delete([s.temp for s in (staged.part, staged.errors) if s is not None])

    def withdraw(self, staged: StagedOutput, published: Published) -> None:
        """The error file copied into ``_errors/``; the part was never in place (it waits for its record)."""
        if published.error_file is not None:
            self.store.delete([f"{ERRORS}/{published.error_file}"])

    def discard(self, staged: StagedOutput) -> None:
        """Nothing now: another attempt with the same bytes may share the staged object, and
        :meth:`complete` (or the next run) sweeps ``_temporary/``."""

    def complete(self) -> None:
        self.store.delete(self.store.find(TEMPORARY))

    def failed(self) -> None:
        """Nothing: a commit whose copy failed needs its staged part; the next run rolls it forward."""


def _why(exc: BaseException) -> str:
    """The store's own answer when there is one (``503 SlowDown: ...``; ``503 Service Unavailable``
    for one without a body, as a HEAD's), else the error's text."""
    seen: BaseException | None = exc
    while seen is not None:
        response = getattr(seen, "response", None)  # botocore's ClientError, under s3fs's OSError
        if isinstance(response, dict) and response.get("Error"):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", "")
            code, message = response["Error"].get("Code", ""), response["Error"].get("Message", "")
            if code in ("", str(status)):  # an answer without a body (to a HEAD): its status says it all
                return " ".join(f"{status} {message}".split())[:200]
            return " ".join(f"{status} {code}: {message}".split())[:200]
        seen = seen.__cause__ or seen.__context__
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def _trouble(exc: BaseException) -> str:
    """A store client's own error (botocore's NoCredentialsError...) in one line, with what to check."""
    return (
        f"{type(exc).__name__}: {_why(exc)}; check the store's endpoint and credentials "
        "(sink.storage_options, or the environment: AWS_* variables, a profile, an instance role)"
    )
