"""One process: the ASGI server (HTTP + websockets) and the runner on the same event loop."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
from typing import Any

import uvicorn
from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from agents.runner import Runner


class PlannerServer(uvicorn.Server):
    """uvicorn, stopping the runner (finishing cycles under way, releasing leases) before it shuts down."""

    def __init__(self, config: uvicorn.Config, runner: Runner | None) -> None:
        super().__init__(config)
        self.runner = runner
        self.runner_task: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.runner is not None:
            self.runner_task = asyncio.create_task(self.runner.run())

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.runner is not None and self.runner_task is not None:
            self.runner.stop()
            await self.runner_task
        await super().shutdown(sockets)


class Command(BaseCommand):
    help = "Serve the dashboard and drive the agents in one process (the embedded mode)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--no-runner", action="store_true", help="Serve only; runners run elsewhere.")

    def handle(self, *args: Any, **options: Any) -> None:
        from planner_site.asgi import application

        # Everything imported so far lives as long as the process: kept out of the collector's full
        # passes, which otherwise walk it every few hundred requests and stall a push for tens of ms.
        gc.collect()
        gc.freeze()
        # uvicorn would take X-Forwarded-For from any client on 127.0.0.1 as the address (a lockout by address
        # undone by a header); the address is read once, in Django, trusting exactly TRUSTED_PROXY_COUNT proxies
        # (planner_site.accounts.client_ip, which the login lockout uses too).
        config = uvicorn.Config(application, host=options["host"], port=options["port"], lifespan="off",
                                log_level="warning", ws_ping_interval=20, proxy_headers=False,
                                forwarded_allow_ips="")
        runner = None if options["no_runner"] or not settings.RUNNER_AUTOSTART else Runner()
        server = PlannerServer(config, runner)
        self.stdout.write(f"Serving http://{options['host']}:{options['port']}/ "
                          f"({'with' if runner else 'without'} the runner). Ctrl-C to stop.")
        self.stdout.flush()
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: the runner was already stopped cleanly
            server.run()
        self.stdout.write("Stopped.")
