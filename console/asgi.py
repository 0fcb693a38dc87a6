"""ASGI entry point: HTTP and websockets.

Two kinds of websocket clients, authorised differently:
- agents on `/ws/agent/runs/<id>/` (`api.routing`): bearer token, no Origin needed —
  agents are not browsers;
- browsers on the other `/ws/` routes (`console.routing`): the session, behind
  `AllowedHostsOriginValidator`, each pattern wrapped by `console.routing.browser_only`.
Both authorise per run, not per connection.
"""

from __future__ import annotations

import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402

from api.routing import agent_websocket_urlpatterns  # noqa: E402
from console.routing import websocket_urlpatterns as browser_websocket_urlpatterns  # noqa: E402
from console.static import StaticFiles  # noqa: E402
from gateway.asgi import McpGateway  # noqa: E402

application = ProtocolTypeRouter(
    {
        # The embedded console serves its own static files (no CDN, no separate server);
        # behind a proxy in production, set SAFESTOP_SERVE_STATIC=0 and serve collectstatic's output.
        # `/mcp/<name>/` is the MCP gateway (gateway/asgi.py): agents' MCP clients, bearer token.
        "http": McpGateway(
            StaticFiles(django_asgi_app) if settings.SAFESTOP_SERVE_STATIC else django_asgi_app
        ),
        "websocket": URLRouter([*agent_websocket_urlpatterns, *browser_websocket_urlpatterns]),
    }
)

# Everything imported so far lives as long as the process: move it out of the collector's reach,
# so a full collection walks only what requests and sockets allocate (fan-out tail latency).
gc.collect()
gc.freeze()
