"""PostgreSQL export: each committed part's rows in one transaction with a row of
``bulkinfer_commits`` naming the part, so a replayed part finds its commit row and is
skipped: exactly once even in append mode. Rows go in by binary ``COPY``; upsert copies
into a temporary table and merges on the id column. Embeddings become a pgvector
``vector(n)`` when the extension can be used, ``real[]`` otherwise. The table is created
when missing; one that exists with other columns is refused with the difference.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..core.errors import ConfigError, OutputError
from ..core.faults import crash_point
from ..core.records import withheld
from .exports import is_vector, retrying, value_columns, vectors

if TYPE_CHECKING:
    from ..config import PostgresExport
    from ..plan import JobPlan

__all__ = ["PostgresTarget"]

log = logging.getLogger("bulkinfer")

COMMITS = "bulkinfer_commits"


def _ident(name: str) -> str:
    return ".".join('"' + p.replace('"', '""') + '"' for p in name.split("."))


class PostgresTarget:
    def __init__(self, spec: PostgresExport, where: str, redact: bool = False) -> None:
        self.redact = redact  # the server's refusals may quote a row's values (execution.redact)
        if not spec.dsn:
            raise ConfigError(f"{where}.dsn: no connection string (postgresql://user@host:port/db)")
        self.spec = spec
        self.where = where
        self.name = f"{where} (postgres table {spec.table})"
        self.conn: Any = None
        self.job = ""
        self.kept: list[str] = []
        self.id_column: str | None = None
        self.pgvector = False
        self.columns: list[tuple[str, str]] | None = None  # (name, SQL type) once the table is known

    # -- lifecycle -----------------------------------------------------------------
    def start(self, plan: JobPlan, kept: Sequence[str]) -> None:
        try:
            import psycopg
        except ImportError as exc:
            raise ConfigError(
                f"{self.where}: the postgres export needs psycopg: pip install 'bulkinfer[postgres]'"
            ) from exc

        self._errors = (psycopg.OperationalError, psycopg.InterfaceError)
        self.kept = list(kept)
        self.job = plan.fingerprint
        self.id_column = plan.config.get("source", {}).get("id_column")
        if self.spec.mode == "upsert" and not self.id_column:
            raise ConfigError(f"{self.where}.mode: upsert needs source.id_column (the key); set it or use append")
        try:
            self._connect()
        except self._errors as exc:
            raise OutputError(f"{self.name}: cannot connect ({' '.join(str(exc).split())[:200]})") from exc

    def _connect(self) -> None:
        import psycopg

        if self.conn is not None and not self.conn.closed:
            self.conn.close()
        self.conn = psycopg.connect(self.spec.dsn, connect_timeout=5, autocommit=True)
        if self.spec.vector != "array":
            self._use_pgvector()
        self.conn.autocommit = False
        with self.conn.transaction():
            self.conn.execute(
                f"CREATE TABLE IF NOT EXISTS {COMMITS} (job text NOT NULL, part text NOT NULL, "
                "target text NOT NULL, rows bigint NOT NULL, at timestamptz NOT NULL DEFAULT now(), "
                "PRIMARY KEY (job, target, part))"
            )

    def _use_pgvector(self) -> None:
        import psycopg

        available = self.conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").fetchone()
        if available:
            try:
                self.conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
                from pgvector.psycopg import register_vector

                register_vector(self.conn)
                self.pgvector = True
                return
            except psycopg.Error as exc:
                why = f"cannot create it ({' '.join(str(exc).split())[:120]})"
        else:
            why = "it is not installed on the server"
        if self.spec.vector == "pgvector":
            raise OutputError(f"{self.name}: vector = 'pgvector' but {why}; install pgvector or set vector = 'array'")
        log.info("%s: pgvector %s; embeddings are stored as real[]", self.name, why)

    def write(self, part: str, table: pa.Table) -> None:
        import psycopg

        if not table.num_rows:
            return
        what = f"{self.name}: writing {part}"
        try:
            retrying(lambda: self._write_once(part, table), what, self._errors, on_retry=self._reconnect)
        except psycopg.Error as exc:  # not a connection problem: the server refused the rows
            why = withheld(
                " ".join(str(exc).split())[:300], type(exc).__name__, self.redact
            )  # it may quote a row's values
            raise OutputError(f"{what}: {type(exc).__name__}: {why}") from exc

    def complete(self) -> None:
        pass  # each part is visible once its transaction commits; nothing is switched at the end

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()

    # -- one part, one transaction ---------------------------------------------------
    def _reconnect(self) -> None:
        try:
            self._connect()
        except self._errors as exc:
            log.warning("%s: reconnect failed (%s)", self.name, type(exc).__name__)

    def _write_once(self, part: str, table: pa.Table) -> None:
        cols = [*[c for c in self.kept if c in table.column_names]]
        cols += [c for c in value_columns(table, self.spec.columns, self.kept, self.where) if c not in cols]
        table = table.select(cols)
        checked_here = self.columns is None
        try:
            self._transaction(part, table)
        except BaseException:
            if checked_here:  # the table made or checked in a rolled-back transaction is checked again
                self.columns = None
            raise

    def _transaction(self, part: str, table: pa.Table) -> None:
        with self.conn.transaction():
            done = self.conn.execute(
                f"SELECT 1 FROM {COMMITS} WHERE job = %s AND target = %s AND part = %s",
                (self.job, self.spec.table, part),
            ).fetchone()
            if done:
                return
            self._ensure_table(table)
            assert self.columns is not None
            if self.spec.mode == "append":
                self._copy(_ident(self.spec.table), table)
            else:
                self._upsert(table)
            crash_point("export-postgres-copied")
            self.conn.execute(
                f"INSERT INTO {COMMITS} (job, target, part, rows) VALUES (%s, %s, %s, %s)",
                (self.job, self.spec.table, part, table.num_rows),
            )

    def _upsert(self, table: pa.Table) -> None:
        assert self.columns is not None and self.id_column is not None
        tmp = "bulkinfer_stage"
        self.conn.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS {tmp} (LIKE {_ident(self.spec.table)}) ON COMMIT DELETE ROWS"
        )
        self._copy(tmp, table)
        names = [n for n, _t in self.columns]
        cols = ", ".join(_ident(n) for n in names)
        updates = ", ".join(f"{_ident(n)} = EXCLUDED.{_ident(n)}" for n in names if n != self.id_column)
        action = f"DO UPDATE SET {updates}" if updates else "DO NOTHING"
        self.conn.execute(
            f"INSERT INTO {_ident(self.spec.table)} ({cols}) SELECT {cols} FROM {tmp} "
            f"ON CONFLICT ({_ident(self.id_column)}) {action}"
        )

    def _copy(self, target: str, table: pa.Table) -> None:
        assert self.columns is not None
        names = [n for n, _t in self.columns]
        types = [_COPY_TYPES.get(t, "vector" if t.startswith("vector") else t) for _n, t in self.columns]
        data = []
        for name, sql in self.columns:
            col = table.column(name)
            if is_vector(col):
                m = vectors(col)
                data.append(list(m) if sql.startswith("vector") else [row.tolist() for row in m])
            else:
                data.append(col.to_pylist())
        cols = ", ".join(_ident(n) for n in names)
        with self.conn.cursor() as cur, cur.copy(f"COPY {target} ({cols}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(types)
            for row in zip(*data, strict=True):
                copy.write_row(row)

    # -- the table -------------------------------------------------------------------
    def _ensure_table(self, table: pa.Table) -> None:
        if self.columns is not None:
            return
        wanted = [(f.name, self._sql_type(table.column(f.name), f.type)) for f in table.schema]
        found = self.conn.execute(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
            "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            (_ident(self.spec.table),),
        ).fetchall()
        if not found:
            key = self.id_column if self.spec.mode == "upsert" else None
            defs = ", ".join(f"{_ident(n)} {t}{' PRIMARY KEY' if n == key else ''}" for n, t in wanted)
            self.conn.execute(f"CREATE TABLE IF NOT EXISTS {_ident(self.spec.table)} ({defs})")
        else:
            self._check_table(dict(found), wanted)
        self.columns = wanted

    def _check_table(self, have: dict[str, str], wanted: list[tuple[str, str]]) -> None:
        """The whole existing table against what the export writes, before any row is sent: every
        column the output has, of a type it can take (a vector's storage named with the setting that
        matches it), and no column the rows would leave empty that may not be (NOT NULL, no default)."""
        for n, t in wanted:
            if n not in have:
                raise OutputError(
                    f"{self.name}: the table exists without column {n!r} ({t}); add it, drop the table, "
                    "or choose another table"
                )
            if _base(have[n]) != _base(t):
                hint = "drop the table or choose another"
                if _base(have[n]) in ("real[]", "double precision[]") and t.startswith("vector"):
                    hint = "set vector = 'array' to write real[] into it, or drop the table"
                elif have[n].startswith("vector") and t == "real[]":
                    hint = "set vector = 'pgvector' (pgvector on the server) to write into it, or drop the table"
                raise OutputError(f"{self.name}: column {n!r} is {have[n]} in the table but the output has {t}; {hint}")
        required = self.conn.execute(
            "SELECT a.attname FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND "
            "d.adnum = a.attnum WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped "
            "AND a.attnotnull AND d.adbin IS NULL AND a.attidentity = '' AND a.attgenerated = ''",
            (_ident(self.spec.table),),
        ).fetchall()
        missing = [r[0] for r in required if r[0] not in dict(wanted)]
        if missing:
            raise OutputError(
                f"{self.name}: the table's column {missing[0]!r} is NOT NULL without a default and the output "
                "has no such column; give it a default, drop the NOT NULL, or choose another table"
            )

    def _sql_type(self, col: pa.ChunkedArray, t: pa.DataType) -> str:
        if is_vector(col):
            dim = t.list_size if pa.types.is_fixed_size_list(t) else len(vectors(col[:1])[0])
            return f"vector({dim})" if self.pgvector else "real[]"
        if pa.types.is_boolean(t):
            return "boolean"
        if pa.types.is_integer(t):
            return "bigint"
        if pa.types.is_floating(t):
            return "double precision"
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return "text"
        if pa.types.is_timestamp(t):
            return "timestamptz" if t.tz else "timestamp"
        raise OutputError(f"{self.name}: cannot store column type {t} in PostgreSQL; drop the column from columns")


_COPY_TYPES = {"bigint": "int8", "double precision": "float8", "real[]": "float4[]", "boolean": "bool"}
"""The names binary COPY knows the column types by."""


def _base(sql: str) -> str:
    """A type without its size for comparing (``vector(384)`` stays itself)."""
    return sql if sql.startswith("vector") else sql.split("(")[0].strip()
