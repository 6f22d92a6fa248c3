"""`manage.py serve --workers N`: several server processes on one port (scale-out only), started again when one
dies, stopped with their supervisor, even by a kill -9 of it."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import urllib.request
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from tests.api.conftest import eventually, server_env, server_start
from tests.browser.conftest import postgres_database_drop, stop

SHARED_STACK = settings.SCALE_OUT and bool(os.environ.get("REDIS_URL"))


def workers_of(supervisor: int) -> list[int]:
    """The supervisor's server processes (its multiprocessing helper left out)."""
    pids = []
    for pid in Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue
        if "spawn_main" in cmdline and state != "Z":
            pids.append(int(pid))
    return pids


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def test_no_workers_is_refused_with_a_clear_error() -> None:
    with pytest.raises(CommandError, match="--workers must be 1 or more, not 0"):
        call_command("serve", "--workers", "0")


@pytest.mark.skipif(SHARED_STACK, reason="on PostgreSQL + Redis several workers are allowed (the next test)")
def test_several_workers_are_refused_on_the_embedded_stack() -> None:
    # SQLite and the in-process channel layer: a page's live updates come only from the process it is served by.
    with pytest.raises(CommandError, match=r"--workers 2 needs the scale-out stack \(DATABASE_URL for PostgreSQL"):
        call_command("serve", "--workers", "2", "--no-runner")


@pytest.mark.skipif(not SHARED_STACK, reason="several workers need PostgreSQL + Redis (the scale-out pass)")
def test_two_workers_serve_one_port_come_back_and_stop_with_their_supervisor() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="planner-workers-"))
    env, db_name = server_env(tmp, name="workers")
    proc = None
    try:
        server, proc = server_start(env, tmp, "--no-runner", "--workers", "2")
        workers = eventually(lambda: (w if len(w := workers_of(proc.pid)) == 2 else None), what="two workers")
        assert "2 workers" in server.log_tail()
        assert all(answers(server.url) for _ in range(10))

        os.kill(workers[0], signal.SIGKILL)  # a worker dies: another takes its place, the port keeps answering
        eventually(lambda: (w if len(w := workers_of(proc.pid)) == 2 and workers[0] not in w else None),
                   what="a new worker in place of the killed one")
        assert answers(server.url)

        workers = workers_of(proc.pid)
        proc.send_signal(signal.SIGKILL)  # the supervisor dies without a word: its workers notice and stop
        proc.wait(10)
        eventually(lambda: not any(alive(pid) for pid in workers), what="the workers stopped")
        assert not answers(server.url)
    finally:
        if proc is not None:
            stop(proc)
        if db_name:
            postgres_database_drop(os.environ["DATABASE_URL"], db_name)
        shutil.rmtree(tmp, ignore_errors=True)
