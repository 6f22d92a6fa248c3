"""`serve` loads the code its requests need before it serves, and keeps it out of the collector's passes
(agents/management/commands/serve.py, `code_loaded`; why: docs/performance.md, the connected agents' figures)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import gc, json, sys
import django
django.setup()
from agents.management.commands.serve import code_loaded, server_config
server_config("127.0.0.1", 8000)  # as serve starts: the ASGI application (the HTTP and socket routes)
before = gc.get_freeze_count()
code_loaded()
print(json.dumps({"before": before, "frozen": gc.get_freeze_count(),
                  "loaded": [m for m in ("planning.views", "planning.api", "planning.mcp_server") if m in sys.modules]}))
"""


def test_a_server_process_loads_every_view_and_freezes_what_it_loaded() -> None:
    # Its own process: a freeze in the test run's would keep the suite's objects from the collector.
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "planner_site.settings"}
    result = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120, check=True)
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["loaded"] == ["planning.views", "planning.api", "planning.mcp_server"]  # a first request imports none
    assert seen["before"] == 0
    assert seen["frozen"] > 50_000  # Django, the apps and the SDKs: out of every full collection
