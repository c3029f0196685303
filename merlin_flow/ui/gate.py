"""The door every request of the dashboard goes through, before any page or action.

``access.py`` says what is checked; this applies it, in order: the ``Host`` (403, for
every path but ``/healthz``), a NUL character in the path or the query (400: no
database takes one), the ``Origin`` of a POST that does not carry the bearer token
(403), then the token (401, or the login form for a browser). The session the request's
cookie holds is left in ``request.state.session`` for the pages and actions. Every answer
says that no other site may frame it.
"""

from __future__ import annotations

from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp

from merlin_flow.ui.access import SESSION_SECONDS, Access, Session

OPEN = ("/login", "/static")
"""Paths served without the token: the login form and the script (never another Host)."""
HEALTH = "/healthz"
"""Served to every Host: a probe asks it by the pod's address, and it says only ``ok``."""
SAFE = ("GET", "HEAD")
"""The methods that change nothing; any other must come from the dashboard's own pages."""
HEADERS = {
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
}
"""On every answer: no page of another site frames the dashboard (and clicks its buttons)."""


class Gate(BaseHTTPMiddleware):
    """The checks of ``access``, on every request (the module's docstring)."""

    def __init__(self, app: ASGIApp, access: Access) -> None:
        """The gate in front of ``app``."""
        super().__init__(app)
        self.access = access

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        """The request's answer: a refusal, or the app's, with ``HEADERS``."""
        if request.url.path == HEALTH:
            return await call_next(request)
        response = self.refusal(request) or await call_next(request)
        response.headers.update(HEADERS)
        return response

    def refusal(self, request: Request) -> Response | None:
        """Why the request is refused (403, 400, 401, the login form), or None."""
        access, headers = self.access, request.headers
        host = headers.get("host")
        if not access.hosts.admits(host):
            return PlainTextResponse(
                f"this dashboard does not answer to Host {(host or '')[:100]!r}: open it at "
                "the address it serves, or start it with --allowed-host (docs/dashboard.md)",
                status_code=403,
            )
        if "\0" in request.url.path:
            return PlainTextResponse("the path holds a NUL character", status_code=400)
        for name, value in request.query_params.multi_items():
            if "\0" in name or "\0" in value:
                return PlainTextResponse(f"{name[:40]}: holds a NUL character", status_code=400)
        request.state.session = access.session_of(request.cookies.get(access.cookie_name))
        request.state.bearer = access.bearer(headers.get("authorization"))
        ours = access.hosts.admits_origin(headers.get("origin"), headers.get("referer"), host)
        if request.method not in SAFE and not request.state.bearer and not ours:
            return PlainTextResponse(
                "refused: a POST must come from the dashboard's own pages (its Origin, "
                "or Referer, names another site or none)",
                status_code=403,
            )
        if request.url.path.startswith(OPEN) or access.allows(
            headers.get("authorization"), request.state.session
        ):
            return None
        if "text/html" in headers.get("accept", ""):
            return RedirectResponse("/login", status_code=303)
        return PlainTextResponse("the dashboard's token is required", status_code=401)


def session(request: Request) -> Session | None:
    """The session the request's cookie holds (``Gate`` read it), or None."""
    found: Session | None = getattr(request.state, "session", None)
    return found


def bearer(request: Request) -> bool:
    """Whether the request carries the token in ``Authorization`` (``Gate`` checked it)."""
    return bool(getattr(request.state, "bearer", False))


def keep_session(response: Response, request: Request, access: Access, kept: Session) -> None:
    """Set the cookie of ``kept`` on ``response``: for the browser's next requests only.

    ``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no other site's page sends
    it), ``Secure`` when the request came over https (as uvicorn reports it: from a proxy
    it trusts, its ``X-Forwarded-Proto``).
    """
    response.set_cookie(
        access.cookie_name,
        kept.cookie,
        max_age=SESSION_SECONDS,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
