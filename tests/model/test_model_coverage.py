"""The model's verb coverage, derived from ``echomq.Queue`` (issue 38, item 5).

The machine of test_model.py records every public ``Queue`` method its rules, its checks
and its teardown call (tests/model/recording.py). ``TOUR`` runs each of its rules at least
once, through the same machine (every step checked against the model), and the verbs it
recorded, together with ``NOT_MODELLED``, must be exactly the public verbs of ``Queue``:

- a verb added to ``Queue`` with no rule driving it fails here until a rule drives it or
  ``NOT_MODELLED`` says why not and where it is tested;
- a rule added to the machine fails here until ``TOUR`` runs it;
- a verb listed as not modelled that the model drives after all fails here too.

The hypothesis runs of test_model.py draw from the same rules, so what the tour reaches is
what the random machine can reach.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis.stateful import INITIALIZE_RULE_MARKER, RULE_MARKER

from model.core import LONG, SHORT
from model.draws import ADMIN
from model.recording import public_verbs
from model.test_model import (  # noqa: F401  (module_server, session_url: the servers)
    ModelMachine,
    Steps,
    module_server,
    session_url,
)

pytestmark = pytest.mark.executors

ROOT = Path(__file__).resolve().parents[2]

# A verb the model does not drive, and where it is tested instead (a path under tests/ that
# calls it: checked below).
NOT_MODELLED: dict[str, str] = {
    "workers": "the worker registry needs live worker processes, not a model step: "
    "tests/runtime/test_fleet.py",
    "metrics": "per-minute buckets of the server clock; the model never reads a minute "
    "boundary (no timing-dependent verdict): tests/features/test_observe.py",
    "events": "the model reads the stream raw to check each enqueue's events; the verb's "
    "paging and blocking read: tests/features/test_observe.py",
}

ENQ = {"group": None, "delay": None, "did": None, "mode": "simple"}
RETRY = {"ms": 0, "max_attempts": 1, "keep": False, "error": "boom"}

# (rule, arguments), in order: every rule of the machine at least once, reaching its verb.
TOUR: list[tuple[str, dict[str, Any]]] = [
    ("seed", {"n": 2, "g": None}),
    ("keep_history", {"keep": 2, "dead": None}),
    ("enqueue", {"qi": 0, "payload": b"a", **ENQ, "group": "la", "did": "d1"}),
    (
        "enqueue_id",
        {"qi": 0, "n": 0, "payload": b"b", "group": None, "did": None, "mode": "simple"},
    ),
    (
        "enqueue_prioritized",
        {"qi": 0, "payload": b"p", "group": None, "delay": SHORT, "priority": 1},
    ),
    (
        "enqueue_many",
        {
            "qi": 0,
            "items": ["mint", "seen", "again", "bad", "mint"],
            "n": 0,
            "group": "lb",
            "delay": None,
            "priority": 0,
        },
    ),
    ("change_priority", {"qi": 0, "n": 0, "priority": 5}),
    ("limit_queue", {"qi": 0, "n": None}),
    ("add_flow", {"qi": 0, "shape": [(1, True, 0, None), (0, False, 0, None)]}),
    ("add_chain", {"qi": 0, "steps": 3, "cross": [0, 1, 0, 0, 0], "lane": None}),
    ("annotate", {"qi": 0, "n": 1, "what": "log", "keep": 0}),
    ("annotate", {"qi": 0, "n": 1, "what": "progress", "keep": 0}),
    ("annotate", {"qi": 0, "n": 1, "what": "log", "keep": 0}),
    ("annotate", {"qi": 0, "n": 1, "what": "clear", "keep": 1}),
    ("claim", {"qi": 0, "lease": LONG}),
    ("claim_batch", {"qi": 0, "n": 3, "lease": LONG}),
    ("settle", {"n": 0, "verb": "extend", **RETRY}),
    ("settle", {"n": 1, "verb": "delay", **RETRY}),
    ("settle", {"n": 2, "verb": "retry", **RETRY}),
    ("settle", {"n": 3, "verb": "complete", **RETRY}),
    ("forge", {"qi": 0, "n": 1, "verb": "complete", "delta": 1}),
    ("forge", {"qi": 0, "n": 1, "verb": "extend", "delta": 0}),
    ("extend_leases", {"qi": 0, "picks": [0, 1], "lease": LONG}),
    ("extend_many", {"qi": 0, "picks": [0, 1], "lease": LONG}),
    ("complete_many", {"qi": 0, "picks": [0, 0]}),
    ("work", {"qi": 0, "outcomes": ["done+keep", "fail", "die"]}),
    (
        "settle_batch",
        {"qi": 0, "done": [0], "again": [1], "n": 1, "lease": LONG, "delay": 0, "max_attempts": 1},
    ),
    ("seam", {"qi": 0, "chain": "rerun-done", "remove": False, "keep": True}),
    ("flow_seam", {"chain": "child-rerun", "cross": 0}),
    ("claim", {"qi": 0, "lease": SHORT}),
    ("fail_with_budget", {"qi": 0, "n": 0}),
    ("claim", {"qi": 0, "lease": SHORT}),
    ("reap", {"qi": 0}),
    ("claim", {"qi": 0, "lease": SHORT}),
    ("sweep_stalled", {"qi": 0, "max_stalled": 1}),
    ("promote", {"qi": 0, "limit": 1}),
    ("repeat", {"qi": 0, "name": "r1", "g": None}),
    ("repeat_limited", {"qi": 0, "name": "r2", "g": "la", "limit": 1}),
    ("fire_due", {"qi": 0}),
    ("pause_repeat", {"qi": 0, "name": "r1"}),
    ("resume_repeat", {"qi": 0, "name": "r1"}),
    ("pump", {"qi": 0}),
    ("unrepeat", {"qi": 0, "name": "r1"}),
    ("look", {"qi": 0, "n": 1}),
    ("look", {"qi": 0, "n": 2}),
    ("reprocess", {"qi": 0, "n": 1, "delay": None}),
    ("reprocess_all", {"qi": 0, "state": "dead", "delay": None}),
    ("reprocess_all", {"qi": 0, "state": "completed", "delay": LONG}),
    ("reassign", {"qi": 0, "n": 1, "g": "lb"}),
    ("weight_lane", {"qi": 0, "g": "la", "w": 2}),
    ("limit_queue", {"qi": 1, "n": 2}),  # a limited queue's first layout: refused
    ("layout", {"qi": 1, "n": 3, "grow": False}),
    ("limit_queue", {"qi": 1, "n": None}),
    ("layout", {"qi": 0, "n": 3, "grow": False}),
    ("layout", {"qi": 0, "n": 2, "grow": False}),
    ("layout", {"qi": 0, "n": 4, "grow": True}),
    ("reschedule", {"qi": 0, "n": 1, "due": False}),
    ("run_now", {"qi": 0, "n": 1}),
    ("update_payload", {"qi": 0, "n": 1, "payload": b"u"}),
    ("wait", {"qi": 0, "n": 0}),
    ("switch_events", {"qi": 0}),
    ("enqueue", {"qi": 0, "payload": b"quiet", **ENQ}),
    ("switch_events", {"qi": 0}),
    ("admin", {"qi": 0, "what": "pause", "g": "la", "n": 2}),  # pause, then resume below
    *(("admin", {"qi": 0, "what": what, "g": "la", "n": 2}) for what in ADMIN),
    ("admin", {"qi": 0, "what": "pause lane", "g": "la", "n": 2}),  # resume_lane
    ("look", {"qi": 0, "n": 0}),
    ("remove", {"qi": 0, "n": 1, "children": True}),
    ("cancel", {"qi": 0, "n": 1, "remove": False}),
    ("cancel_all", {"qi": 0}),
    ("drain", {"qi": 0, "include_schedule": True}),
]


def machine_rules() -> set[str]:
    return {
        name
        for name, fn in inspect.getmembers(ModelMachine)
        if getattr(fn, RULE_MARKER, None) is not None
        or getattr(fn, INITIALIZE_RULE_MARKER, None) is not None
    }


def toured(redis_url: str, executors: tuple[str, ...]) -> set[str]:
    """The verbs the tour drove, its teardown (pause, obliterate, close) included."""
    client = redis.Redis.from_url(redis_url)
    sm = ModelMachine(client, executors)
    try:
        sm.server_agrees_with_model()
        s = Steps(sm)
        for name, kw in TOUR:
            getattr(s, name)(**kw)
        sm.teardown()  # checks that obliterate leaves nothing behind
    finally:
        client.close()
    return sm.calls


@pytest.fixture
def driven(redis_url: str, executor: str) -> set[str]:
    return toured(redis_url, (executor,))


def test_the_tour_runs_every_rule_of_the_machine() -> None:
    assert machine_rules() - {name for name, _ in TOUR} == set()


def test_every_verb_of_queue_is_modelled_or_says_why_not(driven: set[str]) -> None:
    public = public_verbs()
    assert set(NOT_MODELLED) <= public, set(NOT_MODELLED) - public
    assert driven & set(NOT_MODELLED) == set(), "listed as not modelled, yet driven"
    missing = public - driven - set(NOT_MODELLED)
    assert missing == set(), f"verbs of Queue no model rule drives: {sorted(missing)}"


@pytest.mark.parametrize("verb", sorted(NOT_MODELLED))
def test_a_verb_not_modelled_is_tested_where_its_reason_says(verb: str) -> None:
    paths = re.findall(r"tests/[\w/]+\.py", NOT_MODELLED[verb])
    assert paths, f"{verb}: the reason names no test file"
    for path in paths:
        assert f".{verb}(" in (ROOT / path).read_text(), f"{path} never calls {verb}"
