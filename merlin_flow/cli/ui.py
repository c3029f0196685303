"""``merlin ui``: serve the jobs dashboard (``merlin_flow.ui``)."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from merlin_flow.cli.common import console, guarded, state


def ui(
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port.")] = 8700,
    read_only: Annotated[
        bool, typer.Option("--read-only", help="Show jobs, offer and accept no action.")
    ] = False,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-host",
            metavar="NAME[:PORT]",
            help="A name the dashboard answers to besides its address (a proxy's); repeatable.",
        ),
    ] = None,
) -> None:
    """Serve the jobs dashboard: every job, its steps and attempts, live; plans approved there.

    On an address other than loopback it needs MERLIN_UI_TOKEN. It answers only requests
    for its own address, or for a name given with --allowed-host or MERLIN_UI_ALLOWED_HOSTS
    (see docs/dashboard.md).
    """

    def work() -> None:
        import uvicorn

        from merlin_flow.ui.access import Access, Hosts, check_bind, home_key
        from merlin_flow.ui.server import create_app

        token = os.environ.get("MERLIN_UI_TOKEN") or None
        check_bind(host, token)
        settings, db = state()
        names = [*settings.ui_allowed_hosts.split(","), *(allowed_host or [])]
        hosts = Hosts.serving(host, port, names)
        access = Access(token, home_key(settings.home_dir), hosts)
        app = create_app(db, settings, access, read_only)
        shown = f"[{host}]" if ":" in host else host
        mode = " (read-only)" if read_only else ""
        console.print(f"merlin ui{mode} on http://{shown}:{port}/", highlight=False)
        # Open event streams never end by themselves: on Ctrl-C or SIGTERM they are cut
        # after a few seconds instead of holding the server up.
        uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=3)

    guarded(work)
