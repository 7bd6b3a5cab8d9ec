"""What the model machine draws from and counts with (tests/model/test_model.py and the
rule mixins model/rules_*.py): the strategies, the triage waivers (``strict``), coverage
events (``note``) and the hypothesis budget of a machine leg.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from model.core import LANES, LONG, SHORT

DEEP = os.environ.get("ECHOMQ_MODEL_DEEP", "") not in ("", "0")
# Triage aid, never set in CI: ECHOMQ_MODEL_WAIVE=<tags> (events, did255, results, cancel,
# waitdead, orphans, count1, debounce, dropchild, ring, negdeps) turns the checks of known,
# reported findings (FINDINGS.md) into no-ops or models today's behaviour, so a run can look
# past them for the next discrepancy. Unset (the default), every check holds.
WAIVED = set(filter(None, os.environ.get("ECHOMQ_MODEL_WAIVE", "").split(",")))


def strict(tag: str) -> bool:
    return tag not in WAIVED


GROUPS = st.sampled_from((None, *LANES))
LANE = st.sampled_from(LANES)
LEASES = st.sampled_from((SHORT, LONG))
DELAYS = st.sampled_from((None, 0, SHORT, LONG))
RETRY_DELAYS = st.sampled_from((0, SHORT, LONG))
# issue 24: 1 ms is made clearly expired (the machine waits past it), LONG clearly never
TTLS = st.sampled_from((None, None, None, 1, LONG))
PAYLOADS = st.binary(max_size=4)
# Which item of a list (tickets: counted from the most recent): mostly one of the last few.
PICK = st.one_of(st.integers(0, 2), st.integers(0, 255))
QI = st.sampled_from((0, 0, 0, 0, 1))
KEEP_LOGS = st.sampled_from((None, None, 1, 3))  # issue 38: the option keep_logs
PRIORITIES = st.sampled_from((0, 1, 5, 2**21))  # issue 24: the default, low, the maximum
# D3's grammar: a dedup id is [A-Za-z0-9._-]{1,255}; the long one is past the old 128 cap.
DIDS = ("d1", "d2", "L" * 200)
MODES = st.sampled_from(("simple", "throttle", "debounce"))
ERRORS = st.sampled_from(("boom", "boom", "cancelled"))
REPEATS = ("r1", "r2")
# What the admin rule does (test_model_coverage.py tours each).
ADMIN = (
    "pause",
    "pause lane",
    "limit lane",
    "rate",
    "rate lane",
    "clear rate",
    "clear lane",
    "keep",
    "keep dead",
)
_names = itertools.count()


def note(text: str) -> None:
    """A coverage event for ``--hypothesis-show-statistics`` (the scenarios run outside
    hypothesis, where there is nothing to record to)."""
    if currently_in_test_context():
        event(text)
        STATS[text] += 1


STATS: Counter[str] = Counter()  # ECHOMQ_MODEL_STATS=1 prints it after each machine run


def pick(items: list[Any], n: int) -> Any:
    return items[n % len(items)] if items else None


def _chunks(kids: str) -> list[str]:
    return [kids[i : i + 14] for i in range(0, len(kids), 14)]


def _kids(kids: list[str]) -> str | None:
    """A `kids` field compared as a set: the order is the flattened tree's."""
    return "".join(sorted(kids)) or None


def budget(examples: int) -> settings:
    return settings(
        max_examples=examples * 20 if DEEP else examples,
        stateful_step_count=80 if DEEP else 40,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        report_multiple_bugs=False,
        # Triage aid: ECHOMQ_MODEL_NOSHRINK=1 reports the first failure unshrunk (a shrink
        # against a real server can take minutes).
        phases=[Phase.explicit, Phase.generate]
        if os.environ.get("ECHOMQ_MODEL_NOSHRINK")
        else list(Phase),
    )
