"""The images of a request: multipart parts named ``file``, or one image as the raw body; or, in
``/v1/embeddings``' JSON, base64 data URIs (:func:`data_uri_upload`).

A part is named by its filename. A raw body is named by ``?filename=`` or, failing that, by
its ``Content-Disposition: inline; filename="a.png"`` header (``filename*=UTF-8''...`` too), and
is ``"body"`` without either; a name is at most ``MAX_FILENAME`` characters without control
characters (422 otherwise), and is only echoed back in the results.

Limits are enforced while reading, before anything is decoded: the request body
(``max_request_bytes``, from ``Content-Length`` when given and counted as it streams in either
way), each file (``max_upload_bytes``) and the number of files (``max_files``). Content types
other than images are refused with 415; an octet-stream part or a part without a type is
accepted and judged by its bytes. A data URI (``data:image/png;base64,...``, or the base64 alone)
is held to the same limits: its media type, if any, an image's (415), its bytes
``max_upload_bytes`` at most (413, known from its length before decoding), and valid base64
(400 ``invalid_data_uri``).
"""

from __future__ import annotations

import base64
import binascii
import email.message
import logging
import unicodedata

from fastapi import Request
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.types import Message

from service.core.errors import ServiceError, too_large
from service.dataplane.upload import Upload

__all__ = ["MAX_FILENAME", "data_uri_upload", "read_body", "read_uploads"]

GENERIC_TYPES = {"", "application/octet-stream"}
# python-multipart logs a warning for every malformed body it parses: any client could fill the
# server's log with them. The client gets its 400 ("malformed multipart body: ..."); the log
# keeps python-multipart's errors only.
logging.getLogger("python_multipart").setLevel(logging.ERROR)
#: The longest name a raw body may give itself (a file name's usual limit).
MAX_FILENAME = 255


def _check_type(content_type: str | None, name: str) -> None:
    kind = (content_type or "").split(";")[0].strip().lower()
    if kind not in GENERIC_TYPES and not kind.startswith("image/"):
        raise ServiceError(
            415,
            "unsupported_media_type",
            f"{name}: content type {kind!r} is not an image; send image/* (JPEG, PNG, WebP, GIF, "
            "BMP, TIFF) or application/octet-stream",
        )


def _limited(request: Request, limit: int) -> Request:
    """The same request, whose body raises 413 once more than ``limit`` bytes have arrived."""
    size = 0

    async def receive() -> Message:
        nonlocal size
        message = await request.receive()
        if message["type"] == "http.request":
            size += len(message.get("body", b""))
            if size > limit:
                raise too_large("the request body", limit)
        return message

    return Request(request.scope, receive)


def _refuse_declared(request: Request, limit: int, what: str) -> None:
    """413 at once when the request's ``Content-Length`` says more than ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(what, limit)


async def read_body(request: Request, limit: int) -> bytearray:
    """The whole request body; 413 as soon as it is known to exceed ``limit`` bytes.

    Read into one growing buffer, each chunk freed once copied: a body costs its size, not the
    twice its size of a list of chunks joined at the end (Starlette's ``Request.body``).
    """
    _refuse_declared(request, limit, "the request body")
    body = bytearray()
    async for chunk in _limited(request, limit).stream():
        body += chunk
    return body


async def _read_part(part: UploadFile, name: str, limit: int) -> bytes:
    _check_type(part.content_type, name)
    data = await part.read(limit + 1)
    if len(data) > limit:
        raise too_large(f"file {name!r}", limit)
    return data


def _without_filename(what: str) -> ServiceError:
    """422: ``what`` (ending in "so") a part was read as a text field, not as a file."""
    return ServiceError(
        422,
        "missing_filename",
        f"{what} it was read as a text field, not a file; send each image with a filename, "
        'e.g. \'Content-Disposition: form-data; name="file"; filename="a.png"\'',
    )


async def _read_form(form: FormData, max_upload_bytes: int) -> list[Upload]:
    """The parts named ``file``, in order, each under the upload limit (422 for a part of
    another name, which would otherwise be left unanswered)."""
    values = form.getlist("file")
    if any(isinstance(value, str) for value in values):
        # a part without a filename is a text field to the parser: its bytes are decoded as
        # text and cannot be an image any more
        raise _without_filename("a part named 'file' has no filename, so")
    parts = [p for p in values if isinstance(p, UploadFile)]
    if not parts:
        names = sorted(set(form.keys()))
        if not names:  # python-multipart keeps only parts that end with a boundary
            raise ServiceError(
                400,
                "invalid_multipart",
                "malformed multipart body: it holds no complete part; each part ends with "
                "'--<boundary>' and the body with '--<boundary>--' (the boundary of the "
                "Content-Type header)",
            )
        raise ServiceError(
            422,
            "missing_file",
            f"no file part named 'file' (parts sent: {names}); send each image as a multipart "
            "part named 'file'",
        )
    others = sorted({key for key in form if key != "file"})
    if others:  # an image sent under another name would be left out of the answer
        raise ServiceError(
            422,
            "unknown_part",
            f"parts named {', '.join(repr(o[:64]) for o in others[:5])} are not read; send "
            "each image as a multipart part named 'file' and nothing else",
        )
    uploads = []
    for i, part in enumerate(parts):
        if part.filename:
            hint = 'give each part a short printable file name, e.g. filename="a.png"'
            _checked_name(part.filename, f"the filename of part {i + 1}", hint)
        name = part.filename or f"file[{i}]"
        uploads.append(Upload(name, await _read_part(part, name, max_upload_bytes)))
    return uploads


async def read_uploads(
    request: Request, max_request_bytes: int, max_upload_bytes: int, max_files: int
) -> list[Upload]:
    """The request's images, in order; raises :class:`ServiceError` for what is wrong."""
    content_type = request.headers.get("content-type", "")
    kind = content_type.split(";")[0].strip().lower()
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity"):  # images are compressed already
        raise ServiceError(
            415,
            "unsupported_media_type",
            f"Content-Encoding {encoding[:40]!r} is not accepted here; send the image files as "
            "they are (their formats are compressed already)",
        )
    _refuse_declared(request, max_request_bytes, "the request body")
    request = _limited(request, max_request_bytes)
    if kind == "multipart/form-data":
        if "filename" in request.query_params:  # parts are named by their own filenames, but
            _checked_name(request.query_params["filename"], "?filename=")  # as the schema says
        try:
            form = await request.form(max_files=max_files, max_fields=max_files)
        except (MultiPartException, HTTPException) as error:  # Starlette wraps the former
            detail = str(getattr(error, "detail", error))
            if "too many files" in detail.lower():
                raise ServiceError(
                    413, "too_many_files", f"more than {max_files} files; send at most {max_files}"
                ) from None
            if "part exceeded maximum size" in detail.lower():  # only parts read as text are
                raise _without_filename("a part with no filename is over 1 MB, so") from None
            message = f"malformed multipart body: {detail}"
            if "invalid multipart data" in detail.lower():  # python-multipart says no more
                message += (
                    " (a part's headers could not be read: each part needs a "
                    "Content-Disposition header of at most a few kB, file names of at most "
                    f"{MAX_FILENAME} characters, and the boundary of the Content-Type header)"
                )
            raise ServiceError(400, "invalid_multipart", message) from None
        try:
            return await _read_form(form, max_upload_bytes)
        finally:
            await form.close()  # the parts' spooled temporary files
    if kind.startswith("image/") or kind == "application/octet-stream":
        _refuse_declared(request, max_upload_bytes, "the image")
        data = await request.body()
        if len(data) > max_upload_bytes:
            raise too_large("the image", max_upload_bytes)
        if not data:
            raise ServiceError(400, "empty_image", "the request body is empty; send an image")
        return [Upload(body_filename(request), data)]
    raise ServiceError(
        415,
        "unsupported_media_type",
        f"content type {kind or 'none'!r} is not accepted; send multipart/form-data with parts "
        "named 'file', or one image as the body with an image/* content type",
    )


def data_uri_upload(text: str, name: str, max_upload_bytes: int) -> Upload:
    """The image of a base64 data URI ``data:image/png;base64,...`` (or of the base64 alone),
    named ``name``: 415 for a media type that is not an image's, 413 over
    ``max_upload_bytes``, 400 ``invalid_data_uri`` where it is not base64, ``empty_image``
    for no bytes."""
    how = "send each image as a data URI data:image/png;base64,<its bytes in base64>"
    data = text
    if text[:5].lower() == "data:":
        head, comma, data = text.partition(",")
        if not comma:
            raise ServiceError(400, "invalid_data_uri", f"{name}: a data URI without ','; {how}")
        media_type, *parameters = head[5:].split(";")
        if not parameters or parameters[-1].strip().lower() != "base64":
            raise ServiceError(
                400, "invalid_data_uri", f"{name}: the data URI is not base64 (';base64,'); {how}"
            )
        _check_type(media_type[:MAX_FILENAME], name)  # as shown in a 415: bounded
    if len(data) // 4 * 3 > max_upload_bytes + 2:  # its size, known before decoding
        raise too_large(f"image {name!r}", max_upload_bytes)
    try:
        image = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ServiceError(
            400,
            "invalid_data_uri",
            f"{name}: not valid base64 (A-Z, a-z, 0-9, + and /, padded with = to a multiple of "
            f"4 characters, no spaces or line breaks); {how}",
        ) from None
    if len(image) > max_upload_bytes:
        raise too_large(f"image {name!r}", max_upload_bytes)
    if not image:
        raise ServiceError(400, "empty_image", f"{name} holds no bytes; send an image")
    return Upload(name, image)


def body_filename(request: Request) -> str:
    """The name a raw-body image gives itself: ``?filename=``, else the ``Content-Disposition``
    header's filename, else ``"body"``; 422 for a name that is empty, too long or holds control
    characters."""
    name = request.query_params.get("filename")
    if name is not None:
        return _checked_name(name, "?filename=")
    if "content-disposition" in request.headers:
        header = email.message.Message()
        header["content-disposition"] = request.headers["content-disposition"]
        name = header.get_filename()
        if name is not None:
            return _checked_name(name, "the Content-Disposition filename")
    return "body"


def _checked_name(
    name: str,
    where: str,
    hint: str = "name the image with a short printable name, e.g. ?filename=a.png, or send no "
    "name (the image is then called 'body')",
) -> str:
    """``name`` if it is a short printable name; 422 saying what is wrong with it and ``hint``
    otherwise (names are echoed back in the answer: nothing a terminal would act on)."""
    if not name.strip():
        problem = "is empty"
    elif len(name) > MAX_FILENAME:
        problem = f"is {len(name):,} characters long; at most {MAX_FILENAME}"
    elif any(unicodedata.category(c) == "Cc" for c in name):
        problem = "holds control characters"
    else:
        return name
    raise ServiceError(
        422,
        "invalid_filename",
        f"{where} {problem}; {hint}",
    )
