"""The one reading of an `Authorization: Bearer <token>` header, for every door an external agent knocks on: the
API (planning/api.py), its websocket (planning/api_ws.py) and the MCP endpoint (planning/mcp_server.py)."""

from __future__ import annotations


def bearer_token(authorization: str | bytes | None) -> str:
    """The token of an Authorization header's value; "" when there is none or the scheme is not Bearer (matched
    in any case, as RFC 7235 says; surrounding spaces dropped). Bytes (an ASGI header) are read as latin-1."""
    if not authorization:
        return ""
    value = authorization.decode("latin1") if isinstance(authorization, bytes) else authorization
    scheme, _, token = value.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""
