from __future__ import annotations

from django.urls import path, re_path

from planning import api_ws
from planning.live import consumers, operator_consumers
from policies import consumers as policy_consumers

websocket_urlpatterns = [
    path("ws/dashboard/", consumers.DashboardConsumer.as_asgi()),
    path("ws/agents/<int:agent_id>/", consumers.AgentConsumer.as_asgi()),
    path("ws/plans/<int:plan_id>/", consumers.PlanConsumer.as_asgi()),
    path("ws/plans/<int:plan_id>/presence/", operator_consumers.PlanPresenceConsumer.as_asgi()),
    path("ws/inbox/", operator_consumers.InboxConsumer.as_asgi()),
    path("ws/inbox/count/", operator_consumers.InboxCountConsumer.as_asgi()),
    re_path(r"^ws/policy-decisions/(?P<back>inbox|policies)/$", policy_consumers.DecisionsConsumer.as_asgi()),
    re_path(r"", consumers.UnknownPathConsumer.as_asgi()),  # last: closed with 4404, not a server error
]

# The agents' sockets: a bearer token authenticates them, not a session, and no browser Origin is asked for.
api_websocket_urlpatterns = [
    path("ws/api/plans/<int:plan_id>/", api_ws.PlanNextConsumer.as_asgi()),
    re_path(r"", consumers.UnknownPathConsumer.as_asgi()),
]
