"""Health probes (issue 40) on real processes and a real server: ``echomq worker
--health-port`` answers /livez and /readyz; a handler that blocks the event loop turns /livez
red within ``--live-bound`` (and names the run past its lease); a server outage turns /readyz
red and back; SIGTERM turns /readyz red at once while the worker drains; the supervisor of
``-p 2`` serves both for its children. Every wait polls with a generous deadline."""

from __future__ import annotations

import json
import signal
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import echomq
from conftest import wait_for
from echomq.server import EmbeddedServer, free_port
from procs import Proc, Spawner, wait_log


def call(task: str, *args: object) -> bytes:
    return json.dumps({"task": task, "args": list(args), "kwargs": {}}).encode()


def probe(port: int, path: str) -> tuple[int, dict[str, Any]] | None:
    """(status, JSON body) of a probe, or None while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:  # 503 and 404 carry a JSON body too
        return exc.code, json.loads(exc.read())
    except OSError:
        return None


def until(proc: Proc, port: int, path: str, status: int, timeout: float = 90) -> dict[str, Any]:
    """Poll ``path`` until it answers ``status``; its body. Fails at once, with the process's
    output, if the process exits."""
    seen: list[Any] = []

    def check() -> dict[str, Any] | None:
        if proc.popen.poll() is not None:
            raise AssertionError(f"{proc} exited {proc.popen.returncode}:\n{proc.text()}")
        got = probe(port, path)
        seen[:] = [got]
        return got[1] if got is not None and got[0] == status else None

    try:
        body: dict[str, Any] = wait_for(check, timeout, 0.1)
    except AssertionError as exc:
        raise AssertionError(
            f"{path} never answered {status}; last: {seen}\n{proc.text()}"
        ) from exc
    return body


def health_worker(spawn: Spawner, queue: str, port: int, *options: str, **env: str) -> Proc:
    environ = spawn.env(EMQ_TEST_QUEUE=queue, **env)
    args = ["worker", "apps.probes:app", "--health-host", "127.0.0.1"]
    return spawn.start(*args, "--health-port", str(port), *options, env=environ)


def test_a_blocked_event_loop_turns_livez_red_and_names_the_run_past_its_lease(
    spawn: Spawner, q: echomq.Queue, qname: str
) -> None:
    port = free_port()
    w = health_worker(spawn, qname, port, "--live-bound", "2", EMQ_TEST_LEASE_MS="2000")
    body = until(w, port, "/readyz", 200)
    assert body == {"status": "ready"}
    live = until(w, port, "/livez", 200)
    assert live["bound_s"] == 2.0 and live["past_lease"] == [] and live["loop_age_s"] <= 2
    assert probe(port, "/nope") == (404, {"error": "not found: /livez and /readyz are served"})

    job = q.enqueue(call("block", 300))
    red = until(w, port, "/livez", 503)
    assert red["status"] == "stalled" and red["loop_age_s"] > 2
    assert "the event loop has not turned over" in red["reason"]
    # Its lease (2 s) passes with no heartbeat: the run is named, the probe thread still serves.
    late = wait_for(lambda: (b := probe(port, "/livez")) and b[1]["past_lease"] and b[1], 90, 0.1)
    (run,) = late["past_lease"]
    assert run["job"] == job.id and run["task"] == "block" and run["queue"] == qname
    assert run["past_lease_s"] > 0
    assert until(w, port, "/readyz", 503)["reason"] == "the event loop is stalled"
    w.stop()  # SIGKILL: the loop is blocked for 300 s, no signal handler can run


def test_a_server_outage_turns_readyz_red_and_back(spawn: Spawner, tmp_path: Path) -> None:
    srv = EmbeddedServer(tmp_path / "srv", appendonly=False).start()
    port = free_port()
    try:
        w = health_worker(spawn, "outage", port, "--beat-ms", "200", ECHOMQ_URL=srv.url)
        until(w, port, "/readyz", 200)
        srv.stop()
        down = until(w, port, "/readyz", 503)
        assert down["reason"].startswith("server unreachable for "), down
        # Liveness is the process's own: a lost server is not a reason to restart it.
        assert probe(port, "/livez") is not None
        assert probe(port, "/livez")[0] == 200  # type: ignore[index]
        srv = EmbeddedServer(tmp_path / "srv", appendonly=False, port=srv.port).start()
        assert until(w, port, "/readyz", 200) == {"status": "ready"}
        w.signal(signal.SIGTERM)
        assert w.wait(60) == 0, w.text()
    finally:
        srv.stop()


def test_sigterm_turns_readyz_red_while_the_worker_drains(
    spawn: Spawner, q: echomq.Queue, qname: str
) -> None:
    port = free_port()
    w = health_worker(spawn, qname, port, "--grace", "120")
    until(w, port, "/readyz", 200)
    body = sigterm_while_busy(w, port, q, "finishing in-flight jobs")
    assert body["reason"] == "draining: stopping (SIGTERM received)"
    assert probe(port, "/livez")[0] == 200  # type: ignore[index]
    w.signal(signal.SIGTERM)  # the second signal: exit now
    assert w.wait(60) != 0


def sigterm_while_busy(proc: Proc, port: int, q: echomq.Queue, said: str) -> dict[str, Any]:
    """A job holding a slot (for longer than the test), then SIGTERM: /readyz's 503 body
    while the process drains (its --grace outlasts the test)."""
    q.enqueue(call("nap", 300))
    wait_for(lambda: q.counts()["active"] == 1, 60)
    proc.signal(signal.SIGTERM)
    wait_log(proc, said)
    body = until(proc, port, "/readyz", 503)
    assert proc.popen.poll() is None  # still draining: the nap holds it within --grace
    return body


def test_the_supervisor_serves_the_probes_of_its_children(
    spawn: Spawner, q: echomq.Queue, qname: str
) -> None:
    port = free_port()
    sup = health_worker(spawn, qname, port, "-p", "2", "--live-bound", "2", "--grace", "120")
    body = until(sup, port, "/readyz", 200)
    assert body == {"status": "ready", "workers": 2}
    live = until(sup, port, "/livez", 200)
    assert [c["index"] for c in live["workers"]] == [0, 1]
    assert all(isinstance(c["pid"], int) and c["pid"] != sup.pid for c in live["workers"])

    # One child's loop blocked (20 s, then it recovers): the fleet is not live, naming it.
    q.enqueue(call("block", 20))
    red = until(sup, port, "/livez", 503)
    assert "the event loop has not turned over" in red["reason"], red
    assert red["reason"].startswith(("worker 0:", "worker 1:")), red
    assert until(sup, port, "/livez", 200, timeout=120)["status"] == "ok"
    until(sup, port, "/readyz", 200)

    body = sigterm_while_busy(sup, port, q, "supervisor received SIGTERM")
    assert body["reason"] == "draining: stopping (signal received)", body
    sup.signal(signal.SIGTERM)  # the second: the children exit now
    sup.wait(60)


def test_bad_probe_options_are_one_line_and_start_nothing(
    spawn: Spawner, q: echomq.Queue, qname: str
) -> None:
    for options, said in [
        (["--health-port", "0"], "error: --health-port must be a port in [1, 65535], got 0"),
        (["--health-port", "70000"], "error: --health-port must be a port in [1, 65535]"),
        (["--live-bound", "1.5"], "error: --live-bound must be >= 2 seconds, got 1.5"),
        (["--live-bound", "nan"], "error: --live-bound must be >= 2 seconds, got nan"),
    ]:
        w = spawn.start("worker", "apps.probes:app", *options, env=spawn.env(EMQ_TEST_QUEUE=qname))
        assert w.wait(60) == 2, w.text()
        assert w.text().startswith(said) and w.text().count("\n") == 1, w.text()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        w = health_worker(spawn, qname, port)
        assert w.wait(60) == 2, w.text()
        assert f"error: --health-port {port}: cannot listen on 127.0.0.1:{port}" in w.text()
        assert "Traceback" not in w.text()
    assert not q.client.keys(f"emq:{{{qname}}}:*")  # no worker ran: nothing was written
