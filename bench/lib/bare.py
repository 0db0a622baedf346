"""A bare FastAPI app that only reads what it is sent: the floor the service is compared with.

``uvicorn --factory bench.lib.bare:create_app`` (:func:`bench.lib.launch.bare`):
``POST /upload`` reads a multipart form's ``file`` parts, ``POST /body`` a raw body.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from starlette.datastructures import UploadFile


def create_app() -> FastAPI:
    app = FastAPI()

    @app.post("/upload")
    async def upload(request: Request) -> dict[str, list[int]]:
        form = await request.form()
        files = [f for f in form.getlist("file") if isinstance(f, UploadFile)]
        sizes = [len(await f.read()) for f in files]
        await form.close()
        return {"sizes": sizes}

    @app.post("/body")
    async def body(request: Request) -> dict[str, int]:
        return {"size": len(await request.body())}

    return app
