"""Prune what retention no longer keeps (runners do this in the background; this is the same, by hand)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from runtime.retention import retention_prune


class Command(BaseCommand):
    help = ("Delete experiences, model calls, runner events and notifications sent or failed older than the "
            "RETAIN_* settings, and clear old model-call bodies.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch", type=int, default=None,
                            help=f"Rows per statement (default RETENTION_BATCH_ROWS={settings.RETENTION_BATCH_ROWS}).")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["batch"] is not None and options["batch"] < 1:
            raise CommandError("--batch must be at least 1. Nothing was changed.")
        kept = {
            "experiences": settings.RETAIN_EXPERIENCES_HOURS,
            "model-call bodies": settings.RETAIN_LLM_BODIES_HOURS, "model calls": settings.RETAIN_LLM_CALLS_HOURS,
            "runner events of closed plans": settings.RETAIN_EVENTS_HOURS,
            "notifications sent or failed": settings.RETAIN_NOTIFICATIONS_HOURS,
        }
        self.stdout.write("Keeping " + ", ".join(f"{k} {f'{h:g} h' if h > 0 else 'forever'}" for k, h in kept.items()))
        report = retention_prune(batch=options["batch"])
        for name, count in report.counts.items():
            self.stdout.write(f"  {name}: {count} {'cleared' if name == 'model-call bodies' else 'deleted'}")
        self.stdout.write(f"Pruned {report.total} rows.")
