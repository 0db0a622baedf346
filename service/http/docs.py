"""The API docs, served offline: ``/docs`` (Swagger UI), ``/redoc`` and ``GET /`` -> ``/docs``.

FastAPI's own docs pages load Swagger UI and ReDoc from a CDN, which a machine without internet
access (or a browser behind a strict proxy) cannot reach. Here the pages load them from
``/docs-assets/``, files that the ``fastapi-offline`` package ships (Swagger UI 5, ReDoc 2 and a
favicon: the same majors FastAPI points at); nothing on the pages leaves the server. Only
``openapi_url`` (``/openapi.json``) comes from FastAPI.

The docs are installed only when they are served at all: without an API key, or with one and
``docs_public``. Otherwise ``/docs``, ``/redoc``, ``/docs-assets/...`` and ``/`` are unknown
paths (404 JSON, like any other), so nobody without the key learns the routes and limits.

The assets' mount and the schema's route name themselves in the request's scope, as FastAPI's
own routes do, so that their requests are labelled by their templates (``/docs-assets/{path}``,
``/openapi.json``) in the access log and the metrics (:func:`service.http.request_metrics.labels`),
not as ``unmatched``.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.routing import BaseRoute, Match, Mount, Route
from starlette.types import Scope

__all__ = ["ASSETS_URL", "install_docs"]

#: Where the pages load their scripts, styles and favicon from.
ASSETS_URL = "/docs-assets"
# swagger-ui-bundle.js, swagger-ui.css, redoc.standalone.js, favicon.png
_ASSETS = Path(str(files("fastapi_offline") / "static"))


def install_docs(app: FastAPI) -> None:
    """``/docs``, ``/redoc``, their assets and ``GET /`` -> ``/docs`` on ``app``, whose
    ``openapi_url`` is set (the app was built with ``docs_url=None, redoc_url=None``)."""
    openapi_url = app.openapi_url
    if openapi_url is None:
        raise ValueError("install_docs: the app serves no OpenAPI schema to document")
    mount = _NamedMount(ASSETS_URL, app=StaticFiles(directory=_ASSETS), name="docs-assets")
    app.router.routes.append(mount)
    _name_schema_route(app, openapi_url)

    def urls(request: Request) -> tuple[str, str]:
        """The schema's and the assets' URLs, under the proxy's prefix (``root_path``) if any."""
        root = request.scope.get("root_path", "")
        return root + openapi_url, root + ASSETS_URL

    @app.get("/", include_in_schema=False)
    async def root(request: Request) -> RedirectResponse:
        # a path, not a URL built from the client's Host header
        return RedirectResponse(request.scope.get("root_path", "") + "/docs")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        schema, assets = urls(request)
        return get_swagger_ui_html(
            openapi_url=schema,
            title=f"{app.title} - API docs",
            swagger_js_url=f"{assets}/swagger-ui-bundle.js",
            swagger_css_url=f"{assets}/swagger-ui.css",
            swagger_favicon_url=f"{assets}/favicon.png",
            oauth2_redirect_url=None,
            # Swagger UI would send the schema to validator.swagger.io for its badge
            swagger_ui_parameters={"validatorUrl": None},
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        schema, assets = urls(request)
        return get_redoc_html(
            openapi_url=schema,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{assets}/redoc.standalone.js",
            redoc_favicon_url=f"{assets}/favicon.png",
            with_google_fonts=False,
        )


class _NamedMount(Mount):
    """A mount that names itself in the scope of the requests it takes (``scope["route"]``)."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        return _named(self, *super().matches(scope))


class _NamedRoute(Route):
    """A plain Starlette route that names itself in the scope of the requests it takes."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        return _named(self, *super().matches(scope))


def _named(route: BaseRoute, match: Match, child_scope: Scope) -> tuple[Match, Scope]:
    """``route`` as the request's ``scope["route"]`` where it matched (its path, or its path and
    not its method), as FastAPI's ``APIRoute`` sets itself."""
    if match is not Match.NONE:
        child_scope = {**child_scope, "route": route}
    return match, child_scope


def _name_schema_route(app: FastAPI, openapi_url: str) -> None:
    """FastAPI's route of the schema (a plain Starlette route, which names no route in the
    scope), replaced in place by a :class:`_NamedRoute` with the same endpoint."""
    routes = app.router.routes
    for index, route in enumerate(routes):
        if type(route) is Route and route.path == openapi_url:
            routes[index] = _NamedRoute(
                route.path,
                route.endpoint,
                methods=sorted(route.methods or ()),
                name=route.name,
                include_in_schema=False,
            )
