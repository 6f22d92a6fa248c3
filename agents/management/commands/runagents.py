"""Run the runner alone, for scale-out: any number of these share PostgreSQL and Redis."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from agents.runner import Runner


class Command(BaseCommand):
    help = "Drive the agents' cycles (the runner alone, without a web server)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--cycles", type=int, default=None, help="Stop after N cycles per agent.")
        parser.add_argument("--concurrency", type=int, default=None, help="Agents driven at once.")
        parser.add_argument("--runner-id", default=None, help="Name of this runner in leases and events.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["cycles"] is not None and options["cycles"] < 1:
            self.stderr.write("--cycles must be at least 1")
            raise SystemExit(2)
        asyncio.run(self.main(options))

    async def main(self, options: dict[str, Any]) -> None:
        runner = Runner(runner_id=options["runner_id"], cycles=options["cycles"], concurrency=options["concurrency"])
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, runner.stop)
        self.stdout.write(f"runner {runner.id} started")
        if "InMemoryChannelLayer" in settings.CHANNEL_LAYERS["default"]["BACKEND"]:
            self.stderr.write("note: no REDIS_URL: this runner's changes reach the pages of a `serve` process on this "
                              "machine through its local socket (var/live.sock); for other machines set REDIS_URL.")
        await runner.run()
        self.stdout.write(f"runner {runner.id} stopped after {sum(runner.done.values())} cycles")
