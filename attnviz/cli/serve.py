"""`attnviz serve`: the interactive page as a local web app, with the model kept loaded."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Annotated, Any

import typer

from attnviz.cli.app import Command, app, err_console, fail, warn
from attnviz.cli.options import LOAD, briefly, flag, grouped, valued
from attnviz.core.settings import Load
from attnviz.errors import AttnvizError, Interrupted

if TYPE_CHECKING:
    from attnviz.core.models import Model


AgainstOpt = valued(
    str,
    "--against-model",
    metavar="MODEL",
    help=briefly(
        "A second model, loaded too, to compare with.",
        "The page can read text B with it and compare the two head by head (same layers and "
        "heads; a different tokenizer needs words).",
    ),
)
PortOpt = Annotated[
    int, typer.Option("--port", "-p", min=1, max=65535, metavar="N", help="Port to listen on.")
]
HostOpt = Annotated[
    str,
    typer.Option(
        "--host",
        metavar="ADDRESS",
        help=briefly(
            "Address to listen on.",
            "Any address but a loopback one (127.0.0.1, ::1, localhost) lets other machines "
            "use the model, and prints a warning.",
        ),
    ),
]
OpenOpt = Annotated[
    bool, flag("--open", briefly("Open the page in the default browser.", "Once it is served."))
]
QueueOpt = Annotated[
    int,
    typer.Option(
        "--max-queue",
        min=1,
        metavar="N",
        help=briefly(
            "Requests that may wait or run at once.",
            "One more is answered 503 with Retry-After.",
        ),
    ),
]


HoldOpt = Annotated[
    int,
    typer.Option(
        "--hold-mib",
        min=1,
        metavar="MIB",
        help=briefly(
            "Memory for the last text's tiles.",
            "The last text's queries and keys at every layer, which the page's zoom (tiles) "
            "is made from; a longer text is refused for tiles (SmolLM2 at 8,192 tokens holds "
            "720 MiB).",
        ),
    ),
]


@app.command(cls=Command)
@grouped
def serve(
    load: Load = LOAD,
    against_model: AgainstOpt = None,
    port: PortOpt = 8000,
    host: HostOpt = "127.0.0.1",
    open_browser: OpenOpt = False,
    max_queue: QueueOpt = 64,
    hold_mib: HoldOpt = 1024,
) -> None:
    """Serve the interactive page on a local web address, with the model loaded once.

    Type a sentence and press Enter: its head, model, matrix, query and inside views show at
    once, and the address carries the text, so a view can be bookmarked. It listens on
    127.0.0.1 only, unless --host says otherwise. Ctrl-C stops it (exit code 130).
    \f
    A drag over the matrix view zooms into a head's exact cells (tiles, from the last text's
    X, which the server keeps). Scripts can POST to /api/attention and /api/tile
    (docs/serve.md).
    """
    try:
        from attnviz.pipelines import checks
        from attnviz.pipelines.request import ServeRequest
        from attnviz.server import exposed, listen, serve, url
        from attnviz.server.app import LOOPBACK_NAMES, Limits

        warning = exposed(host, port)
        if warning:
            warn(warning)
        sock = listen(host, port)  # before loading: a port in use fails at once
        asked = ServeRequest(load)
        chosen = asked.model()
        checks.before_loading(asked, chosen)
        address = url(host, port)
        with err_console.status(f"loading {load.model or 'the bundled model'}…"):
            loaded = chosen.load()
        checks.against(asked, loaded.info)
        against = _second_model(against_model, load, loaded)
        ready = partial(_ready, address, loaded.info.name, open_browser)
        # A loopback server answers only to loopback names (app.py says why).
        hosts = None if warning else LOOPBACK_NAMES
        limits = Limits(max_queue=max_queue, hosts=hosts, hold_bytes=hold_mib * 2**20)
        serve(chosen, sock, limits, on_ready=ready, against=against)
    except AttnvizError as error:
        raise fail(error) from None
    except KeyboardInterrupt:
        raise fail(Interrupted("the server stopped")) from None


def _ready(address: str, name: str, open_browser: bool) -> None:
    """Say where the page is served, and open it in a browser with --open."""
    err_console.print(
        f"attnviz serve: [bold]{address}[/] ({name}); Ctrl-C stops", highlight=False, soft_wrap=True
    )
    if open_browser:  # in a thread: a browser may take a while to start
        import threading

        threading.Thread(target=_open_page, args=(address,), daemon=True).start()


def _open_page(address: str) -> None:
    import webbrowser

    if not webbrowser.open(address):
        warn(f"--open found no browser to start: open {address} in one")


def _second_model(name: str | None, load: Load, first: Any) -> Model | None:
    """The --against-model, loaded, refused at once if it cannot be compared with `first`
    head by head (its tokenizer is checked per request: words can bridge it)."""
    if name is None:
        return None
    from dataclasses import replace

    from attnviz.analysis.compare import refuse_models
    from attnviz.pipelines import checks
    from attnviz.pipelines.request import ServeRequest

    asked = ServeRequest(replace(load, model=name))
    second = asked.model()
    checks.before_loading(asked, second)
    with err_console.status(f"loading {name}…"):
        loaded = second.load()
        checks.against(asked, loaded.info)
        refuse_models(first, loaded, words=True)
    return second
