"""One process: the ASGI server (HTTP + websockets) and the agents' runtime on the same event loop."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
from typing import Any

import uvicorn
from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from agents.runtime.cycles import runner_id_new


class PlannerServer(uvicorn.Server):
    """uvicorn, with the runtime started after it and stopped (cycles under way finished) before it."""

    def __init__(self, config: uvicorn.Config, with_runner: bool) -> None:
        super().__init__(config)
        self.with_runner = with_runner
        self.runner_stop = asyncio.Event()
        self.runner_task: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.with_runner:
            self.runner_task = asyncio.create_task(self.runner())

    async def runner(self) -> None:
        runner_id = runner_id_new()
        if settings.SCALE_OUT:
            from agents.runtime.worker import worker_run

            await worker_run(runner_id=runner_id, stop=self.runner_stop)
        else:
            from agents.runtime.embedded import Scheduler

            scheduler = Scheduler(runner_id=runner_id)
            stopper = asyncio.create_task(self.runner_stop.wait())
            stopper.add_done_callback(lambda _t: scheduler.stop())
            await scheduler.run()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.runner_task is not None:
            self.runner_stop.set()
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
        with_runner = not options["no_runner"] and settings.RUNNER_AUTOSTART
        server = PlannerServer(config, with_runner)
        self.stdout.write(f"Serving http://{options['host']}:{options['port']}/ "
                          f"({'with' if with_runner else 'without'} the runner). Ctrl-C to stop.")
        self.stdout.flush()
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: the runner was already stopped cleanly
            server.run()
        self.stdout.write("Stopped.")
