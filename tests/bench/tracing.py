"""Traces' cost (docs/tracing.md): the CPU of tool-agent lineages and persona cycles with export on beside export
off, in the same run, against an OTLP/HTTP receiver (another process) that accepts everything. Process CPU, so the
exporter's background thread is counted. Goal: <= 10% more CPU per cycle."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from tests.bench.common import figure

LINEAGES = int(os.environ.get("BENCH_TRACE_LINEAGES", "12"))
PERSONAS, PERSONA_CYCLES = 20, 15
MAX_OVERHEAD = 1.10
RECEIVER = r"""
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200); self.send_header("Content-Type", "application/x-protobuf"); self.end_headers()
    def log_message(self, *a): pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""


def tool_lineages(tag: str) -> int:
    """LINEAGES tool agents: each goal planned, approved, run to completion (offline model). Their cycles."""
    from django.contrib.auth.models import User

    from agents.models import Agent
    from planning.models import Plan
    from planning.planner import plan_generate
    from planning.services import plan_approve
    from runtime.cycle import agent_cycle

    operator = User.objects.get_or_create(username="bench-tracer")[0]
    cycles = 0
    for i in range(LINEAGES):
        agent = Agent.objects.create(name=f"bench-trace-{tag}-{i}", kind=Agent.Kind.TOOL, cycle_interval=0)
        agent.workspace.mkdir(parents=True, exist_ok=True)
        (agent.workspace / "data.csv").write_text("a,b\n1,2\n")
        plan = plan_generate(agent=agent, goal_text="Convert data.csv to JSON")
        plan_approve(plan=plan, user=operator, mode=Plan.ApprovalMode.ALL)
        plan.steps.filter(requires_permission=True).update(approved_by=operator)
        for _ in range(8):
            agent_cycle(agent_id=agent.pk, runner="bench")
            cycles += 1
            if Plan.objects.filter(pk=plan.pk, status=Plan.Status.COMPLETED).exists():
                break
    return cycles


def persona_batches(tag: str) -> int:
    from agents.models import Agent, Need
    from goals.models import Goal
    from planning.models import Plan, PlanStep
    from runtime.cycle import persona_cycles

    ids = []
    for i in range(PERSONAS):
        agent = Agent.objects.create(name=f"bench-persona-{tag}-{i}", kind=Agent.Kind.PERSONA, cycle_interval=0)
        for name, value in {"money": 0.3, "hunger": 0.7, "energy": 0.8, "social": 0.9, "fun": 0.9}.items():
            Need.objects.create(agent=agent, name=name, satisfaction=value, decay_per_hour=0.02)
        goal = Goal.objects.create(agent=agent, description="Keep fed", horizon=Goal.Horizon.SHORT,
                                   source_needs=["hunger"])
        plan = Plan.objects.create(agent=agent, goal=goal, goal_text="Keep fed", status=Plan.Status.ACTIVE,
                                   approval_mode=Plan.ApprovalMode.ALL)
        for position, hint in enumerate(("work", "eat"), start=1):
            PlanStep.objects.create(plan=plan, key=str(position), position=position, action_hint=hint,
                                    description=f"Go {hint}", depends_on=[str(position - 1)] if position > 1 else [])
        ids.append(agent.pk)
    for _ in range(PERSONA_CYCLES):
        persona_cycles(ids, runner="bench")
    return PERSONAS * PERSONA_CYCLES


def cpu_per_cycle(work: Callable[[str], int], tag: str) -> float:
    from planner_site import tracing

    started = time.process_time()
    cycles = work(tag)
    tracing.flush()
    return (time.process_time() - started) / max(cycles, 1) * 1000


def figures() -> list[dict[str, Any]]:
    from django.conf import settings

    from planner_site import tracing

    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(receiver.stdout.readline()) if receiver.stdout else 0
        saved = (settings.OTEL_EXPORTER_OTLP_ENDPOINT, settings.OTEL_PERSONA_SAMPLE_RATIO)
        out = []
        for name, work, ratio in (("trace_export_tool_cycle", tool_lineages, 1.0),
                                  ("trace_export_persona_cycle", persona_batches, saved[1]),
                                  ("trace_export_persona_cycle_all", persona_batches, 1.0)):
            settings.OTEL_EXPORTER_OTLP_ENDPOINT = ""
            tracing.provider_install(None)
            cpu_per_cycle(work, f"{name}-warm-off")  # imports, caches: neither side pays them
            off = cpu_per_cycle(work, f"{name}-off")
            settings.OTEL_EXPORTER_OTLP_ENDPOINT, settings.OTEL_PERSONA_SAMPLE_RATIO = f"http://127.0.0.1:{port}", ratio
            tracing.provider_install(None)
            cpu_per_cycle(work, f"{name}-warm-on")  # the exporter's session made once per process
            on = cpu_per_cycle(work, f"{name}-on")
            settings.OTEL_EXPORTER_OTLP_ENDPOINT, settings.OTEL_PERSONA_SAMPLE_RATIO = saved
            tracing.provider_install(None)
            which = "every lineage" if ratio >= 1 else f"persona lineages sampled at {ratio:g} (the default)"
            out.append(figure(name, on, "ms CPU", baseline=off, baseline_name="export off", passed=on <= off * MAX_OVERHEAD,
                              goal="<= 1.1x the CPU per cycle with export off",
                              note=f"{which} exported to an OTLP/HTTP receiver on loopback"))
        return out
    finally:
        receiver.terminate()
        receiver.wait(5)
