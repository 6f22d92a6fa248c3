"""Real `runagents` processes on the test database, for the scale-out and fault tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from django.db import connection

from agents.models import Agent
from tests.factories import AgentFactory, NeedFactory

ROOT = Path(__file__).resolve().parents[1]


def runner_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a runner process on this test's database (SQLite file or PostgreSQL)."""
    env = {**os.environ, "PLANNER_VAR_DIR": str(tmp_path / "var"), "AGENT_WORKSPACES": str(tmp_path / "ws"),
           "RUNNER_TICK_SECONDS": "0.05", "LOG_LEVEL": "WARNING", "RETENTION_PRUNE_SECONDS": "0",
           # A killed worker is found dead within seconds, and chains are started within one.
           "RUNNER_HEARTBEAT_SECONDS": "0.5", "RUNNER_STALLED_SECONDS": "3", "RUNNER_SWEEP_SECONDS": "1",
           "LLM_LOCAL_CONCURRENCY": "0",  # the scripted model server answers any number at once (tests/conftest.py)
           **extra}
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        env["SQLITE_PATH"] = str(db["NAME"])
    else:
        env["DATABASE_URL"] = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    return env


def runagents(env: dict[str, str], *args: str, log: Path | None = None) -> subprocess.Popen[str]:
    """Start `manage.py runagents`; its output goes to pipes, or to `log` for long runs (no pipe fills up)."""
    if log is None:
        return subprocess.Popen([sys.executable, "manage.py", "runagents", *args], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with log.open("a") as out:
        return subprocess.Popen([sys.executable, "manage.py", "runagents", *args], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT, text=True)


def personas(n: int, *, cycle_interval: float = 0.0) -> list[Agent]:
    agents = []
    for _ in range(n):
        agent = AgentFactory(kind=Agent.Kind.PERSONA, cycle_interval=cycle_interval)
        for name in ("hunger", "energy", "social"):
            NeedFactory(agent=agent, name=name, satisfaction=0.9, decay_per_hour=0.01)
        agents.append(agent)
    return agents
