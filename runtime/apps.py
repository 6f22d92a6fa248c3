from __future__ import annotations

from django.apps import AppConfig


class RuntimeConfig(AppConfig):
    name = "runtime"
    verbose_name = "Runtime"

    def ready(self) -> None:
        # The domain says what happened through its signals; the runtime listens. Installed after the domain apps,
        # so their own receivers (agents.apps: an operator's decision makes the agent due) run first.
        from runtime import notify_signals  # noqa: F401  (the after-commit nudge on new events)
