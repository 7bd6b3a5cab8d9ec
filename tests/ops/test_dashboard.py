"""The dashboard against a real server through Starlette's TestClient: every route and its
JSON twin, actions behind the token with CSRF and confirmation, read-only mode, and names,
payloads and log lines holding HTML rendered inert."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

with warnings.catch_warnings():
    # Starlette 1.x prefers the httpx2 fork for its TestClient; httpx works the same here.
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient
import echomq
from conftest import wait_for
from echomq.server import free_port
from echomq.web import create_app

TOKEN = "t0ken-for-tests"
MAX_FORM = 65536  # the documented bound of a request body
HOSTILE = "<script>alert(1)</script>"
HOSTILE_LOG = '<img src=x onerror="alert(2)">'


@pytest.fixture
def hq(url: str, qname: str, r: redis.Redis) -> Iterator[echomq.Queue]:
    """A queue with a hostile-looking but legal name (only [A-Za-z0-9._-])."""
    queue = echomq.Queue("x.-_" + qname[:60], url=url)
    yield queue
    queue.close()


def _dead(q: echomq.Queue, payload: bytes = b"boom", group: str | None = None) -> str:
    jid = q.enqueue(payload, group=group).id
    job = q.claim()
    assert job is not None and job.id == jid
    assert q.retry(job.id, job.token, delay_ms=0, max_attempts=1, error="<b>bad</b>") == "dead"
    return jid


def _client(url: str, queues: list[str], **kw: Any) -> TestClient:
    return TestClient(create_app(url, queues=queues, **kw))


def _sign_in(c: TestClient) -> str:
    c.get("/login")
    csrf = c.cookies.get("echomq_csrf")
    assert csrf
    res = c.post("/login", data={"token": TOKEN, "csrf": csrf}, follow_redirects=False)
    assert res.status_code == 303
    return csrf


def test_every_page_and_its_json_twin(url: str, q: echomq.Queue) -> None:
    jid = q.enqueue(b"hello", group="tenant-a").id
    q.add_log(jid, "a log line")
    with _client(url, [q.name]) as c:
        res = c.get("/")
        assert res.status_code == 200 and q.name in res.text
        api = c.get("/api/queues").json()
        assert [v["name"] for v in api["queues"]] == [q.name]
        assert api["queues"][0]["counts"]["pending"] == 1

        res = c.get(f"/queues/{q.name}")
        assert res.status_code == 200 and "tenant-a" in res.text
        data = c.get(f"/api/queues/{q.name}").json()
        assert data["counts"]["pending"] == 1
        assert [lane["name"] for lane in data["lanes"]] == ["tenant-a"]
        assert data["lanes"][0]["depth"] == 1

        lane = c.get(f"/api/queues/{q.name}", params={"state": "pending", "lane": "tenant-a"})
        assert [i["id"] for i in lane.json()["page"]["items"]] == [jid]

        res = c.get(f"/queues/{q.name}/jobs/{jid}")
        assert res.status_code == 200 and jid in res.text and "a log line" in res.text
        job = c.get(f"/api/queues/{q.name}/jobs/{jid}").json()
        assert job["place"] == "pending" and job["row"]["group"] == "tenant-a"
        assert job["payload"] == "hello" and job["logs"] == ["a log line"]

        found = c.get(f"/api/queues/{q.name}", params={"id": jid}).json()
        assert found["found"] == "pending"

        res = c.get("/metrics")
        assert res.status_code == 200
        fams = {f.name: f for f in text_string_to_metric_families(res.text)}
        pending = [s for s in fams["echomq_jobs"].samples if s.labels["state"] == "pending"]
        assert [(s.labels["queue"], s.value) for s in pending] == [(q.name, 1.0)]


def test_paging_through_a_set(url: str, q: echomq.Queue) -> None:
    ids = [e.id for e in q.enqueue_many([b"x"] * 120)]  # type: ignore[union-attr]
    with _client(url, [q.name]) as c:
        first = c.get(f"/api/queues/{q.name}", params={"state": "pending"}).json()["page"]
        second = c.get(f"/api/queues/{q.name}", params={"state": "pending", "offset": 50}).json()[
            "page"
        ]
        third = c.get(f"/api/queues/{q.name}", params={"state": "pending", "offset": 100}).json()[
            "page"
        ]
    assert first["total"] == 120
    seen = [i["id"] for p in (first, second, third) for i in p["items"]]
    assert seen == list(reversed(ids))  # newest first, every job exactly once


def test_bad_input_is_a_400(url: str, q: echomq.Queue) -> None:
    with _client(url, [q.name]) as c:
        assert c.get("/queues/bad{name}").status_code == 400
        assert c.get(f"/queues/{q.name}/jobs/not-an-id").status_code == 400
        assert c.get(f"/api/queues/{q.name}/jobs/not-an-id").json()["error"]
        assert c.get(f"/api/queues/{q.name}", params={"state": "nope"}).status_code == 400
        assert c.get(f"/api/queues/{q.name}", params={"offset": "x"}).status_code == 400


def test_actions_need_a_configured_token(
    url: str, q: echomq.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ECHOMQ_DASHBOARD_TOKEN", raising=False)
    jid = _dead(q)
    with _client(url, [q.name]) as c:
        page = c.get(f"/queues/{q.name}/jobs/{jid}").text
        assert "reprocess</button>" not in page
        res = c.post(
            f"/queues/{q.name}/jobs/{jid}/reprocess", headers={"authorization": "Bearer x"}
        )
        assert res.status_code == 403
    assert q.job_state(jid) == "dead"


def test_actions_refused_without_session_csrf_or_right_token(url: str, q: echomq.Queue) -> None:
    jid = _dead(q)
    with _client(url, [q.name], token=TOKEN) as c:
        # No session: refused.
        assert c.post(f"/queues/{q.name}/jobs/{jid}/reprocess").status_code == 401
        # A wrong bearer token: refused.
        res = c.post(f"/api/queues/{q.name}/pause", headers={"authorization": "Bearer nope"})
        assert res.status_code == 401
        # A wrong sign-in token: refused, no session.
        c.get("/login")
        csrf = c.cookies.get("echomq_csrf")
        assert c.post("/login", data={"token": "nope", "csrf": csrf}).status_code == 403
        assert c.post(f"/queues/{q.name}/pause", data={"csrf": csrf}).status_code == 401
        # Signed in but without (or with a wrong) CSRF token: refused.
        csrf = _sign_in(c)
        assert c.post(f"/queues/{q.name}/jobs/{jid}/reprocess").status_code == 403
        res = c.post(f"/queues/{q.name}/jobs/{jid}/reprocess", data={"csrf": csrf + "x"})
        assert res.status_code == 403
        assert q.job_state(jid) == "dead"
        assert not q.is_paused()
        # Signed in with the CSRF token: done.
        res = c.post(
            f"/queues/{q.name}/jobs/{jid}/reprocess", data={"csrf": csrf}, follow_redirects=False
        )
        assert res.status_code == 303
    assert q.job_state(jid) == "pending"


def test_sign_in_needs_csrf(url: str, q: echomq.Queue) -> None:
    with _client(url, [q.name], token=TOKEN) as c:
        assert c.post("/login", data={"token": TOKEN}).status_code == 403
        assert "echomq_session" not in c.cookies


def test_bearer_api_actions(url: str, q: echomq.Queue) -> None:
    q.enqueue(b"x", group="g1")
    auth = {"authorization": f"Bearer {TOKEN}"}
    with _client(url, [q.name], token=TOKEN) as c:
        assert c.post(f"/api/queues/{q.name}/pause", headers=auth).json()["ok"] is True
        assert q.is_paused()
        assert c.post(f"/api/queues/{q.name}/resume", headers=auth).status_code == 200
        assert not q.is_paused()
        lane = {"lane": "g1"}
        assert (
            c.post(f"/api/queues/{q.name}/pause_lane", headers=auth, data=lane).status_code == 200
        )
        c.post(f"/api/queues/{q.name}/limit_lane", headers=auth, data={**lane, "value": "3"})
        c.post(f"/api/queues/{q.name}/weight_lane", headers=auth, data={**lane, "value": "5"})
        data = c.get(f"/api/queues/{q.name}").json()
        assert data["lanes"] == [
            {
                "name": "g1",
                "depth": 1,
                "active": 0,
                "limit": 3,
                "weight": 5,
                "paused": True,
                "oldest_ms": data["lanes"][0]["oldest_ms"],
            }
        ]
        assert "paused" in c.get(f"/queues/{q.name}").text
        bad = c.post(f"/api/queues/{q.name}/limit_lane", headers=auth, data={**lane, "value": "x"})
        assert bad.status_code == 400
        assert c.post(f"/api/queues/{q.name}/explode", headers=auth).status_code == 404
        assert c.post(f"/api/queues/{q.name}/pause_lane", headers=auth).status_code == 400


def test_destructive_actions_ask_first(url: str, q: echomq.Queue) -> None:
    jid = q.enqueue(b"x").id
    q.enqueue(b"y")
    with _client(url, [q.name], token=TOKEN) as c:
        csrf = _sign_in(c)
        res = c.post(f"/queues/{q.name}/jobs/{jid}/remove", data={"csrf": csrf})
        assert res.status_code == 200 and 'name="confirm" value="yes"' in res.text
        assert q.job_state(jid) == "pending"
        res = c.post(
            f"/queues/{q.name}/jobs/{jid}/remove",
            data={"csrf": csrf, "confirm": "yes"},
            follow_redirects=False,
        )
        assert res.status_code == 303
        assert q.job_state(jid) == "absent"
        auth = {"authorization": f"Bearer {TOKEN}"}
        assert c.post(f"/api/queues/{q.name}/drain", headers=auth).status_code == 409
        assert q.counts()["pending"] == 1
        res = c.post(f"/api/queues/{q.name}/drain", headers=auth, data={"confirm": "yes"})
        assert res.json()["result"] == 1
    assert q.counts()["pending"] == 0


def test_retry_now_promotes_a_scheduled_job(url: str, q: echomq.Queue) -> None:
    jid = q.enqueue(b"later", delay_ms=3_600_000).id
    other = q.enqueue(b"pending").id
    auth = {"authorization": f"Bearer {TOKEN}"}
    with _client(url, [q.name], token=TOKEN) as c:
        assert c.post(f"/api/queues/{q.name}/jobs/{jid}/retry", headers=auth).status_code == 200
        assert q.job_state(jid) == "pending"
        # Not scheduled: refused, nothing moved.
        assert c.post(f"/api/queues/{q.name}/jobs/{other}/retry", headers=auth).status_code == 409
        gone = echomq.ids.mint()
        assert c.post(f"/api/queues/{q.name}/jobs/{gone}/reprocess", headers=auth).status_code in (
            404,
            409,
        )
    assert q.check() == []


def test_read_only_hides_and_refuses(url: str, q: echomq.Queue) -> None:
    jid = _dead(q)
    auth = {"authorization": f"Bearer {TOKEN}"}
    with _client(url, [q.name], token=TOKEN, read_only=True) as c:
        _sign_in(c)
        page = c.get(f"/queues/{q.name}/jobs/{jid}").text
        assert "read-only" in page and "reprocess</button>" not in page
        assert '<form method="post"' not in c.get(f"/queues/{q.name}").text
        res = c.post(f"/api/queues/{q.name}/jobs/{jid}/reprocess", headers=auth)
        assert res.status_code == 403
        assert c.post(f"/api/queues/{q.name}/pause", headers=auth).status_code == 403
    assert q.job_state(jid) == "dead"
    assert not q.is_paused()


def test_hostile_names_payloads_and_logs_render_inert(url: str, hq: echomq.Queue) -> None:
    jid = _dead(hq, HOSTILE.encode(), group="x.-_lane")
    hq.add_log(jid, HOSTILE_LOG)
    with _client(url, [hq.name], token=TOKEN) as c:
        _sign_in(c)
        for path in (
            "/",
            f"/queues/{hq.name}",
            f"/queues/{hq.name}?state=dead",
            f"/queues/{hq.name}/jobs/{jid}",
        ):
            text = c.get(path).text
            assert hq.name in text
            assert "<script>alert" not in text
            assert "<img src=x" not in text
            assert "<b>bad</b>" not in text
        job = c.get(f"/queues/{hq.name}/jobs/{jid}").text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in job
        assert "&lt;img src=x onerror=" in job
        assert "&lt;b&gt;bad&lt;/b&gt;" in job
        # The JSON twin carries the text as data, for a script to handle.
        assert c.get(f"/api/queues/{hq.name}/jobs/{jid}").json()["payload"] == HOSTILE


def test_payload_decoded_through_the_apps_serializer(url: str, q: echomq.Queue) -> None:
    app = echomq.App(url=url)

    @app.task(queue=q.name)
    def greet(name: str) -> None:  # pragma: no cover - never run here
        pass

    jid = greet.enqueue(name="<i>ada</i>").id
    with _client(url, [q.name], app=app) as c:
        job = c.get(f"/api/queues/{q.name}/jobs/{jid}").json()
        assert job["payload"]["task"] == greet.name
        assert job["payload"]["kwargs"] == {"name": "<i>ada</i>"}
        page = c.get(f"/queues/{q.name}/jobs/{jid}").text
        assert "&lt;i&gt;ada&lt;/i&gt;" in page and "<i>ada" not in page


def test_discovery_lists_every_queue(url: str, q: echomq.Queue, hq: echomq.Queue) -> None:
    q.enqueue(b"a")
    hq.enqueue(b"b")
    with TestClient(create_app(url)) as c:
        names = [v["name"] for v in c.get("/api/queues").json()["queues"]]
    assert q.name in names and hq.name in names


def test_poll_period_is_bounded(url: str) -> None:
    with pytest.raises(echomq.InvalidArgument):
        create_app(url, poll_ms=200)


def test_mounted_under_a_prefix(url: str, q: echomq.Queue) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    jid = _dead(q)
    outer = Starlette(routes=[Mount("/ops", app=create_app(url, queues=[q.name], token=TOKEN))])
    with TestClient(outer) as c:
        page = c.get("/ops/").text
        assert f'href="/ops/queues/{q.name}"' in page
        assert 'src="/ops/static/dashboard.js"' in page
        assert c.get("/ops/static/dashboard.js").status_code == 200
        assert c.get("/ops/static/dashboard.css").status_code == 200
        assert c.get(f"/ops/api/queues/{q.name}").json()["counts"]["dead"] == 1
        c.get("/ops/login")
        csrf = c.cookies.get("echomq_csrf")
        res = c.post("/ops/login", data={"token": TOKEN, "csrf": csrf}, follow_redirects=False)
        assert res.headers["location"] == "/ops/"
        res = c.post(
            f"/ops/queues/{q.name}/jobs/{jid}/reprocess",
            data={"csrf": csrf},
            follow_redirects=False,
        )
        assert res.status_code == 303
        assert res.headers["location"] == f"/ops/queues/{q.name}/jobs/{jid}"
        res = c.post(
            f"/ops/api/queues/{q.name}/pause", headers={"authorization": f"Bearer {TOKEN}"}
        )
        assert res.json()["ok"] is True
    assert q.job_state(jid) == "pending"
    assert q.is_paused()


def test_foreign_lane_fields_do_not_break_the_page(
    url: str, q: echomq.Queue, r: redis.Redis
) -> None:
    q.enqueue(b"x", group="fine")
    r.hset(f"emq:{{{q.name}}}:gactive", "<i>not a lane</i>", 1)
    with _client(url, [q.name]) as c:
        res = c.get(f"/queues/{q.name}")
        assert res.status_code == 200
        assert "&lt;i&gt;not a lane&lt;/i&gt;" in res.text and "<i>not a lane" not in res.text
        lanes = {lane["name"]: lane for lane in c.get(f"/api/queues/{q.name}").json()["lanes"]}
        assert lanes["fine"]["depth"] == 1 and lanes["<i>not a lane</i>"]["depth"] == 0


# --------------------------------------------------------------------------- request bodies


def test_a_body_over_the_bound_is_413_and_never_buffered(url: str, q: echomq.Queue) -> None:
    jid = q.enqueue(b"x", delay_ms=3_600_000).id
    auth = {"authorization": f"Bearer {TOKEN}"}
    big = b"token=" + b"a" * MAX_FORM

    def chunked() -> Iterator[bytes]:  # no Content-Length: a capped read must refuse it
        for _ in range(4):
            yield b"a" * (MAX_FORM // 2)

    with _client(url, [q.name], token=TOKEN) as c:
        c.get("/login")
        assert c.post("/login", content=big).status_code == 413
        assert c.post("/login", content=chunked()).status_code == 413
        assert "echomq_session" not in c.cookies
        # An action: authentication first, so an anonymous body is refused unread (401).
        path = f"/api/queues/{q.name}/jobs/{jid}/retry"
        assert c.post(path, content=big).status_code == 401
        assert c.post(path, content=chunked()).status_code == 401
        assert c.post(path, content=big, headers=auth).status_code == 413
        assert c.post(path, content=chunked(), headers=auth).status_code == 413
        bad = c.post(path, content=b"x", headers={**auth, "content-length": "x1"})
        assert bad.status_code == 400
        assert q.job_state(jid) == "scheduled"
        # A form of ours is far below the bound and still works.
        assert c.post(path, headers=auth, data={"pad": "p" * 1000}).status_code == 200
    assert q.job_state(jid) == "pending"


def test_sign_in_without_a_csrf_cookie_is_refused_before_the_body(
    url: str, q: echomq.Queue
) -> None:
    with _client(url, [q.name], token=TOKEN) as c:
        assert c.post("/login", content=b"token=" + b"a" * (2 * MAX_FORM)).status_code == 403


def _post(port: int, path: str, headers: dict[str, str], body: Iterable[bytes]) -> int | None:
    """One raw HTTP/1.1 POST; the status, or None when the server closed before answering
    (it may stop reading a refused body and reset the connection)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        head = f"POST {path} HTTP/1.1\r\nHost: t\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        s.sendall(head.encode())
        try:
            for piece in body:
                s.sendall(piece)
        except OSError:
            pass  # refused and closed while we were still sending
        try:
            reply = s.recv(4096)
        except OSError:
            return None
    return int(reply.split()[1]) if reply.startswith(b"HTTP/1.1 ") else None


def _chunks(total: int, size: int = 1 << 20) -> Iterator[bytes]:
    block = f"{size:x}\r\n".encode() + b"a" * size + b"\r\n"
    for _ in range(total // size):
        yield block
    yield b"0\r\n\r\n"


def _peak_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")  # pragma: no cover


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/status")
def test_large_streamed_bodies_do_not_grow_the_process(
    url: str, q: echomq.Queue, tmp_path: Any
) -> None:
    """The reported attack: large POSTs, unauthenticated, with and without Content-Length.
    The dashboard's peak RSS (VmHWM) must not grow by anything near the bodies' size."""
    port = free_port()
    env = {**os.environ, "ECHOMQ_DASHBOARD_TOKEN": TOKEN, "HOME": str(tmp_path)}
    argv = [sys.executable, "-m", "echomq", "--url", url, "dashboard", "--port", str(port)]
    proc = subprocess.Popen(
        [*argv, "-q", q.name],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def up() -> bool:
            try:
                return _post(port, "/logout", {"content-length": "0"}, []) == 303
            except OSError:
                return False

        wait_for(up, timeout=30, interval=0.1)
        jid = echomq.ids.mint()
        before = _peak_rss_kib(proc.pid)
        mib = 64 << 20
        cookie = {"cookie": "echomq_csrf=c"}
        chunked = {"transfer-encoding": "chunked", "content-type": "text/plain"}
        status = [
            _post(port, "/login", {**cookie, **chunked}, _chunks(mib)),
            _post(port, "/login", {**cookie, "content-length": str(400 << 20)}, [b"a" * 4096]),
            _post(port, f"/queues/{q.name}/jobs/{jid}/retry", chunked, _chunks(mib)),
            _post(port, f"/api/queues/{q.name}/pause", {"content-length": str(mib)}, [b"a"]),
        ]
        grown = _peak_rss_kib(proc.pid) - before
        print(f"peak RSS growth {grown} KiB over 2 x 64 MiB streamed bodies, {status}")
        assert all(s in (None, 413, 401) for s in status), status
        assert grown < 16 * 1024, f"the dashboard grew by {grown} KiB"
    finally:
        proc.terminate()
        proc.wait(60)


# --------------------------------------------------------------------------- sessions


def test_sign_out_revokes_the_session_on_the_server(
    url: str, q: echomq.Queue, r: redis.Redis
) -> None:
    with _client(url, [q.name], token=TOKEN) as c:
        csrf = _sign_in(c)
        sid = c.cookies.get("echomq_session")
        assert sid and TOKEN not in sid
        keys = list(r.scan_iter(match="{emq}:session:*"))
        assert len(keys) >= 1 and all(0 < r.pttl(k) <= 12 * 3600 * 1000 for k in keys)
        assert c.post(f"/queues/{q.name}/pause", data={"csrf": csrf}).status_code in (200, 303)
        assert q.is_paused()
        q.resume()
        assert c.post("/logout", follow_redirects=False).status_code == 303
    # The same cookie, replayed after sign-out (a copy an attacker kept): nobody is signed in.
    with _client(url, [q.name], token=TOKEN) as c2:
        c2.cookies.set("echomq_session", sid)
        c2.cookies.set("echomq_csrf", csrf)
        assert c2.post(f"/queues/{q.name}/pause", data={"csrf": csrf}).status_code == 401
    assert not q.is_paused()
    digest = hashlib.sha256(sid.encode()).hexdigest()
    assert not r.exists("{emq}:session:" + digest)


def test_a_session_of_another_token_is_void(url: str, q: echomq.Queue) -> None:
    with _client(url, [q.name], token=TOKEN) as c:
        csrf = _sign_in(c)
        sid = c.cookies.get("echomq_session")
    with _client(url, [q.name], token=TOKEN + "-rotated") as c2:
        c2.cookies.set("echomq_session", sid)
        c2.cookies.set("echomq_csrf", csrf)
        assert c2.post(f"/queues/{q.name}/pause", data={"csrf": csrf}).status_code == 401
        c2.cookies.set("echomq_session", "x" * 500)
        assert c2.post(f"/queues/{q.name}/pause", data={"csrf": csrf}).status_code == 401
    assert not q.is_paused()


def test_run_now_moves_exactly_the_job_asked_for(url: str, q: echomq.Queue, r: redis.Redis) -> None:
    """Another job sits in the schedule at score 0 (a concurrent "run now" half done, in the
    old two-write scheme): running this one now moves this one, in one script."""
    first = q.enqueue(b"other", delay_ms=3_600_000).id
    mine = q.enqueue(b"mine", delay_ms=3_600_000).id
    r.zadd(f"emq:{{{q.name}}}:schedule", {first: 0})
    auth = {"authorization": f"Bearer {TOKEN}"}
    with _client(url, [q.name], token=TOKEN) as c:
        assert c.post(f"/api/queues/{q.name}/jobs/{mine}/retry", headers=auth).status_code == 200
    assert q.job_state(mine) == "pending"
    assert q.browse("pending") == [mine]


def test_a_kept_completed_job_has_its_page_and_list(url: str, q: echomq.Queue) -> None:
    """Kept history (issue 24): the completed state's list and a kept job's page work (the
    dashboard's own completed pages are issue 26)."""
    q.keep_completed(count=10)
    jid = q.enqueue(b"done").id
    job = q.claim()
    assert job is not None
    q.complete(job.id, job.token, result=b"42", keep_result_ms=60_000)
    with _client(url, [q.name]) as c:
        page = c.get(f"/api/queues/{q.name}", params={"state": "completed"}).json()["page"]
        assert [i["id"] for i in page["items"]] == [jid] and page["total"] == 1
        assert c.get(f"/queues/{q.name}", params={"state": "completed"}).status_code == 200
        view = c.get(f"/api/queues/{q.name}/jobs/{jid}").json()
        assert view["place"] == "completed" and view["row"]["state"] == "completed"
        assert int(view["row"]["finished_ms"]) >= int(view["row"]["claimed_ms"])
        res = c.get(f"/queues/{q.name}/jobs/{jid}")
        assert res.status_code == 200 and jid in res.text
