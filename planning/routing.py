from __future__ import annotations

from django.urls import path

from planning import consumers

websocket_urlpatterns = [
    path("ws/dashboard/", consumers.DashboardConsumer.as_asgi()),
    path("ws/agents/<int:agent_id>/", consumers.AgentConsumer.as_asgi()),
    path("ws/plans/<int:plan_id>/", consumers.PlanConsumer.as_asgi()),
]

from planning import steer_consumers  # noqa: E402  (the steering lane's live pages)

websocket_urlpatterns += [
    path("ws/inbox/", steer_consumers.InboxConsumer.as_asgi()),
    path("ws/inbox/count/", steer_consumers.InboxCountConsumer.as_asgi()),
]
websocket_urlpatterns += [
    path("ws/plans/<int:plan_id>/presence/", steer_consumers.PlanPresenceConsumer.as_asgi()),
]
