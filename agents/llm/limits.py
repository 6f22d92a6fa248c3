"""How many calls one process makes to one model at once (LLM_CONCURRENCY_PER_MODEL).

A runner may drive a hundred agents at once; a small local model server (Ollama, llama.cpp) answers a
few requests at a time and queues or refuses the rest. Calls beyond the bound wait on the event loop,
holding neither a thread's database connection nor a socket to the server.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings

# Event loop -> model -> its semaphore (a semaphore belongs to the loop it is first awaited on).
_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Semaphore]] = weakref.WeakKeyDictionary()


def model_slots(model: str) -> asyncio.Semaphore:
    """The semaphore bounding calls to `model` on the running loop."""
    per_model = _slots.setdefault(asyncio.get_running_loop(), {})
    slot = per_model.get(model)
    if slot is None:
        slot = per_model[model] = asyncio.Semaphore(max(1, int(settings.LLM_CONCURRENCY_PER_MODEL)))
    return slot


async def model_call_bounded[T](call: Callable[..., Awaitable[T]], /, *, model: str, **kwargs: Any) -> T:
    """`await call(model=model, **kwargs)` once fewer than LLM_CONCURRENCY_PER_MODEL calls to `model` run."""
    async with model_slots(model):
        return await call(model=model, **kwargs)
