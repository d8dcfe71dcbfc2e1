"""``bulkinfer serve``: the job's adapter behind HTTP, with dynamic micro-batching.

The same adapter, engine and precision as ``bulkinfer run``, so online answers equal the
offline output (tested). Imports starlette and uvicorn only when used.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import TYPE_CHECKING, Any

from ..core.errors import ConfigError

if TYPE_CHECKING:
    from ..config import JobConfig

__all__ = ["review_queue", "serve", "serve_review"]

log = logging.getLogger("bulkinfer")


def serve(cfg: JobConfig) -> None:
    """Serve ``cfg``'s model until interrupted (SIGINT/SIGTERM: finish requests, then stop)."""
    import uvicorn

    from .app import build_app

    if not cfg.model.name and not cfg.models:
        raise ConfigError("model.name: no model given; pass --model (e.g. --model minilm)")
    sv = cfg.serve
    if bool(sv.tls_cert) != bool(sv.tls_key):
        raise ConfigError("serve.tls_cert and serve.tls_key go together: give both (PEM files) or neither")
    for name, path in (("tls_cert", sv.tls_cert), ("tls_key", sv.tls_key)):
        if path and not os.path.isfile(path):
            raise ConfigError(f"serve.{name}: {path} is not a file")
    if not sv.api_keys_file and sv.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning(
            "serving on %s without serve.api_keys_file: anyone who can reach this address can call the model",
            sv.host,
        )
    app = build_app(cfg)
    sock, host, port = _listen(cfg.serve.host, cfg.serve.port)
    scheme = "https" if sv.tls_cert else "http"
    log.info("serving %s at %s://%s:%d (%s)", cfg.model.name, scheme, host, port, route_list(app))
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
        ssl_certfile=sv.tls_cert,
        ssl_keyfile=sv.tls_key,
    )
    _reload_keys_on_sighup(app.state.server)
    uvicorn.Server(config).run(sockets=[sock])


def _listen(host: str, port: int) -> tuple[socket.socket, str, int]:
    """A listening socket on ``host:port`` (0: any free port) and the address it got."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)  # from here a client that read the URL logged next queues instead of being refused
    except OSError as exc:
        raise ConfigError(f"serve.port: cannot listen on {host}:{port} ({exc.strerror or exc})") from exc
    got_host, got_port = sock.getsockname()[:2]
    return sock, got_host, got_port


def review_queue(
    out: str, route: str, lease_s: float = 300, decisions: tuple[str, str] | None = None, audit: int = 0
) -> Any:
    """The review queue of ``out``'s route ``route`` (:class:`.review.ReviewQueue`) with ``audit``
    of the published rows; ``decisions``: a PostgreSQL DSN or Redis URL and the table or hash
    the decisions are also written to."""
    from ..outputs.review import decisions_mirror, queue_folder
    from ..outputs.review_rows import queue_rows
    from .review import ReviewQueue

    folder, config = queue_folder(out, route)
    rows = queue_rows(out, folder, config, audit)
    mirror = decisions_mirror(*decisions, str(folder.resolve())) if decisions else None
    return ReviewQueue(rows, folder, config, route, lease_s, mirror)


def serve_review(
    out: str, route: str, host: str, port: int, api_keys_file: str | None, lease_s: float,
    decisions: tuple[str, str] | None = None, audit: int = 0,
) -> None:  # fmt: skip
    """The review page of ``out``'s route ``route`` until interrupted (see :mod:`.review`)."""
    import uvicorn

    from .auth import KeyRing
    from .review import review_app

    queue = review_queue(out, route, lease_s, decisions, audit)
    folder = queue.store.folder
    sock, host, port = _listen(host, port)
    decided = len(queue.store.decisions())
    log.info("review queue of %s (%d rows, %d decided) at http://%s:%d", folder, len(queue.ids), decided, host, port)
    config_ = uvicorn.Config(review_app(queue, KeyRing(api_keys_file)), log_level="warning", access_log=False)
    try:
        uvicorn.Server(config_).run(sockets=[sock])
    finally:
        queue.store.close()


def _reload_keys_on_sighup(server: Any) -> None:
    """SIGHUP reads serve.api_keys_file again (new keys, revoked keys, new limits) without a restart."""
    import signal

    if server.keys.path is None or not hasattr(signal, "SIGHUP"):
        return

    def reload(_signum: int, _frame: object) -> None:
        try:
            log.info("SIGHUP: %d API key(s) in force from %s", server.keys.reload(), server.keys.path)
        except ConfigError as exc:
            log.warning("SIGHUP: %s; the keys in force are kept", exc)

    signal.signal(signal.SIGHUP, reload)


def route_list(app: Any) -> str:
    """The app's routes by method, as the start-up line lists them: read from the app itself,
    so the line cannot leave out a route the server answers."""
    by_method: dict[str, list[str]] = {}
    for route in app.routes:
        for method in sorted(getattr(route, "methods", None) or ()):
            if method != "HEAD":
                by_method.setdefault(method, []).append(route.path.replace("{id:path}", "{id}"))
    return "; ".join(f"{method} {', '.join(paths)}" for method, paths in sorted(by_method.items(), reverse=True))
