"""The CLI's HTTP client: the public API only. Where to connect: GPUPOOL_URL and GPUPOOL_TOKEN, else the
config file written by `gpupool login` or `gpupool up` ($XDG_CONFIG_HOME/gpupool/config.json), which `gpupool up`
also tells where its data dir is (for `gpupool check`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx

DEFAULT_URL = "http://127.0.0.1:8181"


class ApiError(Exception):
    """A refused request (`status` the HTTP status), or (status 0) a control plane out of reach; `detail` is one
    line for a person, `cause` what went wrong underneath (its traceback shows under `gpupool --debug`)."""

    def __init__(self, status: int, detail: str, cause: BaseException | None = None) -> None:
        self.status, self.detail, self.cause = status, detail, cause
        super().__init__(f"{status}: {detail}")


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpupool" / "config.json"


def save_config(url: str, token: str, data_dir: Path | None = None) -> Path:
    """Write the CLI's config (0600): the control plane to use and, when this host runs it (`gpupool up`), its data
    dir as an absolute path. A config without a data dir (`gpupool login`) points at a control plane elsewhere."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    saved = {"url": url, "token": token} | ({"data_dir": str(data_dir.resolve())} if data_dir else {})
    with os.fdopen(fd, "w") as handle:
        json.dump(saved, handle)
    return path


def _saved() -> dict[str, str]:
    path = config_path()
    return json.loads(path.read_text()) if path.is_file() else {}


def saved_data_dir() -> Path | None:
    """The data dir of the control plane `gpupool up` last started on this host, if the config names one."""
    data_dir = _saved().get("data_dir")
    return Path(data_dir) if data_dir else None


def load_config() -> tuple[str, str | None]:
    url, token = os.environ.get("GPUPOOL_URL"), os.environ.get("GPUPOOL_TOKEN")
    if url and token:
        return url, token
    saved = _saved()
    return url or saved.get("url", DEFAULT_URL), token or saved.get("token")


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    detail = body.get("detail", body) if isinstance(body, dict) else body
    if isinstance(detail, list):  # pydantic validation errors: name each field
        return "; ".join(_field_error(d) for d in detail if isinstance(d, dict))
    return str(detail)


def _field_error(error: dict[str, Any]) -> str:
    """A pydantic error as `field: message` (`gpus: must be between 0 and 64`), without pydantic's "Value error, "."""
    where = ".".join(str(p) for p in error.get("loc", [])[1:]) or "request"
    message = str(error.get("msg", "invalid"))
    for noise in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(noise)
    return f"{where}: {message}"


def unreachable(url: str, exc: httpx.HTTPError) -> str:
    """One line saying which control plane could not be reached, why, and what to check."""
    why = type(exc).__name__ if not str(exc) else str(exc).splitlines()[0]
    return (f"cannot reach the control plane at {url} ({why}): check that it runs and that GPUPOOL_URL or "
            f"`gpupool login --url` names it")


class Client:
    def __init__(self, url: str | None = None, token: str | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        saved_url, saved_token = load_config()
        self.url = (url or saved_url).rstrip("/")
        token = token or saved_token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=30.0, transport=transport)

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.http.request(method, f"/api/v1{path}", **kwargs)
        except httpx.HTTPError as exc:
            raise ApiError(0, unreachable(self.url, exc), exc) from None
        if response.status_code >= 400:
            raise ApiError(response.status_code, _detail(response))
        return response

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None}).json()

    def post(self, path: str, body: dict[str, Any] | None = None, headers: dict[str, str] | None = None) -> Any:
        response = self.request("POST", path, json=body or {}, headers=headers or {})
        return response.json() if response.content else None

    def patch(self, path: str, body: dict[str, Any], **params: Any) -> Any:
        response = self.request("PATCH", path, json=body, params={k: v for k, v in params.items() if v is not None})
        return response.json() if response.content else None

    def delete(self, path: str, **params: Any) -> Any:
        response = self.request("DELETE", path, params={k: v for k, v in params.items() if v is not None})
        return response.json() if response.content else None
