"""The sans-I/O core without a server: enqueue's replay :data:`~echomq.protocol.calls.Plan`
driven by a scripted fake, the way the executor drives it (``send`` a decoded reply, ``throw`` a
:class:`~echomq.protocol.calls.Replay` when a reply was lost).

The fake models just enough of ``enqueue.lua`` to answer as the server would: a row per
admitted id, and the ``<id>:<nonce>`` replay marker an admission leaves when the caller may
resend. What is asserted is the plan's side: which calls it yields, that a resend is the
same call (same id, same nonce), and the receipt it returns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from echomq import ids
from echomq.errors import InvalidArgument, InvalidId
from echomq.protocol import calls as _p
from echomq.protocol import produce as _produce
from echomq.protocol.joboptions import NO_OPTIONS, JobOptions, job_options
from echomq.protocol.kernel import Call, Enqueued, Keys, Replay

LOST = object()  # the server applied the call, its reply never came back
DROPPED = object()  # the request never reached the server


class FakeServer:
    """Answers the ``enqueue``/``enqueue_many`` scripts like the Lua (admission, duplicate,
    replay markers); anything else is an error in the test."""

    def __init__(self) -> None:
        self.rows: dict[str, bytes] = {}
        self.markers: set[str] = set()
        self.applied = 0

    def _admit(
        self, jid: str, data: bytes, mode: str, flags: str, replay_ms: int, nonce: str
    ) -> str:
        # The id is the marker (include/admit.lua): a resend of a minted id due now, sent
        # without a nonce, landed before if its row is there (the fake never deletes one).
        by_id = "f" in flags and mode == "now" and 0 < replay_ms <= _produce.ID_REPLAY_MS
        if by_id and not nonce and "r" in flags and jid in self.rows:
            return "replayed"
        # Only a resend ('r') looks for the marker its first copy left (include/admit.lua).
        if nonce and "r" in flags and f"{jid}:{nonce}" in self.markers:
            return "replayed"
        if nonce and "r" in flags and f"{jid}:{nonce}:s" in self.markers:
            return "replayed:scheduled"
        if jid in self.rows:
            return "duplicate"
        self.rows[jid] = data
        verdict = "enqueued" if mode == "now" else "scheduled"
        if replay_ms > 0 and nonce:
            self.markers.add(f"{jid}:{nonce}" + (":s" if verdict == "scheduled" else ""))
        return verdict

    def reply(self, call: Call[Any]) -> Any:
        self.applied += 1
        assert call.script is not None
        if call.script.name == "enqueue":
            _, jid, data, _, mode, _, flags, replay_ms, nonce, *_ = call.args
            return self._admit(
                str(jid), bytes(data), str(mode), str(flags), int(replay_ms), str(nonce)
            )
        if call.script.name == "enqueue_many":
            _, _, mode, _, replay_ms, nonce, flags, _priority, _ttl, *flat = call.args
            pairs = zip(flat[::2], flat[1::2], strict=True)
            return [
                self._admit(str(j), bytes(d), str(mode), str(flags), int(replay_ms), str(nonce))
                for j, d in pairs
            ]
        raise AssertionError(f"unexpected script {call.script.name}")


def drive(plan: Any, outcomes: list[object], server: FakeServer) -> tuple[Any, list[Any]]:
    """Run ``plan`` as the executor does; the n-th step meets ``outcomes[n]`` (``None``: a
    normal reply). Returns the plan's result and every step it yielded."""
    steps: list[Any] = []
    step = next(plan)
    try:
        for outcome in [*outcomes, *([None] * 10)]:
            steps.append(step)
            calls = step if isinstance(step, list) else [step]
            if outcome is DROPPED:
                step = plan.throw(Replay(ConnectionError("request lost")))
                continue
            replies = [server.reply(c) for c in calls]
            if outcome is LOST:
                step = plan.throw(Replay(ConnectionError("reply lost")))
                continue
            decoded = [c.decode(r) for c, r in zip(calls, replies, strict=True)]
            step = plan.send(decoded if isinstance(step, list) else decoded[0])
    except StopIteration as stop:
        return stop.value, steps
    raise AssertionError("the plan never finished")


K = Keys("orders")


def as_resend(call: Any, flags_at: int) -> Any:
    """``call`` as its resend: the same script, keys and arguments, flagged 'r'."""
    args = list(call.args)
    args[flags_at] = str(args[flags_at]) + "r"
    return dataclasses.replace(call, args=tuple(args))


def test_lost_reply_then_resend_admits_the_job_once() -> None:
    server = FakeServer()
    result, steps = drive(_p.enqueue(K, b"cargo", replay_ms=60_000), [LOST], server)

    first, resend = steps
    assert first.script.name == "enqueue"
    jid = first.args[1]
    assert first.keys == (K.job(jid), K.meta)
    assert first.args[2] == b"cargo"
    # Minted here: the script skips the retired record, and a minted id due now stands for
    # its call, so it goes without a nonce (include/admit.lua "the id is the marker").
    assert first.args[6] == "f"
    assert first.args[8] == "", "the minted id is the call's identity"
    # The call alone is not blindly resendable (its Flags say `once`); the plan resends it,
    # flagged as a resend, because the minted id makes a second copy harmless.
    assert first.replay is False
    assert resend == as_resend(first, 6)
    assert result == Enqueued(jid, "enqueued")
    assert server.rows == {jid: b"cargo"}
    assert server.applied == 2


def test_a_resent_delayed_enqueue_answers_scheduled() -> None:
    server = FakeServer()
    result, steps = drive(_p.enqueue(K, b"later", delay_ms=5_000, replay_ms=60_000), [LOST], server)
    assert len(steps) == 2 and steps[1] == as_resend(steps[0], 6)
    assert steps[0].args[8], "a delayed call may have answered scheduled: it keeps a nonce"
    assert steps[0].args[4:6] == ("in", "5000")
    assert result == Enqueued(steps[0].args[1], "scheduled")


def test_a_request_lost_before_the_server_is_sent_again() -> None:
    server = FakeServer()
    result, steps = drive(_p.enqueue(K, b"x", replay_ms=60_000), [DROPPED], server)
    assert len(steps) == 2 and steps[1] == as_resend(steps[0], 6)
    assert result == Enqueued(steps[0].args[1], "enqueued")
    assert len(server.rows) == 1


def test_without_markers_a_minted_resend_knows_its_own_duplicate() -> None:
    # replay_ms=0: no nonce, no marker. The resend finds the row its first copy wrote; the
    # id was minted by this call, so that duplicate is our own job: enqueued.
    server = FakeServer()
    result, steps = drive(_p.enqueue(K, b"x"), [LOST, None], server)
    assert steps[0].args[8] == ""
    assert steps[1] == as_resend(steps[0], 6)
    assert result == Enqueued(steps[0].args[1], "enqueued")
    assert len(server.rows) == 1


def test_a_minted_id_that_collides_is_minted_again() -> None:
    # No lost reply: "duplicate" for a minted id is another process's job, not ours.
    server = FakeServer()
    plan = _p.enqueue(K, b"mine")
    first = next(plan)
    server.rows[first.args[1]] = b"someone else's"
    steps = [first]
    second = plan.send(first.decode(server.reply(first)))
    steps.append(second)
    with pytest.raises(StopIteration) as stop:
        plan.send(second.decode(server.reply(second)))
    assert second.args[1] != first.args[1]
    assert stop.value.value == Enqueued(second.args[1], "enqueued")
    assert server.rows[first.args[1]] == b"someone else's"


def test_a_caller_id_answers_duplicate_after_a_lost_reply_without_markers() -> None:
    jid = ids.mint()
    server = FakeServer()
    result, _ = drive(_p.enqueue(K, b"x", id=jid), [LOST], server)
    assert result == Enqueued(jid, "duplicate")  # the caller's id is the receipt


def test_enqueue_many_resends_the_whole_pipeline_once() -> None:
    server = FakeServer()
    given = ids.mint()
    plan = _p.enqueue_many(K, [b"a", (given, b"b"), b"c"], replay_ms=60_000)
    result, steps = drive(plan, [LOST], server)
    first, resend = steps
    assert isinstance(first, list) and len(first) == 1
    assert first[0].args[6] == ""  # one id was the caller's: the retired record is read
    assert resend == [as_resend(first[0], 6)]
    assert [type(r) for r in result] == [Enqueued] * 3
    assert [r.status for r in result] == ["enqueued"] * 3  # type: ignore[union-attr]
    assert result[1] == Enqueued(given, "enqueued")
    assert len(server.rows) == 3


def test_a_settle_plan_refuses_to_be_resent() -> None:
    """complete_many does not catch Replay: a settle whose reply was lost is never resent
    (a second copy could answer gone for a job the first one completed)."""
    plan = _p.complete_many(K, [(ids.mint(), 1)])
    call = next(plan)
    assert call.script.name == "settle" and call.replay is False
    with pytest.raises(Replay):
        plan.throw(Replay(ConnectionError("reply lost")))


JID = ids.mint()


def test_enqueue_options_travel_as_a_named_tail() -> None:
    """Issue 38: the lean enqueue sends its 9 fixed arguments and no tail; each option set
    travels by name after '+opt' (enqueue.lua), never padded to its position."""
    lean = next(_p.enqueue(K, b"x"))
    assert len(lean.args) == 9
    call = next(_p.enqueue(K, b"x", JobOptions(priority=5, ttl_ms=60_000)))
    assert call.args[9:] == ("+opt", "priority", 5, "ttl_ms", 60_000)
    call = next(_p.enqueue(K, b"x", dedup="d", dedup_mode="throttle", dedup_ttl_ms=9))
    assert call.args[9:] == ("+opt", "dedup", "d", "dedup_mode", "throttle", "dedup_ttl_ms", 9)
    # A record is checked when it is made, with each keyword's error as before.
    with pytest.raises(InvalidArgument):
        JobOptions(priority=None)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        JobOptions(dedup_ttl_ms=5)
    with pytest.raises(InvalidId):
        JobOptions(id="nope")
    assert job_options(None, None, None, None, None, None, "simple", 0, None) is NO_OPTIONS
    # enqueue_many: '+opt', the number of pairs, the pairs, then the jobs.
    (call,) = next(_p.enqueue_many(K, [(JID, b"x")]))
    assert call.args[7:] == ("+opt", 0, JID, b"x")
    (call,) = next(_p.enqueue_many(K, [(JID, b"x")], JobOptions(priority=3, ttl_ms=9)))
    assert call.args[7:] == ("+opt", 2, "priority", 3, "ttl_ms", 9, JID, b"x")


@pytest.mark.parametrize(
    "make",
    [
        lambda: _p.enqueue(K, 123),  # type: ignore[arg-type]
        lambda: _p.enqueue(K, b"x", id="not-an-id"),
        lambda: _p.enqueue(K, b"x", delay_ms=5, at_ms=5),
        lambda: _p.enqueue_many(K, [b"ok", ("bad", b"x")]),
    ],
)
def test_bad_input_raises_before_the_first_call(make: Callable[[], Any]) -> None:
    plan = make()
    with pytest.raises((InvalidArgument, InvalidId)):
        next(plan)


def test_replay_nonces_ignore_the_apps_random_seed_and_differ_after_fork() -> None:
    """The enqueue's replay nonce is the call's identity across its resends: an application
    seeding ``random`` (common in tests and ML code) must not make two calls, or two forked
    processes, send the same one."""
    import os
    import random

    random.seed(7)
    first = _produce._nonce()
    random.seed(7)
    assert _produce._nonce() != first
    assert len(first) == 12 and int(first, 16) >= 0
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its generator was reseeded at fork
        os.write(write, _produce._nonce().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert child != _produce._nonce()
    assert len(child) == 12
