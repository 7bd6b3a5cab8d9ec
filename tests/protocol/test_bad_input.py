"""Bad input: every malformed argument raises its typed error and leaves the queue's keyspace
byte-identical, on a queue that already holds jobs in every state (Queue and AsyncQueue).

Payload limits, queue names and constructor arguments are in
test_bad_input_construction.py.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from bad_input_support import (
    ABSENT,
    LANE,
    Case,
    populate,
)

import echomq
from conftest import snapshot
from echomq import ids
from echomq.errors import (
    InvalidArgument,
    InvalidId,
    JobGone,
    KindError,
    StateError,
)

# Every test that reaches a server runs on both executors (tests/conftest.py).
pytestmark = pytest.mark.executors


@pytest.fixture
def loaded(anyq: Any, r: redis.Redis, qname: str) -> Iterator[tuple[Any, dict[str, Any]]]:
    jobs = populate(anyq)
    before = snapshot(r, qname)
    yield anyq, jobs
    # Whatever the test did, the queue is byte-identical and still sound.
    assert snapshot(r, qname) == before
    assert anyq.check() == []


BAD_IDS: list[Any] = [
    "JOB123",  # too short
    "JOB0KHTOWnGLuCx",  # too long
    "job0KHTOWnGLuC",  # lowercase namespace
    "J0B0KHTOWnGLuC",
    "JOB0KHTOWnGLu!",  # not base62
    "JOB" + "z" * 11,  # over 2**63 - 1
    "",
    123,
    None,
    b"JOB0KHTOWnGLuC",
]


ID_VERBS: dict[str, Callable[[Any, Any], Any]] = {
    "complete": lambda q, i: q.complete(i, 1),
    "retry": lambda q, i: q.retry(i, 1, delay_ms=0, max_attempts=3, error="e"),
    "delay": lambda q, i: q.delay(i, 1, 0),
    "extend": lambda q, i: q.extend(i, 1, lease_ms=1_000),
    "extend_many": lambda q, i: q.extend_many([(ABSENT, 1), (i, 1)], lease_ms=1_000),
    "reprocess": lambda q, i: q.reprocess(i),
    "remove": lambda q, i: q.remove(i),
    "run_now": lambda q, i: q.run_now(i),
    "change_priority": lambda q, i: q.change_priority(i, 1),
    "get_job": lambda q, i: q.get_job(i),
    "job_state": lambda q, i: q.job_state(i),
    "update_progress": lambda q, i: q.update_progress(i, "1"),
    "add_log": lambda q, i: q.add_log(i, "line"),
    "logs": lambda q, i: q.logs(i),
    "clear_logs": lambda q, i: q.clear_logs(i, keep=1),
    "reassign": lambda q, i: q.reassign(i, LANE),
    "enqueue": lambda q, i: q.enqueue(b"x", id=i),
    "enqueue_many": lambda q, i: q.enqueue_many([b"ok", (ABSENT, b"ok"), (i, b"x")]),
    "complete_many": lambda q, i: q.complete_many([(ABSENT, 1), (i, 1)]),
    "extend_leases": lambda q, i: q.extend_leases([(ABSENT, 1), (i, 1)], lease_ms=1_000),
    "cancel": lambda q, i: q.cancel(i),
    "reschedule": lambda q, i: q.reschedule(i, 1_000),
    "update_payload": lambda q, i: q.update_payload(i, b"new"),
    "result": lambda q, i: q.result(i),
    "wait": lambda q, i: q.wait(i, timeout_s=0),
    "errors": lambda q, i: q.errors(i),
    "children_values": lambda q, i: q.children_values(i),
    "ignored_failures": lambda q, i: q.ignored_failures(i),
    "dependencies": lambda q, i: q.dependencies(i),
}


# The parameters that carry job ids, and those that carry a lane name: every Queue verb
# taking one is in ID_VERBS / LANE_VERBS (test_every_id_and_lane_verb_is_tried), derived
# from the signatures so that a new verb is tried without anyone listing it.
ID_PARAMS = {"id", "parent_id", "pairs", "items"}


LANE_PARAMS = {"lane", "group"}


def _verbs_taking(params: set[str]) -> set[str]:
    return {
        name
        for klass in echomq.Queue.__mro__[:-1]  # its base class FlowVerbs too, not object
        for name, fn in vars(klass).items()
        if not name.startswith("_")
        and inspect.isfunction(fn)
        and params & set(inspect.signature(fn).parameters)
    }


@pytest.mark.parametrize("verb", sorted(ID_VERBS))
def test_malformed_ids(loaded: tuple[Any, dict[str, Any]], verb: str) -> None:
    q, _ = loaded
    for bad in BAD_IDS:
        if verb == "enqueue" and bad is None:
            continue  # id=None means "mint one"
        with pytest.raises(InvalidId):
            ID_VERBS[verb](q, bad)


BAD_LANES: list[Any] = ["", "*", "a b", "a{b}", "a:b", "x" * 129, "caf\u00e9", 5]


LANE_VERBS: dict[str, Callable[[Any, Any, dict[str, Any]], Any]] = {
    "enqueue": lambda q, g, j: q.enqueue(b"x", group=g),
    "enqueue_many": lambda q, g, j: q.enqueue_many([b"x"], group=g),
    "pause_lane": lambda q, g, j: q.pause_lane(g),
    "resume_lane": lambda q, g, j: q.resume_lane(g),
    "limit_lane": lambda q, g, j: q.limit_lane(g, 2),
    "limit_lane_none": lambda q, g, j: q.limit_lane(g, None),
    "weight_lane": lambda q, g, j: q.weight_lane(g, 2),
    "reassign": lambda q, g, j: q.reassign(j["pending"], g),
    "lane_depth": lambda q, g, j: q.lane_depth(g),
    "browse": lambda q, g, j: q.browse("pending", group=g),
    "clear_rate_limit": lambda q, g, j: q.clear_rate_limit(g),
    "rate_limit_lane": lambda q, g, j: q.rate_limit_lane(g, 2, 1_000),
    "rate_limit_ttl": lambda q, g, j: q.rate_limit_ttl(g),
    "repeat": lambda q, g, j: q.repeat("r", b"x", every_ms=1_000, group=g),
}


# Where None means "no lane" (the queue as a whole), not a bad name.
LANE_OPTIONAL = {
    "enqueue",
    "enqueue_many",
    "browse",
    "clear_rate_limit",
    "rate_limit_ttl",
    "repeat",
}


def test_every_id_and_lane_verb_is_tried() -> None:
    assert _verbs_taking(ID_PARAMS) == set(ID_VERBS)
    assert _verbs_taking(LANE_PARAMS) == set(LANE_VERBS) - {"limit_lane_none"}


@pytest.mark.parametrize("verb", sorted(LANE_VERBS))
def test_bad_lane_names(loaded: tuple[Any, dict[str, Any]], verb: str) -> None:
    q, jobs = loaded
    for bad in BAD_LANES:
        with pytest.raises(InvalidId):
            LANE_VERBS[verb](q, bad, jobs)
    if verb not in LANE_OPTIONAL:  # there None means "no lane"
        with pytest.raises(InvalidId):
            LANE_VERBS[verb](q, None, jobs)


# (label, call, error): each one must raise before any write.
CASES: list[tuple[str, Case, type[Exception]]] = [
    # non-JOB kinds, refused by the server
    ("kind", lambda q, j: q.enqueue(b"x", id=ids.mint("ORD")), KindError),
    ("kind-lane", lambda q, j: q.enqueue(b"x", id=ids.mint("ORD"), group=LANE), KindError),
    ("kind-delayed", lambda q, j: q.enqueue(b"x", id=ids.mint("PRT"), delay_ms=5), KindError),
    # wrong payload types
    ("payload-int", lambda q, j: q.enqueue(123), InvalidArgument),
    ("payload-dict", lambda q, j: q.enqueue({"a": 1}), InvalidArgument),
    ("payload-none", lambda q, j: q.enqueue(None), InvalidArgument),
    ("payload-list", lambda q, j: q.enqueue([b"x"]), InvalidArgument),
    ("many-int", lambda q, j: q.enqueue_many([b"ok", 123]), InvalidArgument),
    ("many-dict", lambda q, j: q.enqueue_many([b"ok", {"a": 1}]), InvalidArgument),
    ("many-bytes", lambda q, j: q.enqueue_many(b"abc"), InvalidArgument),
    ("many-str", lambda q, j: q.enqueue_many("abc"), InvalidArgument),
    ("many-pair-int", lambda q, j: q.enqueue_many([(ABSENT, 1)]), InvalidArgument),
    ("many-triple", lambda q, j: q.enqueue_many([(ABSENT, b"x", b"y")]), InvalidArgument),
    ("many-single", lambda q, j: q.enqueue_many([b"ok", (ABSENT,)]), InvalidArgument),
    ("result-int", lambda q, j: q.complete(j["active"], j["token"], result=5), InvalidArgument),
    # leases
    ("lease-0", lambda q, j: q.claim(lease_ms=0), InvalidArgument),
    ("lease-neg", lambda q, j: q.claim(lease_ms=-5), InvalidArgument),
    ("lease-float", lambda q, j: q.claim(lease_ms=1.5), InvalidArgument),
    ("lease-bool", lambda q, j: q.claim(lease_ms=True), InvalidArgument),
    ("lease-str", lambda q, j: q.claim(lease_ms="100"), InvalidArgument),
    ("lease-none", lambda q, j: q.claim(lease_ms=None), InvalidArgument),
    ("lease-huge", lambda q, j: q.claim(lease_ms=2**60), InvalidArgument),
    ("batch-lease-0", lambda q, j: q.claim_batch(2, lease_ms=0), InvalidArgument),
    ("extend-lease-0", lambda q, j: q.extend(j["active"], j["token"], lease_ms=0), InvalidArgument),
    (
        "extend-lease-float",
        lambda q, j: q.extend(j["active"], j["token"], lease_ms=10.0),
        InvalidArgument,
    ),
    (
        "extend_many-lease-0",
        lambda q, j: q.extend_many([(j["active"], j["token"])], lease_ms=0),
        InvalidArgument,
    ),
    (
        "extend_many-lease-bool",
        lambda q, j: q.extend_many([(j["active"], j["token"])], lease_ms=False),
        InvalidArgument,
    ),
    # unknown browse states
    ("browse-wait", lambda q, j: q.browse("wait"), InvalidArgument),
    ("browse-complete", lambda q, j: q.browse("complete"), InvalidArgument),
    # kept history (issue 24): bad settings and reprocess options
    ("keep-completed-negative", lambda q, j: q.keep_completed(-1), InvalidArgument),
    ("keep-completed-float", lambda q, j: q.keep_completed(1.5), InvalidArgument),
    ("keep-completed-age-zero", lambda q, j: q.keep_completed(5, age_ms=0), InvalidArgument),
    ("keep-completed-off-age", lambda q, j: q.keep_completed(0, age_ms=5), InvalidArgument),
    ("keep-dead-zero", lambda q, j: q.keep_dead(0), InvalidArgument),
    ("keep-dead-age", lambda q, j: q.keep_dead(5, age_ms=0), InvalidArgument),
    ("reprocess-delay-negative", lambda q, j: q.reprocess(j["dead"], delay_ms=-1), InvalidArgument),
    (
        "reprocess-delay-and-at",
        lambda q, j: q.reprocess(j["dead"], delay_ms=1, at_ms=1),
        InvalidArgument,
    ),
    ("reprocess-live", lambda q, j: q.reprocess(j["pending"]), StateError),
    ("browse-upper", lambda q, j: q.browse("PENDING"), InvalidArgument),
    ("browse-none", lambda q, j: q.browse(None), InvalidArgument),
    ("browse-lane-active", lambda q, j: q.browse("active", group=LANE), InvalidArgument),
    # n <= 0 and other counts
    ("batch-0", lambda q, j: q.claim_batch(0), InvalidArgument),
    ("batch-neg", lambda q, j: q.claim_batch(-1), InvalidArgument),
    ("batch-bool", lambda q, j: q.claim_batch(True), InvalidArgument),
    ("batch-float", lambda q, j: q.claim_batch(2.0), InvalidArgument),
    ("browse-0", lambda q, j: q.browse("pending", 0), InvalidArgument),
    ("browse-neg", lambda q, j: q.browse("dead", -3), InvalidArgument),
    ("promote-0", lambda q, j: q.promote(0), InvalidArgument),
    ("reap-0", lambda q, j: q.reap(0), InvalidArgument),
    ("reap-neg", lambda q, j: q.reap(-1), InvalidArgument),
    ("sweep-limit-0", lambda q, j: q.sweep_stalled(limit=0), InvalidArgument),
    ("sweep-max-0", lambda q, j: q.sweep_stalled(max_stalled=0), InvalidArgument),
    ("add_log-keep-neg", lambda q, j: q.add_log(j["pending"], "x", keep=-1), InvalidArgument),
    ("clear_logs-keep-neg", lambda q, j: q.clear_logs(j["pending"], keep=-1), InvalidArgument),
    ("clear_logs-keep-big", lambda q, j: q.clear_logs(j["pending"], keep=2**63), InvalidArgument),
    ("clear_logs-keep-str", lambda q, j: q.clear_logs(j["pending"], keep="1"), InvalidArgument),
    # delays
    ("delay_ms-neg", lambda q, j: q.enqueue(b"x", delay_ms=-1), InvalidArgument),
    ("at_ms-neg", lambda q, j: q.enqueue(b"x", at_ms=-1), InvalidArgument),
    ("delay_ms-float", lambda q, j: q.enqueue(b"x", delay_ms=1.5), InvalidArgument),
    ("many-delay-neg", lambda q, j: q.enqueue_many([b"x"], delay_ms=-1), InvalidArgument),
    (
        "retry-delay-neg",
        lambda q, j: q.retry(j["active"], j["token"], delay_ms=-1, max_attempts=3, error="e"),
        InvalidArgument,
    ),
    ("delay-neg", lambda q, j: q.delay(j["active"], j["token"], -1), InvalidArgument),
    ("delay-none", lambda q, j: q.delay(j["active"], j["token"], None), InvalidArgument),
    ("both", lambda q, j: q.enqueue(b"x", delay_ms=10, at_ms=10**12), InvalidArgument),
    ("both-zero", lambda q, j: q.enqueue(b"x", delay_ms=0, at_ms=0), InvalidArgument),
    ("many-both", lambda q, j: q.enqueue_many([b"x"], delay_ms=1, at_ms=1), InvalidArgument),
    # tokens
    ("token-0", lambda q, j: q.complete(j["active"], 0), InvalidArgument),
    ("token-neg", lambda q, j: q.complete(j["active"], -1), InvalidArgument),
    ("token-true", lambda q, j: q.complete(j["active"], True), InvalidArgument),
    ("token-str", lambda q, j: q.complete(j["active"], str(j["token"])), InvalidArgument),
    ("token-float", lambda q, j: q.complete(j["active"], float(j["token"])), InvalidArgument),
    (
        "retry-token-0",
        lambda q, j: q.retry(j["active"], 0, delay_ms=0, max_attempts=3, error="e"),
        InvalidArgument,
    ),
    ("delay-token-false", lambda q, j: q.delay(j["active"], False, 0), InvalidArgument),
    ("extend-token-neg", lambda q, j: q.extend(j["active"], -2, lease_ms=10), InvalidArgument),
    # max_attempts
    (
        "max_attempts-0",
        lambda q, j: q.retry(j["active"], j["token"], delay_ms=0, max_attempts=0, error="e"),
        InvalidArgument,
    ),
    (
        "max_attempts-bool",
        lambda q, j: q.retry(j["active"], j["token"], delay_ms=0, max_attempts=True, error="e"),
        InvalidArgument,
    ),
    # a sharded queue's layout (issue 43)
    ("layout-str", lambda q, j: q.propose_shards(q.name + ",x"), InvalidArgument),
    ("layout-empty", lambda q, j: q.propose_shards([]), InvalidArgument),
    ("layout-not-first", lambda q, j: q.propose_shards(["other", q.name]), InvalidArgument),
    ("layout-twice", lambda q, j: q.propose_shards([q.name, "s1", "s1"]), InvalidArgument),
    ("layout-bad-name", lambda q, j: q.propose_shards([q.name, "a b"]), InvalidId),
    ("layout-comma", lambda q, j: q.propose_shards([q.name, "a,b"]), InvalidId),
    ("layout-not-str", lambda q, j: q.propose_shards([q.name, 3]), InvalidId),
    (
        "layout-too-many",
        lambda q, j: q.propose_shards([q.name, *(f"s{i}" for i in range(300))]),
        InvalidArgument,
    ),
    # lane settings
    ("limit-0", lambda q, j: q.limit_lane(LANE, 0), InvalidArgument),
    ("limit-neg", lambda q, j: q.limit_lane(LANE, -1), InvalidArgument),
    ("limit-bool", lambda q, j: q.limit_lane(LANE, True), InvalidArgument),
    ("limit-float", lambda q, j: q.limit_lane(LANE, 2.0), InvalidArgument),
    ("weight-0", lambda q, j: q.weight_lane(LANE, 0), InvalidArgument),
    ("weight-neg", lambda q, j: q.weight_lane(LANE, -2), InvalidArgument),
    ("weight-bool", lambda q, j: q.weight_lane(LANE, True), InvalidArgument),
    # --- priorities (issue 24): 0..2**21, an int and not a bool
    ("priority-neg", lambda q, j: q.enqueue(b"x", priority=-1), InvalidArgument),
    ("priority-huge", lambda q, j: q.enqueue(b"x", priority=2**21 + 1), InvalidArgument),
    ("priority-float", lambda q, j: q.enqueue(b"x", priority=1.0), InvalidArgument),
    ("priority-bool", lambda q, j: q.enqueue(b"x", priority=True), InvalidArgument),
    ("priority-str", lambda q, j: q.enqueue(b"x", priority="1"), InvalidArgument),
    ("priority-none", lambda q, j: q.enqueue(b"x", priority=None), InvalidArgument),
    ("many-priority-neg", lambda q, j: q.enqueue_many([b"x"], priority=-1), InvalidArgument),
    ("many-priority-bool", lambda q, j: q.enqueue_many([b"x"], priority=False), InvalidArgument),
    ("many-priority-huge", lambda q, j: q.enqueue_many([b"x"], priority=2**22), InvalidArgument),
    ("keep-logs-zero", lambda q, j: q.enqueue(b"x", keep_logs=0), InvalidArgument),
    ("keep-logs-neg", lambda q, j: q.enqueue(b"x", keep_logs=-1), InvalidArgument),
    ("keep-logs-huge", lambda q, j: q.enqueue(b"x", keep_logs=10**15), InvalidArgument),
    ("keep-logs-float", lambda q, j: q.enqueue(b"x", keep_logs=2.0), InvalidArgument),
    ("keep-logs-bool", lambda q, j: q.enqueue(b"x", keep_logs=True), InvalidArgument),
    ("keep-logs-str", lambda q, j: q.enqueue(b"x", keep_logs="5"), InvalidArgument),
    ("many-keep-logs-zero", lambda q, j: q.enqueue_many([b"x"], keep_logs=0), InvalidArgument),
    ("many-keep-logs-bool", lambda q, j: q.enqueue_many([b"x"], keep_logs=False), InvalidArgument),
    ("change-priority-neg", lambda q, j: q.change_priority(j["pending"], -1), InvalidArgument),
    ("change-priority-bool", lambda q, j: q.change_priority(j["pending"], True), InvalidArgument),
    (
        "change-priority-huge",
        lambda q, j: q.change_priority(j["scheduled"], 2**21 + 1),
        InvalidArgument,
    ),
    ("change-priority-active", lambda q, j: q.change_priority(j["active"], 1), StateError),
    (
        "change-priority-lane-active",
        lambda q, j: q.change_priority(j["active_lane"], 1),
        StateError,
    ),
    ("change-priority-dead", lambda q, j: q.change_priority(j["dead"], 1), StateError),
    ("change-priority-gone", lambda q, j: q.change_priority(ABSENT, 1), JobGone),
    ("change-priority-done", lambda q, j: q.change_priority(j["done"], 1), JobGone),
    # --- the queue-wide concurrency limit (issue 24): a positive int, or None
    ("queue-limit-0", lambda q, j: q.limit(0), InvalidArgument),
    ("queue-limit-neg", lambda q, j: q.limit(-3), InvalidArgument),
    ("queue-limit-bool", lambda q, j: q.limit(True), InvalidArgument),
    ("queue-limit-float", lambda q, j: q.limit(2.0), InvalidArgument),
    ("queue-limit-str", lambda q, j: q.limit("2"), InvalidArgument),
    # extend_many with a malformed pair (the good pair before it is not extended either)
    (
        "pair-short",
        lambda q, j: q.extend_many([(j["active"], j["token"]), (j["active_lane"],)], lease_ms=9),
        InvalidArgument,
    ),
    (
        "pair-long",
        lambda q, j: q.extend_many([(j["active"], j["token"]), (j["lane"], 1, 2)], lease_ms=9),
        InvalidArgument,
    ),
    (
        "pair-list",
        lambda q, j: q.extend_many([(j["active"], j["token"]), [j["active_lane"], 1]], lease_ms=9),
        InvalidArgument,
    ),
    (
        "pair-str",
        lambda q, j: q.extend_many([(j["active"], j["token"]), "JOB0KHTOWnGLuC"], lease_ms=9),
        InvalidArgument,
    ),
    (
        "pair-token-0",
        lambda q, j: q.extend_many([(j["active"], j["token"]), (j["active_lane"], 0)], lease_ms=9),
        InvalidArgument,
    ),
    (
        "pair-bad-id",
        lambda q, j: q.extend_many([(j["active"], j["token"]), ("JOB1", 1)], lease_ms=9),
        InvalidId,
    ),
    # text that cannot be encoded (a lone surrogate) and non-str text
    ("payload-surrogate", lambda q, j: q.enqueue("ok \ud800"), InvalidArgument),
    ("many-surrogate", lambda q, j: q.enqueue_many(["ok", "\udc00"]), InvalidArgument),
    (
        "error-surrogate",
        lambda q, j: q.retry(j["active"], j["token"], delay_ms=0, max_attempts=3, error="\ud800"),
        InvalidArgument,
    ),
    (
        "error-bytes",
        lambda q, j: q.retry(j["active"], j["token"], delay_ms=0, max_attempts=3, error=b"e"),
        InvalidArgument,
    ),
    (
        "error-none",
        lambda q, j: q.retry(j["active"], j["token"], delay_ms=0, max_attempts=3, error=None),
        InvalidArgument,
    ),
    ("progress-surrogate", lambda q, j: q.update_progress(j["pending"], "\udfff"), InvalidArgument),
    ("progress-int", lambda q, j: q.update_progress(j["pending"], 50), InvalidArgument),
    ("log-surrogate", lambda q, j: q.add_log(j["pending"], "a\ud800b"), InvalidArgument),
    ("log-bytes", lambda q, j: q.add_log(j["pending"], b"line"), InvalidArgument),
    (
        "result-surrogate",
        lambda q, j: q.complete(j["active"], j["token"], result="\ud800"),
        InvalidArgument,
    ),
]


@pytest.mark.parametrize(("label", "call", "error"), CASES, ids=[c[0] for c in CASES])
def test_bad_input(
    loaded: tuple[Any, dict[str, Any]], label: str, call: Case, error: type[Exception]
) -> None:
    q, jobs = loaded
    with pytest.raises(error):
        call(q, jobs)


def test_kind_error_in_enqueue_many_is_a_verdict(loaded: tuple[Any, dict[str, Any]]) -> None:
    q, _ = loaded
    out = q.enqueue_many([(ids.mint("ORD"), b"x"), (ids.mint("USR"), b"y")])
    assert len(out) == 2
    assert all(isinstance(v, KindError) for v in out)


def test_errors_are_value_errors(loaded: tuple[Any, dict[str, Any]]) -> None:
    q, _ = loaded
    with pytest.raises(ValueError):
        q.complete("nope", 1)
    with pytest.raises(ValueError):
        q.claim(lease_ms=0)
