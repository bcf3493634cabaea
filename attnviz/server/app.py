"""The web app of `attnviz serve` (Starlette): the live page, the JSON API and its limits.

Routes are fixed; none reads or writes a file a client names (the page is built once from
the package's page.js, live.js and page.css). Model work runs one request at a time in one
worker thread, so the event loop keeps answering (the page, /api/health, refusals) meanwhile;
at most `max_queue` model requests wait or run, and one more is answered 503 with Retry-After.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from attnviz.core.models import Model
from attnviz.errors import AttnvizError, NotHeldError
from attnviz.outputs.html.page import live_page
from attnviz.pipelines import serve as work
from attnviz.pipelines import serve_compare, tiles

MAX_BODY = 64 * 1024  # bytes of a request body
MAX_QUEUE = 64  # model requests waiting or running
RETRY_AFTER = "1"  # seconds, with a 503 when the queue is full
# Host names a loopback-bound server answers to: a web page elsewhere that points a name of its
# own at 127.0.0.1 (DNS rebinding) sends that name, and is refused.
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


@dataclass(frozen=True)
class Limits:
    """What the server refuses: body bytes, waiting model requests, which Host headers it
    answers (None: any, for a server bound to a non-loopback address), and the bytes of X it
    holds for tiles."""

    max_body: int = MAX_BODY
    max_queue: int = MAX_QUEUE
    hosts: tuple[str, ...] | None = LOOPBACK_NAMES
    hold_bytes: int = tiles.HOLD_BYTES  # the last text's X, kept for tiles


class Refused(Exception):
    """A request answered with `status` and {"error": message}."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.headers = status, headers


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


# The server speaks JSON keys, not command-line options: "--hide-special" -> "hide_special"
# (but for the options of `attnviz serve` itself, which the person who started it can change).
_OPTION = re.compile(r"--(?!hold-mib)([a-z][a-z-]*)")


def _said(error: AttnvizError) -> str:
    return _OPTION.sub(lambda m: '"' + m.group(1).replace("-", "_") + '"', str(error))


class _Served:
    """What the app's handlers share: the model (and a second one for /api/compare), the
    limits, the page and its headers, the one model thread, how many model requests wait or
    run (changed on the event loop only), and the text held for tiles (used in the model
    thread only). The app keeps it as `app.state.served`."""

    def __init__(self, model: Model, limits: Limits, against: Model | None) -> None:
        from attnviz.analysis.contributions import MEASURES

        self.model, self.limits, self.against = model, limits, against
        # held for the server's life: the process keeps only the models last used
        # (`core.models.KEEP_BYTES`), and a second large model would otherwise let the first
        # go, to be loaded again by the next request
        self.loaded = [m.load() for m in (model, against) if m is not None]
        self.info = self.loaded[0].info
        self.other = self.loaded[1].info if against is not None else None
        self.page = live_page(
            self.info.as_dict(),
            {name: m.help for name, m in MEASURES.items()},
            {
                "max_body": limits.max_body,
                "max_tokens": self.info.max_tokens,
                "tile_side": tiles.TILE_SIDE,
                "hold_bytes": limits.hold_bytes,
            },  # fmt: skip
            self.other.as_dict() if self.other is not None else None,
        )
        self.headers = {
            # The meta tag's policy, and what only a header can say: no other site may frame it.
            "Content-Security-Policy": _page_csp(self.page) + "; frame-ancestors 'none'",
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-store",
        }
        self.model_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="attnviz-model")
        self.queued = 0
        self.holder = tiles.Holder(limits.hold_bytes)  # the last text's q and k


def _served(request: Request) -> _Served:
    return request.app.state.served


async def _run(
    request: Request,
    answer: Callable[[_Served, Any], Any],
    asks: Callable[[_Served, Any], Any] = lambda served, body: work.Question.of(body),
) -> Response:
    """Answer a model request in the model thread: its JSON body read within the limit and
    turned into a question by `asks`, refused with 503 when the queue is full."""
    served = _served(request)
    question = asks(served, await _json_body(request, served.limits.max_body))
    if served.queued >= served.limits.max_queue:
        raise Refused(
            503,
            f"busy: {served.queued} requests are waiting or running (the limit, --max-queue); "
            f"try again in {RETRY_AFTER} s",
            {"Retry-After": RETRY_AFTER},
        )
    served.queued += 1
    try:
        body = await asyncio.get_running_loop().run_in_executor(
            served.model_thread, lambda: _encoded(answer(served, question))
        )
    finally:
        served.queued -= 1
    return Response(body, media_type="application/json", headers={"Cache-Control": "no-store"})


async def _index(request: Request) -> Response:
    served = _served(request)
    return HTMLResponse(served.page, headers=served.headers)


async def _health(request: Request) -> Response:
    served = _served(request)
    held = served.holder.held
    return JSONResponse({
        "ok": True,
        "model": served.info.name,
        "against_model": served.other.name if served.other is not None else None,
        "queued": served.queued,
        "held": held.summary() if held is not None else None,
    })  # fmt: skip


async def _attention(request: Request) -> Response:
    return await _run(request, lambda s, q: work.attention(s.model, q, s.holder))


async def _page_data(request: Request) -> Response:
    return await _run(request, lambda s, q: work.page(s.model, q, holder=s.holder))


async def _text(request: Request) -> Response:
    return await _run(request, lambda s, q: tiles.read(s.model, s.holder, q),
                      lambda s, body: work.Question.of(body, keys=work.TEXT_KEYS))  # fmt: skip


async def _tile(request: Request) -> Response:
    return await _run(request, lambda s, q: tiles.tile(s.model, s.holder, q),
                      lambda s, body: tiles.TileQuestion.of(body, s.model.load()))  # fmt: skip


async def _compare(request: Request) -> Response:
    return await _run(request, lambda s, q: serve_compare.page(s.model, s.against, q),
                      lambda s, body: serve_compare.CompareQuestion.of(body))  # fmt: skip


async def _refused(request: Request, error: Exception) -> Response:
    """Every error as {"error": one line} with its status: the server's own refusals, a bad
    text, layer or measure (the CLI's line, in the API's words), 404, 405, a bug (500)."""
    if isinstance(error, Refused):
        return _error(error.status, str(error), error.headers)
    if isinstance(error, NotHeldError):  # a tile of a text the server no longer holds
        return _error(409, _said(error))
    if isinstance(error, AttnvizError):  # bad text, layer, measure: the CLI's one line
        return _error(400, _said(error))
    if not isinstance(error, HTTPException):  # a bug (uvicorn logs its traceback)
        return _error(500, f"internal error: {type(error).__name__}: {error}")
    if error.status_code == 404:
        return _error(404, f"no such page: {request.url.path}; the API is under /api/")
    if error.status_code == 405:
        return _error(405, f"{request.method} is not allowed on {request.url.path}")
    return _error(error.status_code, str(error.detail))


# One line a handler.
ROUTES = [
    Route("/", _index, methods=["GET"]),
    Route("/api/health", _health, methods=["GET"]),
    Route("/api/attention", _attention, methods=["POST"]),
    Route("/api/page", _page_data, methods=["POST"]),
    Route("/api/compare", _compare, methods=["POST"]),
    Route("/api/text", _text, methods=["POST"]),
    Route("/api/tile", _tile, methods=["POST"]),
]


def build_app(
    model: Model, limits: Limits | None = None, against: Model | None = None
) -> Starlette:
    """The app for `model`, which is loaded here if it is not yet (a first request should not
    wait for it); `against` is a second model that /api/compare can read text B with."""
    served = _Served(model, limits or Limits(), against)
    handled = (Refused, AttnvizError, HTTPException, Exception)
    app = Starlette(routes=ROUTES, exception_handlers=dict.fromkeys(handled, _refused))
    if served.limits.hosts is not None:
        app.add_middleware(_KnownHosts, hosts=served.limits.hosts)
    app.state.served = served
    app.state.model_thread = served.model_thread
    return app


def _page_csp(page: str) -> str:
    return re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1)


def _encoded(found: dict[str, Any]) -> bytes:
    # In the model thread too: encoding a long text's weights takes a while.
    return json.dumps(found, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


async def _json_body(request: Request, limit: int) -> Any:
    """The request's JSON, refusing a body over `limit` bytes (read no further than that),
    another content type, bytes that are not UTF-8, and text that is not JSON."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        # Also what keeps other web sites out: a page elsewhere cannot send this type to
        # this origin without a CORS preflight, which this server never grants.
        raise Refused(415, 'send JSON with "Content-Type: application/json"')
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise Refused(413, f"the body is over {limit} bytes, the limit")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Refused(413, f"the body is over {limit} bytes, the limit")
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks).decode("utf-8"))
    except UnicodeDecodeError as error:
        raise Refused(400, f"the body is not UTF-8 (byte {error.start})") from None
    except json.JSONDecodeError as error:
        raise Refused(400, f"the body is not JSON: {error.msg} at character {error.pos}") from None


class _KnownHosts:
    """Answer only requests whose Host header names this loopback server (ASGI middleware)."""

    def __init__(self, app: Any, hosts: tuple[str, ...]) -> None:
        self.app, self.hosts = app, hosts

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            if name.lower() not in self.hosts:
                refusal = _error(
                    403,
                    f"Host {host!r} is not this server's (it answers to "
                    f"{', '.join(self.hosts)}, with its port)",
                )
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


__all__ = ["Limits", "build_app"]
