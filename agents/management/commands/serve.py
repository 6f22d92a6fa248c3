"""The ASGI server (HTTP + websockets) and the agents' runtime on the same event loop: one process, or on the
scale-out stack `--workers N` processes sharing one listening socket (one Python process runs on one core at a
time: a 2-core machine serves about twice the requests with 2).

This module imports no model at the top: a worker process unpickles `worker_serve` from it before Django is set up.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import multiprocessing
import os
import signal
import socket
import threading
from typing import Any

import uvicorn
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.urls import get_resolver

from agents.llm.gateway import providers_import

logger = logging.getLogger("planner.serve")

PARENT_CHECK_SECONDS = 1.0  # a worker whose supervisor is gone (kill -9) stops within about this long


class PlannerServer(uvicorn.Server):
    """uvicorn, with the runtime started after it and stopped (cycles under way finished) before it."""

    def __init__(self, config: uvicorn.Config, with_runner: bool, supervisor: int | None = None) -> None:
        super().__init__(config)
        self.with_runner = with_runner
        self.supervisor = supervisor  # the pid of the process that started this worker, if any
        self.runner_stop = asyncio.Event()
        self.runner_task: asyncio.Task[None] | None = None
        self.supervisor_task: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.with_runner:
            self.runner_task = asyncio.create_task(self.runner())
        if self.supervisor is not None:
            self.supervisor_task = asyncio.create_task(self.supervisor_watch())

    async def supervisor_watch(self) -> None:
        """A worker whose supervisor died (kill -9 leaves no time to stop it) stops too, instead of serving on."""
        while os.getppid() == self.supervisor:
            await asyncio.sleep(PARENT_CHECK_SECONDS)
        logger.warning("serve: the supervisor (pid %s) is gone; this worker stops", self.supervisor)
        self.should_exit = True

    async def runner(self) -> None:
        from runtime.cycles import runner_id_new

        runner_id = runner_id_new()
        if settings.SCALE_OUT:
            from runtime.worker import worker_run

            await worker_run(runner_id=runner_id, stop=self.runner_stop)
        else:
            from runtime.embedded import Scheduler

            scheduler = Scheduler(runner_id=runner_id)
            stopper = asyncio.create_task(self.runner_stop.wait())
            stopper.add_done_callback(lambda _t: scheduler.stop())
            await scheduler.run()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.supervisor_task is not None:
            self.supervisor_task.cancel()
        if self.runner_task is not None:
            self.runner_stop.set()
            await self.runner_task
        await super().shutdown(sockets)


def server_config(host: str, port: int) -> uvicorn.Config:
    from planner_site.asgi import application

    # uvicorn would take X-Forwarded-For from any client on 127.0.0.1 as the address (a lockout by address
    # undone by a header); the address is read once, in Django, trusting exactly TRUSTED_PROXY_COUNT proxies
    # (planner_site.accounts.client_ip, which the login lockout uses too).
    return uvicorn.Config(application, host=host, port=port, lifespan="off", log_level="warning",
                          ws_ping_interval=20, ws_per_message_deflate=settings.LIVE_WS_DEFLATE,
                          proxy_headers=False, forwarded_allow_ips="")


def code_loaded() -> None:
    """Load the code every request may need, then keep it out of the cyclic collector's passes: planning (the
    runner's, an external agent's request) does not pay the model SDKs' import, nor a first page its views'.

    Everything loaded now (Django, the apps, the SDKs' schemas: a few hundred thousand objects) lives as long as
    the process. Left to the collector, each of its full passes walks all of it while every request and live update
    of the process waits: with thousands of agents connected, those pauses were a decision's slowest deliveries
    (docs/performance.md). `gc.freeze()` moves these objects to the permanent generation, which no pass walks; the
    objects of requests and connections are collected as before."""
    providers_import()
    get_resolver().url_patterns  # noqa: B018 (imports every view: the URLconf's modules)
    gc.collect()
    gc.freeze()


def worker_serve(*, sock: socket.socket, host: str, port: int, with_runner: bool, supervisor: int) -> None:
    """One worker of `serve --workers N` (a spawned process): the same server on the supervisor's socket."""
    import django

    django.setup()
    server = PlannerServer(server_config(host, port), with_runner, supervisor=supervisor)
    code_loaded()
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[sock])


def workers_default() -> int:
    """WEB_WORKERS, else 1."""
    return int(os.environ.get("WEB_WORKERS", "1") or "1")


class Supervisor:
    """Starts the workers on one socket, starts a worker again if one dies, stops them all on SIGTERM/SIGINT."""

    def __init__(self, *, sock: socket.socket, host: str, port: int, with_runner: bool, workers: int) -> None:
        self.kwargs = {"sock": sock, "host": host, "port": port, "with_runner": with_runner, "supervisor": os.getpid()}
        self.workers = workers
        self.stop = threading.Event()
        self.context = multiprocessing.get_context("spawn")  # a fresh interpreter: no state forked half-way

    def start(self) -> Any:
        process = self.context.Process(target=worker_serve, kwargs=self.kwargs, name="planner-web")
        process.start()
        return process

    def run(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: self.stop.set())
        processes = [self.start() for _ in range(self.workers)]
        while not self.stop.wait(0.5):
            for n, process in enumerate(processes):
                if not process.is_alive():
                    logger.warning("serve: worker %s exited (code %s); starting another", process.pid, process.exitcode)
                    processes[n] = self.start()
        for process in processes:
            if process.is_alive():
                process.terminate()  # SIGTERM: uvicorn finishes its requests, the runner its cycles
        for process in processes:
            process.join(60)
            if process.is_alive():
                process.kill()


def base_url_follow(host: str, port: int) -> str:
    """Links in notifications point where this server listens when PLANNER_BASE_URL is not set (they
    said port 8000 whatever --port said); the environment carries it to worker processes too."""
    if os.environ.get("PLANNER_BASE_URL"):
        return str(settings.PLANNER_BASE_URL)
    shown = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host  # noqa: S104 - naming, not binding
    shown = f"[{shown}]" if ":" in shown else shown
    settings.PLANNER_BASE_URL = f"http://{shown}:{port}"
    os.environ["PLANNER_BASE_URL"] = settings.PLANNER_BASE_URL
    return str(settings.PLANNER_BASE_URL)


class Command(BaseCommand):
    help = ("Serve the dashboard and drive the agents in one process (the embedded mode), or in --workers N "
            "processes on the scale-out stack.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--no-runner", action="store_true", help="Serve only; runners run elsewhere.")
        parser.add_argument("--workers", type=int, default=None,
                            help="Server processes sharing the port (default: WEB_WORKERS, else 1). More than 1 "
                                 "needs the scale-out stack (PostgreSQL + Redis); about one per core.")

    def handle(self, *args: Any, **options: Any) -> None:
        workers = workers_default() if options["workers"] is None else options["workers"]
        if workers < 1:
            raise CommandError(f"--workers must be 1 or more, not {workers}.")
        shared_layer = settings.CHANNEL_LAYERS["default"]["BACKEND"] != "channels.layers.InMemoryChannelLayer"
        if workers > 1 and not (settings.SCALE_OUT and shared_layer):
            raise CommandError(f"--workers {workers} needs the scale-out stack (DATABASE_URL for PostgreSQL and "
                               "REDIS_URL): on SQLite one process serves, live updates reach pages only from it.")
        with_runner = not options["no_runner"] and settings.RUNNER_AUTOSTART
        host, port = options["host"], options["port"]
        base_url_follow(host, port)
        self.stdout.write(f"Serving http://{host}:{port}/ ({'with' if with_runner else 'without'} the runner"
                          f"{f', {workers} workers' if workers > 1 else ''}). Ctrl-C to stop.")
        self.stdout.flush()
        if workers > 1:
            config = uvicorn.Config("planner_site.asgi:application", host=host, port=port, log_level="warning")
            Supervisor(sock=config.bind_socket(), host=host, port=port, with_runner=with_runner,
                       workers=workers).run()
        else:
            server = PlannerServer(server_config(host, port), with_runner)
            code_loaded()
            with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: the runner was already stopped cleanly
                server.run()
        self.stdout.write("Stopped.")
