"""Hostile input: hypothesis throws arbitrary arguments at every public verb (ids, names,
payloads of any bytes and size, leases, counts, tokens, states, lanes, delays). Each call
either does what the protocol says or raises a typed ``EchoMQError``/``ValueError`` — and a
refused call leaves the queue's keyspace byte-identical. The queue stays sound throughout.

Then the data itself turns hostile: malformed rows planted straight into Redis (missing or
non-integer fields, keys of the wrong type, ghost ids in every set, ids that are not branded
ids) never crash a worker process: they are skipped or dead-lettered with a reason, and the
other jobs still complete. And a handler or task that asks for values beyond the protocol's
range (a 300-year retry delay, 2**60 attempts) cannot wedge a worker's settle batches.

The worker legs (values beyond the protocol, malformed rows) are in
test_hostile_worker.py.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import echomq
from conftest import SyncOverAsync, snapshot
from echomq import EchoMQError, Enqueued, Job, ids
from echomq.protocol.kernel import MAX_INT

MAX_PAYLOAD = 4096


LANES = ["tenant-a", "PRT0KHTOWnGLuC"]


NUMBERS = st.one_of(
    st.integers(-3, 5),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, 1, 2**41, 2**41 + 1, MAX_INT, MAX_INT + 1, 10**6, 10**6 + 1]),
    st.floats(),
    st.booleans(),
    st.none(),
    st.text(max_size=4),
    st.binary(max_size=4),
)


NAMES = st.one_of(
    st.sampled_from(LANES),
    st.from_regex(r"\A[A-Za-z0-9._-]{1,128}\Z"),
    st.text(max_size=140),
    st.sampled_from(["", "*", "emq", "a" * 128, "a" * 129, "a:b", "{x}", "é", "a b", "\x00"]),
    st.binary(max_size=8),
    st.integers(),
    st.none(),
)


WILD_IDS = st.one_of(
    st.builds(ids.encode, st.sampled_from(["JOB", "ORD", "PRT"]), st.integers(0, 2**63 - 1)),
    st.sampled_from(
        [
            "JOB" + "z" * 11,  # over 2**63 - 1
            "JOBAzL8n0Y58m8",  # 2**63
            "job0KHTOWnGLuC",
            "JOB0KHTOWnGLu!",
            "JOB0KHTOWnGLué",
            "JOB0KHTOWnGLuC\x00",
            "",
        ]
    ),
    st.text(max_size=20),
    st.binary(max_size=16),
    st.integers(),
    st.none(),
)


PAYLOADS = st.one_of(
    st.binary(max_size=512),
    st.text(max_size=200),
    st.binary(min_size=MAX_PAYLOAD - 1, max_size=MAX_PAYLOAD + 1),
    st.binary(max_size=64).map(bytearray),
    st.binary(max_size=64).map(memoryview),
    st.sampled_from(["\ud800", b"\r\n\x00", ""]),
    st.integers(),
    st.none(),
    st.lists(st.integers(), max_size=2),
)


STATES = st.one_of(
    st.sampled_from(["pending", "active", "scheduled", "dead", "completed", "wait"]),
    st.text(max_size=10),
    st.integers(),
    st.none(),
)


def mostly(valid: st.SearchStrategy[Any], wild: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Three times in four a value the verb accepts (so calls get through to the server and
    change the queue), else a wild one. (st.one_of would flatten the wild alternatives and
    pick among all of them alike.)"""
    return st.integers(0, 3).flatmap(lambda i: valid if i else wild)


def num(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return mostly(valid, NUMBERS)


LEASE = num(st.integers(1, 120_000))


DELAY = num(st.integers(0, 5_000))


COUNT = num(st.integers(1, 10))


LANE = mostly(st.sampled_from(LANES), NAMES)


PAYLOAD = mostly(st.binary(max_size=64), PAYLOADS)


TEXT = mostly(st.text(max_size=40), st.one_of(st.just("\ud800"), NUMBERS))


class World:
    """The queue under test and what the test knows of it: ids that exist, leases it holds."""

    def __init__(self, q: Any, r: redis.Redis, name: str) -> None:
        self.q, self.r, self.name = q, r, name
        self.known: list[str] = []
        self.held: list[tuple[str, int]] = []

    def job_id(self, draw: Any) -> Any:
        pool = self.known + [i for i, _ in self.held]
        if pool and draw(st.integers(0, 3)):
            return draw(st.sampled_from(pool))
        return draw(WILD_IDS)

    def token_for(self, draw: Any, job_id: Any) -> Any:
        tokens = [t for i, t in self.held if i == job_id]
        if tokens and draw(st.integers(0, 3)):
            return draw(st.sampled_from(tokens)) + draw(st.sampled_from([0, 0, 0, -1, 1]))
        return draw(mostly(st.integers(-1, 4), NUMBERS))

    def lease(self, draw: Any) -> tuple[Any, Any]:
        """(id, token) for a settle verb: often a lease the test holds (maybe stale by now)."""
        if self.held and draw(st.booleans()):
            job_id, token = draw(st.sampled_from(self.held))
            return job_id, token + draw(st.sampled_from([0, 0, 0, -1, 1]))
        job_id = self.job_id(draw)
        return job_id, self.token_for(draw, job_id)

    def pair(self, draw: Any) -> Any:
        job_id = self.job_id(draw)
        return draw(
            st.one_of(
                st.just((job_id, self.token_for(draw, job_id))),
                st.tuples(WILD_IDS, NUMBERS),
                st.just(job_id),
                st.tuples(WILD_IDS),
            )
        )


def _kw(draw: Any, **options: st.SearchStrategy[Any]) -> dict[str, Any]:
    """A random subset of keyword arguments (a missing one keeps its default)."""
    return {k: draw(v) for k, v in options.items() if draw(st.booleans())}


def _item(w: World, draw: Any) -> Any:
    return draw(
        st.one_of(
            PAYLOAD,
            st.tuples(st.just(w.job_id(draw)), PAYLOAD),
            st.tuples(st.just(ids.mint()), PAYLOAD),
            st.tuples(WILD_IDS, PAYLOADS, PAYLOADS),
        )
    )


def _items(w: World, draw: Any) -> Any:
    """enqueue_many's items: mostly a list of payloads and (id, payload) pairs."""
    if draw(st.integers(0, 5)) == 0:
        return draw(st.one_of(st.just(b"one"), NUMBERS))
    return [_item(w, draw) for _ in range(draw(st.integers(0, 4)))]


# wait()'s timeouts: never one that blocks the fuzz for long (a wild integer could be a day).
WAITS = [0, 0.01, -1, -0.5, float("nan"), 10**400, "1", None, b"x", True]


# Each verb: how to draw its (args, kwargs) from the world.
Builder = Callable[[World, Any], tuple[tuple[Any, ...], dict[str, Any]]]


VERBS: dict[str, Builder] = {
    "enqueue": lambda w, d: (
        (d(PAYLOAD),),
        _kw(
            d,
            id=st.one_of(st.none(), st.just(w.job_id(d)), st.just(ids.mint())),
            group=st.one_of(st.none(), LANE),
            delay_ms=st.one_of(st.none(), DELAY),
            at_ms=st.one_of(st.none(), NUMBERS),
            priority=NUMBERS,  # issue 24
            keep_logs=st.one_of(st.none(), COUNT),  # issue 38
        ),
    ),
    "enqueue_many": lambda w, d: (
        (_items(w, d),),
        _kw(
            d,
            group=st.one_of(st.none(), LANE),
            delay_ms=st.one_of(st.none(), DELAY),
            priority=NUMBERS,
            keep_logs=st.one_of(st.none(), COUNT),
        ),
    ),
    "claim": lambda w, d: ((), _kw(d, lease_ms=LEASE)),
    "claim_batch": lambda w, d: ((d(COUNT),), _kw(d, lease_ms=LEASE)),
    "complete": lambda w, d: (
        w.lease(d),
        _kw(d, result=st.one_of(st.none(), PAYLOAD)),
    ),
    "complete_many": lambda w, d: (([w.pair(d) for _ in range(d(st.integers(0, 3)))],), {}),
    "retry": lambda w, d: (
        w.lease(d),
        {
            "delay_ms": d(DELAY),
            "max_attempts": d(num(st.integers(1, 3))),
            "error": d(TEXT),
        },
    ),
    "delay": lambda w, d: ((*w.lease(d), d(DELAY)), {}),
    "extend": lambda w, d: (w.lease(d), {"lease_ms": d(LEASE)}),
    "extend_many": lambda w, d: (
        ([w.pair(d) for _ in range(d(st.integers(0, 3)))],),
        {"lease_ms": d(LEASE)},
    ),
    "promote": lambda w, d: ((d(COUNT),) if d(st.booleans()) else (), {}),
    "reap": lambda w, d: ((d(COUNT),) if d(st.booleans()) else (), {}),
    "sweep_stalled": lambda w, d: ((), _kw(d, max_stalled=COUNT, limit=COUNT)),
    "reprocess": lambda w, d: ((w.job_id(d),), {}),
    "remove": lambda w, d: ((w.job_id(d),), {}),
    "run_now": lambda w, d: ((w.job_id(d),), {}),
    "change_priority": lambda w, d: ((w.job_id(d), d(NUMBERS)), {}),
    "limit": lambda w, d: ((d(st.one_of(st.none(), COUNT, NUMBERS)),), {}),
    "browse": lambda w, d: (
        (d(mostly(st.sampled_from(["pending", "dead", "active", "scheduled"]), STATES)), d(COUNT)),
        _kw(d, group=st.one_of(st.none(), LANE)),
    ),
    "pending_size": lambda w, d: ((), {}),
    "counts": lambda w, d: ((), {}),
    "check": lambda w, d: ((), {}),
    "get_job": lambda w, d: ((w.job_id(d),), {}),
    "job_state": lambda w, d: ((w.job_id(d),), {}),
    "pause": lambda w, d: ((), {}),
    "resume": lambda w, d: ((), {}),
    "is_paused": lambda w, d: ((), {}),
    "pause_lane": lambda w, d: ((d(LANE),), {}),
    "resume_lane": lambda w, d: ((d(LANE),), {}),
    "limit_lane": lambda w, d: ((d(LANE), d(st.one_of(st.none(), COUNT))), {}),
    "weight_lane": lambda w, d: ((d(LANE), d(COUNT)), {}),
    "reassign": lambda w, d: ((w.job_id(d), d(LANE)), {}),
    "lane_depth": lambda w, d: ((d(LANE),), {}),
    "lanes": lambda w, d: ((), {}),
    "drain": lambda w, d: ((), _kw(d, include_scheduled=st.one_of(st.booleans(), NUMBERS))),
    "obliterate": lambda w, d: (
        (w.q.pause() if d(st.booleans()) else ()) or (),  # obliterate needs a paused queue
        _kw(d, force=st.one_of(st.booleans(), NUMBERS)),
    ),
    "update_progress": lambda w, d: ((w.job_id(d), d(TEXT)), {}),
    "add_log": lambda w, d: (
        (w.job_id(d), d(TEXT)),
        _kw(d, keep=num(st.integers(0, 3))),
    ),
    "logs": lambda w, d: ((w.job_id(d),), {}),
    "clear_logs": lambda w, d: ((w.job_id(d),), _kw(d, keep=num(st.integers(0, 3)))),
    "add_flow": lambda w, d: ((_flow(w, d, depth=2),), {}),
    "cancel": lambda w, d: (
        (w.job_id(d),),
        _kw(
            d,
            remove=st.one_of(st.booleans(), NUMBERS),
            if_state=st.one_of(st.none(), STATES),
            if_attempts=st.one_of(st.none(), num(st.integers(0, 3))),
        ),
    ),
    "cancel_all": lambda w, d: ((), {}),
    "children_values": lambda w, d: ((w.job_id(d),), {}),
    "ignored_failures": lambda w, d: ((w.job_id(d),), {}),
    "dependencies": lambda w, d: ((w.job_id(d),), {}),
    "errors": lambda w, d: ((w.job_id(d),), {}),
    "result": lambda w, d: ((w.job_id(d),), {}),
    "wait": lambda w, d: ((w.job_id(d),), {"timeout_s": d(st.sampled_from(WAITS))}),
    "dedup_holder": lambda w, d: ((d(mostly(st.text(min_size=1, max_size=20), NAMES)),), {}),
    "rate_limit": lambda w, d: ((d(COUNT), d(num(st.integers(1, 60_000)))), {}),
    "rate_limit_lane": lambda w, d: ((d(LANE), d(COUNT), d(num(st.integers(1, 60_000)))), {}),
    "rate_limit_ttl": lambda w, d: (
        (d(st.one_of(st.none(), LANE)),) if d(st.booleans()) else (),
        {},
    ),
    "clear_rate_limit": lambda w, d: (
        (d(st.one_of(st.none(), LANE)),) if d(st.booleans()) else (),
        {},
    ),
    "get_limit": lambda w, d: ((), {}),
    "shards": lambda w, d: ((), {}),
    "propose_shards": lambda w, d: (
        (
            d(
                st.one_of(
                    st.just([w.name, w.name + ".shard1.0"]),
                    st.lists(NAMES, max_size=3).map(lambda rest: [w.name, *rest]),
                    st.lists(NAMES, max_size=3),
                    NAMES,
                )
            ),
        ),
        {},
    ),
    "keep_completed": lambda w, d: (
        (d(st.one_of(st.none(), COUNT)),),
        _kw(d, age_ms=st.one_of(st.none(), num(st.integers(0, 10**9)))),
    ),
    "keep_dead": lambda w, d: (
        (d(st.one_of(st.none(), COUNT)),),
        _kw(d, age_ms=st.one_of(st.none(), num(st.integers(0, 10**9)))),
    ),
    "enable_events": lambda w, d: ((), _kw(d, maxlen=num(st.integers(1, 100)))),
    "disable_events": lambda w, d: ((), {}),
    "events": lambda w, d: (
        (),
        _kw(d, after=mostly(st.sampled_from(["0", "0-0", "$"]), NAMES), count=COUNT),
    ),
    "metrics": lambda w, d: (
        (d(mostly(st.sampled_from(["completed", "failed"]), STATES)),) if d(st.booleans()) else (),
        _kw(d, minutes=num(st.integers(1, 120))),
    ),
    "workers": lambda w, d: ((), {}),
    "extend_leases": lambda w, d: (
        ([w.pair(d) for _ in range(d(st.integers(0, 3)))],),
        {"lease_ms": d(LEASE)},
    ),
    "settle": lambda w, d: (
        (),
        _kw(
            d,
            completed=st.just([w.pair(d) for _ in range(d(st.integers(0, 2)))]),
            retried=st.just([(*w.lease(d), d(DELAY), d(num(st.integers(1, 3))), d(TEXT))]),
            n=mostly(st.integers(0, 3), NUMBERS),
            lease_ms=LEASE,
        ),
    ),
    "fire_due": lambda w, d: ((d(COUNT),) if d(st.booleans()) else (), {}),
    "pump": lambda w, d: ((d(COUNT),) if d(st.booleans()) else (), {}),
    "repeat": lambda w, d: (
        (d(mostly(st.sampled_from(["r1", "r2"]), NAMES)), d(PAYLOAD)),
        d(
            st.one_of(
                st.builds(dict, every_ms=num(st.integers(1, 10**7))),
                st.builds(dict, cron=mostly(st.sampled_from(["* * * * *", "0 3 * * 1"]), TEXT)),
                st.builds(dict, every_ms=NUMBERS, cron=TEXT, tz=TEXT, limit=NUMBERS),
            )
        ),
    ),
    "repeats": lambda w, d: ((), {}),
    "pause_repeat": lambda w, d: ((d(mostly(st.sampled_from(["r1", "r2"]), NAMES)),), {}),
    "resume_repeat": lambda w, d: ((d(mostly(st.sampled_from(["r1", "r2"]), NAMES)),), {}),
    "unrepeat": lambda w, d: ((d(mostly(st.sampled_from(["r1", "r2"]), NAMES)),), {}),
    "reprocess_all": lambda w, d: (
        (d(mostly(st.sampled_from(["dead", "completed"]), STATES)),) if d(st.booleans()) else (),
        _kw(d, delay_ms=st.one_of(st.none(), DELAY)),
    ),
    "reschedule": lambda w, d: ((w.job_id(d), d(st.one_of(st.none(), DELAY))), {}),
    "update_payload": lambda w, d: ((w.job_id(d), d(PAYLOAD)), {}),
}


# The verbs the fuzz does not call, and why. With VERBS it must name every public verb of
# Queue (test_every_verb_is_fuzzed_or_excused): a new verb is fuzzed or excused by name.
NOT_FUZZED = {
    "close": "a lifecycle call: it ends the queue under test",
}


def _flow(w: World, d: Any, depth: int) -> Any:
    """A flow node for add_flow: mostly well formed, sometimes with a wild field or child."""
    children = [_flow(w, d, depth - 1) for _ in range(d(st.integers(0, 2)))] if depth else []
    if d(st.integers(0, 5)) == 0:
        return d(st.one_of(NUMBERS, PAYLOADS))
    kw = _kw(
        d,
        id=st.one_of(st.none(), st.just(w.job_id(d))),
        group=st.one_of(st.none(), LANE),
        fail_parent=st.one_of(st.booleans(), NUMBERS),
        priority=NUMBERS,
    )
    try:
        return echomq.FlowJob(d(PAYLOAD), children=children, **kw)
    except (EchoMQError, ValueError, TypeError):
        return echomq.FlowJob(b"node", children=children)


def _bytes(p: Any) -> bytes:
    return p.encode() if isinstance(p, str) else bytes(p)


def _observe(w: World, verb: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
    """What a call that succeeded must have done (the protocol's promise), and what the world
    learns from it."""
    q = w.q
    if verb == "enqueue":
        assert isinstance(out, Enqueued) and out.status in ("enqueued", "scheduled", "duplicate")
        row = q.get_job(out.id)
        assert row is not None
        if out.status != "duplicate":
            assert row["payload"] == _bytes(args[0])  # verbatim, any bytes
        w.known.append(out.id)
    elif verb == "enqueue_many":
        assert isinstance(out, list) and len(out) == len(list(args[0]))
        for item, verdict in zip(args[0], out, strict=True):
            if isinstance(verdict, Enqueued):
                w.known.append(verdict.id)
                if verdict.status != "duplicate":
                    data = item[1] if isinstance(item, tuple) else item
                    assert q.get_job(verdict.id)["payload"] == _bytes(data)
            else:
                assert isinstance(verdict, echomq.KindError)
    elif verb in ("claim", "claim_batch"):
        jobs = [out] if isinstance(out, Job) else ([] if out is None else out)
        if verb == "claim_batch":
            assert len(jobs) <= args[0]
        for job in jobs:
            assert q.get_job(job.id)["attempts"] == str(job.token)
            assert q.job_state(job.id) == "active"
            w.held.append((job.id, job.token))
    elif verb == "complete":  # kept history (keep_completed) keeps the row as completed
        assert out is None and q.job_state(args[0]) in ("absent", "completed")
    elif verb == "remove":
        assert out is None and q.job_state(args[0]) == "absent"
    elif verb == "retry":
        assert out in ("scheduled", "dead")
        assert q.job_state(args[0]) == out
    elif verb == "delay":
        assert q.job_state(args[0]) in ("pending", "scheduled")
    elif verb == "extend":
        assert q.job_state(args[0]) == "active"
    elif verb in ("reprocess", "run_now"):
        assert q.job_state(args[0]) == "pending"
    elif verb == "change_priority":
        assert q.job_state(args[0]) in ("pending", "scheduled")
        field = q.get_job(args[0]).get("priority")
        assert field == (str(args[1]) if args[1] else None)
    elif verb in ("complete_many", "extend_many", "browse", "lanes"):
        assert isinstance(out, list) and all(isinstance(x, str) for x in out)
    elif verb == "counts":
        assert sorted(out) == sorted(
            ["pending", "active", "schedule", "dead", "completed", "failed", "kept"]
        )
        assert all(isinstance(v, int) and v >= 0 for v in out.values())
    elif verb == "job_state":
        assert out in (
            "pending",
            "active",
            "scheduled",
            "dead",
            "awaiting_children",
            "completed",
            "absent",
        )
    elif verb == "add_log":
        assert isinstance(out, int) and out >= 1
        assert q.logs(args[0])[-1] == args[1].encode()
    elif verb == "clear_logs":
        assert isinstance(out, int) and out >= 0
        assert len(q.logs(args[0])) <= kwargs.get("keep", 0)  # the newest keep, 0: none
    elif verb in ("shards", "propose_shards"):
        assert out == q.shards() and out[0] == q.name  # the stored layout, this queue first
    elif verb == "obliterate":
        assert q.counts()["pending"] == q.counts()["active"] == 0
    elif verb in ("promote", "reap", "drain", "pending_size", "lane_depth"):
        assert isinstance(out, int) and out >= 0


def run_hostile_calls(w: World, data: Any, calls: int) -> None:
    for _ in range(calls):
        verb = data.draw(st.sampled_from(sorted(VERBS)), label="verb")
        args, kwargs = VERBS[verb](w, data.draw)
        before = snapshot(w.r, w.name)
        try:
            out = getattr(w.q, verb)(*args, **kwargs)
        except (EchoMQError, ValueError, TimeoutError) as exc:
            # TimeoutError is wait()'s documented answer at its deadline, and no other's.
            assert not isinstance(exc, TimeoutError) or verb == "wait", exc
            after = snapshot(w.r, w.name)
            if verb == "wait" and isinstance(exc, (TimeoutError, echomq.JobFailed)):
                # Answers, not refusals: the wait left its waiter's marker (want:<id>).
                after = {k: v for k, v in after.items() if b":want:" not in k}
                before = {k: v for k, v in before.items() if b":want:" not in k}
            assert after == before, f"{verb}{args!r} {kwargs!r} raised {exc!r} but wrote"
            continue
        except Exception as exc:  # an untyped error is a finding
            raise AssertionError(f"{verb}{args!r} {kwargs!r} raised untyped {exc!r}") from exc
        _observe(w, verb, args, kwargs, out)
        assert w.q.check() == [], f"after {verb}{args!r} {kwargs!r}"


def populate(w: World) -> None:
    q = w.q
    for group in (None, *LANES):
        for _ in range(2):
            w.known.append(q.enqueue(b"seed", group=group).id)
    for job in q.claim_batch(3, lease_ms=60_000):
        w.held.append((job.id, job.token))
    held = q.claim(lease_ms=60_000)
    q.retry(held.id, held.token, delay_ms=0, max_attempts=1, error="seed")  # dead
    w.known += [held.id, q.enqueue(b"later", delay_ms=600_000).id]
    q.add_log(w.known[0], "seed")


_examples = itertools.count()


@contextlib.contextmanager
def fresh_world(kind: str, url: str, r: redis.Redis, qname: str) -> Iterator[World]:
    """A new queue per example: what hypothesis draws may depend on the world, so every
    example (and every replay while shrinking) must start from the same one."""
    name = f"{qname[:60]}-{next(_examples)}"
    if kind == "sync":
        q: Any = echomq.Queue(name, url=url, max_payload=MAX_PAYLOAD)
    else:
        q = SyncOverAsync(echomq.AsyncQueue(name, url=url, max_payload=MAX_PAYLOAD))
    w = World(q, r, name)
    try:
        populate(w)
        yield w
    finally:
        q.close()
        keys = list(r.scan_iter(match=f"emq:{{{name}}}:*", count=1000))
        if keys:
            r.delete(*keys)


def test_every_verb_is_fuzzed_or_excused() -> None:
    public = {
        name
        for klass in echomq.Queue.__mro__[:-1]  # its base class FlowVerbs too, not object
        for name, member in vars(klass).items()
        if not name.startswith("_") and inspect.isfunction(member)
    }
    assert not set(VERBS) & set(NOT_FUZZED)
    assert set(VERBS) | set(NOT_FUZZED) == public


@pytest.mark.parametrize("kind", ["sync", "async"])
@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_every_verb_under_hostile_arguments(
    kind: str, url: str, r: redis.Redis, qname: str, data: Any
) -> None:
    with fresh_world(kind, url, r, qname) as w:
        run_hostile_calls(w, data, calls=8)


@settings(max_examples=150, deadline=None)
@given(
    name=NAMES,
    max_payload=st.one_of(st.integers(-2, 2**70), NUMBERS),
)
def test_queue_construction_under_hostile_arguments(
    session_url: str, name: Any, max_payload: Any
) -> None:
    try:
        q = echomq.Queue(name, url=session_url, max_payload=max_payload)
    except (EchoMQError, ValueError):
        return
    assert re.fullmatch(r"[A-Za-z0-9._-]{1,128}", name) and name != "emq"
    assert isinstance(max_payload, int) and max_payload >= 1
    q.close()
