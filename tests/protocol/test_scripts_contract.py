"""Script contracts: the Lua headers against the Python calls (KEYS counts, one slot per call),
the `state` vocabulary written by the scripts, and raw EVAL tests that run a script with
hand-built KEYS/ARGV and assert the keys afterwards.

The raw-EVAL legs are in test_scripts_eval.py.
"""

from __future__ import annotations

import re
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from scripts_contract_support import (
    LANE,
)

from echomq import ids, keyspace
from echomq.client import native as _native
from echomq.ops import migrate as _migrate
from echomq.protocol import calls as _p
from echomq.protocol import compose as _compose
from echomq.protocol import control as _control
from echomq.protocol import produce as _produce
from echomq.protocol import registry as _registry
from echomq.protocol.scripts import (
    SCRIPTS,
    TWINS,
    Arity,
    arity_error,
    parse_flags,
    parse_native,
    twin_forms,
)
from echomq.tasks import batches as _batches

LUA = Path(_p.__file__).parents[1] / "lua"  # src/echomq/lua, beside protocol/


JOB_STATES = {"pending", "active", "scheduled", "dead", "completed", "awaiting_children"}


K = _p.Keys("contract")


JID = "JOB0KHTOWnGLuC"


# One sample invocation of every verb in _protocol.
VERBS: dict[str, Callable[[], Any]] = {
    "enqueue": lambda: _p.enqueue(K, b"x"),
    "enqueue_many": lambda: _p.enqueue_many(K, [b"x", (JID, b"y")]),
    "claim": lambda: _p.claim(K, 1000),
    "claim_batch": lambda: _p.claim_batch(K, 3, 1000),
    "complete": lambda: _p.complete(K, JID, 1),
    "retry": lambda: _p.retry(K, JID, 1, delay_ms=0, max_attempts=3, error="e"),
    "delay": lambda: _p.delay(K, JID, 1, 10),
    "extend": lambda: _p.extend(K, JID, 1, 1000),
    "extend_many": lambda: _p.extend_many(K, [(JID, 1)], 1000),
    "settle": lambda: _p.settle(K, [(JID, 1)], [(JID, 2, 0, 3, "e")], 5, 1000),
    "complete_many": lambda: _p.complete_many(K, [(JID, 1)]),
    "promote": lambda: _p.promote(K),
    "reap": lambda: _p.reap(K),
    "sweep_stalled": lambda: _p.sweep_stalled(K),
    "reprocess": lambda: _p.reprocess(K, JID),
    "keep_completed": lambda: _p.keep_completed(K, 10, 60_000),
    "keep_dead": lambda: _p.keep_dead(K, 10),
    "remove": lambda: _p.remove(K, JID),
    "run_now": lambda: _p.run_now(K, JID),
    "change_priority": lambda: _p.change_priority(K, JID, 3),
    "reschedule": lambda: _p.reschedule(K, JID, 10),
    "update_payload": lambda: _p.update_payload(K, JID, b"x"),
    "update_progress": lambda: _p.update_progress(K, JID, "50"),
    "add_log": lambda: _p.add_log(K, JID, "line", 2),
    "logs": lambda: _p.logs(K, JID),
    "clear_logs": lambda: _p.clear_logs(K, JID, 2),
    "errors": lambda: _p.errors(K, JID),
    "get_job": lambda: _p.get_job(K, JID),
    "job_state": lambda: _p.job_state(K, JID),
    "browse": lambda: _p.browse(K, "pending", 10),
    "pending_size": lambda: _p.pending_size(K),
    "counts": lambda: _p.counts(K),
    "check": lambda: _p.check(K),
    "pause": lambda: _p.pause(K),
    "resume": lambda: _p.resume(K),
    "is_paused": lambda: _p.is_paused(K),
    "drain": lambda: _p.drain(K, True),
    "obliterate": lambda: _p.obliterate(K, True),
    "pause_lane": lambda: _p.pause_lane(K, LANE),
    "resume_lane": lambda: _p.resume_lane(K, LANE),
    "limit_lane": lambda: _p.limit_lane(K, LANE, 2),
    "limit": lambda: _p.limit(K, 2),
    "get_limit": lambda: _p.get_limit(K),
    "shards": lambda: _p.shards(K),
    "propose_shards": lambda: _p.propose_shards(K, [K.name, K.name + ".shard1.0"]),
    "weight_lane": lambda: _p.weight_lane(K, LANE, 3),
    "reassign": lambda: _p.reassign(K, JID, LANE),
    "lane_depth": lambda: _p.lane_depth(K, LANE),
    "lanes": lambda: _p.lanes(K),
    "wake_wait": lambda: _p.wake_wait(K, 100),
}


# Verbs of the feature modules (not _protocol): their scripts count as called.
EXTRA_VERBS: dict[str, Callable[[], Any]] = {
    "repeat": lambda: _compose.repeat(K, "r", b"x", every_ms=1000),
    "unrepeat": lambda: _compose.unrepeat(K, "r"),
    "pause_repeat": lambda: _compose.pause_repeat(K, "r"),
    # Its first step reads the spec and TIME: the script is its second (a paused every_ms).
    "resume_repeat": lambda: _second_step(
        _compose.resume_repeat(K, "r"), [[b"1000", None, None, b"1"], (1, 0)]
    ),
    "fire_due": lambda: _compose.fire_due(K),
    "add_flow": lambda: _compose.add_flow(
        K, _compose.FlowJob(b"p", children=[_compose.FlowJob(b"c")])
    ),
    "deliver": lambda: _compose.deliver(K, [f"{K.name}\0{JID}\0{JID}\0r".encode()]),
    "trim": lambda: _compose.trim(K, [b"entry"]),
    "cancel": lambda: _control.cancel(K, ids.mint()),
    "cancel_all": lambda: _control.cancel_all(K),
    "notify_rearm": lambda: _control.rearm(K, ids.mint()),
    "rate_limit": lambda: _control.rate_limit(K, 5, 1000, "g"),
    "rate_ttl": lambda: _control.rate_limit_ttl(K),
    "push_back": lambda: _control.push_back(K, ids.mint(), 1, 0),
    "worker_beat": lambda: _registry.beat(K, ids.mint("WRK"), "{}", 1000),
    "workers": lambda: _registry.list_workers(K),
    # A queue's first minted id: the minter leases its node first (issue 37).
    "mint": lambda: _produce.mint(ids.Minter()),
    # `echomq migrate`'s step (issue 39).
    "migrate_dead_scores": lambda: _migrate.dead_scores_step(K.name, 100),
    # Batches (issue 42): the first call of each verb (no minter: ids.mint()'s own node).
    "batch_open": lambda: _batches.open_batch(K, None, None, None, None, None),
    "batch_add": lambda: _batches.add(K, None, JID, [_member()], ""),
    "batch_close": lambda: _batches.close(K, JID),
    "batch_status": lambda: _batches.status(K, JID),
}


def _member() -> Any:
    from echomq import App

    app = App(url="redis://127.0.0.1:1/0")
    return app.task(queue=K.name, name="member")(lambda: None).s()


def _second_step(plan: Any, replies: Any) -> Any:
    next(plan)
    return plan.send(replies)


def _first_calls(work: Any) -> list[_p.Call[Any]]:
    """The calls a verb sends first: its Call, or the first step of its plan."""
    if isinstance(work, _p.Call):
        return [work]
    assert isinstance(work, types.GeneratorType)
    step = next(work)
    work.close()
    return list(step) if isinstance(step, list) else [step]


def test_every_protocol_verb_is_sampled_and_exported() -> None:
    defined = {
        name
        for name, obj in vars(_p).items()
        if name[:1].islower()
        and isinstance(obj, types.FunctionType)
        and obj.__module__
        in {
            _p.__name__,
            "echomq.protocol.produce",
            "echomq.protocol.reads",
            "echomq.protocol.admin",
        }
    }
    assert defined == set(VERBS)
    exported = {name for name in _p.__all__ if name[:1].islower()}
    assert exported == set(VERBS)


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_calls_pass_exactly_the_header_keys(verb: str) -> None:
    for call in _first_calls(VERBS[verb]()):
        if call.script is None:
            # A plain command: its key (args[1]) is a key of this queue.
            assert keyspace.hashtag(str(call.args[1])) == "contract"
            continue
        assert call.script is SCRIPTS[call.script.name]
        assert len(call.keys) == call.script.nkeys, (verb, call.script.name)
        # D9: every KEYS entry and the base in ARGV pin the queue's slot.
        for key in call.keys:
            assert keyspace.hashtag(key) == "contract"
        for arg in call.args:
            if isinstance(arg, str) and arg.startswith("emq:"):
                assert keyspace.hashtag(arg) == "contract"


def test_every_script_is_called_by_some_verb() -> None:
    used = {
        call.script.name
        for make in [*VERBS.values(), *EXTRA_VERBS.values()]
        for call in _first_calls(make())
        if call.script is not None
    }
    assert used == set(SCRIPTS)


def test_lua_files_are_the_scripts() -> None:
    assert {p.stem for p in LUA.glob("*.lua")} == set(SCRIPTS)
    for script in SCRIPTS.values():
        assert not re.search(r"^--@include", script.source, re.M)  # includes were inlined
        assert re.fullmatch(r"[0-9a-f]{40}", script.sha)


_HEADER = re.compile(r"^--\[\[(.*?)\]\]", re.S)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_header_contract(name: str) -> None:
    text = (LUA / f"{name}.lua").read_text()
    header = _HEADER.match(text)
    assert header is not None
    head = header.group(1)
    assert head.lstrip().startswith(name + ":"), "the header names its script"
    assert "Returns" in head
    declared = [int(n) for n in re.findall(r"^\s*KEYS\[(\d+)\]", head, re.M)]
    assert declared == list(range(1, len(declared) + 1))
    assert len(declared) == SCRIPTS[name].nkeys
    argv = [int(n) for n in re.findall(r"^\s*ARGV\[(\d+)\]", head, re.M)]
    # The body (with its includes) never reads a KEYS or ARGV slot the header does not declare.
    body = SCRIPTS[name].source[header.end() :]
    used_keys = {int(n) for n in re.findall(r"KEYS\[(\d+)\]", body)}
    assert used_keys <= set(declared), name
    used_argv = {int(n) for n in re.findall(r"ARGV\[(\d+)\]", body)}
    # A header may declare a variadic tail ("ARGV[5..]").
    tail = re.search(r"^\s*ARGV\[(\d+)\.\.\]", head, re.M)
    limit = int(tail.group(1)) if tail else max(argv, default=0)
    assert all(n <= limit for n in used_argv), name


_WRITE_COMMANDS = re.compile(
    r"rcall\('(?:ZADD|ZREM|ZPOPMIN|ZREMRANGEBY\w+|HSET|HSETNX|HDEL|HINCRBY|DEL|LPUSH|RPUSH|LREM|"
    r"LSET|LTRIM|RPOPLPUSH|LMOVE|SET|INCR\w*|EXPIRE|PEXPIRE|SADD|SREM|XADD|UNLINK)'"
)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_header_declares_flags(name: str) -> None:
    """Every script's traits live in its header: a script added without a ``Flags:`` line
    fails to load, and a script that declares ``reads`` writes nothing."""
    text = (LUA / f"{name}.lua").read_text()
    head = _HEADER.match(text)
    assert head is not None
    assert len(re.findall(r"^\s*Flags:", head.group(1), re.M)) == 1, name
    script = SCRIPTS[name]
    if not script.writes:
        # The script's own lines (shared includes define write helpers it may not call).
        body = text[head.end() :]
        assert not _WRITE_COMMANDS.search(body), f"{name} declares reads but writes"
        assert script.replay, f"{name}: a read is always safe to resend"


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        ("", "exactly one 'Flags:'"),
        ("  Flags: writes\n", "one of ('replay', 'once')"),
        ("  Flags: reads writes once\n", "one of ('reads', 'writes')"),
        ("  Flags: writes replay fast\n", "unknown flags"),
        ("  Flags: writes once\n  Flags: writes once\n", "exactly one 'Flags:'"),
    ],
)
def test_unclassified_scripts_are_refused(flags: str, error: str) -> None:
    header = f" demo: a script.\n  KEYS[1] meta\n  Returns 1\n{flags}"
    with pytest.raises(RuntimeError, match=re.escape(error)):
        parse_flags("demo", header)


def _lua_sources() -> list[Path]:
    return sorted(LUA.glob("*.lua")) + sorted((LUA / "include").glob("*.lua"))


def test_every_state_literal_is_a_job_state() -> None:
    found: set[str] = set()
    writes = 0
    for path in _lua_sources():
        for line in path.read_text().splitlines():
            if "'HSET'" in line and "'state'" in line:
                writes += 1
                found |= set(re.findall(r"""'state',\s*'(\w+)'""", line))
            # admit.lua computes the state it writes in a local first.
            found |= set(re.findall(r"""\bstate\s*=\s*'(\w+)'""", line))
    assert writes >= 5, "the scan found no state write"
    assert found, "the scan found no state literal at all"
    assert found <= JOB_STATES, found - JOB_STATES
    assert {"pending", "active", "scheduled", "dead"} <= found


def test_job_state_answers_are_documented() -> None:
    text = (LUA / "job_state.lua").read_text()
    answers = set(re.findall(r"return '(\w+)'", text))
    assert answers == JOB_STATES | {"unknown", "absent"}


_SHAPE = re.compile(r"^shape\((\d+), (\d+), (\d+|nil), (?:'([^']*)'|(\w+))\)$", re.M)


def test_twins_are_the_native_lines() -> None:
    assert _native.TWINS is TWINS
    assert {n: s.native.command for n, s in SCRIPTS.items() if s.native} == TWINS
    # The hot path at least; a script added without a twin (repeat pause ...) is fine.
    assert {"enqueue", "claim", "complete", "retry", "settle", "extend"} <= set(TWINS)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_native_line_matches_the_prologue(name: str) -> None:
    """A twin's prologue checks the counts its Native line declares (KEYS: the header's
    KEYS lines), and refuses with the text the module answers (_scripts.arity_error)."""
    script = SCRIPTS[name]
    text = (LUA / f"{name}.lua").read_text()
    if script.native is None:
        assert "EMQ." not in text, f"{name} names an EMQ.* command but has no Native: line"
        return
    shape = _SHAPE.search(text)
    assert shape is not None, f"{name}: a twin checks its shape first (include/args.lua)"
    nkeys, lo, hi = int(shape.group(1)), int(shape.group(2)), shape.group(3)
    args = script.native.args
    assert (nkeys, lo) == (script.nkeys, args.lo), name
    assert (None if hi == "nil" else int(hi)) == args.hi, name
    command = script.native.command
    expected = arity_error(command, twin_forms()[command])
    literals = set(re.findall(rf"'(ERR {re.escape(command)} takes [^']*)'", text))
    assert literals == {expected}, name
    if shape.group(5):  # shape(..., ARITY): a local holding the text
        assert re.search(rf"local {shape.group(5)} = '{re.escape(expected)}'", text), name


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("  Native: EMQ.CLAIM args=2\n", Arity(2, 2)),
        ("  Native: EMQ.X args=4..5\n", Arity(4, 5)),
        ("  Native: EMQ.X args=4..\n", Arity(4, None)),
        ("  Native: EMQ.X args=9+2n deny-oom\n", Arity(9, None, 2)),
        ("  Native: EMQ.X args=2|4\n", Arity(2, 4, 2)),
        ("  Flags: writes once\n", None),
    ],
)
def test_native_lines_parse(line: str, expected: Arity | None) -> None:
    found = parse_native("demo", " demo: a script.\n" + line)
    assert (found.args if found else None) == expected


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("  Native: EMQ.X\n", "takes EMQ.<VERB>"),
        ("  Native: emq.x args=2\n", "takes EMQ.<VERB>"),
        ("  Native: EMQ.X args=two\n", "bad arity"),
        ("  Native: EMQ.X args=5..4\n", "bad arity"),
        ("  Native: EMQ.X args=4|2\n", "bad arity"),
        ("  Native: EMQ.X args=2 fast\n", "unknown 'Native:' words"),
        ("  Native: EMQ.X args=2\n  Native: EMQ.X args=2\n", "more than one"),
    ],
)
def test_malformed_native_lines_are_refused(line: str, error: str) -> None:
    with pytest.raises(RuntimeError, match=re.escape(error)):
        parse_native("demo", " demo: a script.\n" + line)


def test_arity_texts() -> None:
    assert [Arity(3, 3).text(), Arity(1, 1).text(), Arity(4, 5).text()] == [
        "3 args",
        "1 arg",
        "4..5 args",
    ]
    assert [Arity(2, 4, 2).text(), Arity(4, None).text(), Arity(9, None, 2).text()] == [
        "2 or 4 args",
        "at least 4 args",
        "9 + 2n args",
    ]
    assert [n for n in range(12) if Arity(9, None, 2).fits(n)] == [9, 11]
    assert [n for n in range(6) if Arity(2, 4, 2).fits(n)] == [2, 4]


NATIVE = LUA.parent.parent.parent / "native"


# The C files with no Lua namesake: the runtime (the frame with include/args.lua's checks,
# values, calls, the key API) and the module's entry.
NATIVE_RUNTIME = {"emq.c", "trafikey.c"}


def test_the_native_tree_mirrors_the_lua_tree() -> None:
    """Issue 23: lua/include/X.lua <-> native/X.c and lua/Y.lua <-> native/cmd_Y.c, whose
    body is emq_cmd_Y, for exactly the scripts with a Native line."""
    sources = {p.name: p.read_text() for p in NATIVE.glob("*.c")}
    includes = {p.stem for p in (LUA / "include").glob("*.lua")}
    for name, text in sources.items():
        if name in NATIVE_RUNTIME:
            continue
        if name.startswith("cmd_"):
            script = name[4:-2]
            assert script in TWINS, f"native/{name}: no lua/{script}.lua with a Native line"
            bodies = re.findall(r"^void (emq_cmd_\w+)\(emq \*e\) \{", text, re.M)
            assert bodies == [f"emq_cmd_{script}"], (name, bodies)
        else:
            assert name[:-2] in includes, f"native/{name}: no lua/include/{name[:-2]}.lua"
    assert {f"cmd_{s}.c" for s in TWINS} <= set(sources)


def test_every_script_has_a_reply_row() -> None:
    """lua/README.md's Replies table names every script (a row may name several, comma
    separated), and no script that does not exist: the list is the code's, not typed."""
    text = (LUA / "README.md").read_text(encoding="utf-8")
    table = text.split("## Replies", 1)[1].split("\n## ", 1)[0]
    named = {
        name.strip()
        for row in re.findall(r"^\| ([a-z_, ]+) \|", table, re.M)
        for name in row.split(",")
    } - {"script"}
    assert set(SCRIPTS) - named == set(), sorted(set(SCRIPTS) - named)
    assert named - set(SCRIPTS) == set(), sorted(named - set(SCRIPTS))
