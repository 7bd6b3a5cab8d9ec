"""Security: payloads are data, never code; TLS end to end; least privilege with an ACL user.

- No code path unpickles or evaluates payload data: a scan of ``src/`` (Python by AST, Lua
  by text) finds no pickle/marshal/shelve/yaml/dill import, no eval/exec/compile, no Lua
  loadstring; the serializer refuses "pickle"; a pickle bomb enqueued as a payload is
  dead-lettered as undecodable and its side effect never happens.
- TLS: a ``redis-server`` with a TLS port and a certificate from a CA the test makes with
  ``openssl``; a producer and a worker process on ``rediss://...?ssl_ca_certs=...`` run jobs
  end to end; a client that trusts another CA, or speaks plain text, is refused.
- ACL: the rule set of docs/RELIABILITY.md (``ACL_COMMANDS`` below) is exactly the commands
  echomq uses — found by running the whole public surface and a worker as an unrestricted
  user and reading INFO commandstats — and is sufficient: the same run as a restricted user
  is refused nothing but ``CONFIG GET`` (echomq's optional eviction check). That user cannot
  FLUSHALL, touch keys outside ``emq:*``/``{emq}:*`` (not even from a script), or publish
  outside ``emq:*``.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import pickle
import re
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import echomq
from conftest import wait_for
from echomq.server import EmbeddedServer, free_port
from procs import Spawner, wait_log
from reliability import leftover_keys, payload, read_books

SRC = Path(echomq.__file__).resolve().parent

# --------------------------------------------------------------------------- payloads


FORBIDDEN_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle"}
FORBIDDEN_MODULES |= {"yaml", "jsonpickle", "joblib"}
FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__", "execfile"}
FORBIDDEN_LUA = re.compile(r"\b(loadstring|loadfile|dofile|load)\s*\(")
# The only places src/ names these words: the docs that say "never", and the refusal.
ALLOWED_MENTIONS = {
    ("serializers.py", "There is no pickle"),
    ("serializers.py", 'if value == "pickle":'),
    ("serializers.py", "echomq never unpickles payloads"),
    ("app.py", "JSON by default, never pickle"),
    ("protocol/envelope.py", "never pickle)"),
    # isolate=True: the worker and its own child exchange the objects it decoded (never the
    # payload's bytes) over a multiprocessing pipe.
    ("app.py", "return value are pickled"),
    ("runtime/isolate.py", "no payload bytes are ever unpickled"),
    # pool="process": the same exchange with the worker's persistent children.
    ("runtime/pool.py", "no payload bytes are unpickled"),
}


def test_no_code_path_unpickles_or_evaluates_payloads() -> None:
    python = sorted(SRC.rglob("*.py"))
    lua = sorted(SRC.rglob("*.lua"))
    assert len(python) > 10 and len(lua) > 20
    found: list[str] = []
    for path in python:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [(node.module or "").split(".")[0]]
            else:
                names = []
            found += [
                f"{path.name}:{node.lineno} imports {n}" for n in names if n in FORBIDDEN_MODULES
            ]
            call = isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            if call and node.func.id in FORBIDDEN_CALLS:  # type: ignore[attr-defined]
                found.append(f"{path.name}:{node.lineno} calls {node.func.id}()")  # type: ignore[attr-defined]
            if isinstance(node, ast.Attribute) and node.attr in ("load", "loads", "Unpickler"):
                base = node.value
                if isinstance(base, ast.Name) and base.id in FORBIDDEN_MODULES:
                    found.append(f"{path.name}:{node.lineno} uses {base.id}.{node.attr}")
    for path in lua:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("--", 1)[0]
            if FORBIDDEN_LUA.search(code):
                found.append(f"{path.name}:{n} evaluates text: {line.strip()}")
    seen = set()
    for path in python + lua:
        for line in path.read_text().splitlines():
            if re.search(r"pickle|marshal|shelve|yaml|\beval\(|\bexec\(", line):
                where = path.relative_to(SRC).as_posix()
                allowed = {(f, s) for f, s in ALLOWED_MENTIONS if f == where and s in line}
                if not allowed:
                    found.append(f"{where}: {line.strip()}")  # a new mention: worth a look
                seen |= allowed
    assert found == []
    assert seen == ALLOWED_MENTIONS


def test_the_serializer_refuses_pickle(url: str) -> None:
    with pytest.raises(ValueError, match="never unpickles"):
        echomq.serializers.resolve_serializer("pickle")
    with pytest.raises(ValueError, match="never unpickles"):
        echomq.App(url=url, serializer="pickle")


class _Bomb:
    """Unpickling this object would create a file: the side effect a pickle payload buys."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.path), "w"))


def test_a_pickle_payload_is_never_unpickled(tmp_path: Path, url: str, qname: str) -> None:
    marker = tmp_path / "unpickled"
    app = echomq.App(url=url)
    ran: list[Any] = []
    app.task(queue=qname, name="victim")(ran.append)
    q = app.queue(qname)
    bomb = q.enqueue(pickle.dumps(_Bomb(marker))).id
    ok = q.enqueue(app.tasks["victim"].payload((1,), {})).id
    worker = echomq.Worker(app, concurrency=2, beat_ms=100)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(worker.arun(),))
    thread.start()
    try:
        wait_for(lambda: q.job_state(bomb) == "dead" and q.job_state(ok) == "absent", timeout=30)
    finally:
        loop.call_soon_threadsafe(worker.stop)
        thread.join(30)
        loop.close()
    assert ran == [1]
    assert "undecodable payload" in str(q.get_job(bomb)["last_error"])
    assert not marker.exists()
    app.close()


# --------------------------------------------------------------------------- TLS


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(d: Path, name: str) -> tuple[Path, Path]:
    key, crt = d / f"{name}.key", d / f"{name}.crt"
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256", "-days", "2",
        "-keyout", key.name, "-out", crt.name, "-subj", f"/CN={name}", cwd=d,
    )  # fmt: skip
    return key, crt


def make_server_cert(d: Path, ca_key: Path, ca_crt: Path) -> tuple[Path, Path]:
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-sha256", "-keyout", "server.key",
        "-out", "server.csr", "-subj", "/CN=127.0.0.1", cwd=d,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", ca_crt.name, "-CAkey", ca_key.name,
        "-CAcreateserial", "-out", "server.crt", "-days", "2", "-sha256",
        "-extfile", "san.cnf", cwd=d,
    )  # fmt: skip
    return d / "server.key", d / "server.crt"


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[EmbeddedServer, int, Path, Path]]:
    """A server with a TLS port (certificate from a test CA). Its plain port stays on
    loopback only for EmbeddedServer's readiness PING; every client below uses the TLS
    port. Yields (server, tls port, the CA's cert, another CA's cert)."""
    certs = tmp_path / "certs"
    certs.mkdir()
    ca_key, ca_crt = make_ca(certs, "echomq-test-ca")
    _, other_crt = make_ca(certs, "another-ca")
    key, crt = make_server_cert(certs, ca_key, ca_crt)
    tls_port = free_port()
    args = [
        "--tls-port", str(tls_port), "--tls-cert-file", str(crt), "--tls-key-file", str(key),
        "--tls-ca-cert-file", str(ca_crt), "--tls-auth-clients", "no",
    ]  # fmt: skip
    srv = EmbeddedServer(tmp_path / "tls", appendonly=False, args=args).start()
    yield srv, tls_port, ca_crt, other_crt
    srv.stop()


def test_tls_end_to_end(
    tls_server: tuple[EmbeddedServer, int, Path, Path], spawn: Spawner, qname: str
) -> None:
    _, tls_port, ca, other_ca = tls_server
    tls_url = f"rediss://127.0.0.1:{tls_port}/0?ssl_ca_certs={ca}"
    q = echomq.Queue(qname, url=tls_url)
    ids = [e.id for e in q.enqueue_many([payload(n) for n in range(200)]) if hasattr(e, "id")]
    env = spawn.env(ECHOMQ_URL=tls_url, EMQ_TEST_HISTORY_URL=tls_url, EMQ_TEST_QUEUE=qname)
    w = spawn.start("worker", "apps.chaos:app", "-c", "16", "--beat-ms", "200", env=env)
    wait_log(w, "serving", timeout=60)
    assert f"on rediss://127.0.0.1:{tls_port}/0" in w.text()
    wait_for(lambda: q.counts()["completed"] == 200, timeout=60)
    with redis.Redis.from_url(tls_url) as c:
        assert sorted(i for i, _, _, _ in read_books(c, qname).history) == sorted(ids)
        assert leftover_keys(c, qname) == []
    assert q.check() == []
    w.signal(15)
    assert w.wait(30) == 0, w.text()
    q.close()

    # A client that trusts another CA is refused (the certificate is really verified) ...
    stranger = echomq.Queue(
        qname, url=f"rediss://127.0.0.1:{tls_port}/0?ssl_ca_certs={other_ca}", retry_for=0
    )
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        stranger.counts()
    stranger.close()
    # ... and the TLS port does not speak plain text.
    with socket.create_connection(("127.0.0.1", tls_port), timeout=5) as s:
        s.sendall(b"PING\r\n")
        try:
            reply = s.recv(64)
        except OSError:
            reply = b""
    assert not reply.startswith(b"+PONG")


# --------------------------------------------------------------------------- ACL

# Every command echomq sends (or runs inside its scripts): the public verbs of Queue and
# AsyncQueue, the worker, the version fence. Found by the discovery test below.
ACL_COMMANDS = sorted(
    {
        # the fence, the scripts, and the commands only scripts send
        *("evalsha", "eval", "get", "set", "time", "exists", "del", "type", "scan"),
        # reads outside scripts (get_job, is_paused, pending_size, browse, lanes); the worker
        *("hgetall", "hexists", "zcard", "zrange", "smembers", "blpop", "ping"),
        *("hget", "hmget", "hset", "hsetnx", "hdel", "hincrby", "hlen"),
        *("zadd", "zrem", "zscore", "zpopmin", "zrangebyscore", "zremrangebyrank"),
        *("lpush", "rpush", "lpop", "rpop", "lrange", "lindex", "llen", "lmove", "lset"),
        *("ltrim", "lpos", "sadd", "srem", "sismember", "scard", "smove", "sscan"),
        # events (D15), results and dedup TTLs (D17, D20), rate-limit windows (D21), flows
        *("xadd", "xread", "pexpire", "pttl", "incrby", "decr"),
        # the worker names its connections (the registry's id; skipped when refused)
        "client|setname",
        # the retired record's rotation (replay markers expire by PEXPIRE, above)
        *("unlink", "rename"),
        # executor="auto" reads MODULE LIST once to find the trafikey module (client/native.py)
        "module|list",
    }
)
# Sent by the client library rather than by echomq, so a short run may not show them: PING
# is redis-py's health check of a connection idle for 30 s (echomq's clients set
# health_check_interval=30); without it such a connection fails. LPOS runs only when promote
# repairs a ring that lost its flat entry, which a healthy run never needs. HLEN, UNLINK and
# RENAME keep the retired record's two generations: HLEN on about one small settle in eight,
# the other two once per 25,000 retirements (lua/include/common.lua retire).
# hsetnx: only a fail_parent child's death records with it (the exercise kills none).
ACL_EXTRAS = {"ping", "lpos", "hlen", "unlink", "rename", "hsetnx"}
# Used and deliberately not granted: CONFIG GET maxmemory-policy, echomq's startup check for
# an evicting server (it is skipped when denied), would expose every setting.
ACL_DENIED = {"config|get"}
ACL_RULES = [
    "on", "resetkeys", "~emq:*", "~{emq}:*", "resetchannels", "&emq:*", "-@all",
    *[f"+{c}" for c in ACL_COMMANDS],
]  # fmt: skip


def exercise(url: str, qname: str) -> None:
    """Every public verb of Queue and AsyncQueue, then a worker, against ``url``."""
    q = echomq.Queue(qname, url=url)
    q.enable_events(1000)  # D15: every transition below also appends its event (XADD)
    lane = "tenant-a"
    q.enqueue(b"a")
    q.enqueue(b"later", delay_ms=50)
    q.enqueue(b"in-a-lane", group=lane)
    q.enqueue_many([b"x", b"y"])
    q.enqueue_many([b"z"], group=lane)
    job = q.claim(lease_ms=60_000)
    assert job is not None
    q.extend(job.id, job.token, lease_ms=60_000)
    q.extend_many([(job.id, job.token)], lease_ms=60_000)
    q.add_log(job.id, "a line")
    q.add_log(job.id, "another line")
    q.logs(job.id)
    q.clear_logs(job.id, keep=1)  # LLEN, LTRIM
    q.clear_logs(job.id)  # DEL
    q.propose_shards([q.name, q.name + ".shard1.0"])  # HGET, HSET (issue 43)
    q.shards()  # HGET
    q.update_progress(job.id, "50")  # a progress event
    q.get_job(job.id)
    q.job_state(job.id)
    q.complete(job.id, job.token)
    a, b, c = q.claim_batch(3, lease_ms=60_000)
    q.retry(a.id, a.token, delay_ms=0, max_attempts=5, error="again")
    q.retry(b.id, b.token, delay_ms=0, max_attempts=1, error="dead")
    q.delay(c.id, c.token, 10)
    q.complete_many([])
    time.sleep(0.1)
    q.promote()
    q.reprocess(b.id)
    q.claim(lease_ms=1)
    time.sleep(0.01)
    q.reap()
    q.claim(lease_ms=1)
    time.sleep(0.01)
    q.sweep_stalled(max_stalled=5)
    for state in ("pending", "active", "scheduled", "dead"):
        q.browse(state)
    q.browse("pending", group=lane)
    q.pending_size()
    q.counts()
    q.events(count=1000)
    q.metrics("failed", minutes=5)
    assert q.check() == []
    q.pause()
    q.is_paused()
    q.resume()
    q.pause_lane(lane)
    q.resume_lane(lane)
    q.limit_lane(lane, 3)
    q.limit_lane(lane, None)
    q.weight_lane(lane, 2)
    q.reassign(q.enqueue(b"moves").id, lane)
    q.lane_depth(lane)
    q.lanes()
    q.remove(q.enqueue(b"removed").id)
    q.run_now(q.enqueue(b"later", delay_ms=60_000).id)
    moved = q.enqueue(b"moved", delay_ms=60_000).id
    q.reschedule(moved, delay_ms=120_000)
    q.change_priority(moved, 2)
    q.update_payload(moved, b"rewritten")
    q.limit(5)
    q.get_limit()
    q.limit(None)
    q.keep_completed(10, 60_000)
    q.keep_dead(10)
    q.keep_completed(None)
    q.keep_dead(None)
    settled = q.claim(lease_ms=60_000)
    assert settled is not None
    q.settle(completed=[(settled.id, settled.token)], n=1, lease_ms=60_000)
    q.errors(moved)
    q.dedup_holder("acl-dedup")
    q.reprocess_all()
    q.workers()
    # The second round's verbs: results and waiting, dedup, rate limits, cancel, repeats, flows.
    kept = q.enqueue(b"kept", dedup="acl-dedup")
    assert q.enqueue(b"again", dedup="acl-dedup").status == "deduplicated"
    q.enqueue(b"throttled", dedup="acl-throttle", dedup_mode="throttle", dedup_ttl_ms=1000)
    q.rate_limit(1000, 1000)
    q.rate_limit_lane(lane, 1000, 1000)
    q.rate_limit_ttl()
    q.rate_limit_ttl(lane)
    held = q.claim(lease_ms=60_000)
    assert held is not None
    q.complete(held.id, held.token, result=b"r", keep_result_ms=60_000)
    q.result(held.id)
    q.wait(held.id, timeout_s=1)
    q.clear_rate_limit(lane)
    q.clear_rate_limit()
    q.cancel(kept.id)
    active = q.claim(lease_ms=60_000)
    assert active is not None
    q.cancel(active.id)
    q.extend_leases([(active.id, active.token)], lease_ms=60_000)
    q.repeat("acl-every", b"tick", every_ms=60_000)
    q.repeats()
    q.fire_due()
    assert q.pause_repeat("acl-every") and q.resume_repeat("acl-every")
    q.unrepeat("acl-every")
    flow = q.add_flow(echomq.FlowJob(b"parent", children=[echomq.FlowJob(b"child")]))
    child = q.claim(lease_ms=60_000)
    while child is not None and child.id not in flow.child_ids:
        q.complete(child.id, child.token)
        child = q.claim(lease_ms=60_000)
    assert child is not None
    q.complete(child.id, child.token, result=b"c", keep_result_ms=60_000)
    q.children_values(flow.parent_id)
    q.dependencies(flow.parent_id)
    q.ignored_failures(flow.parent_id)
    q.pump()
    q.drain(include_scheduled=True)
    q.cancel_all()
    q.disable_events()
    q.pause()
    q.obliterate(force=True)
    q.close()

    async def asynchronously() -> None:
        aq = echomq.AsyncQueue(qname, url=url)
        e = await aq.enqueue(b"async")
        j = await aq.claim(lease_ms=60_000)
        assert j is not None and j.id == e.id
        await aq.complete(j.id, j.token)
        await aq.aclose()

    asyncio.run(asynchronously())

    app = echomq.App(url=url)
    attempts: list[int] = []

    @app.task(queue=qname, name="acl.job", backoff=10, max_attempts=2)
    def acl_job(n: int) -> None:
        attempts.append(n)
        if n == 0:
            raise RuntimeError("fails, is retried, then dead")

    acl_job.enqueue_many([((n,), {}) for n in range(5)])
    worker = echomq.Worker(app, concurrency=4, beat_ms=100)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(worker.arun(),))
    thread.start()
    try:
        wait_for(lambda: app.queue(qname).counts()["completed"] >= 5, timeout=30)
        wait_for(lambda: app.queue(qname).counts()["dead"] == 1, timeout=30)
    finally:
        loop.call_soon_threadsafe(worker.stop)
        thread.join(30)
        loop.close()
    app.close()


def test_exercise_calls_every_public_verb() -> None:
    """The ACL rule set is only as good as ``exercise()``'s reach: every public verb of
    ``Queue`` (derived from the class) is called there, so a verb sending a command the rule
    set lacks fails the ACL test instead of a deployment's user."""
    source = inspect.getsource(exercise)
    called = set(re.findall(r"\bq\.([a-z_]+)\(", source))
    public = {
        name
        for klass in echomq.Queue.__mro__[:-1]
        for name, member in vars(klass).items()
        if not name.startswith("_") and inspect.isfunction(member)
    }
    assert public - called - {"close"} == set(), sorted(public - called)


@pytest.fixture
def acl_server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    srv = EmbeddedServer(tmp_path / "acl", appendonly=False).start()
    yield srv
    srv.stop()


def test_acl_rule_set_is_exactly_what_echomq_uses(acl_server: EmbeddedServer, qname: str) -> None:
    admin = redis.Redis.from_url(acl_server.url)
    admin.config_resetstat()
    exercise(acl_server.url, qname)  # as the default (unrestricted) user
    used = {k.removeprefix("cmdstat_") for k in admin.info("commandstats")}
    used -= {"config|resetstat", "info"}  # the test's own
    used -= {"hello"}  # redis-py's handshake; Redis allows HELLO to every user (no grant)
    admin.close()
    print(f"\nACL: echomq used {len(used)} commands: {' '.join(sorted(used))}")
    assert used - ACL_DENIED <= set(ACL_COMMANDS)  # sufficient: everything used is granted
    assert set(ACL_COMMANDS) - ACL_EXTRAS <= used  # minimal: nothing granted goes unused


def test_worker_and_producer_under_the_acl_user(
    acl_server: EmbeddedServer, spawn: Spawner, qname: str
) -> None:
    admin = redis.Redis.from_url(acl_server.url)
    admin.execute_command("ACL", "SETUSER", "emq", ">s3cret", *ACL_RULES)
    admin.set("other:secret", "x")
    url = f"redis://emq:s3cret@127.0.0.1:{acl_server.port}/0"

    exercise(url, qname)  # the whole public surface and an in-process worker
    # A worker process (CLI) and a producer, end to end.
    # (The test app's bookkeeping lives outside emq:*, so it writes as the default user.)
    env = spawn.env(ECHOMQ_URL=url, EMQ_TEST_HISTORY_URL=acl_server.url, EMQ_TEST_QUEUE=qname)
    w = spawn.start("worker", "apps.chaos:app", "-c", "8", "--beat-ms", "200", env=env)
    q = echomq.Queue(qname, url=url)
    ids = [e.id for e in q.enqueue_many([payload(n) for n in range(100)]) if hasattr(e, "id")]
    wait_for(lambda: q.counts()["completed"] >= 100 + 5, timeout=60)
    wait_log(w, "serving")
    w.signal(15)
    assert w.wait(30) == 0, w.text()
    assert "NOPERM" not in w.text()
    assert {i for i, _, _, _ in read_books(admin, qname).history} == set(ids)
    assert q.check() == []
    q.close()

    denied = [(e["reason"], e["object"]) for e in admin.acl_log()]
    assert set(denied) == {("command", "config|get")}, denied

    user = redis.Redis.from_url(url)
    assert user.ping()
    for cmd in (
        ("FLUSHALL",),
        ("FLUSHDB",),
        ("GET", "other:secret"),
        ("SET", "other:key", "x"),
        ("DEL", "other:secret"),
        ("KEYS", "*"),
        ("CONFIG", "SET", "maxmemory-policy", "allkeys-lru"),
        ("CONFIG", "GET", "requirepass"),
        ("SCRIPT", "FLUSH"),
        ("ACL", "WHOAMI"),
        ("SHUTDOWN", "NOSAVE"),
        ("PUBLISH", "other:channel", "x"),
        ("SUBSCRIBE", "emq:{x}:events"),
        # A script runs with its caller's rights: no key outside the patterns, declared or not.
        ("EVAL", "return redis.call('GET', KEYS[1])", 1, "other:secret"),
        ("EVAL", "return redis.call('GET', 'other:secret')", 1, "emq:{x}:meta"),
        ("EVAL", "return redis.call('FLUSHALL')", 1, "emq:{x}:meta"),
    ):
        with pytest.raises(redis.ResponseError, match=r"NOPERM|permission|can't"):
            user.execute_command(*cmd)
    assert admin.get("other:secret") == b"x"
    # The documented caveat: SCAN (which check and obliterate need) lists the names of keys
    # beyond the patterns; their values stay out of reach.
    assert b"other:secret" in user.scan(0, match="other:*", count=1000)[1]
    user.close()
    admin.close()
