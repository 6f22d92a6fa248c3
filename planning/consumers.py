"""Live pages over websockets: one hub per process, one feed per open page, pushes of what changed.

- The **hub** is this process's single listener: it subscribes once to the layer's `LIVE_GROUP` (or,
  on the embedded stack, binds the relay socket other processes send their changes to) and hands each
  change message to the feeds it concerns. It checks the layer with a heartbeat (a ping to itself every
  second) and the publishers' sequence numbers; after a gap (a Redis outage, a lost message) every open
  page is asked to resync: its socket is closed with `CLOSE_RESYNC` and the page reconnects at once,
  receiving its full state.
- A **feed** serves every client of one page (the dashboard, plan 12, agent 3) in this process. On a
  change it renders at once (no sleep), once per audience (operator or viewer), only what changed
  (the step rows, the new timeline entries, the counts, the sections whose HTML differs), and sends
  the same text to every client of that audience. Changes that arrive during a render are merged into
  the next one.
- A **consumer** is one websocket: it checks the login, joins its page's feed, sends the page's full
  state (so a reconnect always resyncs), and then only relays what the feed sends. Clients send
  nothing; anything they send is ignored.

The browser side (static/js/live.js) morphs each pushed element into the element of the same id, so a
form being filled in keeps its text and the focus stays where it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import parse_qsl

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer
from django.contrib.auth.models import User
from django.core.exceptions import ObjectDoesNotExist
from django.db.models import Count, Max
from django.template.loader import render_to_string
from django.utils.datastructures import MultiValueDict

from agents.models import LLMCall
from planner_site import events
from planner_site.roles import user_can_decide
from planner_site.statements import Statement, columns
from planning.models import Plan, PlanEvent, PlanStep, steps_done
from planning.selectors import (
    AgentRow,
    DashboardFilter,
    agent_context,
    dashboard_page,
    dashboard_rows,
    dashboard_totals,
    plan_calls_page,
    plan_context,
    plan_steps,
    plan_versions,
    plan_withdrawn,
    step_rollback_possible,
)
from planning.templatetags.steer import GRAPH_FIELDS, plan_graph_svg

logger = logging.getLogger("planner.live")

CLOSE_RESYNC = 4000  # the page may have missed changes: reconnect now and get the full state
CLOSE_UNAUTHENTICATED = 4401  # log in again
CLOSE_NOT_FOUND = 4404  # no such page (an unknown path, a deleted plan)
CLOSE_LAYER_DOWN = 4503  # live updates are unavailable for now: retry with backoff

PING_SECONDS = 1.0
PING_TIMEOUT_SECONDS = 3.0
OPERATOR, VIEWER = "operator", "viewer"


class LayerUnavailable(Exception):
    """The channel layer (Redis) cannot be reached: live updates are off until it is back."""


# --- pages: what one page shows, rendered incrementally --------------------------------------------------------


class LivePage:
    """The state of one page as this process last pushed it; renders only what changed since.

    `baseline` and `render_changes` run on the database thread, one at a time per feed.
    """

    def __init__(self, key: str) -> None:
        self.key = key

    def concerns(self, message: dict[str, Any]) -> set[int]:
        """The ids this page must re-render for this message (empty: not this page's business)."""
        raise NotImplementedError

    def baseline(self) -> None:
        """Take the current state as already shown (the clients get it in full on connect)."""

    def render_changes(self, ids: set[int], audiences: set[str]) -> dict[str, str]:
        """The push for each audience: the changed elements, each with its id; "" when nothing changed."""
        raise NotImplementedError


def render_for(template: str, context: dict[str, Any], audience: str) -> str:
    return render_to_string(template, context | {"can_decide": audience == OPERATOR, "live": True})


class DashboardLivePage(LivePage):
    """Changed rows, and the counts when a changed row may have moved them (one aggregate less per push)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.row_states: dict[int, tuple[Any, ...]] = {}

    def concerns(self, message: dict[str, Any]) -> set[int]:
        return set(message["agents"])

    @staticmethod
    def row_state(row: AgentRow) -> tuple[Any, ...]:
        steps = row.steps
        return (row.agent.status, bool(row.agent.waiting_reason), row.plan.pk if row.plan else None,
                row.plan.status if row.plan else None,
                tuple((s.status, s.retries) for s in steps if s.status == PlanStep.Status.FAILED or s.retries))

    def render_changes(self, ids: set[int], audiences: set[str]) -> dict[str, str]:
        # Rows carry no decisions: one render serves every audience.
        rows = dashboard_rows(agent_ids=sorted(ids))
        removed = sorted(ids - {r.agent.pk for r in rows})
        moved = bool(removed)
        for row in rows:
            state = self.row_state(row)
            if self.row_states.get(row.agent.pk) != state:
                self.row_states[row.agent.pk] = state
                moved = True
        for pk in removed:
            self.row_states.pop(pk, None)
        context: dict[str, Any] = {"rows": rows, "removed": removed}
        if moved:
            context["counts"] = dashboard_totals()
        html = render_to_string("planning/dashboard_live.html", context)
        return dict.fromkeys(audiences, html)


STEP_FIELDS = tuple(f.attname for f in PlanStep._meta.concrete_fields)
PLAN_FIELDS = tuple(f.attname for f in Plan._meta.concrete_fields)
GRAPH_AT = [STEP_FIELDS.index(f) for f in GRAPH_FIELDS]  # where the graph's fields are in a step's columns
# What a timeline entry shows (its step is taken from the steps read in the same push).
EVENT_FIELDS = columns(PlanEvent, "id", "plan_id", "step_id", "kind", "actor_label", "reason", "created_at")
# Events after which the versions, the attempts and the model calls of a plan may have changed.
PLANNING_KINDS = {PlanEvent.Kind.CREATED, PlanEvent.Kind.ATTEMPT_REJECTED, PlanEvent.Kind.VALIDATED,
                  PlanEvent.Kind.REPLANNED, PlanEvent.Kind.PLAN_FAILED}


class PlanLivePage(LivePage):
    """Step rows that changed, new timeline entries, and the sections whose content changed.

    A push costs three queries in the common case (the plan's columns, the steps' columns, the new
    events), whatever the number of steps, each compiled once for the page (`statements_compile`);
    the other sections are read and rendered only when what they show may have changed.
    """

    def __init__(self, key: str, plan_id: int) -> None:
        super().__init__(key)
        self.plan_id = plan_id
        self.last_event_id = 0
        self.steps: dict[int, tuple[Any, ...]] = {}
        self.step_order: list[int] = []
        self.plan_state: tuple[Any, ...] = ()
        self.calls_state: tuple[Any, ...] = ()
        self.graph_state: tuple[Any, ...] | None = None  # what the graph last pushed showed (graph_key's fields)
        self.sections: dict[tuple[str, str], Any] = {}
        self.flags: list[str] = []
        self.diff: Any = None
        self.versions: list[Plan] = []
        self.next_version: Plan | None = None
        self.compiled = False

    def statements_compile(self) -> None:
        """The reads of every push: their SQL depends only on the plan, so the ORM compiles them once (on the
        database thread: compiling may ask the database for its version)."""
        if self.compiled:
            return
        self.plan_read = Statement(Plan.objects.filter(pk=self.plan_id).values_list(*PLAN_FIELDS))
        self.steps_read = Statement(PlanStep.objects.filter(plan_id=self.plan_id).order_by("position")
                                    .values_list(*STEP_FIELDS))
        # Run with (this plan, the last event pushed): the parameters in that order, checked here.
        self.events_read = Statement(PlanEvent.objects.filter(plan_id=self.plan_id).filter(pk__gt=0)
                                     .order_by("created_at", "id").values_list(*EVENT_FIELDS))
        if list(self.events_read.params) != [self.plan_id, 0]:
            raise RuntimeError(f"unexpected parameters of the events read: {self.events_read.params}")
        self.compiled = True

    def concerns(self, message: dict[str, Any]) -> set[int]:
        return {self.plan_id} if self.plan_id in message["plans"] else set()

    def events_new(self) -> list[PlanEvent]:
        """The timeline entries added since the last push, each with its step (from the steps just read)."""
        events = [PlanEvent.from_db("default", list(EVENT_FIELDS), row)
                  for row in self.events_read.rows([self.plan_id, self.last_event_id])]
        if events:
            self.last_event_id = max(e.pk for e in events)
        others = {e.step_id for e in events if e.step_id and e.step_id not in self.steps}
        elsewhere = PlanStep.objects.in_bulk(others) if others else {}  # a step moved to another plan
        for e in events:
            if e.step_id in self.steps:
                e.step = PlanStep.from_db("default", list(STEP_FIELDS), self.steps[e.step_id])
            elif e.step_id:
                e.step = elsewhere.get(e.step_id)
        return events

    def versions_refresh(self, plan: Plan) -> None:
        self.versions = plan_versions(plan)
        later = [v for v in self.versions if v.version > plan.version and v.previous_id == plan.pk]
        self.next_version = later[0] if later else None

    def baseline(self) -> None:
        self.statements_compile()
        plan = Plan.objects.get(pk=self.plan_id)
        rows = self.steps_read.rows()
        self.steps = {r[0]: r for r in rows}
        self.step_order = [r[0] for r in rows]
        self.plan_state = (plan.status, plan.approval_mode)
        self.last_event_id = plan.events.aggregate(m=Max("pk"))["m"] or 0
        self.calls_state = self.calls_now(plan)
        self.validated_refresh(plan)
        self.versions_refresh(plan)

    def calls_now(self, plan: Plan) -> tuple[Any, ...]:
        agg = LLMCall.objects.filter(plan=plan).aggregate(n=Count("pk"), m=Max("pk"))
        return (agg["n"], agg["m"])

    def validated_refresh(self, plan: Plan) -> None:
        validated = plan.events.filter(kind=PlanEvent.Kind.VALIDATED).order_by("-created_at", "-id").first()
        self.flags = validated.detail.get("flags", []) if validated else []
        self.diff = validated.detail.get("diff") if validated else None

    def changed(self, audience: str, name: str, key: Any) -> bool:
        """Whether this audience was last sent this section with another key (then remember this one)."""
        if self.sections.get((audience, name)) == key:
            return False
        self.sections[(audience, name)] = key
        return True

    def render_changes(self, ids: set[int], audiences: set[str]) -> dict[str, str]:
        # The plan's columns first (cheap); the plan with its agent only when the header must be rendered.
        self.statements_compile()
        plan_rows = self.plan_read.rows()
        if not plan_rows:
            raise Plan.DoesNotExist(self.plan_id)
        plan_row = plan_rows[0]
        plan = Plan.from_db("default", list(PLAN_FIELDS), plan_row)
        rows = self.steps_read.rows()
        plan_state = (plan.status, plan.approval_mode)
        order = [r[0] for r in rows]
        whole_steps = order != self.step_order  # steps added, removed or reordered: send the whole list
        all_rows = plan_state != self.plan_state  # the plan's status decides which buttons every row has
        changed_ids = [r[0] for r in rows if all_rows or self.steps.get(r[0]) != r]
        self.steps = {r[0]: r for r in rows}
        self.step_order, self.plan_state = order, plan_state
        status_at = STEP_FIELDS.index("status")
        done = steps_done((r[status_at] for r in rows), plan_status=plan.status)
        graph_state = tuple(tuple(r[i] for i in GRAPH_AT) for r in rows)
        graph_changed = graph_state != self.graph_state
        self.graph_state = graph_state

        new_events = self.events_new()
        kinds = {e.kind for e in new_events}
        if PlanEvent.Kind.VALIDATED in kinds:
            self.validated_refresh(plan)
        planning = bool(kinds & PLANNING_KINDS) or all_rows

        if planning:
            self.versions_refresh(plan)
        header_key = (plan_row, done, len(rows), tuple(self.flags), self.next_version.pk if self.next_version else None)
        if planning or any(self.sections.get((a, "header")) != header_key for a in audiences):
            plan = Plan.objects.select_related("agent", "goal", "previous").get(pk=self.plan_id)
        context: dict[str, Any] = {"plan": plan, "flags": self.flags, "diff": self.diff, "done": done, "total": len(rows),
                                   "withdrawn": plan_withdrawn(plan)}
        if planning:
            attempts = list(plan.events.filter(kind=PlanEvent.Kind.ATTEMPT_REJECTED).order_by("-created_at", "-id")[:20])
            context["attempts"] = list(reversed(attempts))
            calls_state = self.calls_now(plan)
            if calls_state != self.calls_state:
                self.calls_state = calls_state
                calls = plan_calls_page(plan, 1)
                context |= {"calls": calls.object_list, "calls_page": calls}
        context |= {"versions": self.versions, "next_version": self.next_version,
                    "agent": plan.agent if "agent" in plan._state.fields_cache else None}
        if whole_steps:
            steps = plan_steps(plan)
        else:  # built from the columns already read; only an approver's name costs one more query
            steps = [PlanStep.from_db("default", list(STEP_FIELDS), self.steps[pk]) for pk in changed_ids]
            approver_ids = {s.approved_by_id for s in steps if s.approved_by_id}
            if approver_ids:
                approvers = User.objects.in_bulk(approver_ids)
                for s in steps:
                    if s.approved_by_id:
                        s.approved_by = approvers.get(s.approved_by_id)
        # The graph shows no buttons: the same for everyone, drawn when a step's status, words or links changed.
        graph = ""
        if graph_changed:
            every = steps if whole_steps else [PlanStep.from_db("default", list(STEP_FIELDS), r) for r in rows]
            graph = plan_graph_svg(plan, every, True)
        # Timeline entries are the same for everyone: rendered once, newest on top after prepending.
        entries = "".join(render_to_string("planning/plan_detail.html#event", {"e": e, "prepend": True})
                          for e in new_events)

        out: dict[str, str] = {}
        for audience in sorted(audiences):
            parts: list[str] = []
            if self.changed(audience, "header", header_key):
                parts.append(render_for("planning/plan_detail.html#header", context, audience))
            if whole_steps:
                parts.append(render_for("planning/plan_detail.html#steps", context | {"steps": steps}, audience))
            else:
                parts.extend(render_for("planning/plan_detail.html#step", context | {
                    "step": s, "rollback": audience == OPERATOR and step_rollback_possible(s, agent_id=plan.agent_id),
                }, audience) for s in steps)
            if planning and self.changed(audience, "versions", tuple((v.pk, v.status) for v in self.versions)):
                parts.append(render_for("planning/plan_detail.html#versions", context, audience))
            if "attempts" in context:
                parts.append(render_for("planning/plan_detail.html#attempts", context, audience))
            if "calls_page" in context:
                # Only pages showing the first page of calls have this tbody's id.
                parts.append(render_for("planning/plan_detail.html#calls", context, audience))
            parts.append(graph)
            parts.append(entries)
            out[audience] = "".join(parts).strip()
        return out


class AgentLivePage(LivePage):
    """The agent page's sections, sent when their HTML differs from what was last pushed."""

    def __init__(self, key: str, agent_id: int) -> None:
        super().__init__(key)
        self.agent_id = agent_id
        self.last: dict[str, str] = {}

    def concerns(self, message: dict[str, Any]) -> set[int]:
        return {self.agent_id} if self.agent_id in message["agents"] else set()

    def render_changes(self, ids: set[int], audiences: set[str]) -> dict[str, str]:
        context = agent_context(self.agent_id)
        out = {}
        for audience in audiences:
            html = render_for("planning/agent_live.html", context, audience)
            out[audience] = "" if self.last.get(audience) == html else html
            self.last[audience] = html
        return out


# --- feeds and the hub -----------------------------------------------------------------------------------------


class Feed:
    """The clients of one page in this process, and the render loop that serves them all."""

    def __init__(self, hub: LiveHub, page: LivePage) -> None:
        self.hub = hub
        self.page = page
        self.clients: dict[LiveConsumer, str] = {}
        self.pending: set[int] = set()
        self.task: asyncio.Task[None] | None = None
        self.generation = 0
        self.ready = False

    def notice(self, message: dict[str, Any]) -> None:
        ids = self.page.concerns(message)
        if ids:
            self.pending |= ids
            self.kick()

    def kick(self) -> None:
        if self.ready and self.pending and (self.task is None or self.task.done()):
            self.task = asyncio.ensure_future(self.run())

    async def run(self) -> None:
        while self.pending and self.clients:
            ids, self.pending = self.pending, set()
            self.generation += 1
            generation = self.generation
            audiences = set(self.clients.values())
            try:
                payloads = await database_sync_to_async(self.page.render_changes)(ids, audiences)
            except ObjectDoesNotExist:
                await asyncio.gather(*(c.close(code=CLOSE_NOT_FOUND) for c in list(self.clients)))
                return
            except Exception:
                logger.exception("rendering a live update of %s failed", self.page.key)
                continue
            sends = [client.push(payloads.get(audience, ""), generation)
                     for client, audience in list(self.clients.items()) if payloads.get(audience)]
            if sends:
                await asyncio.gather(*sends, return_exceptions=True)


class LiveHub:
    """This process's one listener for changes, and its open pages' feeds."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.feeds: dict[str, Feed] = {}
        self.shared = events.layer_is_shared()
        self.layer: Any = get_channel_layer() if self.shared else None
        self.channel = ""
        self.healthy = True
        self.tasks: list[asyncio.Task[None]] = []
        self.seqs: dict[str, int] = {}
        self.pongs: dict[int, asyncio.Future[None]] = {}
        self.relay: asyncio.DatagramTransport | None = None
        self.relay_path = ""
        # Listeners that are not pages (the external agents' long polls and sockets): which agents and plans
        # they follow, and what to call when one changes.
        self.watchers: dict[object, tuple[frozenset[int], frozenset[int], Callable[[], None]]] = {}

    # lifecycle

    async def start(self) -> None:
        if self.shared:
            try:
                self.channel = await self.layer.new_channel("live-hub.")
                await self.layer.group_add(events.LIVE_GROUP, self.channel)
            except Exception as exc:
                raise LayerUnavailable(str(exc)) from exc
            self.tasks = [asyncio.ensure_future(self.receive_loop()), asyncio.ensure_future(self.ping_loop())]
        else:
            await self.relay_start()
        events.publisher.local = (self.loop, self.deliver)

    async def stop(self) -> None:
        if events.publisher.local is not None and events.publisher.local[0] is self.loop:
            events.publisher.local = None
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(BaseException):
                await task
        if self.shared and self.channel:
            with contextlib.suppress(Exception):
                await self.layer.group_discard(events.LIVE_GROUP, self.channel)
        if self.relay is not None:
            self.relay.close()
            with contextlib.suppress(OSError):
                os.unlink(self.relay_path)

    async def relay_start(self) -> None:
        """Embedded stack: listen for the changes other processes make (see planner_site.events)."""
        if not hasattr(socket, "AF_UNIX"):
            return
        relay_path = events.live_relay_path()
        try:
            relay_path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            logger.warning("live updates from other processes are off: no folder for %s (%s)", relay_path, exc)
            return
        path = str(relay_path)
        if os.path.exists(path):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                probe.connect(path)
            except OSError:  # a stale file: its process is gone
                with contextlib.suppress(OSError):
                    os.unlink(path)
            else:
                logger.warning("another process already relays live updates at %s; this one gets only its own", path)
                return
            finally:
                probe.close()
        hub = self

        class RelayProtocol(asyncio.DatagramProtocol):
            def datagram_received(self, data: bytes, addr: Any) -> None:
                try:
                    raw = json.loads(data)
                except ValueError:
                    return
                message = events.message_parse(raw)
                if message is not None:
                    hub.deliver(message)

        try:
            transport, _ = await self.loop.create_datagram_endpoint(RelayProtocol, local_addr=path, family=socket.AF_UNIX)
        except OSError as exc:
            logger.warning("live updates from other processes are off: cannot listen at %s (%s)", path, exc)
            return
        self.relay, self.relay_path = transport, path

    # messages

    def deliver(self, message: dict[str, Any]) -> None:
        for feed in list(self.feeds.values()):
            feed.notice(message)
        agents, plans = set(message["agents"]), set(message["plans"])
        for watched_agents, watched_plans, notify in list(self.watchers.values()):
            if agents & watched_agents or plans & watched_plans:
                notify()

    def note_sequence(self, message: dict[str, Any]) -> bool:
        """False when messages from this publisher were lost since the last one seen."""
        last = self.seqs.get(message["src"])
        self.seqs[message["src"]] = max(message["seq"], last or 0)
        return not message["gap"] and (last is None or message["seq"] <= last + 1)

    async def receive_loop(self) -> None:
        while True:
            try:
                raw = await self.layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("receiving live updates failed")
                await asyncio.sleep(PING_SECONDS)
                continue
            if raw.get("type") == "live.ping":
                pong = self.pongs.pop(int(raw.get("n", 0)), None)
                if pong is not None and not pong.done():
                    pong.set_result(None)
                continue
            message = events.message_parse(raw)
            if message is None:
                continue
            if message["src"] == events.publisher.src:
                continue  # this process's own change, delivered locally already
            in_order = self.note_sequence(message)
            self.deliver(message)
            if not in_order:
                logger.warning("live updates were lost (publisher %s); open pages resync", message["src"][:8])
                await self.resync()

    async def ping(self, n: int) -> bool:
        """Whether a ping sent to this hub's own channel comes back through the layer in time."""
        pong = self.loop.create_future()
        self.pongs[n] = pong
        try:
            await asyncio.wait_for(self.layer.send(self.channel, {"type": "live.ping", "n": n}), PING_TIMEOUT_SECONDS)
            await asyncio.wait_for(pong, PING_TIMEOUT_SECONDS)
        except asyncio.CancelledError:
            raise
        except Exception:
            return False
        finally:
            self.pongs.pop(n, None)
        return True

    async def ping_loop(self) -> None:
        """A heartbeat through the layer. While it fails, pages are told live updates are off (they retry
        with backoff, and get their full state when they are back); so a gap never leaves a page stale."""
        for n in itertools.count(1):
            await asyncio.sleep(PING_SECONDS)
            ok = await self.ping(n)
            if ok and not self.healthy:
                logger.warning("the channel layer answers again: open pages resync")
                self.healthy = True
                await self.resync()
            elif not ok and self.healthy:
                logger.warning("the channel layer does not answer: live updates paused, pages retry")
                self.healthy = False
                await self.close_all(CLOSE_LAYER_DOWN)

    async def close_all(self, code: int) -> None:
        clients = [c for feed in self.feeds.values() for c in feed.clients]
        await asyncio.gather(*(c.close(code=code) for c in clients), return_exceptions=True)

    async def resync(self) -> None:
        """Every open page reconnects and gets its full state; every watcher looks again."""
        for _agents, _plans, notify in list(self.watchers.values()):
            notify()
        await self.close_all(CLOSE_RESYNC)

    # feeds

    async def join(self, client: LiveConsumer, key: str, page_new: Callable[[], LivePage], audience: str) -> Feed:
        feed = self.feeds.get(key)
        if feed is None:
            feed = Feed(self, page_new())
            self.feeds[key] = feed
            try:
                await database_sync_to_async(feed.page.baseline)()
            except BaseException:
                self.feeds.pop(key, None)
                raise
            feed.ready = True
        feed.clients[client] = audience
        client.generation_min = feed.generation + 1
        return feed

    async def leave(self, client: LiveConsumer, feed: Feed) -> None:
        feed.clients.pop(client, None)
        if not feed.clients and self.feeds.get(feed.page.key) is feed:
            del self.feeds[feed.page.key]
            if feed.task is not None:
                feed.task.cancel()
        if not self.feeds and not self.watchers:
            await hub_stop(self)

    # watchers

    def watch(self, *, agents: set[int], plans: set[int], notify: Callable[[], None]) -> object:
        token = object()
        self.watchers[token] = (frozenset(agents), frozenset(plans), notify)
        return token

    async def unwatch(self, token: object) -> None:
        self.watchers.pop(token, None)
        if not self.feeds and not self.watchers:
            await hub_stop(self)


_hubs: dict[asyncio.AbstractEventLoop, asyncio.Future[LiveHub]] = {}


async def hub_get() -> LiveHub:
    """This loop's hub, started on first use; LayerUnavailable if it cannot listen (Redis down)."""
    loop = asyncio.get_running_loop()
    for old in [lp for lp in _hubs if lp.is_closed()]:
        del _hubs[old]
    future = _hubs.get(loop)
    if future is None:
        future = loop.create_future()
        _hubs[loop] = future
        hub = LiveHub(loop)
        try:
            await hub.start()
        except BaseException as exc:
            del _hubs[loop]
            future.set_exception(exc)
            future.exception()  # retrieved: the waiters below re-raise it
            raise
        future.set_result(hub)
    hub = await asyncio.shield(future)
    if not hub.healthy:
        raise LayerUnavailable("the channel layer does not answer the heartbeat")
    return hub


@contextlib.asynccontextmanager
async def changes_watched(*, agents: set[int], plans: set[int]) -> AsyncIterator[asyncio.Event | None]:
    """An event set whenever one of these agents or plans changes (from any process), cleared by the caller;
    None when this process cannot listen (the shared layer is down): then the caller polls."""
    try:
        hub = await hub_get()
    except Exception:  # LayerUnavailable, or Redis refusing the connection
        logger.warning("live updates unavailable; a watcher polls instead", exc_info=True)
        yield None
        return
    changed = asyncio.Event()
    token = hub.watch(agents=agents, plans=plans, notify=changed.set)
    try:
        yield changed
    finally:
        await hub.unwatch(token)


async def hub_stop(hub: LiveHub) -> None:
    future = _hubs.get(hub.loop)
    if future is not None and future.done() and not future.exception() and future.result() is hub:
        del _hubs[hub.loop]
    await hub.stop()


# --- consumers ---------------------------------------------------------------------------------------------------


class LiveConsumer(AsyncWebsocketConsumer):
    """One open page. Subclasses say which feed it joins and how its full state renders."""

    # No channel of its own (an alias with no layer): the hub listens for the whole process, so a
    # page opens without touching Redis, and one Redis outage does not fail every connect with a 500.
    channel_layer_alias = "live-pages-listen-through-the-hub"
    feed: Feed | None = None
    generation_min = 0

    async def connect(self) -> None:
        self.feed = None
        self.backlog: list[str] = []
        self.live = False
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.refuse(CLOSE_UNAUTHENTICATED)
            return
        self.audience = OPERATOR if await database_sync_to_async(user_can_decide)(user) else VIEWER
        self.query: MultiValueDict[str, str] = MultiValueDict()
        for k, v in parse_qsl(self.scope.get("query_string", b"").decode("latin-1")):
            self.query.appendlist(k, v)
        try:
            hub = await hub_get()
        except LayerUnavailable as exc:
            logger.warning("websocket refused while the channel layer is down: %s", exc)
            await self.refuse(CLOSE_LAYER_DOWN)
            return
        try:
            # Join first, render after: a change committed meanwhile is pushed, never lost.
            self.feed = await hub.join(self, self.page_key(), self.page_new, self.audience)
            html = await database_sync_to_async(self.render_all)()
        except ObjectDoesNotExist:
            if self.feed is not None:
                await hub.leave(self, self.feed)
                self.feed = None
            else:
                await self.leave_hub_if_idle(hub)
            await self.refuse(CLOSE_NOT_FOUND)
            return
        await self.accept()
        await self.send(text_data=html)
        self.live = True
        for text in self.backlog:
            await self.send(text_data=text)
        self.backlog = []

    async def leave_hub_if_idle(self, hub: LiveHub) -> None:
        if not hub.feeds and not hub.watchers:
            await hub_stop(hub)

    async def refuse(self, code: int) -> None:
        """Accept, then close with a code the page can read (a refused handshake only shows 1006)."""
        await self.accept()
        await self.close(code=code)

    async def disconnect(self, code: int) -> None:
        feed, self.feed = self.feed, None
        if feed is not None:
            await feed.hub.leave(self, feed)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """The pages only listen; a client message changes nothing."""

    async def push(self, text: str, generation: int) -> None:
        if generation < self.generation_min:
            return  # rendered before this page's full state was read
        if not self.live:
            self.backlog.append(text)
            return
        await self.send(text_data=text)

    def page_key(self) -> str:
        raise NotImplementedError

    def page_new(self) -> LivePage:
        raise NotImplementedError

    def render_all(self) -> str:
        raise NotImplementedError

    def render(self, template: str, context: dict[str, Any]) -> str:
        return render_for(template, context | {"user": self.scope["user"], "oob": True}, self.audience)


class DashboardConsumer(LiveConsumer):
    def page_key(self) -> str:
        return "dashboard"

    def page_new(self) -> LivePage:
        return DashboardLivePage(self.page_key())

    def render_all(self) -> str:
        rows, _ = dashboard_page(DashboardFilter.from_query(self.query))
        return self.render("planning/dashboard_full.html", {"rows": rows, "counts": dashboard_totals(),
                                                            "filters": DashboardFilter.from_query(self.query)})


class ObjectPageConsumer(LiveConsumer):
    """The page of one object, named by the route's `<kind>_id`: one feed per object."""

    kind = ""
    page_class: type[AgentLivePage] | type[PlanLivePage]

    def object_id(self) -> int:
        return int(self.scope["url_route"]["kwargs"][f"{self.kind}_id"])

    def page_key(self) -> str:
        return f"{self.kind}-{self.object_id()}"

    def page_new(self) -> LivePage:
        return self.page_class(self.page_key(), self.object_id())


class AgentConsumer(ObjectPageConsumer):
    kind = "agent"
    page_class = AgentLivePage

    def render_all(self) -> str:
        return self.render("planning/agent_live.html", agent_context(self.object_id()))


class PlanConsumer(ObjectPageConsumer):
    kind = "plan"
    page_class = PlanLivePage

    def render_all(self) -> str:
        context = plan_context(self.object_id(), events_page=self.query.get("events", 1),
                               calls_page=self.query.get("calls", 1))
        return self.render("planning/plan_live.html", context)


class UnknownPathConsumer(AsyncWebsocketConsumer):
    """Any other websocket path: closed with CLOSE_NOT_FOUND, not an error."""

    channel_layer_alias = LiveConsumer.channel_layer_alias

    async def connect(self) -> None:
        await self.accept()
        await self.close(code=CLOSE_NOT_FOUND)
