"""The control plane serves the dashboard at `/` without taking anything from the API: its static files, every module
they import, and the packaging that ships them. No browser and no processes: the app in-process, without its
lifespan (nothing here touches the database)."""

from __future__ import annotations

import posixpath
import re
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import httpx
import pytest
from fastapi import FastAPI

from gpupool.server.app import DASHBOARD, create_app
from gpupool.server.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
MARKUP = re.compile(r"\.(inner|outer)HTML\s*=|insertAdjacentHTML|document\.write|\beval\(|new Function\(")
IMPORT = re.compile(r"""^import .* from '(\.[^']+)';$|^import '(\.[^']+)';$""", re.MULTILINE)


class Client:
    """Requests straight into the ASGI app (its lifespan never runs), each on a thread of its own: Playwright's sync
    API may hold this thread's event loop."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    def request(self, method: str, path: str) -> httpx.Response:
        async def send() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://dashboard.test") as client:
                response = await client.request(method, path)
                await response.aread()
                return response
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(anyio.run, send).result()

    def get(self, path: str) -> httpx.Response:
        return self.request("GET", path)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Client:
    return Client(create_app(Settings(data_dir=tmp_path_factory.mktemp("served"))))


def _files() -> set[str]:
    return {p.relative_to(DASHBOARD).as_posix() for p in DASHBOARD.rglob("*") if p.is_file()}


def test_the_dashboard_is_served_at_the_root(client: Client) -> None:
    index = client.get("/")
    assert index.status_code == 200 and index.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="js/app.js"></script>' in index.text
    assert "Content-Security-Policy" in index.text
    for path in sorted(_files()):
        response = client.get(f"/{path}")
        assert response.status_code == 200, path
    assert "javascript" in client.get("/js/app.js").headers["content-type"]
    assert client.get("/css/dashboard.css").headers["content-type"].startswith("text/css")
    assert client.get("/no-such-page.html").status_code == 404


def test_every_module_import_resolves_to_a_shipped_file() -> None:
    files = _files()
    modules = sorted(f for f in files if f.endswith(".js"))
    assert "js/app.js" in modules and "js/charts.js" in modules
    for module in modules:
        for match in IMPORT.finditer((DASHBOARD / module).read_text()):
            target = posixpath.normpath(posixpath.join(posixpath.dirname(module), match.group(1) or match.group(2)))
            assert target in files, f"{module} imports {target}, which is not in the dashboard"


def test_the_api_and_system_routes_are_untouched(client: Client) -> None:
    assert client.get("/openapi.json").json()["info"]["title"] == "gpupool"
    assert not [p for p in client.get("/openapi.json").json()["paths"] if not p.startswith("/api/v1/")]
    assert client.get("/docs").status_code == 200
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/metrics").status_code == 401  # an operator's token, unless GPUPOOL_METRICS_PUBLIC
    assert client.get("/api/v1/jobs").status_code == 401  # still the API, asking for a token
    for method in ("GET", "POST", "DELETE"):  # unknown API paths: the API's JSON 404, never a static file's 405
        response = client.request(method, "/api/v1/no-such-route")
        assert response.status_code == 404 and response.json() == {"detail": "Not Found"}, method
    assert client.request("DELETE", "/api/v1/jobs").status_code == 405  # a known path, a wrong method
    assert client.get("/api/v1/jobs/abc/cancel").status_code == 405
    assert client.get("/api").status_code == 404


def test_the_package_ships_every_dashboard_file() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["gpupool"]
    package = DASHBOARD.parent
    shipped = {p.relative_to(DASHBOARD).as_posix() for pattern in patterns for p in package.glob(pattern)
               if p.is_relative_to(DASHBOARD)}
    assert shipped == _files()


def test_the_dashboard_fetches_nothing_from_elsewhere_and_writes_no_markup() -> None:
    for path in sorted(_files()):
        text = (DASHBOARD / path).read_text()
        urls = set(re.findall(r"https?://[^\s'\"`)]+", text)) - {"http://www.w3.org/2000/svg"}
        assert not urls, f"{path} refers to {urls}"
        assert not MARKUP.search(text), f"{path}: {MARKUP.search(text)}"
