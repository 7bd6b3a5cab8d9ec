"""Issue 37 item 7: every public verb rides out a lost connection up to ``retry_for`` with
the replay rule fit for it, and RELIABILITY's replay table names every public verb.

The outage is a gate: a TCP proxy in front of the leg's server that, once closed, resets
every live connection and every new one (counting the attempts) until it is opened again.
Each verb is started while the gate is closed and the gate is opened only after the verb
met it (its attempt was counted), so the verb did ride an outage out; no timing is assumed.
Runs on both executors."""

from __future__ import annotations

import asyncio
import inspect
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

from conftest import wait_for
from echomq import App, FlowJob, Queue

pytestmark = pytest.mark.executors

DOCS = Path(__file__).resolve().parents[2] / "docs" / "RELIABILITY.md"


class Gate:
    """A TCP proxy on 127.0.0.1 in front of ``upstream`` (a port), on its own event loop in
    a thread, that can be closed (every connection reset, new ones too) and opened."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.port = 0
        self.closed = False
        self.refused = 0
        self._live: set[asyncio.BaseTransport] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def close(self) -> None:
        assert self._loop is not None

        def shut() -> None:
            self.closed = True
            for t in list(self._live):
                t.abort()

        self._loop.call_soon_threadsafe(shut)
        wait_for(lambda: not self._live, timeout=10)

    def open(self) -> None:
        self.closed = False

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stop.wait()
        server.close()
        for t in list(self._live):
            t.abort()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.closed:
            self.refused += 1
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:
            writer.transport.abort()
            return
        pair = (writer.transport, up_writer.transport)
        self._live.update(pair)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    if self.closed:
                        break
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                for t in pair:
                    t.abort()
                    self._live.discard(t)

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))


@pytest.fixture
def gate(redis_url: str) -> Iterator[Gate]:
    g = Gate(urlsplit(redis_url).port or 0)
    yield g
    g.stop()


@pytest.fixture
def gq(gate: Gate, qname: str, r: redis.Redis) -> Iterator[Queue]:
    q = Queue(qname, url=gate.url, retry_for=60)
    yield q
    q.close()


def through_outage(gate: Gate, verb: Callable[[], Any]) -> Any:
    """Run ``verb`` with the gate closed; open it once the verb met the outage (one of its
    connections was refused); the verb's answer (or what it raised, re-raised here)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = verb()
        except BaseException as exc:  # handed to the test's thread
            out["error"] = exc

    gate.close()
    before = gate.refused
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: gate.refused > before or not thread.is_alive(), timeout=30)
    finally:
        gate.open()
    thread.join(90)
    assert not thread.is_alive(), "the verb did not return after the outage"
    if "error" in out:
        raise out["error"]
    assert gate.refused > before, "the verb never met the outage"
    return out["value"]


# --------------------------------------------------------------------------- the verbs


def test_check_rides_out_an_outage(gate: Gate, gq: Queue) -> None:
    gq.enqueue(b"x")
    assert through_outage(gate, gq.check) == []


def test_counts_rides_out_an_outage(gate: Gate, gq: Queue) -> None:
    gq.enqueue(b"x")
    assert through_outage(gate, gq.counts)["pending"] == 1


def test_resume_and_pause_repeat_ride_out_an_outage(gate: Gate, gq: Queue) -> None:
    gq.repeat("tick", b"t", every_ms=3_600_000)
    assert through_outage(gate, lambda: gq.pause_repeat("tick")) is True
    assert through_outage(gate, lambda: gq.resume_repeat("tick")) is True
    assert not any(rep.paused for rep in gq.repeats())


def test_add_flow_rides_out_an_outage_and_lands_once(gate: Gate, gq: Queue) -> None:
    flow = FlowJob(b"parent", children=[FlowJob(b"a"), FlowJob(b"b")])
    added = through_outage(gate, lambda: gq.add_flow(flow))
    assert gq.job_state(added.parent_id) == "awaiting_children"
    assert gq.counts()["pending"] == 2
    assert gq.check() == []


def test_a_flow_whose_reply_was_lost_is_not_added_twice(gq: Queue, qname: str) -> None:
    """The resend rule itself: a flow_add that landed, answered by a resend, is found by its
    mark (a lost reply is a plan thrown ``Replay``; here the first copy is sent by hand)."""
    from echomq.protocol import compose as _compose
    from echomq.protocol.kernel import Keys, Replay

    flow = FlowJob(b"parent", children=[FlowJob(b"a")])
    plan = _compose.add_flow(Keys(qname), flow)
    first = next(plan)  # the flow_add call, alone in a list (a refusal comes back as a value)
    calls = first if isinstance(first, list) else [first]
    assert [gq._x.run(c) for c in calls] == ["ok"]  # type: ignore[attr-defined]
    probe = plan.throw(Replay(ConnectionError("lost")))  # its reply was lost
    with pytest.raises(StopIteration) as done:
        plan.send(gq._x.run(probe))  # type: ignore[attr-defined]
    assert done.value.value is not None
    assert gq.counts()["pending"] == 1


def test_clear_logs_rides_out_an_outage(gate: Gate, gq: Queue) -> None:
    """Resent (``Flags: replay``): a second copy leaves the same newest lines."""
    jid = gq.enqueue(b"x").id
    for line in ("a", "b", "c"):
        gq.add_log(jid, line)
    assert through_outage(gate, lambda: gq.clear_logs(jid, keep=1)) in (0, 2)
    assert gq.logs(jid) == [b"c"]


def test_propose_shards_rides_out_an_outage(gate: Gate, gq: Queue) -> None:
    """Resent (``Flags: replay``): a second copy of a stored layout finds it stored and
    answers it; a layout never shrinks or doubles."""
    names = [gq.name, gq.name + ".shard1.0", gq.name + ".shard2.0"]
    assert through_outage(gate, lambda: gq.propose_shards(names)) == names
    assert through_outage(gate, gq.shards) == names


def test_cancel_rides_out_an_outage(gate: Gate, gq: Queue) -> None:
    jid = gq.enqueue(b"x").id
    assert through_outage(gate, lambda: gq.cancel(jid)) in ("removed", "absent")
    assert gq.job_state(jid) == "absent"


def test_cancel_all_and_drain_ride_out_an_outage(gate: Gate, gq: Queue) -> None:
    for i in range(5):
        gq.enqueue(b"%d" % i)
    through_outage(gate, gq.cancel_all)
    assert gq.counts()["pending"] == 0
    for i in range(5):
        gq.enqueue(b"%d" % i)
    through_outage(gate, gq.drain)
    assert gq.counts()["pending"] == 0


def test_fire_due_rides_out_an_outage(gate: Gate, gq: Queue) -> None:
    gq.repeat("tick", b"t", every_ms=3_600_000)
    through_outage(gate, gq.fire_due)
    assert gq.check() == []


# --------------------------------------------------------------------------- the table


# Public methods that send no verb of their own to the server, and why.
NOT_SERVER_VERBS = {
    "Queue.close": "closes the client's connections; no server verb",
    "App.aclose": "closes the app's clients",
    "App.close": "closes the app's clients",
    "App.aqueue": "builds an AsyncQueue; no I/O",
    "App.queue": "builds a Queue; no I/O",
    "App.client": "the app's redis client; no I/O",
    "App.queues": "the queue names the app's tasks use; no I/O",
    "App.task": "a decorator; registers a handler, no I/O",
    "App.periodic": "a decorator; registers a schedule, no I/O",
    "App.flow_job": "builds a FlowJob; no I/O",
    "App.chain": "builds a Chain (its enqueue is an add_flow); no I/O",
    "App.group": "builds a Group (its enqueue is one enqueue per member); no I/O",
    "App.chord": "builds a Chord (its enqueue is an add_flow); no I/O",
    "App.batch_by_id": "a handle on a batch; nothing is read until it is used",
}
# The App's producer verbs and the Queue verb each one runs.
APP_VERBS = {
    "App.flow": "add_flow",
    "App.sync_periodic": "repeat",
    "App.result": "result",
    "App.aresult": "result",
    "App.wait_result": "wait",
    "App.await_result": "wait",
}


def public_verbs() -> set[str]:
    found = {
        f"Queue.{n}" for n, v in inspect.getmembers(Queue) if not n.startswith("_") and callable(v)
    }
    found |= {
        f"App.{n}" for n, v in inspect.getmembers(App) if not n.startswith("_") and callable(v)
    }
    return found


def replay_table() -> set[str]:
    """The verbs named in the first column of RELIABILITY's replay table."""
    lines = DOCS.read_text().split("### The replay policy", 1)[1].splitlines()
    rows: list[str] = []
    for line in lines:
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break  # the table ended
    names: set[str] = set()
    for line in rows[2:]:
        names |= set(re.findall(r"`([a-z_]+)`", line.split("|")[1]))
    return names


def test_the_replay_table_lists_every_public_verb() -> None:
    listed = replay_table()
    missing = []
    for verb in sorted(public_verbs()):
        if verb in NOT_SERVER_VERBS:
            continue
        name = APP_VERBS.get(verb, verb.split(".", 1)[1])
        if name not in listed:
            missing.append(verb)
    assert not missing, f"RELIABILITY's replay table does not list: {missing}"
    stale = set(NOT_SERVER_VERBS) - public_verbs()
    assert not stale, f"not public verbs any more: {stale}"
    assert set(APP_VERBS) <= public_verbs()
