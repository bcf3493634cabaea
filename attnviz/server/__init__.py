"""`attnviz serve`: a local web app that keeps one model loaded and answers each text as fast
as the model reads it.

    exposed(host) -> str | None     the warning a non-loopback --host prints
    listen(host, port) -> socket    bound and listening (a port in use: one-line error)
    serve(model, sock, ...)         the app on that socket until Ctrl-C

`app.py` holds the routes and limits. Starlette and uvicorn are imported here, so only
`attnviz serve` imports them.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

from attnviz.core import interrupts
from attnviz.errors import InputError

if TYPE_CHECKING:
    from attnviz.core.models import Model
    from attnviz.server.app import Limits


def loopback(host: str) -> bool:
    """Whether `host` is a loopback address (127.0.0.0/8, ::1) or the name localhost."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a name other than localhost: it may resolve anywhere
        return False


def exposed(host: str, port: int) -> str | None:
    """The warning for a server bound where other machines may reach it, or None."""
    if loopback(host):
        return None
    return (
        f"--host {host} is not a loopback address: anyone who can reach this machine on port "
        f"{port} can use the model (no password, no encryption)"
    )


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port) and listening; refuses a port in use in one line."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM
        )[0]
    except socket.gaierror as error:
        raise InputError(f"--host {host}: {error.strerror}") from None
    sock = socket.socket(family, kind, proto)
    # A restarted server may take the port over from its own closed connections (TIME_WAIT);
    # a server still listening on it keeps it.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            raise InputError(
                f"port {port} is in use on {host}: stop what holds it or pass --port N"
            ) from None
        raise InputError(f"cannot listen on {host}:{port}: {error.strerror}") from None
    return sock


def url(host: str, port: int) -> str:
    """The address to open in a browser."""
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}/"


def serve(
    model: Model,
    sock: socket.socket,
    limits: Limits,
    on_ready: Callable[[], None] | None = None,
    against: Model | None = None,
) -> None:
    """Serve the app on `sock` until Ctrl-C (then KeyboardInterrupt, once the server has
    stopped). `on_ready` runs once requests are answered; `against` is a second model for
    comparisons (/api/compare)."""
    import contextlib

    import uvicorn

    from attnviz.pipelines.serve import Question, page
    from attnviz.server.app import build_app

    interrupts.hold()  # a Ctrl-C from now stops the server (uvicorn hands it on)
    app = build_app(model, limits, against)
    # A first forward pass is several times slower than the next (lazy set-up in torch): it
    # is spent here, not on the first person's request.
    page(model, Question("The model reads one sentence before the first request."))

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        if on_ready is not None:
            on_ready()
        yield
        app.state.model_thread.shutdown(wait=False, cancel_futures=True)

    app.router.lifespan_context = lifespan
    config = uvicorn.Config(
        app,
        log_level="warning",  # errors only: no access log of the texts people send
        access_log=False,
        server_header=False,
        date_header=False,
        timeout_graceful_shutdown=5,
    )
    uvicorn.Server(config).run(sockets=[sock])
