"""schemathesis against the real server (`manage.py serve`) with an agent's token: every phase (examples,
coverage, fuzzing, stateful), every check, a fixed seed and a fixed number of examples per operation; no
failure allowed. What it may accept as an answer to schema-valid data is in tests/api/schemathesis.toml."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.conftest import LiveServer, server_env, server_start
from tests.browser.conftest import postgres_database_drop, stop

CONFIG = Path(__file__).with_name("schemathesis.toml")
EXAMPLES_PER_OPERATION = 25
SEED = 18
RUN_SECONDS = 150


@pytest.fixture(scope="module")
def fuzzed_server() -> Iterator[LiveServer]:
    """A server of its own (what schemathesis creates is thrown away), without the API's rate limit, no runner."""
    import os

    tmp = Path(tempfile.mkdtemp(prefix="planner-schemathesis-"))
    env, db_name = server_env(tmp, "schemathesis")
    env["API_RATE_LIMIT"] = "100000/m"
    env["API_LONG_POLL_MAX_SECONDS"] = "2"  # a long poll answers within the checks' response time, and quickly
    proc = None
    try:
        server, proc = server_start(env, tmp, "--no-runner")
        yield server
    finally:
        if proc is not None:
            stop(proc)
        if db_name:
            postgres_database_drop(os.environ["DATABASE_URL"], db_name)


def test_schemathesis_finds_nothing_wrong_with_the_api(fuzzed_server: LiveServer, tmp_path: Path) -> None:
    token = fuzzed_server.token("Fuzzed agent")
    command = [
        str(Path(sys.executable).with_name("schemathesis")), "--config-file", str(CONFIG), "run",
        f"{fuzzed_server.url}/api/openapi.json", "--header", f"Authorization: Bearer {token}",
        "--checks", "all", "--phases", "examples,coverage,fuzzing,stateful",
        "--max-examples", str(EXAMPLES_PER_OPERATION), "--seed", str(SEED), "--generation-database", "none",
        "--workers", "1", "--request-timeout", "70", "--no-color",
        "--report", "junit", "--report-dir", str(tmp_path),
    ]
    # Run where schemathesis may keep its cache (.schemathesis/): not in the checkout.
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=RUN_SECONDS * 2)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:] + "\n--- server log ---\n" + fuzzed_server.log_tail()
    assert f"Seed: {SEED}" in output and "✅ Stateful" in output, output[-3000:]  # the stateful phase ran too
