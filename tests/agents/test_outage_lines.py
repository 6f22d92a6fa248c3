"""A runner cut off from the database logs one warning line per outage, when it ends, instead of an error (and a
traceback) from everything that failed meanwhile (agents/runtime/outage.py)."""

from __future__ import annotations

import logging
import sys
import time

import pytest
from django.db import OperationalError
from django.test import override_settings

from agents.runtime import outage
from agents.runtime.outage import OUTAGE_LINE, REFUSED_LINE, STRAGGLER_LINE, Outage, OutageLines


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> Outage:
    fresh = Outage()
    monkeypatch.setattr(outage, "OUTAGE", fresh)
    fresh.watch("B")
    return fresh


def record(name: str, level: int, message: str, *, error: BaseException | None = None,
           extra: dict[str, object] | None = None) -> logging.LogRecord:
    made = logging.LogRecord(name, level, __file__, 1, message, (), None)
    if error is not None:
        try:
            raise error
        except BaseException:
            made.exc_info = sys.exc_info()
    for key, value in (extra or {}).items():
        setattr(made, key, value)
    return made


def cut_off() -> OperationalError:
    """A lost connection as Django raises it, from the driver's error."""
    try:
        try:
            raise ConnectionResetError("No route to host")
        except ConnectionResetError as driver:
            raise OperationalError("consuming input failed: could not receive data from server") from driver
    except OperationalError as exc:
        return exc


@override_settings(RUNNER_HEARTBEAT_SECONDS=2, RUNNER_LEASE_SECONDS=6)
def test_an_outage_is_one_warning_when_the_database_answers_again(runner: Outage,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    lines = OutageLines()
    contact = time.monotonic() - 1
    runner.answered(contact)  # the last heartbeat the database took
    failed = [
        record("planner.cycle", logging.ERROR, "plannings of a pass failed", error=cut_off()),
        record("psycopg.pool", logging.WARNING, "error connecting in 'pool-1': connection failed"),
        record("psycopg", logging.WARNING, "query cancellation interrupted (CancelledError): closing connection"),
        record("procrastinate.worker", logging.ERROR, "Side task listener failed", error=cut_off()),
        record("planner.runner", logging.WARNING, "cycle of agent 3 not recorded: lease ran out", extra=REFUSED_LINE),
        record("planner.runner", logging.WARNING, "B: database unreachable; try 4", extra=OUTAGE_LINE),
    ]
    assert [lines.filter(r) for r in failed] == [False] * len(failed)  # none of them logged
    other = record("planner.runner", logging.WARNING, "recovered 3 jobs of workers whose heartbeat stopped")
    assert lines.filter(other)  # not the outage's: logged as ever
    runner.lost(heartbeat=True)  # the engine's heartbeat failed too
    with caplog.at_level(logging.INFO, logger="planner.runner"):
        runner.answered(contact + 31)  # the registration after the heal
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["B: lost the database for 31 s; fenced after 6 s (lease ran out: 1 cycles or passes not "
                        "recorded, no tool started; its jobs were left to the other runners); resuming"]
    # Stale work refused in the seconds after (a job taken over meanwhile) belongs to that line.
    assert not lines.filter(record("planner.runner", logging.WARNING, "pass of personas 1/4 not recorded: taken over",
                                   extra=STRAGGLER_LINE))


@override_settings(RUNNER_HEARTBEAT_SECONDS=2, RUNNER_LEASE_SECONDS=6)
def test_a_short_outage_within_the_lease_and_a_cut_connection(runner: Outage,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="planner.runner"):
        runner.answered(10.0)
        runner.began, runner.errors, runner.heartbeat_lost = 10.5, 2, True
        runner.answered(14.0)
        runner.ended = float("-inf")
        runner.began, runner.errors, runner.heartbeat_lost = 14.5, 1, False
        runner.answered(16.0)  # the next heartbeat on time: a connection was cut, not the database lost
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said == [("WARNING", "B: lost the database for 4 s; within its lease, nothing fenced; resuming"),
                    ("INFO", "B: 1 database errors (connections cut); the database took every heartbeat meanwhile")]


@override_settings(RUNNER_HEARTBEAT_SECONDS=2, RUNNER_LEASE_SECONDS=6)
def test_late_heartbeats_are_said_as_such(runner: Outage, caplog: pytest.LogCaptureFixture) -> None:
    """Nothing failed for want of the database, but the lease ran out (a busy host): said so, not as an outage."""
    with caplog.at_level(logging.INFO, logger="planner.runner"):
        runner.answered(10.0)
        runner.began, runner.errors, runner.refused = 16.5, 2, 2
        runner.answered(18.0)
    assert [r.getMessage() for r in caplog.records] == [
        "B: no heartbeat for 8 s (the runner was too busy or paused); fenced after 6 s (lease ran out: 2 cycles or "
        "passes not recorded, no tool started; its jobs were left to the other runners); resuming"]


def test_a_refusal_with_no_outage_near_and_any_process_not_a_runner_log_as_ever(
        monkeypatch: pytest.MonkeyPatch) -> None:
    lines = OutageLines()
    elsewhere = Outage()
    monkeypatch.setattr(outage, "OUTAGE", elsewhere)
    assert lines.filter(record("planner.cycle", logging.ERROR, "plannings of a pass failed", error=cut_off()))
    elsewhere.watch("A")
    assert lines.filter(record("planner.runner", logging.WARNING, "cycle of agent 3 not recorded: taken over",
                               extra=STRAGGLER_LINE))
    assert lines.filter(record("planner.cycle", logging.ERROR, "cycle of agent 3 failed", error=ValueError("bug")))
