"""Authorisation, the same for every door: the API key, when one is set.

A door hands over what its client sent, ``X-API-Key`` and ``Authorization`` (HTTP headers or
gRPC metadata), before it reads the request's body: a client without the key costs the server
no more than its headers.
"""

from __future__ import annotations

import hmac

from pydantic import SecretStr

from service.core.errors import ServiceError

__all__ = ["authorize", "presented_key"]


def presented_key(api_key: str | None, authorization: str | None) -> str | None:
    """The key a client presents: ``X-API-Key``, else ``Authorization: Bearer <key>``."""
    if api_key:  # an empty X-API-Key is none: a Bearer token beside it still counts
        return api_key
    if authorization is not None and authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    return None


def authorize(
    key: SecretStr | None,
    api_key: str | None,
    authorization: str | None,
    how: str,
    headers: dict[str, str] | None = None,
) -> None:
    """Nothing when no ``key`` is set or the client presents it (compared in constant time);
    else 401 ``unauthorized``, telling the client ``how`` to send it."""
    if key is None:
        return
    given = presented_key(api_key, authorization)
    expected = key.get_secret_value().encode()
    if given is None or not hmac.compare_digest(given.encode(), expected):
        raise ServiceError(401, "unauthorized", f"missing or wrong API key: send {how}", headers)
