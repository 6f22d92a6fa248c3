"""ASGI entry point: Django for HTTP (bodies read under a size and time limit first), with the MCP server for
external agents at /mcp (a bearer token) beside it; Channels for the live websockets: the browser's (login and
this site's Origin checked) and the agents' API socket (a bearer token)."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "planner_site.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from planner_site.asgi_guards import BodyLimit, SameOriginValidator, WebsocketByPath  # noqa: E402
from planning.mcp_server import McpEndpoint  # noqa: E402
from planning.routing import api_websocket_urlpatterns, websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": BodyLimit(McpEndpoint(django_asgi_app)),
        "websocket": WebsocketByPath(
            api=URLRouter(api_websocket_urlpatterns),
            browser=SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
        ),
    }
)
