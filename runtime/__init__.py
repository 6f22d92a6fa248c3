"""The runtime: what drives agents' cycles, apart from the domain that says what a cycle does.

Two modes share one cycle (`cycles.cycle_run`):
- embedded (SQLite, one process, `make run`): `embedded.Scheduler`, the simplest in-process scheduler. One
  process drives every agent, so there is nothing to lease or claim: an agent is driven when it falls due,
  at most one cycle at a time.
- scale-out (PostgreSQL): cycles are jobs of Procrastinate (`tasks.py`), a well-kept PostgreSQL job engine.
  Any number of `runagents` workers share them; the engine owns delivery (a lock per agent so no agent runs
  two cycles at once, a queueing lock so each agent has one cycle waiting, scheduled jobs for the intervals,
  worker heartbeats and the retry of jobs whose worker died); the product owns the domain.
"""
