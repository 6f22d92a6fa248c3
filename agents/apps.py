from __future__ import annotations

from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "agents"

    def ready(self) -> None:
        from agents.services import cycle_soon_on_decision
        from agents.signals import operator_acted

        # Connected here, before any runtime connects its own: every process makes the agent due in the database
        # first (an embedded `runagents` of its own finds it on its next tick), then the runtime in the process,
        # if any, acts on it (Django calls receivers in the order they were connected).
        operator_acted.connect(cycle_soon_on_decision, dispatch_uid="agents.cycle_soon_on_decision")
