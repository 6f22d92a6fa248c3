"""A runner cut off from the database logs one warning line per outage, when it ends, instead of an error (and a
traceback) from everything that failed meanwhile (runtime/outage.py)."""

from __future__ import annotations

import logging
import sys

import pytest
from django.db import OperationalError
from django.test import override_settings

from runtime import outage
from runtime.outage import OUTAGE_LINE, REFUSED_LINE, STRAGGLER_LINE, Outage, OutageLines


class Clock:
    """The runner's monotonic time, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> Outage:
    fresh = Outage(clock=Clock())
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


def last_heard(runner: Outage, seconds_ago: float) -> None:
    """The database took the runner's last heartbeat `seconds_ago` (sent then, answered at once)."""
    runner.contact = runner.answer = runner.clock() - seconds_ago


@override_settings(RUNNER_HEARTBEAT_SECONDS=2, RUNNER_LEASE_SECONDS=6)
def test_an_outage_is_one_warning_when_the_database_answers_again(runner: Outage,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    lines = OutageLines()
    last_heard(runner, 31)
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
        runner.answered(runner.clock())  # the registration after the heal
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["B: lost the database for 31 s; fenced after 6 s (lease ran out: 1 cycles or passes not "
                        "recorded, no tool started; its jobs were left to the other runners); resuming (first: "
                        "planner.cycle: plannings of a pass failed (OperationalError: consuming input failed: could "
                        "not receive data from server))"]
    # Stale work refused in the seconds after (a job taken over meanwhile) belongs to that line.
    assert not lines.filter(record("planner.runner", logging.WARNING, "pass of personas 1/4 not recorded: taken over",
                                   extra=STRAGGLER_LINE))


@override_settings(RUNNER_HEARTBEAT_SECONDS=2, RUNNER_LEASE_SECONDS=6)
def test_a_heartbeat_sent_before_the_outage_and_answered_after_it_ends_it(runner: Outage,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """A heartbeat waits for the database as long as it is away: its answer, not its sending, says it is back."""
    last_heard(runner, 15)
    runner.lost()
    with caplog.at_level(logging.INFO, logger="planner.runner"):
        runner.answered(runner.clock() - 14.5)  # sent just after the last one, answered now
    assert [r.getMessage() for r in caplog.records] == [
        "B: the database fails (an outage, or a connection cut); waiting for it",
        "B: lost the database for 15 s; fenced after 6 s (lease ran out: 0 cycles or passes not recorded, no tool "
        "started; its jobs were left to the other runners); resuming"]


@override_settings(RUNNER_HEARTBEAT_SECONDS=2, RUNNER_LEASE_SECONDS=6)
def test_a_short_outage_within_the_lease_and_a_cut_connection(runner: Outage,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="planner.runner"):
        last_heard(runner, 4)
        runner.lost(heartbeat=True)
        runner.answered(runner.clock())
        runner.ended = float("-inf")
        last_heard(runner, 0.5)
        runner.lost()
        runner.answered(runner.clock())  # the next heartbeat on time: a connection was cut, not the database lost
    said = [(r.levelname, r.getMessage()) for r in caplog.records if "fails" not in r.getMessage()]
    assert said == [("WARNING", "B: lost the database for 4 s; within its lease, nothing fenced; resuming"),
                    ("INFO", "B: 1 database errors (connections cut); the database took every heartbeat meanwhile")]


@override_settings(RUNNER_HEARTBEAT_SECONDS=2, RUNNER_LEASE_SECONDS=6)
def test_late_heartbeats_are_said_as_such(runner: Outage, caplog: pytest.LogCaptureFixture) -> None:
    """Nothing failed for want of the database, but the lease ran out (a busy host): said so, not as an outage."""
    last_heard(runner, 8)
    runner.lost(refused=True)
    runner.lost(refused=True)
    with caplog.at_level(logging.WARNING, logger="planner.runner"):
        runner.answered(runner.clock())
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
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
    done = record("procrastinate.worker", logging.INFO, "Job succeeded")
    done.exc_info = False  # type: ignore[assignment]  # as the engine logs a job that succeeded (exc_info=False)
    assert lines.filter(done)
