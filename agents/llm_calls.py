"""The call log: the LLM gateway hands every model call here (settings.LLM_CALL_RECORDER).

Each call, answered or failed, becomes an LLMCall row (shown on the plan page, costed from LLM_PRICES,
pruned by retention); after an answered call the agent's budget is checked, and a budget reached pauses it.
"""

from __future__ import annotations

from collections.abc import Sequence

from agents.llm.gateway import CallRecord
from agents.models import LLMCall
from planning.trace_spans import calls_traced
from policies.services import budgets_after_calls


def llm_calls_record(records: Sequence[CallRecord]) -> list[int]:
    """Record model calls (one, or a runner pass's together), in one INSERT; the ids of their LLMCall rows, in
    order (LLMResult.call_id), kept with their lineage for its trace (planning/trace_spans.py). Then each agent
    that had an answer is checked against its budget once."""
    calls = LLMCall.objects.bulk_create([LLMCall(
        agent_id=record.agent_id, plan_id=record.plan_id, purpose=record.purpose, prompt=record.prompt,
        provider=record.provider, model=record.model, latency_ms=record.latency_ms, error=record.error,
        response=record.response, tokens_in=record.tokens_in, tokens_out=record.tokens_out, cost=record.cost,
        finish_reason=record.finish_reason, response_format=record.response_format,
    ) for record in records])
    calls_traced(calls)
    budgets_after_calls((r.agent_id, r.plan_id) for r in records if not r.error)
    return [call.pk for call in calls]
