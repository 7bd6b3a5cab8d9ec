"""``echomq.testing`` and the pytest plugin, as a user's test suite meets them: ``drain`` runs a
real worker in-process against the session server; the plugin's fixtures are exercised by
running a tiny user test file with pytester, in-process and as a real ``pytest`` subprocess.
"""

from __future__ import annotations

import importlib.metadata
import json
import textwrap
from pathlib import Path

import pytest
import redis

import echomq
import echomq.server
from echomq import App, InvalidArgument, Retry, fixed
from echomq.testing import EmbeddedCluster, adrain, drain, obliterate_queues
from procs import pids_in

# --------------------------------------------------------------------------- drain


def _app(url: str) -> App:
    return App(url=url)


def test_drain_reports_what_ran_failed_and_died(url: str, qname: str, r: redis.Redis) -> None:
    app = _app(url)
    seen: list[str] = []
    tries: dict[str, int] = {}

    @app.task(queue=qname, max_attempts=3, backoff=fixed(0))
    def ok(n: int) -> None:
        seen.append(f"ok{n}")

    @app.task(queue=qname, max_attempts=3, backoff=fixed(0))
    def flaky(key: str) -> None:
        tries[key] = tries.get(key, 0) + 1
        if tries[key] == 1:
            raise RuntimeError("first try fails")
        seen.append(key)

    @app.task(queue=qname, max_attempts=2, backoff=fixed(0))
    def poison() -> None:
        raise RuntimeError("always")

    for n in range(3):
        ok.enqueue(n)
    flaky.enqueue("f1")
    flaky.options(group="tenant-a").enqueue("f2")
    poison.enqueue()

    result = drain(app, timeout_s=30)

    # ok: 3 runs; flaky: 2 runs each (the retry is due at once and promoted by the beat);
    # poison: 2 runs, the second at max_attempts is dead.
    assert result.ran == 3 + 4 + 2
    assert result.completed == 5
    assert result.failed == 3
    assert result.dead == 1
    assert result.lost == 0
    assert sorted(seen) == ["f1", "f2", "ok0", "ok1", "ok2"]
    counts = result.counts[qname]
    assert (counts["pending"], counts["active"], counts["schedule"]) == (0, 0, 0)
    assert counts["dead"] == 1
    app.close()


def test_drain_leaves_a_retry_that_is_not_due(url: str, qname: str, r: redis.Redis) -> None:
    app = _app(url)

    @app.task(queue=qname, max_attempts=3)
    def later() -> None:
        raise Retry(delay_ms=60_000)

    later.enqueue()
    result = drain(app, timeout_s=30)
    assert (result.ran, result.failed, result.completed) == (1, 1, 0)
    assert result.counts[qname]["schedule"] == 1  # waits a minute: not due, not waited for
    app.close()


def test_drain_times_out_on_a_paused_queue(url: str, qname: str, r: redis.Redis) -> None:
    app = _app(url)

    @app.task(queue=qname)
    def never() -> None:  # pragma: no cover - the queue is paused
        raise AssertionError("ran on a paused queue")

    never.enqueue()
    app.queue(qname).pause()
    with pytest.raises(TimeoutError, match="not drained"):
        drain(app, timeout_s=1.0)
    assert app.queue(qname).counts()["pending"] == 1
    app.close()


async def test_adrain_on_the_running_loop(url: str, qname: str, r: redis.Redis) -> None:
    app = _app(url)
    done: list[int] = []

    @app.task(queue=qname)
    async def job(n: int) -> None:
        done.append(n)

    for n in range(5):
        await job.aenqueue(n)
    result = await adrain(app, [qname], timeout_s=30)
    assert (result.ran, result.completed) == (5, 5)
    assert sorted(done) == [0, 1, 2, 3, 4]
    with pytest.raises(echomq.EchoMQError, match="adrain"):
        drain(app)  # a blocking drain inside a running loop would deadlock it
    await app.aclose()


@pytest.mark.parametrize(
    "kwargs",
    [{"timeout_s": 0}, {"timeout_s": -1.0}, {"timeout_s": float("nan")}, {"poll_s": 0}],
)
def test_drain_refuses_bad_arguments(url: str, qname: str, kwargs: dict[str, float]) -> None:
    app = _app(url)

    @app.task(queue=qname)
    def t() -> None:  # pragma: no cover - never runs
        pass

    with pytest.raises(InvalidArgument):
        drain(app, **kwargs)


def test_drain_needs_queues(url: str) -> None:
    with pytest.raises(InvalidArgument, match="no queues"):
        drain(_app(url))
    with pytest.raises(echomq.InvalidId):
        drain(_app(url), ["bad name"])


def test_obliterate_queues_deletes_every_key(url: str, qname: str, r: redis.Redis) -> None:
    with echomq.Queue(qname, url=url) as q:
        q.enqueue(b"x")
        q.enqueue(b"y", group="g1")
        q.claim()
    assert r.keys(f"emq:{{{qname}}}:*")
    obliterate_queues(url, [qname])
    assert r.keys(f"emq:{{{qname}}}:*") == []


# --------------------------------------------------------------------------- EmbeddedCluster


def test_embedded_cluster_left_the_library_path() -> None:
    """The cluster builder is test infrastructure: it lives in echomq.testing now."""
    assert not hasattr(echomq.server, "EmbeddedCluster")
    assert "EmbeddedCluster" not in echomq.server.__all__
    assert EmbeddedCluster.__module__ == "echomq.testing"


# --------------------------------------------------------------------------- the plugin


def test_plugin_is_registered_as_a_pytest11_entry_point() -> None:
    found = [e for e in importlib.metadata.entry_points(group="pytest11") if e.name == "echomq"]
    assert len(found) == 1, "reinstall the package (pip install -e .) to register the plugin"
    module = found[0].load()
    assert module.__name__ == "echomq.pytest_plugin"
    for name in ("echomq_server", "echomq_url", "echomq_queue_name", "echomq_app"):
        assert hasattr(module, name)


# The user's suites below are sync; pytest-asyncio (a dev dependency here) would warn about
# its unset loop scope, which this suite's filterwarnings=error turns into a failure.
INNER = ("-p", "no:cacheprovider", "-p", "no:asyncio")

USER_TESTS = """
import json
from pathlib import Path

import echomq
from echomq.testing import drain

NAMES = Path(__file__).with_name("names.json")


def _record(name):
    names = json.loads(NAMES.read_text()) if NAMES.exists() else []
    NAMES.write_text(json.dumps(names + [name]))


def test_send(echomq_app, echomq_queue_name):
    sent = []

    @echomq_app.task(queue=echomq_queue_name)
    def send(to):
        sent.append(to)

    send.enqueue("a@b.c")
    send.enqueue("d@e.f")
    assert drain(echomq_app).completed == 2
    assert sorted(sent) == ["a@b.c", "d@e.f"]
    _record(echomq_queue_name)


def test_fresh_queue(echomq_app, echomq_queue_name, echomq_url):
    # A queue name of its own, empty, on the same session server.
    assert echomq_queue_name not in json.loads(NAMES.read_text())
    with echomq.Queue(echomq_queue_name, url=echomq_url) as q:
        assert q.counts()["pending"] == 0
        q.enqueue(b"left behind")  # the fixture's teardown obliterates it
    _record(echomq_queue_name)
"""


def test_plugin_fixtures_in_process(
    pytester: pytest.Pytester, url: str, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ECHOMQ_TEST_URL points the plugin at this suite's server, so what the user's tests
    # leave behind can be inspected once they end.
    monkeypatch.setenv("ECHOMQ_TEST_URL", url)
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest(*INNER)
    result.assert_outcomes(passed=2)
    names = json.loads((pytester.path / "names.json").read_text())
    assert len(set(names)) == 2
    for name in names:
        assert r.keys(f"emq:{{{name}}}:*") == [], f"queue {name} was not cleaned up"


def test_plugin_is_inert_unless_a_fixture_is_used(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="def test_nothing():\n    assert True\n")
    basetemp = pytester.path / "basetemp"
    result = pytester.runpytest(*INNER, f"--basetemp={basetemp}")
    result.assert_outcomes(passed=1)
    assert not list(basetemp.glob("echomq-server[0-9]*")), "a server was started for nothing"


def test_plugin_in_a_real_pytest_subprocess(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's suite as they run it: `pytest` in a fresh process, the plugin found through
    its entry point, a private server started once and stopped at the end."""
    monkeypatch.delenv("ECHOMQ_TEST_URL", raising=False)
    pytester.makepyfile(
        test_user=USER_TESTS,
        test_more=textwrap.dedent(
            """
            def test_same_server(echomq_server, echomq_url):
                assert echomq_server is not None
                assert echomq_url == echomq_server.url
            """
        ),
    )
    basetemp = pytester.path / "basetemp"
    result = pytester.runpytest_subprocess(*INNER, f"--basetemp={basetemp}")
    result.assert_outcomes(passed=3)
    servers = list(basetemp.glob("echomq-server[0-9]*"))
    assert len(servers) == 1, "one server per session"
    assert pids_in(Path(servers[0])) == [], "the session server outlived the session"


def test_drain_runs_the_jobs_that_handlers_enqueue(url: str, qname: str, r: redis.Redis) -> None:
    """Follow-up jobs enqueued by handlers are drained too: empty means empty at the end."""
    app = _app(url)
    done: list[int] = []

    @app.task(queue=qname)
    async def countdown(n: int) -> None:
        done.append(n)
        if n > 0:
            await countdown.aenqueue(n - 1)

    countdown.enqueue(4)
    result = drain(app, timeout_s=30)
    assert (result.ran, result.completed) == (5, 5)
    assert done == [4, 3, 2, 1, 0]
    app.close()


def test_drain_waits_for_a_cross_queue_parent(url: str, qname: str) -> None:
    # The child's settle sits in its queue's outbox until a pump beat delivers it; a drain
    # that saw both queues empty returned before the parent (in no set meanwhile) ran.
    app = _app(url)
    ran: list[str] = []

    @app.task(queue=qname + "-c", keep_result_ms=60_000)
    def child(n: int) -> int:
        ran.append(f"child{n}")
        return n

    @app.task(queue=qname)
    def parent() -> None:
        ran.append("parent")

    app.flow(parent.s(), [child.s(1), child.s(2)])
    drain(app, timeout_s=30, beat_ms=1000)
    assert sorted(ran) == ["child1", "child2", "parent"]
