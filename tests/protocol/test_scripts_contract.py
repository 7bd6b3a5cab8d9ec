"""Script contracts: the Lua headers against the Python calls (KEYS counts, one slot per call),
the `state` vocabulary written by the scripts, and raw EVAL tests that run a script with
hand-built KEYS/ARGV and assert the keys afterwards."""

from __future__ import annotations

import re
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from conftest import server_ms
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
LANE = "PRT0KHTOWnGLuC"

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


# --------------------------------------------------------------------------- native twins
# A header's `Native: EMQ.<VERB> args=<arity> [deny-oom]` line is the one source of the twin
# table (_scripts.TWINS, _native.TWINS), the C command table (native/commands.gen.h) and the
# docs' twin tables (scripts/gen-native; tests/protocol/test_key_suffixes.py checks they are
# current).

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


# --------------------------------------------------------------------------- raw EVAL


def _k(q: str, suffix: str) -> str:
    return keyspace.queue_key(q, suffix)


def _eval(r: redis.Redis, name: str, keys: list[str], args: list[Any]) -> Any:
    return r.eval(SCRIPTS[name].source, len(keys), *keys, *args)


def _row(r: redis.Redis, key: str) -> dict[str, bytes]:
    return {f.decode(): v for f, v in r.hgetall(key).items()}


def test_eval_enqueue_then_claim_then_complete(r: redis.Redis, qname: str) -> None:
    base = _k(qname, "")
    jid = ids.mint()
    jk = _k(qname, "job:" + jid)
    reply = _eval(r, "enqueue", [jk, _k(qname, "meta")], [base, jid, b"p\r\n\x00", "", "now", 0])
    assert reply == b"enqueued"
    assert _row(r, jk) == {"state": b"pending", "attempts": b"0", "payload": b"p\r\n\x00"}
    assert r.zscore(_k(qname, "pending"), jid) == 0
    assert r.lrange(_k(qname, "ring"), 0, -1) == [b"*"]
    assert r.lrange(_k(qname, "wake"), 0, -1) == [b"1"]

    t0 = server_ms(r)
    keys = [_k(qname, "meta"), _k(qname, "ring"), _k(qname, "active")]
    reply = _eval(r, "claim", keys, [base, 5000])
    t1 = server_ms(r)
    assert reply == [jid.encode(), b"p\r\n\x00", 1, None]
    assert _row(r, jk)["state"] == b"active"
    assert _row(r, jk)["attempts"] == b"1"
    score = r.zscore(_k(qname, "active"), jid)
    assert score is not None and t0 + 5000 <= score <= t1 + 5000
    assert r.zcard(_k(qname, "pending")) == 0
    assert r.llen(_k(qname, "ring")) == 0

    with pytest.raises(redis.ResponseError, match=r"^EMQSTALE complete token mismatch"):
        _eval(r, "complete", [_k(qname, "active"), jk], [base, jid, "2", ""])
    assert r.exists(jk) == 1
    r.rpush(jk + ":logs", "a line")
    assert _eval(r, "complete", [_k(qname, "active"), jk], [base, jid, "1", ""]) == 1
    assert r.exists(jk, jk + ":logs") == 0
    assert r.zcard(_k(qname, "active")) == 0
    assert r.hget(_k(qname, "metrics:completed"), "count") == b"1"
    # A second complete answers gone (0), never stale.
    assert _eval(r, "complete", [_k(qname, "active"), jk], [base, jid, "1", ""]) == 0


def test_eval_enqueue_refuses_kind_and_writes_nothing(r: redis.Redis, qname: str) -> None:
    base = _k(qname, "")
    oid = ids.mint("ORD")
    jk = _k(qname, "job:" + oid)
    with pytest.raises(redis.ResponseError, match=r"^EMQKIND job id must be JOB-namespaced"):
        _eval(r, "enqueue", [jk, _k(qname, "meta")], [base, oid, b"x", "", "now", 0])
    assert list(r.scan_iter(match=f"emq:{{{qname}}}:*")) == []


def test_eval_enqueue_in_uses_the_server_clock(r: redis.Redis, qname: str) -> None:
    base = _k(qname, "")
    jid = ids.mint()
    jk = _k(qname, "job:" + jid)
    t0 = server_ms(r)
    reply = _eval(r, "enqueue", [jk, _k(qname, "meta")], [base, jid, b"x", "", "in", 60_000])
    t1 = server_ms(r)
    assert reply == b"scheduled"
    score = r.zscore(_k(qname, "schedule"), jid)
    assert score is not None and t0 + 60_000 <= score <= t1 + 60_000
    assert _row(r, jk)["state"] == b"scheduled"
    assert r.exists(_k(qname, "pending"), _k(qname, "ring")) == 0


def test_eval_lane_enqueue_and_claim(r: redis.Redis, qname: str) -> None:
    base = _k(qname, "")
    jid = ids.mint()
    jk = _k(qname, "job:" + jid)
    lane = _k(qname, f"g:{LANE}:pending")
    assert _eval(r, "enqueue", [jk, _k(qname, "meta")], [base, jid, b"x", LANE, "now", 0]) == (
        b"enqueued"
    )
    assert _row(r, jk)["group"] == LANE.encode()
    assert r.zscore(lane, jid) == 0
    assert r.smembers(_k(qname, "lanes")) == {LANE.encode()}
    assert r.lrange(_k(qname, "ring"), 0, -1) == [LANE.encode()]
    assert r.exists(_k(qname, "pending")) == 0

    keys = [_k(qname, "meta"), _k(qname, "ring"), _k(qname, "active")]
    reply = _eval(r, "claim", keys, [base, 1000])
    assert reply == [jid.encode(), b"x", 1, LANE.encode()]
    assert r.hget(_k(qname, "gactive"), LANE) == b"1"
    assert r.exists(lane, _k(qname, "lanes"), _k(qname, "ring")) == 0


def test_eval_claim_reads_pause_inside(r: redis.Redis, qname: str) -> None:
    base = _k(qname, "")
    jid = ids.mint()
    jk = _k(qname, "job:" + jid)
    _eval(r, "enqueue", [jk, _k(qname, "meta")], [base, jid, b"x", "", "now", 0])
    r.hset(_k(qname, "meta"), "paused", "1")
    keys = [_k(qname, "meta"), _k(qname, "ring"), _k(qname, "active")]
    assert _eval(r, "claim", keys, [base, 1000]) == []
    assert _eval(r, "claim_batch", keys, [base, 1000, 5]) == []
    assert r.zscore(_k(qname, "pending"), jid) == 0
    assert _row(r, jk)["attempts"] == b"0"
    r.hdel(_k(qname, "meta"), "paused")
    assert _eval(r, "claim", keys, [base, 1000])[0] == jid.encode()


def test_eval_retry_at_ceiling_is_dead(r: redis.Redis, qname: str) -> None:
    base = _k(qname, "")
    jid = ids.mint()
    jk = _k(qname, "job:" + jid)
    _eval(r, "enqueue", [jk, _k(qname, "meta")], [base, jid, b"x", "", "now", 0])
    _eval(r, "claim", [_k(qname, "meta"), _k(qname, "ring"), _k(qname, "active")], [base, 1000])
    keys = [_k(qname, "active"), _k(qname, "schedule"), _k(qname, "dead"), jk]
    assert _eval(r, "retry", keys, [base, jid, "1", 0, 1, "boom"]) == b"dead"
    assert _row(r, jk) == {
        "state": b"dead",
        "attempts": b"1",
        "payload": b"x",
        "last_error": b"boom",
    }
    assert (r.zscore(_k(qname, "dead"), jid) or 0) > 0  # its time of death (D25)
    assert r.zcard(_k(qname, "active")) == 0
    assert r.hget(_k(qname, "metrics:failed"), "count") == b"1"
    with pytest.raises(redis.ResponseError, match=r"^EMQSTALE retry lease settled"):
        _eval(r, "retry", keys, [base, jid, "1", 0, 1, "again"])


def test_eval_retry_schedules_on_the_server_clock(r: redis.Redis, qname: str) -> None:
    base = _k(qname, "")
    jid = ids.mint()
    jk = _k(qname, "job:" + jid)
    _eval(r, "enqueue", [jk, _k(qname, "meta")], [base, jid, b"x", "", "now", 0])
    _eval(r, "claim", [_k(qname, "meta"), _k(qname, "ring"), _k(qname, "active")], [base, 1000])
    keys = [_k(qname, "active"), _k(qname, "schedule"), _k(qname, "dead"), jk]
    t0 = server_ms(r)
    assert _eval(r, "retry", keys, [base, jid, "1", 7000, 3, "boom"]) == b"scheduled"
    t1 = server_ms(r)
    score = r.zscore(_k(qname, "schedule"), jid)
    assert score is not None and t0 + 7000 <= score <= t1 + 7000
    assert _row(r, jk)["state"] == b"scheduled"
    assert _row(r, jk)["last_error"] == b"boom"


def test_eval_reap_returns_lapsed_lease(r: redis.Redis, qname: str) -> None:
    base = _k(qname, "")
    jid = ids.mint()
    jk = _k(qname, "job:" + jid)
    _eval(r, "enqueue", [jk, _k(qname, "meta")], [base, jid, b"x", "", "now", 0])
    _eval(r, "claim", [_k(qname, "meta"), _k(qname, "ring"), _k(qname, "active")], [base, 60_000])
    assert _eval(r, "reap", [_k(qname, "active")], [base, 100]) == 0
    r.zadd(_k(qname, "active"), {jid: server_ms(r) - 1})  # the lease lapsed
    assert _eval(r, "reap", [_k(qname, "active")], [base, 100]) == 1
    assert _row(r, jk)["state"] == b"pending"
    assert _row(r, jk)["attempts"] == b"1"  # the next claim mints token 2
    assert r.zscore(_k(qname, "pending"), jid) == 0
    assert r.zcard(_k(qname, "active")) == 0
    assert r.lrange(_k(qname, "ring"), 0, -1) == [b"*"]


def test_eval_extend_sets_server_clock_lease(r: redis.Redis, qname: str) -> None:
    base = _k(qname, "")
    jid = ids.mint()
    jk = _k(qname, "job:" + jid)
    _eval(r, "enqueue", [jk, _k(qname, "meta")], [base, jid, b"x", "", "now", 0])
    _eval(r, "claim", [_k(qname, "meta"), _k(qname, "ring"), _k(qname, "active")], [base, 100])
    t0 = server_ms(r)
    assert _eval(r, "extend", [_k(qname, "active"), jk], [base, jid, "1", 90_000]) == 1
    t1 = server_ms(r)
    score = r.zscore(_k(qname, "active"), jid)
    assert score is not None and t0 + 90_000 <= score <= t1 + 90_000
    with pytest.raises(redis.ResponseError, match=r"^EMQSTALE extend token mismatch"):
        _eval(r, "extend", [_k(qname, "active"), jk], [base, jid, "0", 90_000])
    gone = _k(qname, "job:" + ids.mint())
    assert _eval(r, "extend", [_k(qname, "active"), gone], [base, "x", "1", 1000]) == 0


def test_eval_check_reports_planted_violations(r: redis.Redis, qname: str) -> None:
    base = _k(qname, "")

    def section(name: str, where: str = "", pos: int = 0) -> list[str]:
        lines, _, _ = _eval(r, "check", [_k(qname, "meta")], [base, name, where, pos, 1000])
        return [v.decode() for v in lines]

    def rows() -> list[str]:
        # A SCAN section covers the database page by page: follow the cursor to its end.
        out, cursor = [], "0"
        while True:
            lines, cursor, _ = _eval(
                r, "check", [_k(qname, "meta")], [base, "rows", cursor, 0, 1000]
            )
            out += [v.decode() for v in lines]
            cursor = cursor.decode() if isinstance(cursor, bytes) else str(cursor)
            if cursor == "0":
                return out

    def everything() -> list[str]:
        return [*section("core"), *section("members", "pending"), *rows(), *section("ring")]

    assert everything() == []
    ghost = ids.mint()
    r.zadd(_k(qname, "pending"), {ghost: 0})
    orphan = ids.mint()
    r.hset(_k(qname, "job:" + orphan), mapping={"state": "pending", "attempts": "0"})
    out = everything()
    assert any(ghost in v and "ghost" in v for v in out)
    assert any(orphan in v and "no set" in v for v in out)
    assert any("ring misses the flat set" in v for v in out)
    with pytest.raises(redis.ResponseError, match="unknown section"):
        section("everything")


def test_eval_replay_markers_first_copy_writes_and_only_a_resend_reads(
    r: redis.Redis, qname: str
) -> None:
    """A single enqueue's marker is one field of the per-second HASH
    recent:<replay_ms>:<second>:<nonce[:2]>; a call that names no second (ARGV[13]) gets the
    server's, and sets the key's TTL, replay_ms + 2 s. Only a copy flagged 'r' looks for it;
    a fresh call of the same id is a new job."""
    base, jid, nonce = _k(qname, ""), ids.mint(), "ab0123456789"
    jk = _k(qname, "job:" + jid)
    args = [base, jid, b"x", "", "now", 0, "f", 60_000, nonce]
    t0 = server_ms(r)
    assert _eval(r, "enqueue", [jk, _k(qname, "meta")], args) == b"enqueued"
    (key,) = list(r.scan_iter(match=base + "recent:*"))
    second = int(key.decode().split(":")[-2])
    assert key.decode() == f"{base}recent:60000:{second}:ab" and second in (
        t0 // 1000,
        t0 // 1000 + 1,
    )
    assert r.hgetall(key) == {("0123456789" + jid[-4:]).encode(): b"e"}
    assert 61_000 <= r.pttl(key) <= 62_000
    # A second first copy (no 'r') never reads markers: the row answers duplicate.
    assert _eval(r, "enqueue", [jk, _k(qname, "meta")], args) == b"duplicate"
    job = _eval(
        r, "claim", [_k(qname, "meta"), _k(qname, "ring"), _k(qname, "active")], [base, 5000]
    )
    assert _eval(r, "complete", [_k(qname, "active"), jk], [base, jid, str(job[2]), ""]) == 1
    # The resend after the job completed: replayed, nothing admitted.
    resend = [base, jid, b"x", "", "now", 0, "fr", 60_000, nonce]
    assert _eval(r, "enqueue", [jk, _k(qname, "meta")], resend) == b"replayed"
    assert r.exists(jk) == 0
    # A resend of a call that never landed (another nonce): admitted.
    other = [base, jid, b"y", "", "now", 0, "r", 60_000, "cd0123456789"]
    assert _eval(r, "enqueue", [jk, _k(qname, "meta")], other) == b"enqueued"
    assert _row(r, jk)["attempts"] == b"1"  # not minted ('f' absent): continues its count


def test_eval_enqueue_many_leaves_one_marker_a_call(r: redis.Redis, qname: str) -> None:
    base, a, b = _k(qname, ""), ids.mint(), ids.mint()
    head = [base, "", "now", 0, 60_000, "ef0123456789"]
    pairs = [a, b"1", b, b"2", "ORD" + a[3:], b"3"]
    assert _eval(r, "enqueue_many", [_k(qname, "meta")], [*head, "f", 0, "", *pairs]) == [
        b"enqueued",
        b"enqueued",
        b"kind",
    ]
    assert r.get(base + "recent:ef0123456789") == b"eek"
    assert 59_000 <= r.pttl(base + "recent:ef0123456789") <= 61_000
    r.delete(_k(qname, "job:" + a))  # as if it completed
    assert _eval(r, "enqueue_many", [_k(qname, "meta")], [*head, "fr", 0, "", *pairs]) == [
        b"replayed",
        b"replayed",
        b"kind",
    ]
    assert r.exists(_k(qname, "job:" + a)) == 0  # never admitted twice
    # A call that admits nothing leaves no marker.
    head2 = [base, "", "now", 0, 60_000, "aa0123456789"]
    again = _eval(r, "enqueue_many", [_k(qname, "meta")], [*head2, "", 0, "", b, b"x"])
    assert again == [b"duplicate"]
    assert r.exists(base + "recent:aa0123456789") == 0


def test_eval_a_minted_id_skips_the_retired_record(r: redis.Redis, qname: str) -> None:
    base, jid = _k(qname, ""), ids.mint()
    jk = _k(qname, "job:" + jid)
    r.hset(base + "retired", jid, 7)
    assert _eval(r, "enqueue", [jk, _k(qname, "meta")], [base, jid, b"x", "", "now", 0, "f"]) == (
        b"enqueued"
    )
    assert _row(r, jk)["attempts"] == b"0"  # 'f': minted in this call, never handed out
    r.delete(jk)
    assert _eval(r, "enqueue", [jk, _k(qname, "meta")], [base, jid, b"x", "", "now", 0, ""]) == (
        b"enqueued"
    )
    assert _row(r, jk)["attempts"] == b"7" and _row(r, jk)["floor"] == b"7"
    assert r.hexists(base + "retired", jid) is False
