"""Unit tests without a server: branded ids (D2), the keyspace grammar and names (D3, §1),
hash tags and slots (§1.2), and the package's public surface."""

from __future__ import annotations

import itertools
import random
import threading
import time
import types
from typing import Any

import pytest

import echomq
from echomq import errors, ids, keyspace
from echomq.errors import InvalidId

# --------------------------------------------------------------------------- branded ids


def test_d2_vectors() -> None:
    assert ids.encode("USR", 274557032793636864) == "USR0KHTOWnGLuC"
    assert ids.parse("USR0NgWEfAEJfs") == ("USR", 320636799581945856)
    assert ids.parse("USR0KHTOWnGLuC") == ("USR", 274557032793636864)


def test_encode_is_fixed_width_and_round_trips() -> None:
    rng = random.Random(7)
    values = [0, 1, 61, 62, 2**22, 2**62, 2**63 - 1] + [rng.getrandbits(63) for _ in range(500)]
    for n in values:
        s = ids.encode("JOB", n)
        assert len(s) == 14 and s.isascii()
        assert ids.parse(s) == ("JOB", n)
        assert ids.is_valid(s)
    assert ids.encode("JOB", 0) == "JOB00000000000"
    assert ids.encode("JOB", 2**63 - 1) == "JOBAzL8n0Y58m7"


def test_byte_order_is_numeric_order() -> None:
    rng = random.Random(11)
    values = sorted({rng.getrandbits(rng.choice([8, 30, 50, 63])) for _ in range(2000)})
    encoded = [ids.encode("JOB", n) for n in values]
    assert encoded == sorted(encoded)
    assert [s.encode() for s in encoded] == sorted(s.encode() for s in encoded)


def test_base62_overflow_rejected() -> None:
    with pytest.raises(InvalidId):
        ids.parse("USR" + "z" * 11)
    # The first integer past 2**63 - 1 is refused as well.
    with pytest.raises(InvalidId):
        ids.parse("JOBAzL8n0Y58m8")
    assert not ids.is_valid("USR" + "z" * 11)
    with pytest.raises(InvalidId):
        ids.encode("JOB", 2**63)
    with pytest.raises(InvalidId):
        ids.encode("JOB", -1)
    with pytest.raises(InvalidId):
        ids.encode("JOB", True)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "USR0KHTOWnGLu",  # 13 bytes
        "USR0KHTOWnGLuCx",  # 15 bytes
        "usr0KHTOWnGLuC",  # lowercase namespace
        "Usr0KHTOWnGLuC",
        "U1R0KHTOWnGLuC",  # digit in the namespace
        "USR0KHTOWnGL-C",  # not base62
        "USR0KHTOWnGL C",
        "USR0KHTOWnGLu\u00e9",  # 14 chars but not ASCII
        "ÄSR0KHTOWnGLuC",
    ],
)
def test_malformed_ids_rejected(bad: str) -> None:
    with pytest.raises(InvalidId):
        ids.parse(bad)
    assert not ids.is_valid(bad)


@pytest.mark.parametrize("bad", [None, 12345678901234, b"USR0KHTOWnGLuC", ["USR0KHTOWnGLuC"]])
def test_non_str_ids_rejected(bad: Any) -> None:
    with pytest.raises(InvalidId):
        ids.parse(bad)
    assert not ids.is_valid(bad)


@pytest.mark.parametrize("ns", ["", "JO", "JOBS", "job", "J0B", None, "ÄBC"])
def test_bad_namespace_rejected_by_encode_and_mint(ns: Any) -> None:
    with pytest.raises(InvalidId):
        ids.encode(ns, 1)
    with pytest.raises(InvalidId):
        ids.mint(ns)


def test_mint_default_namespace_and_time() -> None:
    before = int(time.time() * 1000)
    jid = ids.mint()
    after = int(time.time() * 1000)
    assert ids.parse(jid)[0] == "JOB"
    assert before - 1 <= ids.decode_time_ms(jid) <= after + 1
    assert ids.parse(ids.mint("ORD"))[0] == "ORD"


def test_mint_monotonic_over_100k() -> None:
    minted = [ids.mint() for _ in range(100_000)]
    # Strictly increasing in mint order, as strings and as bytes (the pending set's order).
    assert all(a < b for a, b in itertools.pairwise(minted))
    raw = [m.encode() for m in minted]
    assert raw == sorted(raw)
    assert len(set(minted)) == len(minted)


class _FakeClock:
    """A stand-in for the ``time`` module as ``echomq.ids`` uses it (``time()``, ``sleep()``)."""

    def __init__(self, ms: int) -> None:
        self.ms = ms
        self.sleeps = 0

    def time(self) -> float:
        # +0.5 keeps int(t * 1000) == ms despite float rounding.
        return (self.ms + 0.5) / 1000

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.ms += 1


def test_mint_never_decreases_when_the_clock_steps_back(monkeypatch: pytest.MonkeyPatch) -> None:
    first = ids.mint()
    clock = _FakeClock(int(time.time() * 1000) - 10_000)  # ten seconds in the past
    monkeypatch.setattr(ids, "time", types.SimpleNamespace(time=clock.time, sleep=clock.sleep))
    minted = [first]
    # Far more than one millisecond's 256 sequence numbers at a frozen, earlier time.
    minted += [ids.mint() for _ in range(10_000)]
    clock.ms -= 5_000  # and another step back
    minted += [ids.mint() for _ in range(100)]
    assert all(a < b for a, b in itertools.pairwise(minted))
    # The clock was far behind: the minter ran its logical clock forward instead of waiting.
    assert clock.sleeps == 0


def test_mint_sequence_overflow_waits_for_next_ms(monkeypatch: pytest.MonkeyPatch) -> None:
    # The minter is process-wide: put its state back afterwards, so the ids the rest of the
    # session mints do not carry this test's future timestamps.
    monkeypatch.setattr(ids._local.clock, "last_ms", ids._local.clock.last_ms)
    monkeypatch.setattr(ids._local.clock, "seq", ids._local.clock.seq)
    # A clock ahead of anything minted before, frozen until slept.
    start = int(time.time() * 1000) + 3_600_000
    clock = _FakeClock(start)
    monkeypatch.setattr(ids, "time", types.SimpleNamespace(time=clock.time, sleep=clock.sleep))
    minted = [ids.mint() for _ in range(256 * 2 + 10)]
    assert all(a < b for a, b in itertools.pairwise(minted))
    # 256 ids per millisecond, then the minter waited for the next one (never reused a slot).
    assert clock.sleeps == 2
    stamps = [ids.decode_time_ms(m) for m in minted]
    assert stamps[:256] == [start] * 256
    assert stamps[256:512] == [start + 1] * 256
    assert stamps[512:] == [start + 2] * 10


def test_mint_is_thread_safe() -> None:
    per_thread: dict[int, list[str]] = {}
    barrier = threading.Barrier(8)

    def work(n: int) -> None:
        barrier.wait()
        per_thread[n] = [ids.mint() for _ in range(5_000)]

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = [m for minted in per_thread.values() for m in minted]
    assert len(everything) == 40_000
    assert len(set(everything)) == 40_000
    for minted in per_thread.values():
        assert minted == sorted(minted)


# --------------------------------------------------------------------------- keyspace


def test_key_builders() -> None:
    jid = "JOB0KHTOWnGLuC"
    assert keyspace.queue_key("orders", "pending") == "emq:{orders}:pending"
    assert keyspace.queue_key("orders", "") == keyspace.base("orders") == "emq:{orders}:"
    assert keyspace.job_key("orders", jid) == "emq:{orders}:job:" + jid
    assert keyspace.lane_key("orders", "PRT0KHTOWnGLuC") == "emq:{orders}:g:PRT0KHTOWnGLuC:pending"
    assert keyspace.VERSION_KEY == "{emq}:version"
    # The 17-byte budget: emq:{orders}:job: is 17 bytes before the 14-byte id.
    assert len(keyspace.queue_key("orders", "job:").encode()) == 17
    assert len(keyspace.job_key("orders", jid).encode()) == 31


def test_job_key_gate_is_kind_blind_but_wellformedness_strict() -> None:
    # An ORD id passes the builder (the enqueue script refuses the kind).
    assert keyspace.job_key("q", "ORD0KHTOWnGLuC").endswith("ORD0KHTOWnGLuC")
    for bad in ["JOB", "job0KHTOWnGLuCx", "JOB0KHTOWnGLu!", None, 5]:
        with pytest.raises(InvalidId, match="job_key requires a valid branded id"):
            keyspace.job_key("q", bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "name",
    ["a", "orders", "A-b_c.d", "0", "x" * 128, "JOB0KHTOWnGLuC", "emq2", "EMQ", "...", "-"],
)
def test_legal_queue_names(name: str) -> None:
    assert keyspace.check_queue(name) == name
    assert keyspace.hashtag(keyspace.queue_key(name, "pending")) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "x" * 129,
        "emq",
        "a{b",
        "a}b",
        "{a}",
        "a b",
        "a:b",
        "a*b",
        "a?b",
        "a/b",
        "caf\u00e9",
        "a\nb",
        None,
        7,
        b"orders",
    ],
)
def test_illegal_queue_names(name: Any) -> None:
    with pytest.raises(InvalidId):
        keyspace.check_queue(name)
    with pytest.raises(InvalidId):
        keyspace.queue_key(name, "pending")


def test_lane_names() -> None:
    for good in ["PRT0KHTOWnGLuC", "tenant-1", "x" * 128, "emq", "a.b_c-d"]:
        assert keyspace.check_lane(good) == good
    # '*' is the flat set's ring token: it must never be a lane name.
    for bad in ["*", "", "x" * 129, "a b", "a{b}", "a:b", None, 3]:
        with pytest.raises(InvalidId):
            keyspace.check_lane(bad)
        with pytest.raises(InvalidId):
            keyspace.lane_key("q", bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("key", "tag"),
    [
        ("emq:{orders}:pending", "orders"),
        ("emq:{}:pending", "emq:{}:pending"),
        ("nobrace", "nobrace"),
        ("{emq}:version", "emq"),
        ("a{b", "a{b"),
        ("a}b{c}d", "c"),
        ("{a}{b}", "a"),
        ("{}{x}", "{}{x}"),
        ("x{y}}", "y"),
        ("", ""),
    ],
)
def test_hashtag(key: str, tag: str) -> None:
    assert keyspace.hashtag(key) == tag


def test_slot_vectors() -> None:
    assert keyspace.slot("123456789") == 12739
    assert keyspace.slot("{orders}") == 105
    assert keyspace.slot("{fills}") == 4165
    assert keyspace.slot("{payments}") == 8507
    assert keyspace.slot("emq:{orders}:pending") == 105
    assert keyspace.slot("emq:{orders}:job:JOB0KHTOWnGLuC:logs") == 105
    assert keyspace.slot("emq:{}:pending") == keyspace.slot("emq:{}:pending")
    for key in ["x", "{emq}:version", "emq:{a}:b", "123456789" * 20]:
        assert 0 <= keyspace.slot(key) < 16384


def test_every_queue_key_shares_the_queue_slot() -> None:
    for q in ["orders", "fills", "a", "x" * 128]:
        tag_slot = keyspace.slot("{" + q + "}")
        keys = [keyspace.queue_key(q, t) for t in keyspace.QUEUE_TYPES]
        keys += [keyspace.job_key(q, "JOB0KHTOWnGLuC"), keyspace.lane_key(q, "PRT0KHTOWnGLuC")]
        for key in keys:
            assert keyspace.hashtag(key) == q
            assert keyspace.slot(key) == tag_slot
    assert keyspace.hashtag(keyspace.VERSION_KEY) == "emq"


def test_session_keys_live_in_the_reserve() -> None:
    digest = "0123456789abcdef" * 4
    key = keyspace.session_key(digest)
    assert key == "{emq}:session:" + digest and keyspace.hashtag(key) == "emq"
    assert keyspace.queue_of(key) is None
    assert sorted(keyspace.RESERVE_TYPES) == ["layout", "migrations", "nodes", "session", "version"]
    for bad in ("", "A" * 64, digest[:-1], digest + "0", "../" + digest[3:], None):
        with pytest.raises(InvalidId):
            keyspace.session_key(bad)  # type: ignore[arg-type]


class _NoIOClient:
    """A client that fails the test if echomq ever sends it a command."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, ...]] = []

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.sent.append(args)
        raise AssertionError(f"I/O happened: {args!r}")

    def pipeline(self, transaction: bool = True) -> Any:
        raise AssertionError("I/O happened: pipeline")

    def close(self) -> None:
        pass


def test_bad_ids_raise_before_any_io() -> None:
    client = _NoIOClient()
    queue = echomq.Queue("orders", client=client)
    calls = [
        lambda: queue.complete("JOB123", 1),
        lambda: queue.retry("nope", 1, delay_ms=0, max_attempts=1, error="e"),
        lambda: queue.delay("job0KHTOWnGLuC", 1, 0),
        lambda: queue.extend(None, 1, lease_ms=10),  # type: ignore[arg-type]
        lambda: queue.extend_many([("bad", 1)], lease_ms=10),
        lambda: queue.reprocess("x"),
        lambda: queue.remove("JOB0KHTOWnGLuC!"),
        lambda: queue.get_job(""),
        lambda: queue.job_state("JOB"),
        lambda: queue.update_progress("JOB", "1"),
        lambda: queue.add_log("JOB", "1"),
        lambda: queue.logs("JOB"),
        lambda: queue.reassign("JOB", "PRT0KHTOWnGLuC"),
        lambda: queue.enqueue(b"x", id="JOBzzzzzzzzzzz"),
        lambda: queue.enqueue_many([b"ok", ("JOB", b"x")]),
        lambda: queue.enqueue(b"x", group="a b"),
        lambda: queue.lane_depth("*"),
    ]
    for call in calls:
        with pytest.raises(InvalidId):
            call()
    assert client.sent == []


# --------------------------------------------------------------------------- public surface


def _isort_key(name: str) -> tuple[int, str]:
    # The order ruff's RUF022 calls "isort-style": CONSTANTS, then Classes, then the rest.
    if name.isupper():
        return 0, name
    if name[:1].isupper():
        return 1, name
    return 2, name


@pytest.mark.parametrize("module", [echomq, errors, ids, keyspace], ids=lambda m: m.__name__)
def test_all_is_sorted_and_complete(module: types.ModuleType) -> None:
    names = list(module.__all__)
    assert names == sorted(names, key=_isort_key)
    assert len(set(names)) == len(names)
    for name in names:
        assert hasattr(module, name), name


def test_top_level_exports() -> None:
    for name in [
        "Queue",
        "AsyncQueue",
        "Job",
        "Enqueued",
        "EchoMQError",
        "InvalidId",
        "KindError",
        "StaleToken",
        "JobGone",
        "StateError",
        "Locked",
        "RateLimited",
        "VersionFenceError",
        "PayloadTooLarge",
        "ids",
        "keyspace",
    ]:
        assert name in echomq.__all__
    assert echomq.WIRE_VERSION == "echomq:3.0.0"
    assert isinstance(echomq.__version__, str)
    assert issubclass(echomq.InvalidId, ValueError)
    assert issubclass(echomq.InvalidArgument, ValueError)
    assert issubclass(echomq.PayloadTooLarge, ValueError)
    for cls in [echomq.KindError, echomq.StaleToken, echomq.JobGone, echomq.StateError]:
        assert issubclass(cls, echomq.EchoMQError)


@pytest.mark.parametrize(
    ("text", "cls", "reason"),
    [
        (
            "EMQKIND job id must be JOB-namespaced",
            errors.KindError,
            "job id must be JOB-namespaced",
        ),
        ("EMQSTALE complete token mismatch", errors.StaleToken, "complete token mismatch"),
        ("EMQSTATE not dead or completed", errors.StateError, "not dead or completed"),
        ("EMQLOCK job is locked", errors.Locked, "job is locked"),
        ("EMQRATE at concurrency ceiling", errors.RateLimited, "at concurrency ceiling"),
        ("EMQNEW something else", errors.ProtocolError, "something else"),
    ],
)
def test_from_reply_maps_class_words(text: str, cls: type, reason: str) -> None:
    err = errors.from_reply(text)
    assert type(err) is cls
    assert err.text == text  # type: ignore[union-attr]
    assert err.reason == reason  # type: ignore[union-attr]


@pytest.mark.parametrize("text", ["ERR unknown command", "NOSCRIPT No matching script", "EMQ"])
def test_from_reply_leaves_foreign_errors(text: str) -> None:
    err = errors.from_reply(text)
    if text == "EMQ":
        # A bare "EMQ" starts with the prefix: an unknown class, passed through with its text.
        assert isinstance(err, errors.ProtocolError)
    else:
        assert err is None
