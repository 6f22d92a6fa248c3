"""A runner's outages of the database in its log: one warning line each, said when the database answers again.

While a runner cannot reach the database (a failing switch, a paused VM, a restart), everything in it that
touches the database fails: cycles and passes, the engine's listener, heartbeat and finishes, the connection
pools' attempts. Each would log its own error, many with a traceback, for as long as the outage lasts. In a
runner (`OUTAGE.watch`), the log filter `OutageLines` (settings.LOGGING) folds them into the outage instead: the
first marks it begun (an info line), and once the database takes the runner's heartbeat again one warning says
for how long it was lost, whether the runner fenced itself (its lease ran out: from then on it recorded nothing
and started no tool, and its jobs were left to the other runners) with what was refused meanwhile, and that it
resumes:

    B: lost the database for 31 s; fenced after 6 s (lease ran out: 12 cycles or passes not recorded, no tool
    started); resuming

Errors of connections cut while the database still took the heartbeats (a terminated backend) are one info
line. Anything else keeps its own line; a process that is not a runner (pages, tests) logs as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger("planner.runner")


def connection_error(exc: BaseException | None) -> bool:
    """Whether `exc` (or what caused it) is a lost database connection: the driver's, Django's or the engine's
    wrapping of it, Redis's (the cache, the channel layer: behind the same network), or the socket's own error."""
    from django.db import InterfaceError, OperationalError
    from procrastinate.exceptions import ConnectorException
    from psycopg import InterfaceError as DriverInterfaceError
    from psycopg import OperationalError as DriverOperationalError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    kinds = (OperationalError, InterfaceError, DriverOperationalError, DriverInterfaceError, ConnectorException,
             RedisConnectionError, RedisTimeoutError, ConnectionError, TimeoutError)
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, kinds):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


class Outage:
    """This runner's view of the database: since when it has been lost, and what was folded meanwhile."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock  # the runner's monotonic time (the heartbeats' sent times are of it)
        self.runner = ""
        self.watching = False
        self.contact: float | None = None  # when the last heartbeat (or registration) the database took was sent
        self.answer: float | None = None  # and when its answer came (time.monotonic())
        self.began: float | None = None  # the first error of the outage under way (time.monotonic())
        self.heartbeat_lost = False  # the database stopped taking heartbeats: the runner lost it, not a connection
        self.errors = 0
        self.refused = 0
        self.first = ""  # what failed first, in a few words (the line says it: where to look)
        self.ended: float = float("-inf")
        self._lock = threading.Lock()

    def watch(self, runner: str) -> None:
        """From now on this process is runner `runner`: fold its outages (`OutageLines`)."""
        self.runner, self.watching = runner, True

    def lost(self, *, refused: bool = False, heartbeat: bool = False, what: str = "") -> None:
        """Something failed for want of the database (`refused`: a cycle or pass not recorded by a fence; `what`:
        what failed, in a few words)."""
        now = self.clock()
        began = False
        with self._lock:
            if self.began is None:
                if now - self.ended < self.late_seconds() and not heartbeat:
                    return  # a straggler of the outage just ended (a thread cut off then): said with it
                self.began, self.errors, self.refused, self.heartbeat_lost, began = now, 0, 0, False, True
                self.first = " ".join(what.split())[:160]
            self.errors += 1
            self.refused += refused
            self.heartbeat_lost |= heartbeat
        if began:
            logger.info("%s: the database fails (an outage, or a connection cut)%s; waiting for it", self.runner,
                        f": {self.first}" if self.first else "")

    def answered(self, sent_at: float) -> None:
        """The database took a heartbeat (or a registration) sent at `sent_at`: an outage under way is over. It
        was lost from the answer before to this one; the lease ran out if that was sent long enough ago."""
        from django.conf import settings

        now = self.clock()
        with self._lock:
            began, last, last_answer = self.began, self.contact, self.answer
            self.contact = sent_at if last is None else max(last, sent_at)
            self.answer = now
            if began is None:
                return
            errors, refused, heartbeat_lost, first = self.errors, self.refused, self.heartbeat_lost, self.first
            self.began, self.ended = None, now
        first = f" (first: {first})" if first else ""
        lost_for = now - (last_answer if last_answer is not None else began)
        unleased = now - (last if last is not None else began)
        if not heartbeat_lost and lost_for < 2 * settings.RUNNER_HEARTBEAT_SECONDS:
            logger.info("%s: %d database errors (connections cut)%s; the database took every heartbeat meanwhile",
                        self.runner, errors, first)
            return
        lease = settings.RUNNER_LEASE_SECONDS
        fenced = (f"fenced after {lease:.0f} s (lease ran out: {refused} cycles or passes not recorded, no tool "
                  "started; its jobs were left to the other runners)" if unleased >= lease else
                  "within its lease, nothing fenced")
        if heartbeat_lost or errors > refused:
            logger.warning("%s: lost the database for %.0f s; %s; resuming%s", self.runner, lost_for, fenced, first)
        else:  # nothing failed for want of the database: the heartbeats were late (a busy or paused process)
            logger.warning("%s: no heartbeat for %.0f s (the runner was too busy or paused); %s; resuming%s",
                           self.runner, lost_for, fenced, first)

    def late_seconds(self) -> float:
        """How long after an outage its stragglers still come: a thread cut off mid-statement learns of it when
        its connection gives up (DB_TCP_USER_TIMEOUT_SECONDS) or when its fence refuses it, after the heal."""
        from django.conf import settings

        return float(getattr(settings, "DB_TCP_USER_TIMEOUT_SECONDS", 10)) + settings.RUNNER_STALLED_SECONDS


OUTAGE = Outage()

# `extra` of a runner's own log lines: a line of an outage (folded into it), a cycle or pass its fence refused
# for want of the database (its lease ran out), and one refused after a takeover (a straggler of an outage, said
# as its own line when no outage is near: the runner was found stalled without one).
OUTAGE_LINE: dict[str, object] = {"outage": True}
REFUSED_LINE: dict[str, object] = {"outage": True, "refused": True}
STRAGGLER_LINE: dict[str, object] = {"outage": "straggler", "refused": True}


class OutageLines(logging.Filter):
    """The log filter of settings.LOGGING: in a runner, a record of a lost database connection (a connection
    error, or one of the driver's or its pools' warnings, or a runner's own line marked `extra={"outage": True}`) is folded into
    the outage (`Outage.lost`) instead of logged. Elsewhere, or any other record, passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not OUTAGE.watching or record.levelno >= logging.CRITICAL:
            return True
        try:
            return self.passes(record)
        except Exception:  # a log filter never breaks what logs (the engine logs inside its job handling)
            return True

    def passes(self, record: logging.LogRecord) -> bool:
        """`filter` in a runner: whether the record is logged (False: it is folded into the outage)."""
        marked = getattr(record, "outage", False)
        error = record.exc_info[1] if isinstance(record.exc_info, tuple) else None  # exc_info=False is allowed
        if not (marked or (record.name.split(".")[0] == "psycopg" and record.levelno == logging.WARNING)
                or connection_error(error)
                or (record.name.startswith("procrastinate") and "ConnectorException" in record.getMessage())):
            return True
        if marked == "straggler" and OUTAGE.began is None and \
                OUTAGE.clock() - OUTAGE.ended >= OUTAGE.late_seconds():
            return True  # a fence refusing with no outage near: the runner was found stalled, say it
        OUTAGE.lost(refused=bool(getattr(record, "refused", False)),
                    what=f"{record.name}: {record.getMessage()}" + (f" ({type(error).__name__}: {error})" if error else ""))
        return False
