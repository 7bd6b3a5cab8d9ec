"""Helpers for the native-module conformance tests: build trafikey, and run one transition
through both executors (the Lua script on queue A, the EMQ.* command on queue B of the same
server) so replies and keyspaces can be compared.

It also holds what every test_native_* module shares: the module fixtures (made by
`differential_fixtures` and assigned to names in the test module, so pytest finds them there
and each module keeps its own server), the replica and the valgrind server launchers."""

from __future__ import annotations

import contextlib
import itertools
import re
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import pytest
import redis

import echomq
from echomq.protocol.scripts import SCRIPTS, TWINS
from echomq.server import EmbeddedServer, find_binary, free_port

ROOT = Path(__file__).resolve().parent.parent
NATIVE = ROOT / "native"

# Scores that are server-clock times (leases, delays, rate windows): compared within this.
TOLERANCE_MS = 2000


def build(target: str = "all") -> Path:
    """make -C native; a failed build fails the caller loudly (never a skip)."""
    proc = subprocess.run(
        ["make", "-C", str(NATIVE), target], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise AssertionError(f"native build failed:\n{proc.stdout}\n{proc.stderr}")
    name = "trafikey.so" if target == "all" else "trafikey-debug.so"
    return NATIVE / name


def base(queue: str) -> str:
    return f"emq:{{{queue}}}:"


def expand(items: Sequence[str], queue: str) -> list[str]:
    """'@suffix' is the queue's base + suffix; anything else is sent as is."""
    return [base(queue) + s[1:] if s.startswith("@") else s for s in items]


Reply = tuple[str, Any]


_SCRIPT_AT = re.compile(r" script: [0-9a-f]{40}, on @user_script:\d+\.$")


def call_script(
    r: redis.Redis, script: str, keys: Sequence[str], args: Sequence[str | bytes]
) -> Reply:
    try:
        return ("ok", r.eval(SCRIPTS[script].source, len(keys), *keys, *args))
    except redis.ResponseError as exc:
        # A script's own refusal (error({err = ...})) comes back with the server's location
        # suffix; the text before it is the module's (include/args.lua).
        return ("err", _SCRIPT_AT.sub("", str(exc)))


def command(r: redis.Redis, *args: Any) -> Any:
    """A raw command (redis-py's execute_command is untyped)."""
    return r.execute_command(*args)  # type: ignore[no-untyped-call]


def call_native(
    r: redis.Redis, script: str, keys: Sequence[str], args: Sequence[str | bytes]
) -> Reply:
    try:
        return ("ok", command(r, TWINS[script], len(keys), *keys, *args))
    except redis.ResponseError as exc:
        return ("err", str(exc))


def _norm_key(key: bytes | str, queue: str) -> str:
    k = key.decode("latin-1") if isinstance(key, bytes) else key
    k = k.replace(f"{{{queue}}}", "{Q}")
    # A single enqueue's replay markers are keyed by the server second of the call.
    return re.sub(r"recent:(\d+):\d+:", r"recent:\1:S:", k)


def snapshot(r: redis.Redis, queue: str) -> dict[str, Any]:
    """Every key of the queue, names normalised: (type, content). Two pipelined round trips
    (the types, then each key's content and TTL), not three calls a key: the randomized
    differentials snapshot both queues after every step."""
    keys = list(r.scan_iter(match=f"emq:{{{queue}}}:*", count=1000))
    with r.pipeline(transaction=False) as p:
        for key in keys:
            p.type(key)
        kinds = [k.decode() if isinstance(k, bytes) else str(k) for k in p.execute()]
    with r.pipeline(transaction=False) as p:
        for key, kind in zip(keys, kinds, strict=True):
            if kind == "hash":
                p.hgetall(key)
            elif kind == "zset":
                p.zrange(key, 0, -1, withscores=True)
            elif kind == "list":
                p.lrange(key, 0, -1)
            elif kind == "set":
                p.smembers(key)
            elif kind == "string":
                p.get(key)
            elif kind == "stream":
                p.xrange(key)
            else:
                p.dump(key)
            p.pttl(key)
        replies = p.execute()
    out: dict[str, Any] = {}
    for n, (key, read_as) in enumerate(zip(keys, kinds, strict=True)):
        kind = read_as
        value: Any = replies[2 * n]
        ttl = replies[2 * n + 1]
        if kind == "zset":
            value = dict(cast(list[tuple[bytes, float]], value))
        elif kind == "stream":
            value = [fields for _id, fields in cast(list[tuple[bytes, Any]], value)]
        name = _norm_key(key, queue)
        # The TTL is compared as "has one", and lets diff forgive a key that expired on one
        # side between the two snapshots.
        if ttl == -2 or kind == "none":
            continue  # it expired while we read it
        if kind == "hash" and ":S:" in name:
            # Replay markers of several server seconds share a normalised name: merge their
            # fields, each with its key's TTL (diff forgives one about to expire).
            kind = "markers"
            merged = dict(out[name][1]) if name in out else {}
            merged.update({f: (v, ttl) for f, v in value.items()})
            value = merged
        out[name] = (kind, value, ttl)
    _norm_marks(out)
    return out


_MARKED_PARENT = re.compile(rb"(?<=JOB[0-9A-Za-z]{11}):([0-9A-Za-z]{11})\0")


def _norm_marks(snap: dict[str, Any]) -> None:
    """A flow's mark (row field ``flow``, and after a ':' in an outbox entry's parent) is
    minted by the client for each add_flow, so the two queues of a pair hold different ones:
    each is renamed M1, M2... by its first appearance in key order (the same on both sides)."""
    names: dict[bytes, bytes] = {}
    for name in sorted(snap):
        kind, value, _ttl = snap[name]
        if kind == "hash" and b"flow" in value:
            value[b"flow"] = names.setdefault(value[b"flow"], b"M%d" % (len(names) + 1))
    for name in sorted(snap):
        kind, value, ttl = snap[name]
        if kind == "list" and name.endswith(":flow:outbox"):

            def alias(m: re.Match[bytes]) -> bytes:
                return b":" + names.setdefault(m[1], b"M%d" % (len(names) + 1)) + b"\0"

            fixed = [_MARKED_PARENT.sub(alias, entry, count=1) for entry in value]
            snap[name] = (kind, fixed, ttl)


def _close(a: Any, b: Any) -> bool:
    try:
        return abs(float(a) - float(b)) <= TOLERANCE_MS
    except (TypeError, ValueError):
        return False


_SERIES = re.compile(r":metrics:(completed|failed):data$")


def _series(value: Any) -> list[tuple[int, int]] | None:
    """A per-minute metrics series (D16) as (minute, count) pairs, newest first; None when an
    element is not ``<minute>:<count>``."""
    out = []
    for raw in value:
        m = re.fullmatch(rb"(\d+):(\d+)", raw)
        if m is None:
            return None
        out.append((int(m[1]), int(m[2])))
    return out


def _same_series(va: Any, vb: Any) -> bool:
    """The script's (A) and the module's (B) per-minute series (D16) agree. Each bucket is a
    server-clock read (unix seconds // 60), and a pair's two legs run one after the other,
    so a minute boundary may fall between them: a count the script filed under minute M the
    module files under M + 1 (issue 36: "keyspaces differ after complete"), the bucket's
    form of what TOLERANCE_MS forgives in a score. So, equal when: the same total; each
    list newest first with no minute twice; every minute within one of a minute on the
    other side; and A (whose leg of each pair runs first: Pair.run, the ``both`` fixture)
    ahead of or level with B at every minute, so a count B filed a minute early, or lost,
    still differs."""
    if va == vb:
        return True
    sa, sb = _series(va), _series(vb)
    if sa is None or sb is None or not sa or not sb:
        return False
    for s in (sa, sb):
        minutes = [m for m, _c in s]
        if any(newer <= older for newer, older in itertools.pairwise(minutes)):
            return False
    if sum(c for _m, c in sa) != sum(c for _m, c in sb):
        return False
    ma, mb = {m for m, _c in sa}, {m for m, _c in sb}
    if any(min(abs(m - o) for o in mb) > 1 for m in ma) or any(
        min(abs(m - o) for o in ma) > 1 for m in mb
    ):
        return False

    def upto(s: list[tuple[int, int]], minute: int) -> int:
        return sum(c for m, c in s if m <= minute)

    return all(upto(sa, m) >= upto(sb, m) for m in ma | mb)


def diff(sa: dict[str, Any], sb: dict[str, Any]) -> list[str]:
    """Differences between two snapshots (empty when they match within the tolerance); sa is
    the side whose legs run first (the script's, A), or the earlier snapshot of one queue."""
    out: list[str] = []
    for name in sorted(set(sa) | set(sb)):
        if name not in sa or name not in sb:
            kind, value, ttl = sa.get(name) or sb[name]
            if kind == "markers":
                ttl = max(t for _v, t in value.values())
            if not 0 <= ttl <= TOLERANCE_MS:
                out.append(f"{name}: only in {'script' if name in sa else 'native'}")
            continue
        (ka, va, ta), (kb, vb, tb) = sa[name], sb[name]
        if (ta >= 0) != (tb >= 0):
            out.append(f"{name}: TTL {ta} vs {tb}")
        elif ka != kb:
            out.append(f"{name}: type {ka} != {kb}")
        elif ka == "zset":
            if set(va) != set(vb) or any(not _close(va[m], vb[m]) for m in va):
                out.append(f"{name}: {va} != {vb}")
        elif ka == "markers":
            for f in set(va) | set(vb):
                if f in va and f in vb:
                    if va[f][0] != vb[f][0]:
                        out.append(f"{name}: {f!r} {va[f]} != {vb[f]}")
                elif not 0 <= (va.get(f) or vb[f])[1] <= TOLERANCE_MS:
                    out.append(f"{name}: {f!r} only in {'script' if f in va else 'native'}")
        elif ka == "stream":
            if len(va) != len(vb):
                out.append(f"{name}: {va} != {vb}")
                continue
            for ea, eb in zip(va, vb, strict=True):
                same = set(ea) == set(eb) and all(
                    ea[f] == eb[f] or (f == b"run_at" and _close(ea[f], eb[f])) for f in ea
                )
                if not same:
                    out.append(f"{name}: {ea} != {eb}")
        elif ka == "list" and _SERIES.search(name):
            if not _same_series(va, vb):
                out.append(f"{name}: {va} != {vb}")
        elif va != vb:
            out.append(f"{name}: {va} != {vb}")
    return out


class Pair:
    """Queue A runs the scripts, queue B the module; both on one server."""

    def __init__(self, r: redis.Redis, a: str, b: str) -> None:
        self.r, self.a, self.b = r, a, b
        self.calls = 0

    def run(self, script: str, keys: list[str], args: list[str | bytes]) -> Reply:
        """Run one transition on both queues; assert equal replies and keyspaces."""
        ra = call_script(self.r, script, expand(keys, self.a), expand_args(args, self.a))
        rb = call_native(self.r, script, expand(keys, self.b), expand_args(args, self.b))
        self.calls += 1
        assert ra == rb, f"{script} {keys} {args}: script {ra!r} != native {rb!r}"
        self.check(f"after {script} {args!r}")
        return ra

    def check(self, what: str = "") -> None:
        d = diff(snapshot(self.r, self.a), snapshot(self.r, self.b))
        assert not d, f"keyspaces differ {what}:\n" + "\n".join(d[:20])


def expand_args(args: Sequence[str | bytes], queue: str) -> list[str | bytes]:
    return [base(queue) + a[1:] if isinstance(a, str) and a.startswith("@") else a for a in args]


class SettlePair(Pair):
    """A Pair whose keyspace check also forgives a kept outcome's finished_ms (a server-clock
    time read by each executor) within the tolerance, as clock-derived scores are."""

    def check(self, what: str = "") -> None:
        sa, sb = snapshot(self.r, self.a), snapshot(self.r, self.b)
        settle_clock(sa, sb)
        d = diff(sa, sb)
        assert not d, f"keyspaces differ {what}:\n" + "\n".join(d[:20])


def settle_clock(sa: dict[str, Any], sb: dict[str, Any]) -> None:
    """Make B's finished_ms of a kept outcome, and a row's ``expires`` (issue 24: now +
    ttl_ms), A's when they are within the tolerance: each is its executor's own clock read."""
    for name in set(sa) & set(sb):
        if sa[name][0] != "hash" or sb[name][0] != "hash":
            continue
        field = b"finished_ms" if ":result:" in name else b"expires"
        fa, fb = sa[name][1].get(field), sb[name][1].get(field)
        if fa is not None and fb is not None and _close(fa, fb):
            sb[name][1][field] = fa


def quiet(fn: Callable[[], Any]) -> Any:
    """fn's result, or the name of the EchoMQError it raised (randomized walks compare these)."""
    try:
        return fn()
    except echomq.EchoMQError as exc:
        return type(exc).__name__


def jid(n: int) -> str:
    """A JOB id (14 bytes, the shape the client mints)."""
    return f"JOB{n:011d}"


# Applies one Queue API step to both queues (Any: mypy cannot type the steps' lambdas with
# default arguments).
Both = Any


def differential_fixtures(
    qa: str,
    qb: str,
    *,
    tmp_name: str,
    clean: Sequence[str] = (),
    pair_class: type[Pair] = Pair,
) -> tuple[Any, Any, Any, Any, Any]:
    """The fixtures module_path, nserver, r, pair and both of one test module: a
    module-scoped server with trafikey loaded, a client on it (queues qa, qb and `clean`
    emptied before each test), a pair_class on qa/qb, and `both` (a Queue API step applied to
    both queues). A test module assigns them to those names:

        module_path, nserver, r, pair, both = differential_fixtures(QA, QB, tmp_name="x")

    (a factory rather than imports: imported fixtures read as unused imports and shadowed
    names to the linter, and each module passes its own queues)."""

    @pytest.fixture(scope="module")
    def module_path() -> Path:
        return build()

    @pytest.fixture(scope="module")
    def nserver(
        module_path: Path, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[EmbeddedServer]:
        with loaded_server(tmp_path_factory.mktemp(tmp_name), module_path) as srv:
            yield srv

    @pytest.fixture
    def r(nserver: EmbeddedServer) -> Iterator[redis.Redis]:
        client = redis.Redis.from_url(nserver.url)
        empty_queues(client, (qa, qb, *clean))
        yield client
        client.close()

    @pytest.fixture
    def pair(r: redis.Redis) -> Pair:
        return pair_class(r, qa, qb)

    @pytest.fixture
    def both(nserver: EmbeddedServer) -> Iterator[Both]:
        """Apply one Queue API step to both queues (to build states); returns A's result."""
        queue_a, queue_b = echomq.Queue(qa, url=nserver.url), echomq.Queue(qb, url=nserver.url)

        def run(step: Callable[[echomq.Queue], Any]) -> Any:
            ra, rb = step(queue_a), step(queue_b)
            assert repr(ra) == repr(rb)
            return ra

        yield run
        queue_a.close()
        queue_b.close()

    return module_path, nserver, r, pair, both


@contextlib.contextmanager
def loaded_server(directory: Path, so: Path) -> Iterator[EmbeddedServer]:
    """An EmbeddedServer with the module `so` loaded, stopped on exit."""
    srv = EmbeddedServer(directory, args=["--loadmodule", str(so)]).start()
    try:
        yield srv
    finally:
        srv.stop()


def empty_queues(client: redis.Redis, queues: Sequence[str]) -> None:
    """Delete every key of these queues (tests share one module-scoped server)."""
    for q in queues:
        keys = list(client.scan_iter(match=f"emq:{{{q}}}:*"))
        if keys:
            client.delete(*keys)


@contextlib.contextmanager
def replica_of(primary: EmbeddedServer, directory: Path) -> Iterator[redis.Redis]:
    """A plain server (no module) replicating `primary`, once its link is up: a client on it."""
    # The primary starts the full sync at once (its default waits 5 s for more replicas).
    with redis.Redis(port=primary.port) as pr:
        pr.config_set("repl-diskless-sync-delay", 0)
    replica = EmbeddedServer(
        directory, args=["--replicaof", "127.0.0.1", str(primary.port)]
    ).start()
    try:
        rr = redis.Redis(port=replica.port)
        deadline = time.monotonic() + 10
        while rr.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "replica did not sync"
            time.sleep(0.05)
        yield rr
        rr.close()
    finally:
        replica.stop()


def assert_replicated(
    r: redis.Redis, rr: redis.Redis, queues: Sequence[str], *, hashes: bool = False
) -> None:
    """Every key of the queues is on the replica as on the primary. A hashtable's DUMP order
    depends on the process's hash seed: those are compared by content (sets, and hashes when
    `hashes`), everything else byte for byte."""
    for q in queues:
        primary = sorted(r.scan_iter(match=f"emq:{{{q}}}:*"))
        assert primary and sorted(rr.scan_iter(match=f"emq:{{{q}}}:*")) == primary
        for key in primary:
            if r.object("encoding", key) == b"hashtable":
                kind = r.type(key)
                assert rr.type(key) == kind, key
                if hashes and kind == b"hash":
                    assert rr.hgetall(key) == r.hgetall(key), key
                else:
                    assert kind == b"set", key
                    assert rr.smembers(key) == r.smembers(key), key
            else:
                assert rr.dump(key) == r.dump(key), key
            assert abs(rr.pttl(key) - r.pttl(key)) < 1000, key


def wait_for_ping(r: redis.Redis, timeout: float, what: str, every: float = 0.2) -> None:
    """PING until the server answers; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            r.ping()
            return
        except redis.ConnectionError:
            assert time.monotonic() < deadline, f"{what} did not start"
            time.sleep(every)


@contextlib.contextmanager
def valgrind_server(
    tmp_path: Path, so: Path, *, socket_timeout: float = 60
) -> Iterator[tuple[redis.Redis, str]]:
    """redis-server under valgrind with the module `so` loaded: yields a client and its URL.
    On exit the server is shut down and must exit 0 (no valgrind error) with no block
    definitely lost in trafikey. A ConnectionError in the body (the server died) is left to
    those checks, which then fail with the log's tail."""
    port = free_port()
    log = tmp_path / "valgrind.log"
    cmd = [
        "valgrind", "--error-exitcode=1", "--leak-check=full",
        "--errors-for-leak-kinds=definite", f"--log-file={log}",
        find_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
        "--appendonly", "no", "--dir", str(tmp_path), "--loadmodule", str(so),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        r = redis.Redis(port=port, socket_timeout=socket_timeout)
        wait_for_ping(r, 60, "valgrind server")
        yield r, f"redis://127.0.0.1:{port}"
        r.shutdown(nosave=True)
    except redis.ConnectionError:
        pass
    finally:
        try:
            rc = proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
    text = log.read_text()
    assert rc == 0, text[-4000:]
    assert not re.search(r"definitely lost.*\n(.*\n){0,30}.*trafikey", text), text[-4000:]
