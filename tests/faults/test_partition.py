"""A runner cut off the network while its process keeps running (a failing switch, a paused VM): runner B runs in a
network namespace joined to this host by a veth pair, and reaches PostgreSQL and Redis (which listen on loopback
only) through socat relays on the host's end; taking that end down cuts B off without a word to either side.

Runner B starts alone and takes every chain, including a tool step that blocks in its write (its file is a FIFO
nobody reads yet: a slow tool); runner A joins. A cut shorter than the lease changes nothing; a cut longer than
RUNNER_STALLED_SECONDS hands B's jobs to A: the personas go on within the stalled threshold plus 5 s, the step B
began is not run again but waits for an operator (outcome unknown) while B, cut off, finishes it anyway, and after
the heal B's stale commits and finishes are refused. No step runs twice, no shard has two passes at once, no cycle
is lost or recorded twice, no traceback. Skipped, saying why, where namespaces or socat cannot be had.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlparse

import pytest
from django.conf import settings
from django.db import connection, connections

from agents.models import Agent, Experience
from planning.models import Plan, PlanEvent, PlanStep
from tests.factories import AgentFactory, GoalFactory
from tests.faults.test_runner_faults import jobs_doing, wait_until, workers_live
from tests.runners import ROOT, personas, runagents, runner_env

pytestmark = [
    pytest.mark.skipif("postgresql" not in settings.DATABASES["default"]["ENGINE"],
                       reason="partition test: needs PostgreSQL and Redis (the scale-out pass)"),
    pytest.mark.scaleout,
    pytest.mark.django_db(transaction=True),
]

STALLED = 4.0  # RUNNER_STALLED_SECONDS of both runners: their lease is 3 s (settings: stalled - max(2 beats, 25 %))
SHORT_CUT = 1.0
LONG_CUT = 14.0


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=20)


def port_free(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class Link:
    """The veth pair between this host and runner B's namespace, with relays to the database and Redis."""

    def __init__(self) -> None:
        tag = os.getpid() % 100000
        self.ns, self.host_if, self.ns_if = f"plan{tag}", f"vph{tag}", f"vpn{tag}"
        used = run("ip", "-4", "addr").stdout if shutil.which("ip") else ""
        net = next((n for n in (*range(tag % 250, 250), *range(tag % 250)) if f"10.253.{n}." not in used), 0)
        self.host_ip, self.ns_ip = f"10.253.{net}.1", f"10.253.{net}.2"  # a subnet no other run of this test uses
        self.relays: list[subprocess.Popen[bytes]] = []
        self.batch: subprocess.Popen[str] | None = None  # one `ip` reading commands: a cut in a millisecond

    def make(self) -> str | None:
        """Build it; None, or why it cannot be built here."""
        if os.geteuid() != 0:
            return "network namespaces need root"
        if shutil.which("ip") is None:
            return "no `ip` command (iproute2)"
        if shutil.which("socat") is None:
            return "no socat (apt-get install socat)"
        for cmd in (["ip", "netns", "add", self.ns],
                    ["ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if],
                    ["ip", "link", "set", self.ns_if, "netns", self.ns],
                    ["ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if],
                    ["ip", "link", "set", self.host_if, "up"],
                    ["ip", "-n", self.ns, "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if],
                    ["ip", "-n", self.ns, "link", "set", self.ns_if, "up"],
                    ["ip", "-n", self.ns, "link", "set", "lo", "up"]):
            done = run(*cmd)
            if done.returncode != 0:
                return f"`{' '.join(cmd)}` failed: {done.stderr.strip()}"
        return None

    def relay(self, to_host: str, to_port: int) -> int:
        """A relay on the host's end of the link to `to_host:to_port`; its port."""
        port = port_free(self.host_ip)
        self.relays.append(subprocess.Popen(  # its own session: its children (one a connection) end with it
            ["socat", f"TCP-LISTEN:{port},bind={self.host_ip},fork,reuseaddr", f"TCP:{to_host}:{to_port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection((self.host_ip, port), timeout=1):
                return port
            time.sleep(0.1)
        raise AssertionError(f"socat relay on {self.host_ip}:{port} never listened")

    def ip_now(self, command: str) -> None:
        """Run an `ip` command at once (no process to start: a cut lands while a pass is under way)."""
        if self.batch is None:
            self.batch = subprocess.Popen(["ip", "-force", "-batch", "-"], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        assert self.batch.stdin is not None and self.batch.stdout is not None
        self.batch.stdin.write(f"{command}\nlink show {self.host_if}\n")  # the show answers once it has run
        self.batch.stdin.flush()
        said = [self.batch.stdout.readline()]
        while not said[-1].startswith("    link/"):
            said.append(self.batch.stdout.readline())
        assert not any(word in line for line in said for word in ("rror", "RTNETLINK", "Cannot")), said

    def cut(self) -> None:
        self.ip_now(f"link set {self.host_if} down")

    def heal(self) -> None:
        self.ip_now(f"link set {self.host_if} up")

    def remove(self) -> None:
        if self.batch is not None and self.batch.stdin is not None:
            self.batch.stdin.close()
            self.batch.wait(timeout=10)
        for relay in self.relays:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(relay.pid, signal.SIGKILL)
            relay.wait(timeout=10)
        run("ip", "link", "del", self.host_if)
        run("ip", "netns", "del", self.ns)


@pytest.fixture
def link() -> Iterator[Link]:
    made = Link()
    problem = made.make()
    if problem is not None:
        made.remove()
        pytest.skip(f"partition test skipped: {problem}")
    try:
        yield made
    finally:
        made.remove()


@pytest.fixture
def runners() -> Iterator[list[subprocess.Popen[str]]]:
    """Every runner the test starts; whatever is still running at the end is killed."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def runner_behind(link: Link, env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    """Runner B: `runagents` in the link's namespace, reaching the database and Redis through its relays."""
    db = connection.settings_dict
    redis = urlparse(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    env_b = {**env,
             "DATABASE_URL": f"postgres://{db['USER']}@{link.host_ip}:{link.relay(db['HOST'], int(db['PORT'] or 5432))}"
                             f"/{db['NAME']}",
             "REDIS_URL": f"redis://{link.host_ip}:{link.relay(redis.hostname or '127.0.0.1', redis.port or 6379)}"
                          f"{redis.path or '/0'}"}
    with log.open("a") as out:
        return subprocess.Popen(["ip", "netns", "exec", link.ns, sys.executable, "manage.py", "runagents",
                                 "--runner-id", "B"], cwd=ROOT, env=env_b, stdout=out, stderr=subprocess.STDOUT,
                                text=True)


class PassSampler(threading.Thread):
    """Samples the engine's jobs: how many passes of each shard were under way at once, at most."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.most: Counter[str] = Counter()
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                with connection.cursor() as cursor:
                    cursor.execute("SELECT lock, count(*) FROM procrastinate_jobs WHERE status = 'doing' "
                                   "AND lock LIKE 'personas:%%' GROUP BY lock")
                    for lock, n in cursor.fetchall():
                        self.most[lock] = max(self.most[lock], n)
                time.sleep(0.1)
        finally:
            connections.close_all()


def appending_agent(n_steps: int, name: str) -> tuple[Agent, Plan]:
    agent = AgentFactory(kind=Agent.Kind.TOOL, cycle_interval=0.4, name=name)
    goal = GoalFactory(agent=agent, description="Write the log", source_needs=[])
    plan = Plan.objects.create(agent=agent, goal=goal, goal_text=goal.description, status=Plan.Status.ACTIVE,
                               approval_mode=Plan.ApprovalMode.ALL)
    PlanStep.objects.bulk_create([
        PlanStep(plan=plan, key=str(i), position=i, description=f"line {i}", tool="file.append",
                 tool_input={"path": "log.txt", "content": f"line {i}\n"}, depends_on=[str(i - 1)] if i > 1 else [])
        for i in range(1, n_steps + 1)
    ])
    return agent, plan


def longest_gaps(agents: list[Agent], since: float, until: float) -> dict[int, float]:
    """Each persona's longest time between cycles (or from `since` / to `until`), in seconds, from its experiences."""
    from datetime import UTC, datetime

    start, end = datetime.fromtimestamp(since, UTC), datetime.fromtimestamp(until, UTC)
    gaps: dict[int, float] = {}
    for agent in agents:
        times = [start, *Experience.objects.filter(agent=agent, created_at__gt=start, created_at__lt=end)
                 .order_by("created_at").values_list("created_at", flat=True), end]
        gaps[agent.pk] = max((b - a).total_seconds() for a, b in zip(times, times[1:], strict=False))
    return gaps


def test_a_runner_cut_off_the_network_runs_no_step_twice_and_stalls_nobody(
    tmp_path: Path, link: Link, runners: list[subprocess.Popen[str]]
) -> None:
    people = personas(30, cycle_interval=0.5)
    writers = [appending_agent(60, f"Writer {i}") for i in range(4)]
    slow, slow_plan = appending_agent(1, "Slow writer")
    slow_plan.steps.update(tool_input={"path": "pipe", "content": "slow line\n"})
    env = runner_env(tmp_path, RUNNER_STALLED_SECONDS=str(STALLED), RUNNER_DB_RETRY_MAX_SECONDS="1",
                     DB_IDLE_IN_TRANSACTION_SECONDS="2", DB_TCP_USER_TIMEOUT_SECONDS="4",
                     RUNNER_SHARD_CYCLES_PER_SECOND="10", LOG_LEVEL="WARNING", PLANNER_MODELS="offline-rules",
                     FAST_MODELS="offline-rules", RESTATE_MODELS="offline-rules")
    workspaces = Path(env["AGENT_WORKSPACES"])  # the runners'
    pipe = workspaces / str(slow.pk) / "pipe"
    pipe.parent.mkdir(parents=True)
    os.mkfifo(pipe)  # its write blocks until someone reads: a tool step that takes its time
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    runner_b = runner_behind(link, env, log_b)
    runners.append(runner_b)
    slow_step = slow_plan.steps.get()
    wait_until(lambda: PlanStep.objects.get(pk=slow_step.pk).status == PlanStep.Status.RUNNING, timeout=60,
               what="runner B to begin the slow step", log=log_b)
    runner_a = runagents(env, "--runner-id", "A", log=log_a)
    runners.append(runner_a)
    wait_until(lambda: workers_live() == 2, timeout=60, what="runner A", log=log_a)
    sampler = PassSampler()
    sampler.start()
    time.sleep(3)

    # A cut shorter than the lease: nothing is taken over.
    link.cut()
    time.sleep(SHORT_CUT)
    link.heal()
    time.sleep(STALLED + 1)
    assert "recovered" not in log_a.read_text(), log_a.read_text()[-3000:]
    assert PlanStep.objects.get(pk=slow_step.pk).status == PlanStep.Status.RUNNING

    # A cut longer than the stalled threshold: A takes B's jobs over.
    outages = len(outage_lines(log_b))
    cut_at = time.time()
    link.cut()
    wait_until(lambda: PlanStep.objects.get(pk=slow_step.pk).status == PlanStep.Status.AWAITING_APPROVAL,
               timeout=LONG_CUT - 2, what="runner A to take the slow step over", log=log_a)
    # B, cut off, finishes its tool anyway (files need no database): the one write of the step.
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    written = b""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not written.endswith(b"\n"):
        with contextlib.suppress(BlockingIOError):
            written += os.read(reader, 1000)
        time.sleep(0.05)
    time.sleep(max(0.0, cut_at + LONG_CUT - time.time()))
    link.heal()
    healed_at = time.time()
    wait_until(lambda: len(outage_lines(log_b)) > outages, timeout=40, what="runner B back", log=log_b)
    time.sleep(4)
    with contextlib.suppress(BlockingIOError):
        written += os.read(reader, 1000)
    os.close(reader)
    runners_stopped((runner_a, log_a), (runner_b, log_b))
    sampler.stop.set()
    sampler.join(10)
    output = log_a.read_text() + log_b.read_text()

    # The slow step began once, on B; A did not run it again: it waits for an operator, outcome unknown.
    slow_step.refresh_from_db()
    assert written == b"slow line\n"
    assert slow_step.status == PlanStep.Status.AWAITING_APPROVAL
    assert slow_step.error.startswith("outcome unknown, interrupted")
    assert slow_plan.events.filter(kind=PlanEvent.Kind.STEP_STARTED).count() == 1
    # No step ran twice, no step completed twice, none left running; every line written is a step's that
    # completed or waits for a person, never one that could run again.
    assert writers_checked(writers, workspaces) >= 5 * len(writers), "the writers barely moved"
    # No shard had two passes under way at once; every persona went on within the bound; no cycle lost or twice.
    assert sampler.most and max(sampler.most.values()) == 1, sampler.most
    gaps = longest_gaps(people, cut_at, healed_at + 4)
    assert max(gaps.values()) <= STALLED + 5, (sorted(gaps.values())[-5:], f"cut at {cut_at}, healed at {healed_at}",
                                               log_a.read_text()[-3000:], log_b.read_text()[-3000:])
    cycles_continuous(people)
    assert jobs_doing() == 0
    # No traceback from either runner: B says its outage in one line (how long, fenced, resuming), and nothing
    # of a stale finish, a refused commit or a cycle run twice.
    said = outage_lines(log_b)[outages]
    assert "fenced after" in said and "; resuming" in said, said
    quiet(output, "IntegrityError", "FenceLost", "finish_job")
    from datetime import UTC, datetime

    recovered = [line[:23] for line in log_a.read_text().splitlines() if "recovered" in line]
    print(f"partition: cut at {datetime.fromtimestamp(cut_at, UTC):%H:%M:%S.%f}, A recovered at {recovered}")
    print(f"partition: B said: {said}")
    print(f"partition: longest persona gap {max(gaps.values()):.1f} s (bound {STALLED + 5:.0f} s); "
          f"passes at once per shard {dict(sampler.most)}; slow step {slow_step.status}")


# --- long cuts at the product's own thresholds -----------------------------------------------------------------

LONG_CUTS = (30.0, 120.0, 300.0)  # seconds: successive cuts of runner B, on the same two runners
DEFAULT_STALLED = 10.0  # RUNNER_STALLED_SECONDS as shipped (planner_site/settings.py)


def gaps_across(agents: list[Agent], since: float, until: float) -> dict[int, float]:
    """Each persona's longest time between two of its cycles around [since, until]: from its last cycle before
    `since` (a cut) to its first after, and so on to `until`, in seconds."""
    from datetime import UTC, datetime

    start, end = datetime.fromtimestamp(since, UTC), datetime.fromtimestamp(until, UTC)
    gaps: dict[int, float] = {}
    for agent in agents:
        before = (Experience.objects.filter(agent=agent, created_at__lte=start).order_by("-created_at")
                  .values_list("created_at", flat=True).first()) or start
        times = [before, *Experience.objects.filter(agent=agent, created_at__gt=start, created_at__lt=end)
                 .order_by("created_at").values_list("created_at", flat=True), end]
        gaps[agent.pk] = max((b - a).total_seconds() for a, b in zip(times, times[1:], strict=False))
    return gaps


def writers_checked(writers: list[tuple[Agent, Plan]], workspaces: Path) -> int:
    """No step of the writers ran twice, none completed twice, none left running; every line written is a step's
    that completed or waits for a person. Returns the steps completed."""
    total = 0
    for agent, plan in writers:
        log = workspaces / str(agent.pk) / "log.txt"
        lines = Counter(log.read_text().splitlines() if log.exists() else [])
        assert all(n == 1 for n in lines.values()), lines
        completed = Counter(PlanEvent.objects.filter(plan=plan, kind=PlanEvent.Kind.STEP_COMPLETED)
                            .values_list("step__key", flat=True))
        assert all(n == 1 for n in completed.values()), completed
        status = dict(plan.steps.values_list("key", "status"))
        assert PlanStep.Status.RUNNING not in status.values()
        assert {f"line {k}" for k, s in status.items() if s == PlanStep.Status.COMPLETED} <= set(lines)
        assert all(status[line.removeprefix("line ")] in (PlanStep.Status.COMPLETED, PlanStep.Status.AWAITING_APPROVAL)
                   for line in lines)
        total += len(completed)
    return total


def fifo_drain(pipe: Path, timeout: float = 5.0) -> bytes:
    """Read what a tool blocked on the FIFO `pipe` writes (it then finishes), up to a line."""
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    written = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and not written.endswith(b"\n"):
            with contextlib.suppress(BlockingIOError):
                written += os.read(reader, 1000)
            time.sleep(0.05)
    finally:
        os.close(reader)
    return written


def slow_step_on(runner: str, workspaces: Path, n: int, other: subprocess.Popen[str]) -> tuple[Agent, PlanStep, Path]:
    """A tool step that blocks in its write (its file a FIFO nobody reads yet: a slow tool) begun by `runner`.
    Either runner may take a new agent's cycle: one begun by the other is let finish, and another agent made;
    after two, the `other` runner is paused (SIGSTOP, well within its lease) while the agent is made."""
    for attempt in range(12):
        agent, plan = appending_agent(1, f"Slow writer {n}.{attempt}")
        pipe = workspaces / str(agent.pk) / "pipe"
        pipe.parent.mkdir(parents=True)
        os.mkfifo(pipe)
        paused = attempt >= 2
        if paused:
            other.send_signal(signal.SIGSTOP)
        try:
            plan.steps.update(tool_input={"path": "pipe", "content": "slow line\n"})
            step = plan.steps.get()
            deadline = time.monotonic() + (3 if paused else 60)
            while PlanStep.objects.get(pk=step.pk).status != PlanStep.Status.RUNNING and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            if paused:
                other.send_signal(signal.SIGCONT)
        wait_until(lambda step=step: PlanStep.objects.get(pk=step.pk).status == PlanStep.Status.RUNNING, timeout=60,
                   what="a runner to begin a slow step")
        began = PlanEvent.objects.get(step=step, kind=PlanEvent.Kind.STEP_STARTED).actor_label
        if began.endswith(f" {runner}") or began == runner:
            return agent, step, pipe
        assert fifo_drain(pipe) == b"slow line\n"
    raise AssertionError(f"runner {runner} never took a slow step")


def job_holder(lock: str) -> int | None:
    """The worker doing the job of this lock, if any."""
    from procrastinate.contrib.django.models import ProcrastinateJob

    return ProcrastinateJob.objects.filter(lock=lock, status="doing").values_list("worker_id", flat=True).first()


def runners_stopped(*runners: tuple[subprocess.Popen[str], Path]) -> None:
    """Stop the runners as an operator does (SIGTERM): each ends cleanly."""
    for proc, _ in runners:
        proc.send_signal(signal.SIGTERM)
    for proc, log in runners:
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]


def cycles_continuous(people: list[Agent]) -> None:
    """No persona's cycle was lost or recorded twice: its cycle numbers run from 1 to its count, without a gap."""
    for agent in Agent.objects.filter(pk__in=[p.pk for p in people]):
        cycles = sorted(Experience.objects.filter(agent=agent).values_list("cycle", flat=True))
        assert cycles == list(range(1, agent.cycle_count + 1)), (agent.pk, agent.cycle_count, cycles[-5:])


def passes_held(worker_id: int | None) -> list[str]:
    """The shards whose pass this worker is doing now."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT lock FROM procrastinate_jobs WHERE status = 'doing' AND worker_id = %s "
                       "AND lock LIKE 'personas:%%' ORDER BY lock", [worker_id])
        return [lock for (lock,) in cursor.fetchall()]


def quiet(text: str, *bad: str) -> None:
    """No traceback, no error and no line of the driver or its pools in a runner's log, nor any of `bad`; an outage
    line's last words, which quote what failed first, aside."""
    for line in text.splitlines():
        said = line.split(" (first: ", 1)[0]
        words = said.split()
        level, source = (words[2], words[3]) if len(words) > 3 else ("", "")
        assert not (any(word in said for word in ("Traceback", "Task exception was never retrieved",
                                                   "Job was not found", *bad))
                    or level == "ERROR" or source.startswith("psycopg")), (line, text[-6000:])


def outage_lines(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if "lost the database for" in line]


def outage_of(log: Path, length: float) -> str | None:
    """The runner's line for a cut of `length` seconds: an outage at least that long, said once."""
    said = [line.split(": ", 1)[-1] for line in outage_lines(log)
            if length <= float(line.split("lost the database for ", 1)[1].split(" s", 1)[0]) < length + 90]
    assert len(said) <= 1, said
    return said[0] if said else None


@pytest.mark.timeout(1200)
def test_long_partitions_at_the_default_threshold_run_no_step_twice_and_stall_nobody(
    tmp_path: Path, link: Link, runners: list[subprocess.Popen[str]]
) -> None:
    """Runner B cut off for 30 s, 120 s and 5 min in turn, with the product's own heartbeat, stalled threshold,
    lease, sweep and connection limits; a slow tool step of B's in flight at each cut."""
    people = personas(30, cycle_interval=0.5)
    writers = [appending_agent(400, f"Writer {i}") for i in range(4)]
    for agent, _ in writers:
        Agent.objects.filter(pk=agent.pk).update(cycle_interval=1.5)
    # The product's defaults (runner_env speeds the other fault tests up): only the shard size is set, so that
    # 30 personas make four shards, spread over both runners.
    env = runner_env(tmp_path, RUNNER_HEARTBEAT_SECONDS="2", RUNNER_STALLED_SECONDS=str(DEFAULT_STALLED),
                     RUNNER_SWEEP_SECONDS="2", RUNNER_TICK_SECONDS="0.5", RUNNER_SHARD_CYCLES_PER_SECOND="10",
                     LOG_LEVEL="WARNING", PLANNER_MODELS="offline-rules", FAST_MODELS="offline-rules",
                     RESTATE_MODELS="offline-rules")
    workspaces = Path(env["AGENT_WORKSPACES"])
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    runner_b = runner_behind(link, env, log_b)
    runners.append(runner_b)
    runner_a = runagents(env, "--runner-id", "A", log=log_a)
    runners.append(runner_a)
    wait_until(lambda: workers_live() == 2, timeout=60, what="both runners", log=log_a)
    sampler = PassSampler()
    sampler.start()
    figures: list[str] = []
    slow_steps: list[tuple[PlanStep, bytes]] = []
    for n, length in enumerate(LONG_CUTS):
        slow, slow_step, pipe = slow_step_on("B", workspaces, n, runner_a)
        b_worker = job_holder(f"agent:{slow.pk}")
        time.sleep(2)
        # Cut in the middle of one of B's passes, if B takes any within a minute: its personas then wait for the
        # takeover. (Its jobs stay "doing" under B once it is cut off: read just after the cut, they say which.)
        deadline = time.monotonic() + 60
        while not passes_held(b_worker) and time.monotonic() < deadline:
            time.sleep(0.005)
        cut_at = time.time()
        link.cut()
        shards_b = passes_held(b_worker)
        wait_until(lambda step=slow_step: PlanStep.objects.get(pk=step.pk).status == PlanStep.Status.AWAITING_APPROVAL,
                   timeout=length - 2, what="runner A to take the slow step over", log=log_a)
        taken = time.time() - cut_at
        written = fifo_drain(pipe)  # B, cut off, finishes its tool anyway: the one write of the step
        time.sleep(max(0.0, cut_at + length - time.time()))
        link.heal()
        healed_at = time.time()
        # B finds the database again within its backoff (10 s), or once the worker's pool, opened during the cut,
        # gives up waiting for it (30 s): then it says so.
        wait_until(lambda length=length: outage_of(log_b, length) is not None, timeout=90, what="runner B back",
                   log=log_b)
        back = time.time() - healed_at
        time.sleep(10)
        steps_b = PlanEvent.objects.filter(kind=PlanEvent.Kind.STEP_STARTED, actor_label="B",
                                           created_at__gt=datetime.fromtimestamp(healed_at, UTC)).count()
        gaps = gaps_across(people, cut_at, time.time())
        worst = max(gaps.values())
        slow_steps.append((slow_step, written))
        figures.append(f"{length:.0f} s cut: B held {len(shards_b)} shard(s) {shards_b}; slow step taken over "
                       f"{taken:.1f} s in; B back {back:.1f} s after the heal, then began {steps_b} steps in 10 s; longest "
                       f"persona gap {worst:.1f} s "
                       f"(bound {DEFAULT_STALLED + 5:.0f} s); B said: {outage_of(log_b, length)}")
        print(f"partition: {figures[-1]}", flush=True)
        assert worst <= DEFAULT_STALLED + 5, (figures[-1], sorted(gaps.values())[-5:], log_a.read_text()[-3000:],
                                              log_b.read_text()[-3000:])
    runners_stopped((runner_a, log_a), (runner_b, log_b))
    sampler.stop.set()
    sampler.join(10)

    # Each slow step began once, on B; A did not run it again: it waits for an operator, outcome unknown.
    for step, written in slow_steps:
        step.refresh_from_db()
        assert written == b"slow line\n"
        assert step.status == PlanStep.Status.AWAITING_APPROVAL
        assert step.error.startswith("outcome unknown, interrupted")
        assert PlanEvent.objects.filter(step=step, kind=PlanEvent.Kind.STEP_STARTED).count() == 1
    completed = writers_checked(writers, workspaces)
    assert completed >= 100, f"the writers barely moved: {completed} steps"
    # No shard had two passes under way at once; no cycle lost or recorded twice; nothing left under way.
    assert sampler.most and max(sampler.most.values()) == 1, sampler.most
    cycles_continuous(people)
    assert jobs_doing() == 0
    # One warning line for each cut from B (it says any other silence of its own in a line too), no traceback
    # from either runner.
    assert all(outage_of(log_b, length) for length in LONG_CUTS), outage_lines(log_b)
    quiet(log_a.read_text())
    quiet(log_b.read_text())
    others = [line for line in outage_lines(log_b) if line.split(": ", 1)[-1] not in
              [outage_of(log_b, length) for length in LONG_CUTS]]
    print("partition: " + f"{completed} writer steps completed, none twice; passes at once per shard "
          f"{dict(sampler.most)}; B's other outage lines: {others}")
