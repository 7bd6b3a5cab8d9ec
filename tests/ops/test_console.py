"""The operator console (issue 26) against a real server through Starlette's TestClient:
job lists that carry task, arguments, attempts, last error and times; find by id prefix,
task name and error text with a "searched N of M" note; cancel, retry all dead, delete all
dead and actions on a selection, each behind the token, CSRF and a confirm; the workers,
repeats, flows and charts pages; bad input as a 4xx page; an unreachable server as a 503.

The per-page tests (repeats, flows, charts, lanes, payload edits, ...) are in
test_console_pages.py.
"""

from __future__ import annotations

import os
import re
import threading
import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient
import console_support
from console_support import (
    HTML,
    _call,
    _client,
    _kill,
    _post,
    _row,
)
from test_dashboard import TOKEN, _sign_in

import echomq
from conftest import running, wait_for
from echomq.ops import console as _console
from echomq.protocol import envelope as _envelope
from echomq.serializers import MsgPack
from echomq.server import free_port

# Shared fixtures (bound here so pytest finds them in this module).
signed = console_support.signed


def test_preview_decodes_json_and_msgpack_envelopes_and_shows_bytes_otherwise() -> None:
    assert _console.preview(None, _call("resize", 3, "a", w=2)) == ("resize", "3, 'a', w=2")
    packed = _envelope.build(MsgPack(), "thumb", [b"\x00\x01"], {})
    assert _console.preview(None, packed) == ("thumb", "b'\\x00\\x01'")
    assert _console.preview(None, b"plain text") == (None, "plain text")
    assert _console.preview(None, b"\xff\xfe") == (None, "b'\\xff\\xfe'")
    task, args = _console.preview(None, _call("long", "x" * 500))
    assert task == "long" and len(args) == _console.PREVIEW and args.endswith("…")


def test_one_line_takes_a_tracebacks_last_line() -> None:
    tb = 'Traceback (most recent call last):\n  File "x", line 1\nKeyError: 7\n'
    assert _console.one_line(tb) == "KeyError: 7"
    assert _console.one_line("first\nsecond") == "first"
    assert _console.one_line("") == ""


def test_lists_carry_task_args_attempts_error_and_times(url: str, q: echomq.Queue) -> None:
    dead = _kill(q, _call("charge", 12), 'Traceback (most recent call last):\nKeyError: "card"')
    waiting = q.enqueue(_call("resize", 640, mode="fit")).id
    later = q.enqueue(_call("remind", "bob"), delay_ms=3_600_000).id
    with _client(url, [q.name]) as c:
        page = c.get(f"/queues/{q.name}")
        assert page.status_code == 200
        row = _row(page.text, waiting)
        assert "resize" in row and "640, mode=&#39;fit&#39;" in row
        dead_page = c.get(f"/queues/{q.name}", params={"state": "dead"}).text
        row = _row(dead_page, dead)
        assert "charge" in row and "KeyError: &#34;card&#34;" in row
        assert re.search(r'<td class="n lo">1</td>', row)  # one attempt
        sched = c.get(f"/queues/{q.name}", params={"state": "schedule"}).text
        row = _row(sched, later)
        assert "remind" in row and ">in 6" in row  # runs in ~60 minutes, human
        assert "unix ms" in row  # the raw value on hover
        api = c.get(f"/api/queues/{q.name}", params={"state": "dead"}).json()
        (r,) = api["rows"]
        assert (r["id"], r["task"], r["args"], r["attempts"]) == (dead, "charge", "12", 1)
        assert r["error"] == 'KeyError: "card"' and r["priority"] is None


def test_active_list_names_the_worker_holding_the_job(url: str, qname: str) -> None:
    app = echomq.App(url=url)
    release = threading.Event()

    @app.task(queue=qname, name="hold")
    def hold() -> None:
        release.wait(60)

    q = app.queue(qname)
    try:
        with running(echomq.Worker(app, [qname], 2, beat_ms=100)):
            jid = hold.enqueue().id
            wait_for(lambda: any(w.jobs for w in q.workers()), 60)
            with _client(url, [qname]) as c:
                rows = c.get(f"/api/queues/{qname}", params={"state": "active"}).json()["rows"]
                (row,) = rows
                assert row["id"] == jid and row["task"] == "hold"
                assert row["worker"] and row["worker"].endswith(f":{os.getpid()}")
                page = c.get(f"/queues/{qname}/workers")
                assert page.status_code == 200 and jid in page.text and "hold" in page.text
                api = c.get(f"/api/queues/{qname}/workers").json()
                assert api["workers"][0]["concurrency"] == 2
                release.set()
    finally:
        release.set()
        app.close()


def test_paging_by_rank_with_first_last_and_page_size(url: str, q: echomq.Queue) -> None:
    ids = [e.id for e in q.enqueue_many([b"x"] * 1234)]  # type: ignore[union-attr]
    newest_first = list(reversed(ids))
    with _client(url, [q.name]) as c:
        page = c.get(f"/queues/{q.name}", params={"per": 100}).text
        assert "1\u2013100 of 1,234" in page  # thousands separators
        assert "offset=1200" in page  # the last page's link
        last = c.get(f"/api/queues/{q.name}", params={"per": 100, "offset": 1200}).json()
        assert [i["id"] for i in last["page"]["items"]] == newest_first[1200:]
        mid = c.get(f"/api/queues/{q.name}", params={"per": 25, "offset": 50}).json()
        assert [i["id"] for i in mid["page"]["items"]] == newest_first[50:75]
        assert c.get(f"/queues/{q.name}", params={"per": 7}).status_code == 400


def test_find_by_id_prefix_task_and_error_with_a_searched_note(url: str, q: echomq.Queue) -> None:
    dead = [_kill(q, _call("charge", i), f"CardDeclined: card {i}") for i in range(3)]
    a = q.enqueue(_call("send_email", "a@x")).id
    q.enqueue(_call("resize", 1))
    with _client(url, [q.name]) as c:
        by_prefix = c.get(f"/api/queues/{q.name}", params={"find": a[:12]}).json()["find"]
        got = [r["id"] for r in by_prefix["rows"]]
        assert a in got and all(j.startswith(a[:12]) for j in got) and by_prefix["complete"]
        exact = c.get(f"/api/queues/{q.name}", params={"find": a}).json()["find"]
        assert [r["id"] for r in exact["rows"]] == [a]
        by_task = c.get(f"/api/queues/{q.name}", params={"find": "EMAIL", "by": "task"}).json()
        assert [r["id"] for r in by_task["find"]["rows"]] == [a]
        params = {"state": "dead", "find": "card 1", "by": "error"}
        by_error = c.get(f"/api/queues/{q.name}", params=params).json()["find"]
        assert [r["id"] for r in by_error["rows"]] == [dead[1]]
        assert (by_error["searched"], by_error["total"]) == (3, 3)
        page = c.get(f"/queues/{q.name}", params=params).text
        assert "searched all 3 dead jobs" in page and dead[1] in page


def test_a_find_is_bounded_and_says_how_much_it_searched(url: str, q: echomq.Queue) -> None:
    from echomq.client.executor import SyncExecutor, sync_client
    from echomq.protocol.kernel import Keys

    q.enqueue_many([_call("noop", i) for i in range(1200)])
    client = sync_client(url)
    try:
        found = _console.find(
            SyncExecutor(client), Keys(q.name), "pending", "task", "absent", bound=600
        )
    finally:
        client.close()
    assert (found.searched, found.total, found.rows, found.complete) == (600, 1200, [], False)


def test_a_search_string_with_html_is_inert_or_refused(url: str, q: echomq.Queue) -> None:
    q.enqueue(b"x")
    with _client(url, [q.name]) as c:
        res = c.get(f"/queues/{q.name}", params={"find": HTML, "by": "task"})
        assert res.status_code == 200 and HTML not in res.text
        assert "&lt;script&gt;" in res.text
        bad = c.get(f"/queues/{q.name}", params={"find": HTML, "by": "id"})
        assert bad.status_code == 400 and HTML not in bad.text
        assert c.get(f"/queues/{q.name}", params={"find": "x", "by": "nope"}).status_code == 400


def test_bad_input_is_a_4xx_page_never_a_500(url: str, q: echomq.Queue) -> None:
    q.enqueue(b"x")
    with _client(url, None) as c:
        cases = {
            "/queues/no-such-queue-here": 404,
            "/queues/no-such-queue-here/workers": 404,
            "/queues/no-such-queue-here/charts": 404,
            "/queues/bad{name}": 400,
            f"/queues/{q.name}/jobs/not-an-id": 400,
            f"/queues/{q.name}/jobs/JOB%3Cb%3E": 400,
            f"/queues/{q.name}?offset=99999999999": 400,
            f"/queues/{q.name}?offset=999999": 404,
            f"/queues/{q.name}?offset=-1": 400,
            f"/queues/{q.name}?per=100000": 400,
            f"/queues/{q.name}?state=%3Cb%3E": 400,
            f"/api/queues/{q.name}?offset=999999": 404,
        }
        for path, status in cases.items():
            res = c.get(path)
            assert res.status_code == status, (path, res.status_code, res.text[:200])
            assert "Traceback" not in res.text
        assert "no such queue" in c.get("/queues/no-such-queue-here").text


def test_unreachable_server_is_a_clear_503_and_healthz_says_so(url: str, q: echomq.Queue) -> None:
    dead_url = f"redis://127.0.0.1:{free_port()}/0"
    # With a token: even the error page's "signed in?" read cannot reach the server.
    with _client(dead_url, [q.name], token=TOKEN) as c:
        c.cookies.set("echomq_session", "some-session")
        login = c.get("/login")
        assert login.status_code == 200
        csrf = c.cookies.get("echomq_csrf") or ""
        res = c.post("/login", data={"token": TOKEN, "csrf": csrf})
        assert res.status_code == 503 and "unreachable" in res.text
        for path in ("/", f"/queues/{q.name}", f"/queues/{q.name}/charts", "/api/queues"):
            res = c.get(path)
            assert res.status_code == 503, (path, res.text[:200])
            assert "unreachable" in res.text and "Traceback" not in res.text
        health = c.get("/healthz")
        assert health.status_code == 503 and health.text.startswith("unreachable")
    with _client(url, [q.name]) as c:
        assert c.get("/healthz").text == "ok\n"


def test_cancel_an_active_job_asks_first_then_signals(
    url: str, q: echomq.Queue, signed: tuple[TestClient, str]
) -> None:
    c, csrf = signed
    jid = q.enqueue(b"x").id
    assert q.claim() is not None
    path = f"/queues/{q.name}/jobs/{jid}/cancel"
    ask = c.post(path, data={"csrf": csrf})
    assert ask.status_code == 200 and "confirm" in ask.text
    assert q.get_job(jid) is not None and "cancel" not in (q.get_job(jid) or {})
    done = c.post(path, data={"csrf": csrf, "confirm": "yes"}, follow_redirects=False)
    assert done.status_code == 303
    assert (q.get_job(jid) or {}).get("cancel") is not None
    gone = c.post(
        f"/queues/{q.name}/jobs/JOB00000000000/cancel", data={"csrf": csrf, "confirm": "yes"}
    )
    assert gone.status_code == 404


def test_retry_all_dead_and_delete_all_dead(
    url: str, q: echomq.Queue, signed: tuple[TestClient, str]
) -> None:
    c, csrf = signed
    dead = [_kill(q, b"x") for _ in range(3)]
    res = c.post(f"/queues/{q.name}/retry_dead", data={"csrf": csrf}, follow_redirects=False)
    assert res.status_code == 303
    assert q.counts()["dead"] == 0 and all(q.job_state(j) == "pending" for j in dead)
    while (job := q.claim()) is not None:
        q.retry(job.id, job.token, delay_ms=0, max_attempts=1, error="again")
    assert q.counts()["dead"] == 3
    ask = c.post(f"/queues/{q.name}/delete_dead", data={"csrf": csrf})
    assert ask.status_code == 200 and "Delete every dead job" in ask.text
    assert q.counts()["dead"] == 3
    c.post(f"/queues/{q.name}/delete_dead", data={"csrf": csrf, "confirm": "yes"})
    assert q.counts()["dead"] == 0 and all(q.job_state(j) == "absent" for j in dead)


def test_actions_on_a_selection(url: str, q: echomq.Queue, signed: tuple[TestClient, str]) -> None:
    c, csrf = signed
    dead = [_kill(q, b"x") for _ in range(4)]
    page = c.get(f"/queues/{q.name}", params={"state": "dead"}).text
    assert 'form="bulk"' in page and 'id="bulk-verb"' in page
    picked = dead[:2]
    form = [("csrf", csrf), ("verb", "reprocess")] + [("ids", j) for j in picked]
    res = _post(c, f"/queues/{q.name}/selected", form, follow_redirects=False)
    assert res.status_code == 303
    assert [q.job_state(j) for j in dead] == ["pending", "pending", "dead", "dead"]
    form = [("csrf", csrf), ("verb", "remove"), ("ids", dead[2])]
    ask = _post(c, f"/queues/{q.name}/selected", form)
    assert ask.status_code == 200 and dead[2] in ask.text and q.job_state(dead[2]) == "dead"
    _post(c, f"/queues/{q.name}/selected", [*form, ("confirm", "yes")])
    assert q.job_state(dead[2]) == "absent" and q.job_state(dead[3]) == "dead"
    # Every id is checked before the first one moves: a malformed one refuses the lot.
    form = [("csrf", csrf), ("verb", "reprocess"), ("ids", dead[3]), ("ids", "<b>")]
    assert _post(c, f"/queues/{q.name}/selected", form).status_code == 400
    assert q.job_state(dead[3]) == "dead"
    none = [("csrf", csrf), ("verb", "reprocess")]
    assert _post(c, f"/queues/{q.name}/selected", none).status_code == 400
    bad_verb = [("csrf", csrf), ("verb", "obliterate"), ("ids", dead[3])]
    assert _post(c, f"/queues/{q.name}/selected", bad_verb).status_code == 400


def test_bulk_actions_need_the_token_and_csrf(url: str, q: echomq.Queue) -> None:
    dead = _kill(q, b"x")
    with _client(url, [q.name], token=TOKEN) as c:
        assert c.post(f"/queues/{q.name}/retry_dead").status_code == 401
        _sign_in(c)
        assert c.post(f"/queues/{q.name}/retry_dead", data={"csrf": "forged"}).status_code == 403
        assert q.job_state(dead) == "dead"
    with _client(url, [q.name], token=TOKEN, read_only=True) as c:
        page = c.get(f"/queues/{q.name}", params={"state": "dead"}).text
        assert "retry-dead" not in page and 'class="badge ro"' in page
        assert c.post(f"/queues/{q.name}/retry_dead").status_code == 403
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with _client(url, [q.name], token=TOKEN) as c:
        res = c.post(f"/api/queues/{q.name}/retry_dead", headers=auth).json()
        assert res == {"ok": True, "action": "retry_dead", "result": 1}
    assert q.job_state(dead) == "pending"
