"""``--@cold`` (src/echomq/protocol/scripts.py, issue 28): a script's functions that only its cold
roots (or a lazy group) reach are built on first use, not as a closure on every call."""

from __future__ import annotations

import re

import pytest
import redis

import echomq
from echomq.protocol.scripts import SCRIPTS, _chill

pytestmark = pytest.mark.executors

_TOP = re.compile(r"^local function (\w+)\(", re.M)


def test_a_plain_enqueue_builds_no_ring_or_retired_record_closure() -> None:
    source = SCRIPTS["enqueue"].source
    top = set(_TOP.findall(source.split("load_cold = function()", 1)[0]))
    after = source.split("return lazy_cold\nend\n", 1)[1]
    top |= set(_TOP.findall(after))
    for cold in ("sync", "serviceable", "ring_add", "ring_remove", "retired_last", "unretire"):
        assert cold not in top, cold
        assert f"local function {cold}(" in source  # inside the loader
    assert {"admit", "touch", "emit", "wake", "mark_one"} <= top
    assert "load_cold().sync(" in source and "load_cold().retired_last(" in source


def test_cold_names_must_be_functions_the_script_keeps() -> None:
    src = "local function a()\n  return 1\nend\n--@cold nope\nreturn a()\n"
    with pytest.raises(RuntimeError, match="nope"):
        _chill(src)


def test_a_cold_function_reached_from_the_common_path_is_still_built_lazily() -> None:
    src = (
        "local function helper()\n  return 2\nend\n"
        "local function rare()\n  return helper()\nend\n"
        "local function hot(x)\n  if x then return rare() end\n  return 1\nend\n"
        "--@cold rare\n"
        "return hot(ARGV[1])\n"
    )
    out = _chill(src)
    assert out.startswith("local lazy_cold, load_cold\n")
    assert "return load_cold().rare()" in out
    loader = out.split("load_cold = function()", 1)[1]
    assert "local function rare(" in loader and "local function helper(" in loader
    assert "local function hot(" in out.split("load_cold = function()", 1)[0]


def test_the_cold_paths_run(q: echomq.Queue, r: redis.Redis, qname: str) -> None:
    """The first job into an empty set (the ring resync) and a named id coming back after it
    was retired (the retired record) go through the loader, on both executors alike."""
    first = q.enqueue(b"a")
    assert first.status == "enqueued"
    job = q.claim()
    assert job is not None
    q.complete(job.id, job.token)
    again = q.enqueue(b"b", id=job.id)  # retired: continues its count
    assert again.status == "enqueued"
    job2 = q.claim()
    assert job2 is not None and job2.id == job.id and job2.token == job.token + 1
    assert q.check() == []
