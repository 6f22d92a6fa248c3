"""Drive the agents' cycles without a web server.

Scale-out (PostgreSQL): a worker of the job engine (runtime/worker.py); start as many as you like,
on any machines. Embedded (SQLite): the in-process scheduler, the only driver of the database's agents (run
the web with `serve --no-runner` beside it, or nothing); its changes reach open pages when they are reloaded,
since the embedded stack pushes only the serve process's own changes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from agents.llm.gateway import providers_import
from runtime.cycles import runner_id_new

logger = logging.getLogger("planner.runner")

EMBEDDED_PAGES_NOTE = ("embedded stack: open pages show this process's changes when they are reloaded; for live pages run "
                       "the agents inside `manage.py serve` (the default) or use the scale-out stack (PostgreSQL + Redis)")


class Command(BaseCommand):
    help = ("Drive the agents' cycles (without a web server). SIGTERM or Ctrl-C stops it cleanly: no new cycle "
            "starts and the cycles under way finish; a second signal stops it at once.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--cycles", type=int, default=None,
                            help="Stop once every running agent has had N more cycles.")
        parser.add_argument("--concurrency", type=int, default=None,
                            help=f"Cycles at once (default RUNNER_CONCURRENCY={settings.RUNNER_CONCURRENCY}).")
        parser.add_argument("--runner-id", default=None, help="Name of this runner in timelines and logs.")

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
        runner_id = options["runner_id"] or runner_id_new()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        signals = 0

        def on_signal() -> None:
            nonlocal signals
            signals += 1
            if signals == 1:
                logger.warning("%s stopping: no new cycle starts, the cycles under way finish "
                               "(a second signal stops it at once)", runner_id)
                stop.set()
            else:
                logger.warning("%s stopped at once; its cycles under way are retried elsewhere", runner_id)
                os._exit(1)

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        self.stdout.write(f"{runner_id} started")
        self.stdout.flush()
        providers_import()  # the first cycle's model call does not pay the SDK's import
        if settings.SCALE_OUT:
            from runtime.worker import worker_run

            await worker_run(runner_id=runner_id, stop=stop, cycles=options["cycles"],
                             concurrency=options["concurrency"])
        else:
            from runtime.embedded import Scheduler

            self.stderr.write("note: SQLite: this process drives every agent; run no other runner beside it "
                              "(`serve --no-runner` for the pages). Several runners need PostgreSQL.")
            logger.warning(EMBEDDED_PAGES_NOTE)
            scheduler = Scheduler(runner_id=runner_id, cycles=options["cycles"], concurrency=options["concurrency"])
            stopper = asyncio.create_task(self.stop_when(stop, scheduler))
            await scheduler.run()
            stopper.cancel()
        self.stdout.write(f"{runner_id} stopped")

    @staticmethod
    async def stop_when(stop: asyncio.Event, scheduler: Any) -> None:
        await stop.wait()
        scheduler.stop()
