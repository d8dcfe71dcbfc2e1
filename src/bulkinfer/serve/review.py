"""``bulkinfer review OUT``: a web page where people work through the rows a job routed to
review (:mod:`bulkinfer.outputs.review` keeps the decisions and leases).

The page (``bulkinfer/data/review.html``, no script or style from elsewhere) lists the queue
with each row's decision so far; a reviewer takes the next row (a lease: nobody else gets it
meanwhile), sees its picture or text, every model's scores and the rule that sent it, and
approves (``a``) or rejects (``r``) it, with a note. With ``serve.api_keys_file`` the page asks
for a key and the key's id is the reviewer; without, the name typed on the page is.
"""

from __future__ import annotations

import json
import math
from importlib.resources import files
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from ..outputs.review import Conflict, Mirror, ReviewStore, sent_by
from ..outputs.review_rows import AUDIT_RULE, QueueRows
from .auth import KeyRing
from .validation import ApiError, JSONResponse

__all__ = ["ReviewQueue", "review_app"]

_BIG = 200
"""A text shown whole up to this many characters (longer: cut, with its length)."""


class ReviewQueue:
    """The rows under review (:class:`~bulkinfer.outputs.review_rows.QueueRows`), their
    decisions and how each is shown."""

    def __init__(
        self, rows: QueueRows, folder: Path, config: dict[str, Any], route: str, lease_s: float,
        mirror: Mirror | None = None,
    ) -> None:  # fmt: skip
        self.rows, self.table, self.ids, self.id_column = rows, rows.table, rows.ids, rows.id_column
        self.config, self.route = config, route
        self.store = ReviewStore(folder, self.ids, lease_s, mirror=mirror)
        self._at = {str(v): n for n, v in enumerate(self.table.column(self.id_column).to_pylist())}

    def __contains__(self, row_id: object) -> bool:
        return row_id in self._at

    def listing(self) -> list[dict[str, Any]]:
        decided, held = self.store.decisions(), self.store.holders()
        out = []
        for row_id in self.ids:
            d = decided.get(row_id)
            out.append({"id": row_id, "decision": self._decision(row_id), "verdict": d and d.verdict,
                        "reviewer": d and d.reviewer, "note": d and d.note, "held_by": held.get(row_id)})  # fmt: skip
        return out

    def row(self, row_id: str) -> dict[str, Any]:
        """One row as the page shows it: its scores, its text, whether it has a picture, its rule."""
        one = self.table.slice(self._at[row_id], 1)
        values = one.to_pylist()[0]
        decision = self._decision(row_id)
        rule = AUDIT_RULE if row_id in self.rows.audited else sent_by(self.config, self.route, one)
        shown = {k: _shown(v) for k, v in values.items() if k not in ("image", self.id_column, "_input_hash")}
        return {"id": row_id, "decision": decision, "rule": rule, "columns": shown,
                "picture": self.picture(row_id) is not None}  # fmt: skip

    def picture(self, row_id: str) -> bytes | None:
        """The row's picture: its bytes (an ``image`` column), else the file its ``path`` names."""
        at = self._at[row_id]
        if "image" in self.table.column_names and self.table.column("image")[at].is_valid:
            data = self.table.column("image")[at].as_py()
            return data if isinstance(data, bytes) else None
        if "path" in self.table.column_names and self.table.column("path")[at].is_valid:
            from ..core.storage import open_binary

            try:
                with open_binary(str(self.table.column("path")[at].as_py())) as f:
                    return bytes(f.read())
            except OSError:
                return None
        return None

    def _decision(self, row_id: str) -> str | None:
        if "decision" not in self.table.column_names:
            return None
        value = self.table.column("decision")[self._at[row_id]].as_py()
        return str(value) if value is not None else None


def _shown(value: Any) -> Any:
    """A value as the page shows it: numbers and short texts as they are, the rest as JSON, cut."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= _BIG else f"{text[:_BIG]}... ({len(text)} characters)"


class _Routes:
    """The page and its API over one queue; the reviewer of each call is its key's id or the
    name the page sends."""

    def __init__(self, queue: ReviewQueue, keys: KeyRing) -> None:
        self.queue, self.keys = queue, keys

    def reviewer(self, request: Request) -> str:
        self.keys.authorize(request)
        if self.keys.keys:
            return str(request.state.key_id)
        name = request.headers.get("x-reviewer", "").strip()
        if not name:
            raise ApiError(401, "say who you are: the page asks for your name (X-Reviewer)", "unauthorized")
        return name

    async def page(self, _request: Request) -> Response:
        html = files("bulkinfer").joinpath("data/review.html").read_text()
        return HTMLResponse(html.replace("{{keys}}", "true" if self.keys.keys else "false"))

    async def rows(self, request: Request) -> Response:
        return JSONResponse({"reviewer": self.reviewer(request), "rows": self.queue.listing()})

    async def take_next(self, request: Request) -> Response:
        row_id = self.queue.store.lease(self.reviewer(request))
        return JSONResponse({"row": self.queue.row(row_id) if row_id is not None else None})

    async def one(self, request: Request) -> Response:
        self.reviewer(request)
        row_id = request.path_params["id"]
        if row_id not in self.queue:
            raise ApiError(404, f"row {row_id!r} is not in this review queue", "not_found")
        return JSONResponse(self.queue.row(row_id))

    async def picture(self, request: Request) -> Response:
        self.reviewer(request)
        row_id = request.path_params["id"]
        data = self.queue.picture(row_id) if row_id in self.queue else None
        if data is None:
            raise ApiError(404, "this row has no picture", "not_found")
        return Response(data, media_type="application/octet-stream")

    async def decide(self, request: Request) -> Response:
        who = self.reviewer(request)
        try:
            body = json.loads(await request.body())
            row_id, verdict, note = str(body["id"]), str(body["verdict"]), str(body.get("note") or "")
        except (ValueError, KeyError, TypeError):
            raise ApiError(400, "body: expected {id, verdict: approve|reject, note}", "invalid_request") from None
        try:
            d = self.queue.store.decide(row_id, who, verdict, note)
        except Conflict as exc:
            raise ApiError(exc.status, str(exc), "conflict" if exc.status == 409 else "invalid_request") from None
        return JSONResponse({"id": d.id, "verdict": d.verdict, "reviewer": d.reviewer, "note": d.note, "at": d.at})


async def _on_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return exc.response()


def review_app(queue: ReviewQueue, keys: KeyRing) -> Starlette:
    """The page and its API (``/api/rows``, ``/api/next``, ``/api/rows/{id}``, ``/api/pictures/{id}``,
    ``/api/decide``)."""
    r = _Routes(queue, keys)
    routes = [
        Route("/", r.page, methods=["GET"]),
        Route("/api/rows", r.rows, methods=["GET"]),
        Route("/api/next", r.take_next, methods=["POST"]),
        Route("/api/rows/{id:path}", r.one, methods=["GET"]),
        Route("/api/pictures/{id:path}", r.picture, methods=["GET"]),
        Route("/api/decide", r.decide, methods=["POST"]),
    ]
    return Starlette(routes=routes, exception_handlers={ApiError: _on_error})
