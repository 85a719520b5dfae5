"""`SecurityHeaders`: the browser-facing security headers on every HTTP response of the control plane (OWASP's
HTTP headers cheat sheet), sent by the server because a `<meta>` Content-Security-Policy cannot carry
frame-ancestors, and API answers have no page to carry one at all.

Every response: `X-Frame-Options: DENY`, `X-Content-Type-Options: nosniff`, `Referrer-Policy: no-referrer` and a
Content-Security-Policy with `frame-ancestors 'none'`: the dashboard's own policy on its pages, `default-src 'none'`
on everything else (API answers, statements and metrics are data, never a page to run), and on FastAPI's interactive
docs (which load Swagger UI and ReDoc from their CDN) only `frame-ancestors 'none'`. API answers and /metrics also
get `Cache-Control: no-store` (they hold a tenant's data, fetched with a bearer token). A header the route set
itself is kept.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

DASHBOARD_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
                 "frame-src 'self' blob:; object-src 'none'; base-uri 'none'; form-action 'self'; "
                 "frame-ancestors 'none'")
DATA_CSP = "default-src 'none'; frame-ancestors 'none'; sandbox"
DOCS_CSP = "frame-ancestors 'none'"
DOCS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc"})
EVERY = ((b"x-frame-options", b"DENY"), (b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"))


def _policy(path: str) -> tuple[tuple[bytes, bytes], ...]:
    """The headers for a response to `path`, besides EVERY."""
    if path.startswith("/api/") or path == "/api" or path == "/metrics":
        return (b"content-security-policy", DATA_CSP.encode()), (b"cache-control", b"no-store")
    if path in DOCS:
        return ((b"content-security-policy", DOCS_CSP.encode()),)
    if path in ("/openapi.json", "/healthz", "/readyz", "/version"):
        return ((b"content-security-policy", DATA_CSP.encode()),)
    return ((b"content-security-policy", DASHBOARD_CSP.encode()),)


class SecurityHeaders:
    """See the module docstring. Outermost, so that the guard's own refusals (408, 413, 429) carry them too."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extra = (*EVERY, *_policy(scope["path"]))

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {key.lower() for key, _ in headers}
                headers += [(key, value) for key, value in extra if key not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)
