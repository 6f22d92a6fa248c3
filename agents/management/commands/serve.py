"""One process: the ASGI server (HTTP + websockets) and the runner on the same event loop."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from agents.runner import Runner


class Command(BaseCommand):
    help = "Serve the dashboard and drive the agents in one process (the embedded mode)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--no-runner", action="store_true", help="Serve only; runners run elsewhere.")

    def handle(self, *args: Any, **options: Any) -> None:
        asyncio.run(self.main(options))

    async def main(self, options: dict[str, Any]) -> None:
        from planner_site.asgi import application

        config = uvicorn.Config(application, host=options["host"], port=options["port"], lifespan="off",
                                log_level="warning", ws_ping_interval=20)
        server = uvicorn.Server(config)
        runner = None if options["no_runner"] or not settings.RUNNER_AUTOSTART else Runner()
        runner_task = asyncio.create_task(runner.run()) if runner else None
        self.stdout.write(f"Serving http://{options['host']}:{options['port']}/ "
                          f"({'with' if runner else 'without'} the runner). Ctrl-C to stop.")
        self.stdout.flush()
        try:
            await server.serve()
        finally:
            if runner and runner_task:
                runner.stop()
                await runner_task
