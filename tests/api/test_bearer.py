"""One reading of the Authorization header for every door an external agent uses (planner_site/bearer.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner_site.bearer import bearer_token

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("header", "token"), [
    ("Bearer abc123", "abc123"),
    ("bearer abc123", "abc123"),
    ("BEARER   abc123  ", "abc123"),
    (b"Bearer abc123", "abc123"),  # an ASGI header (the websocket, MCP)
    ("Basic dXNlcjpwYXNz", ""),
    ("Token abc123", ""),
    ("Bearer", ""),
    ("abc123", ""),
    ("", ""),
    (None, ""),
])
def test_the_token_of_a_header_as_clients_send_it(header: str | bytes | None, token: str) -> None:
    assert bearer_token(header) == token


@pytest.mark.parametrize("path", ["planning/api.py", "planning/api_ws.py", "planning/mcp_server.py"])
def test_no_door_parses_the_header_itself(path: str) -> None:
    """The API, its websocket and the MCP endpoint all ask bearer_token; none splits the header on its own."""
    source = (ROOT / path).read_text()
    assert "bearer_token(" in source
    assert '== "bearer"' not in source and "partition(\" \")" not in source
