"""Run the runner alone, for scale-out: any number of these share PostgreSQL and Redis."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from agents.runner import Runner

logger = logging.getLogger("planner.runner")


class Command(BaseCommand):
    help = ("Drive the agents' cycles (the runner alone, without a web server). SIGTERM or Ctrl-C stops it cleanly: "
            "agents not in a cycle are freed at once, the others when their cycle ends; a second signal stops it now.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--cycles", type=int, default=None, help="Stop after N cycles per agent.")
        parser.add_argument("--concurrency", type=int, default=None,
                            help=f"Agents driven at once (default RUNNER_CONCURRENCY={settings.RUNNER_CONCURRENCY}).")
        parser.add_argument("--runner-id", default=None, help="Name of this runner in leases and events.")

    def handle(self, *args: Any, **options: Any) -> None:
        for name in ("cycles", "concurrency"):
            if options[name] is not None and options[name] < 1:
                self.stderr.write(f"--{name} must be at least 1")
                raise SystemExit(2)
        if options["runner_id"] is not None and not 0 < len(options["runner_id"]) <= 100:
            self.stderr.write("--runner-id must be 1 to 100 characters")
            raise SystemExit(2)
        asyncio.run(self.main(options))

    async def main(self, options: dict[str, Any]) -> None:
        runner = Runner(runner_id=options["runner_id"], cycles=options["cycles"], concurrency=options["concurrency"])
        loop = asyncio.get_running_loop()
        signals = 0

        def on_signal() -> None:
            nonlocal signals
            signals += 1
            if signals == 1:
                logger.warning("runner %s stopping: freeing its agents, finishing the cycles under way "
                               "(a second signal stops it at once)", runner.id)
                runner.stop()
            else:
                logger.warning("runner %s stopped at once; the leases of its cycles under way expire in %.0f s",
                               runner.id, settings.RUNNER_LEASE_SECONDS)
                os._exit(1)

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        self.stdout.write(f"runner {runner.id} started")
        self.stdout.flush()
        if "InMemoryChannelLayer" in settings.CHANNEL_LAYERS["default"]["BACKEND"]:
            self.stderr.write("note: no REDIS_URL: this runner's changes reach the pages of a `serve` process on this "
                              "machine through its local socket (var/live.sock); for other machines set REDIS_URL.")
        await runner.run()
        self.stdout.write(f"runner {runner.id} stopped after {sum(runner.done.values())} cycles")
