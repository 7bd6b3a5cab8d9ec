"""bench/servertime.py: server time counted once (issue 28). A script's inner commands have
commandstats rows of their own whose time is also inside the EVALSHA's; the benchmarks sum
the top-level calls (script calls and EMQ.* commands) only."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import redis

import echomq

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from servertime import is_top_level, top_level_calls, top_level_usec, usec_of

pytestmark = pytest.mark.executors


def test_only_script_calls_and_module_commands_are_top_level() -> None:
    stats = {
        "cmdstat_evalsha": {"calls": 3, "usec": 90},
        "cmdstat_eval": {"calls": 1, "usec": 40},
        "cmdstat_emq.enqueue": {"calls": 2, "usec": 20},
        "cmdstat_zadd": {"calls": 4, "usec": 8},  # inside the scripts' time
        "cmdstat_hset": {"calls": 4, "usec": 12},
        "cmdstat_time": {"calls": 4, "usec": 1},
    }
    assert top_level_usec(stats) == 150.0
    assert top_level_calls(stats) == 6
    assert usec_of(stats, ("zadd", "hset")) == 20.0
    assert is_top_level("EMQ.SETTLE") and is_top_level("evalsha_ro")
    assert not is_top_level("cmdstat_hset") and not is_top_level("emqx")


def test_the_inner_commands_rows_are_inside_the_top_level_time(url: str, r: redis.Redis) -> None:
    """The premise, on a real server: after enqueues, rows of the script's or command's own
    writes exist beside the top-level row (Lua: always; native: as the server counts its
    calls), and the sum of every row is at least the top-level sum, never less."""
    with echomq.Queue("servertime", url=url) as q:
        q.enqueue(b"warm")  # the script is cached (EVALSHA -> NOSCRIPT -> EVAL) before
        r.config_resetstat()
        for i in range(20):
            q.enqueue(str(i).encode())
        stats = r.info("commandstats")
    assert top_level_calls(stats) == 20, stats
    every = sum(float(v["usec"]) for v in stats.values())
    assert 0 < top_level_usec(stats) <= every
    if q.executor == "lua":
        assert "cmdstat_hset" in stats and "cmdstat_zadd" in stats, sorted(stats)
        assert every > top_level_usec(stats)
