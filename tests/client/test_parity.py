"""Queue and AsyncQueue expose the same verbs with identical signatures; every AsyncQueue verb
is a coroutine function; and the verbs match the API contract (API.md)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest

import echomq
from echomq.protocol import calls as _protocol

# Every test that reaches a server runs on both executors (tests/conftest.py).
pytestmark = pytest.mark.executors

# Lifecycle methods differ by design (close / aclose, __enter__ / __aenter__).
LIFECYCLE = {"close", "aclose"}

API = Path(__file__).resolve().parents[2] / "docs" / "API.md"


def _documented() -> set[str]:
    """The verbs API.md shows called on a queue (``q.verb(`` / ``await q.verb(``)."""
    return set(re.findall(r"\bq\.(\w+)\(", API.read_text()))


def _verbs(cls: type) -> set[str]:
    return {
        name
        for klass in cls.__mro__[:-1]  # its own and its base classes' (FlowVerbs), not object's
        for name, member in vars(klass).items()
        if not name.startswith("_") and inspect.isfunction(member) and name not in LIFECYCLE
    }


def _shape(sig: inspect.Signature) -> list[tuple[str, Any, Any, Any]]:
    return [(p.name, p.kind, p.default, p.annotation) for p in sig.parameters.values()]


def test_same_verbs() -> None:
    assert _verbs(echomq.Queue) == _verbs(echomq.AsyncQueue)


def test_every_verb_is_documented_and_every_documented_verb_exists() -> None:
    """The API contract and the code name the same verbs, derived from both: a new verb is
    documented in API.md, and API.md shows no verb the queue lacks."""
    documented = _documented()
    assert _verbs(echomq.Queue) <= documented | LIFECYCLE
    assert documented - LIFECYCLE <= _verbs(echomq.Queue)


# Protocol calls that only the worker sends (its idle BLPOP), not part of the Queue API.
WORKER_ONLY = {"wake_wait"}


def test_every_protocol_verb_has_a_queue_method() -> None:
    verbs = {
        name
        for name, obj in vars(_protocol).items()
        if name[:1].islower()
        and inspect.isfunction(obj)
        # the verbs defined in protocol.calls and in protocol.admin (which calls re-exports)
        and obj.__module__ in {_protocol.__name__, "echomq.protocol.admin"}
    }
    assert verbs - WORKER_ONLY <= _verbs(echomq.Queue)


@pytest.mark.parametrize("verb", sorted(_verbs(echomq.Queue)))
def test_identical_signatures(verb: str) -> None:
    sync = inspect.signature(getattr(echomq.Queue, verb))
    asyn = inspect.signature(getattr(echomq.AsyncQueue, verb))
    assert _shape(sync) == _shape(asyn)
    assert sync.return_annotation == asyn.return_annotation


@pytest.mark.parametrize("verb", sorted(_verbs(echomq.AsyncQueue)))
def test_async_verbs_are_coroutine_functions(verb: str) -> None:
    assert inspect.iscoroutinefunction(getattr(echomq.AsyncQueue, verb))
    assert not inspect.iscoroutinefunction(getattr(echomq.Queue, verb))


def test_lifecycle() -> None:
    assert inspect.iscoroutinefunction(echomq.AsyncQueue.aclose)
    assert inspect.iscoroutinefunction(echomq.AsyncQueue.__aenter__)
    assert inspect.iscoroutinefunction(echomq.AsyncQueue.__aexit__)
    assert not inspect.iscoroutinefunction(echomq.Queue.close)
    assert hasattr(echomq.Queue, "__enter__") and hasattr(echomq.Queue, "__exit__")
    for cls in (echomq.Queue, echomq.AsyncQueue):
        assert isinstance(vars(cls)["name"], property)
        assert isinstance(vars(cls)["client"], property)
    # The constructors take the same arguments (the client's type differs by design).
    inits = [inspect.signature(cls.__init__) for cls in (echomq.Queue, echomq.AsyncQueue)]
    sync, asyn = ([(n, p.kind, p.default) for n, p in s.parameters.items()] for s in inits)
    assert sync == asyn
    assert [n for n, _, _ in sync] == [
        "self",
        "name",
        "url",
        "client",
        "max_payload",
        "retry_for",
        "durable",
        "executor",
        "shards",
    ]


POS = inspect.Parameter.POSITIONAL_OR_KEYWORD
KW = inspect.Parameter.KEYWORD_ONLY
EMPTY = inspect.Parameter.empty

# API.md's signatures: (name, kind, default) after self.
API_SIGNATURES: dict[str, list[tuple[str, Any, Any]]] = {
    "enqueue": [
        ("payload", POS, EMPTY),
        ("id", KW, None),
        ("group", KW, None),
        ("delay_ms", KW, None),
        ("at_ms", KW, None),
        ("dedup", KW, None),
        ("dedup_ttl_ms", KW, None),
        ("dedup_mode", KW, "simple"),
        ("priority", KW, 0),
        ("ttl_ms", KW, None),
        ("keep_logs", KW, None),
    ],
    "change_priority": [("id", POS, EMPTY), ("priority", POS, EMPTY)],
    "limit": [("n", POS, EMPTY)],
    "get_limit": [],
    "claim": [("lease_ms", KW, 30_000)],
    "claim_batch": [("n", POS, EMPTY), ("lease_ms", KW, 30_000)],
    "complete": [
        ("id", POS, EMPTY),
        ("token", POS, EMPTY),
        ("result", KW, None),
        ("keep_result_ms", KW, 0),
    ],
    "retry": [
        ("id", POS, EMPTY),
        ("token", POS, EMPTY),
        ("delay_ms", KW, EMPTY),
        ("max_attempts", KW, EMPTY),
        ("error", KW, EMPTY),
        ("keep_result_ms", KW, 0),
    ],
    "result": [("id", POS, EMPTY)],
    "wait": [("id", POS, EMPTY), ("timeout_s", KW, EMPTY)],
    "cancel": [
        ("id", POS, EMPTY),
        ("remove", KW, False),
        ("if_state", KW, None),
        ("if_attempts", KW, None),
    ],
    "delay": [("id", POS, EMPTY), ("token", POS, EMPTY), ("delay_ms", POS, EMPTY)],
    "extend": [("id", POS, EMPTY), ("token", POS, EMPTY), ("lease_ms", KW, EMPTY)],
    "extend_many": [("pairs", POS, EMPTY), ("lease_ms", KW, EMPTY)],
    "promote": [("limit", POS, 100)],
    "reap": [("limit", POS, 100)],
    "sweep_stalled": [("max_stalled", KW, 1), ("limit", KW, 100)],
    "reprocess": [("id", POS, EMPTY), ("delay_ms", KW, None), ("at_ms", KW, None)],
    "reprocess_all": [("state", POS, "dead"), ("delay_ms", KW, None), ("at_ms", KW, None)],
    "keep_completed": [("count", POS, EMPTY), ("age_ms", POS, None)],
    "keep_dead": [("count", POS, EMPTY), ("age_ms", POS, None)],
    "remove": [
        ("id", POS, EMPTY),
        ("children", KW, True),
        ("if_state", KW, None),
        ("if_attempts", KW, None),
    ],
    "run_now": [("id", POS, EMPTY)],
    "reschedule": [("id", POS, EMPTY), ("delay_ms", POS, None), ("at_ms", KW, None)],
    "update_payload": [("id", POS, EMPTY), ("payload", POS, EMPTY)],
    "cancel_all": [],
    "pending_size": [],
    "counts": [],
    "check": [],
    "get_job": [("id", POS, EMPTY)],
    "job_state": [("id", POS, EMPTY)],
    "pause": [],
    "resume": [],
    "is_paused": [],
    "reassign": [("id", POS, EMPTY), ("lane", POS, EMPTY)],
    "lane_depth": [("lane", POS, EMPTY)],
    "lanes": [],
    "drain": [("include_scheduled", KW, False)],
    "obliterate": [("force", KW, False)],
    "add_log": [("id", POS, EMPTY), ("line", POS, EMPTY), ("keep", KW, None)],
    "logs": [("id", POS, EMPTY)],
    "clear_logs": [("id", POS, EMPTY), ("keep", KW, 0)],
    "repeat": [
        ("name", POS, EMPTY),
        ("payload", POS, EMPTY),
        ("every_ms", KW, None),
        ("cron", KW, None),
        ("tz", KW, "UTC"),
        ("group", KW, None),
        ("owner", KW, None),
        ("limit", KW, None),
        ("until_ms", KW, None),
    ],
    "unrepeat": [("name", POS, EMPTY)],
    "pause_repeat": [("name", POS, EMPTY)],
    "resume_repeat": [("name", POS, EMPTY)],
    "repeats": [],
    "fire_due": [("limit", POS, 100)],
}


@pytest.mark.parametrize("cls", [echomq.Queue, echomq.AsyncQueue], ids=lambda c: c.__name__)
@pytest.mark.parametrize("verb", sorted(API_SIGNATURES))
def test_signatures_follow_the_api(cls: type, verb: str) -> None:
    params = list(inspect.signature(getattr(cls, verb)).parameters.values())
    assert params[0].name == "self"
    assert [(p.name, p.kind, p.default) for p in params[1:]] == API_SIGNATURES[verb]


def test_browse_and_enqueue_many_start_as_the_api_says() -> None:
    for cls in (echomq.Queue, echomq.AsyncQueue):
        browse = list(inspect.signature(cls.browse).parameters.values())[1:]
        assert [(p.name, p.default) for p in browse[:2]] == [("state", "pending"), ("n", 50)]
        many = list(inspect.signature(cls.enqueue_many).parameters.values())[1:]
        assert many[0].name == "items" and many[0].kind == POS
        assert ("group", KW, None) in [(p.name, p.kind, p.default) for p in many]
