"""Failures of the control plane's own resources, answered as retryable HTTP errors instead of 500 stack traces.

| Cause                                                           | Status | Retry-After |
|-----------------------------------------------------------------|--------|-------------|
| storage full: SQLite "database or disk is full", PostgreSQL      | 507    | 5 s         |
| SQLSTATE 53100 (disk_full), OSError ENOSPC / EDQUOT             |        |             |
| any other database operational error (locked, connection lost,  | 503    | 1 s         |
| I/O error), a connection-pool timeout, an OSError EIO           |        |             |
| an armed `error` failpoint (gpupool.server.failpoints)          | 503    | 1 s         |

The transaction of the request was rolled back (one transaction per request), so nothing was acknowledged and a
retry is safe; a submission retried with its Idempotency-Key never makes two jobs. Every such answer is logged
as one warning line. Other OSErrors stay 500 (logged with their traceback), with no trace in the body.
"""

from __future__ import annotations

import errno
import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from gpupool.server.failpoints import FailpointError

log = logging.getLogger(__name__)

STORAGE_FULL_RETRY_S = 5
UNAVAILABLE_RETRY_S = 1
_FULL_MARKERS = ("database or disk is full", "no space left on device", "disk full", "could not extend file")


def storage_full(exc: BaseException) -> bool:
    """Whether `exc` (a database error or an OSError) means the storage under the control plane is full."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    original = getattr(exc, "orig", None)
    if getattr(original, "sqlstate", None) == "53100" or getattr(original, "pgcode", None) == "53100":
        return True
    text = str(original if original is not None else exc).lower()
    return any(marker in text for marker in _FULL_MARKERS)


def answer(exc: BaseException, request: Request) -> Response:
    """The 507 or 503 response for `exc` (see the module table), logged as one warning."""
    full = storage_full(exc)
    status, retry = (507, STORAGE_FULL_RETRY_S) if full else (503, UNAVAILABLE_RETRY_S)
    detail = ("the control plane's storage is full; nothing was changed, retry later" if full else
              "the control plane cannot reach or write its database right now; nothing was changed, retry later")
    if isinstance(exc, FailpointError):
        detail = f"{exc}; nothing was changed, retry later"
    log.warning("%s %s -> %d: %s: %s", request.method, request.url.path, status, type(exc).__name__,
                str(getattr(exc, "orig", exc))[:200])
    return JSONResponse({"detail": detail}, status_code=status, headers={"Retry-After": str(retry)})


def install(app: FastAPI) -> None:
    """Register the handlers of the module table on `app` (HTTP only: on a WebSocket the error propagates as
    before, closing the channel, whose peer reconnects and re-sends what was not acknowledged)."""

    async def retryable(request: Request, exc: Exception) -> Response:
        if request.scope["type"] != "http":
            raise exc
        return answer(exc, request)

    async def os_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, OSError)
        if request.scope["type"] != "http":
            raise exc
        if storage_full(exc) or exc.errno == errno.EIO:
            return answer(exc, request)
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return JSONResponse({"detail": "internal error"}, status_code=500)

    for kind in (OperationalError, PoolTimeout, FailpointError):
        app.add_exception_handler(kind, retryable)
    app.add_exception_handler(OSError, os_error)
