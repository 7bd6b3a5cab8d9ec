"""Console pages beyond the lists: repeats, flows and batches, charts, lanes, times,
no-javascript reads, priorities, completed jobs, reschedule, payload edits and
cancel-all.
"""

from __future__ import annotations

import re
import time
import warnings
from typing import Any

import redis

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient
import console_support
from console_support import (
    _call,
    _client,
    _kill,
    _post,
    _row,
)
from test_dashboard import TOKEN, _sign_in

import echomq
from echomq.ops import console as _console
from echomq.protocol import envelope as _envelope
from echomq.serializers import JSON, MsgPack

# Shared fixtures (bound here so pytest finds them in this module).
signed = console_support.signed


def test_repeats_page_lists_and_removes(
    url: str, q: echomq.Queue, signed: tuple[TestClient, str]
) -> None:
    c, csrf = signed
    q.repeat("nightly", _call("report"), cron="0 3 * * *")
    q.repeat("tick", b"t", every_ms=30_000)
    page = c.get(f"/queues/{q.name}/repeats").text
    assert "nightly" in page and "0 3 * * *" in page and "every 30.0 s" in page
    api = c.get(f"/api/queues/{q.name}/repeats").json()
    assert sorted(r["name"] for r in api["repeats"]) == ["nightly", "tick"]
    ask = c.post(f"/queues/{q.name}/unrepeat", data={"csrf": csrf, "name": "tick"})
    assert ask.status_code == 200 and "tick" in ask.text
    assert len(q.repeats()) == 2
    c.post(f"/queues/{q.name}/unrepeat", data={"csrf": csrf, "name": "tick", "confirm": "yes"})
    assert [r.name for r in q.repeats()] == ["nightly"]


def test_flows_page_shows_a_parent_with_its_childrens_states(url: str, q: echomq.Queue) -> None:
    from echomq import FlowJob

    added = q.add_flow(
        FlowJob(
            _call("assemble"),
            children=[FlowJob(_call("part", i), fail_parent=False) for i in range(3)],
        )
    )
    parent = added.parent_id
    first = q.claim()
    assert first is not None
    q.complete(first.id, first.token, result=b"done-1")
    second = q.claim()
    assert second is not None
    q.retry(second.id, second.token, delay_ms=0, max_attempts=1, error="broke")
    with _client(url, [q.name]) as c:
        api = c.get(f"/api/queues/{q.name}/flows").json()
        (node,) = [p for p in api["parents"] if p["id"] == parent]
        assert node["task"] == "assemble" and node["state"] == "awaiting_children"
        settled = {s[0]: s[1] for s in node["settled"]}
        assert settled == {first.id: "completed", second.id: "ignored"}
        assert node["waiting"] + len(settled) == 3
        page = c.get(f"/queues/{q.name}/flows").text
        assert parent in page and first.id in page and "completed" in page


def test_flows_page_shows_a_batch(url: str, q: echomq.Queue) -> None:
    """Issue 42: a batch is listed on the flows page: its state, description, the members
    still to settle (not the open batch's hold) and their outcomes."""
    app = echomq.App(url=url)

    @app.task(queue=q.name, name="resize")
    def resize(n: int) -> None:
        return None

    b = app.batch(on_complete=resize.s(0), description="thumbnails")
    members = b.add_many([resize.s(i) for i in range(3)])
    job = q.claim()
    assert job is not None and job.id == members[0]
    q.complete(job.id, job.token)
    with _client(url, [q.name]) as c:
        api = c.get(f"/api/queues/{q.name}/flows").json()
        (node,) = [p for p in api["parents"] if p["id"] == b.id]
        assert (node["batch"], node["about"], node["waiting"]) == ("open", "thumbnails", 2)
        assert {s[0]: s[1] for s in node["settled"]} == {members[0]: "completed"}
        assert {t["id"] for t in node["tree"]} == set(members)
        page = c.get(f"/queues/{q.name}/flows").text
        assert "batch open" in page and "thumbnails" in page and "2 members still" in page
        b.close()
        page = c.get(f"/queues/{q.name}/flows").text
        assert "batch closed" in page
    app.close()


def test_charts_show_completed_failed_depth_and_oldest(url: str, q: echomq.Queue) -> None:
    for _ in range(3):
        q.enqueue(b"x")
        job = q.claim()
        assert job is not None
        q.complete(job.id, job.token)
    _kill(q, b"y")
    q.enqueue(b"waiting")
    with _client(url, [q.name]) as c:
        page = c.get(f"/queues/{q.name}/charts")
        assert page.status_code == 200
        assert page.text.count("<svg") >= 4 and "(3 in 60 min)" in page.text
        assert "0 min ago: 3" in page.text  # the current minute's bar carries its value
        api = c.get(f"/api/queues/{q.name}/charts").json()
        assert sum(api["completed_per_minute"]) == 3 and sum(api["failed_per_minute"]) == 1
        assert len(api["depth"]) == 60 and api["depth"][-1] == 1


def test_lanes_table_headers_line_up_with_their_cells(
    url: str, q: echomq.Queue, signed: tuple[TestClient, str]
) -> None:
    c, _ = signed
    q.enqueue(b"x", group="tenant-a")
    html = c.get(f"/queues/{q.name}").text
    table = re.search(r'<table class="grid" id="lanes">(.*?)</table>', html, re.S)
    assert table
    heads = re.findall(r"<th[ >]", table.group(1))
    row = re.search(r'<tr data-lane="tenant-a">(.*?)</tr>', table.group(1), re.S)
    assert row
    # Cells are direct <td>s (a flex <td> is not a table cell: its content slid under the
    # wrong header); the actions' flex box sits inside the last one.
    cells = re.findall(r"<td[ >]", row.group(1))
    assert len(heads) == len(cells) == 7
    assert '<td class="row-actions"' not in html


def test_times_are_human_with_the_raw_value_on_hover(url: str, q: echomq.Queue) -> None:
    jid = q.enqueue(b"x").id
    with _client(url, [q.name]) as c:
        row = _row(c.get(f"/queues/{q.name}").text, jid)
        m = re.search(r'<time title="since ([^"]+) UTC \((\d+) unix ms\)">([^<]+)</time>', row)
        assert m and m.group(3).endswith("s")
        job = c.get(f"/queues/{q.name}/jobs/{jid}").text
        assert "unix ms" in job and "ago" in job


def test_pages_read_without_javascript(url: str, q: echomq.Queue, r: redis.Redis) -> None:
    """Every page is complete HTML as served: the script only refreshes counts."""
    jid = q.enqueue(_call("resize", 1)).id
    with _client(url, [q.name]) as c:
        for path in ("", "/workers", "/repeats", "/flows", "/charts"):
            html = c.get(f"/queues/{q.name}{path}").text
            assert "<noscript" not in html and "</main>" in html
        assert (
            "resize" in c.get(f"/queues/{q.name}").text and jid in c.get(f"/queues/{q.name}").text
        )
    time.sleep(0)


def test_an_id_prefix_find_is_exact_over_a_set_of_one_score(url: str, q: echomq.Queue) -> None:
    """A prefix over a set whose members all share one score is a BYLEX range: it finds a
    job however deep in the set, past any bound; with mixed scores (scheduled jobs, or
    waiting jobs with priorities) it is a bounded scan instead."""
    from echomq.client.executor import SyncExecutor, sync_client
    from echomq.protocol.kernel import Keys

    oldest = q.enqueue(b"first").id
    q.enqueue_many([b"x"] * 1500)
    later = [q.enqueue(b"s", delay_ms=60_000 + i).id for i in range(3)]
    client = sync_client(url)
    try:
        x, k = SyncExecutor(client), Keys(q.name)
        deep = _console.find(x, k, "pending", "id", oldest, bound=100)
        assert [r.id for r in deep.rows] == [oldest] and deep.searched == 1501
        mixed = _console.find(x, k, "schedule", "id", later[0], bound=2)
        assert mixed.searched == 2 and mixed.total == 3  # bounded: a scan, not a range
    finally:
        client.close()


def test_priority_column_and_change_priority(
    url: str, q: echomq.Queue, signed: tuple[TestClient, str]
) -> None:
    c, csrf = signed
    urgent = q.enqueue(_call("page_oncall"), priority=1).id
    plain = q.enqueue(_call("send_digest")).id
    later = q.enqueue(_call("remind"), delay_ms=600_000).id
    rows = {r["id"]: r for r in c.get(f"/api/queues/{q.name}").json()["rows"]}
    assert rows[urgent]["priority"] == "1" and rows[plain]["priority"] is None
    row = _row(c.get(f"/queues/{q.name}").text, urgent)
    assert re.search(r'<td class="n lo">1</td>\s*<td class="bad err', row)  # the priority cell
    page = c.get(f"/queues/{q.name}/jobs/{plain}").text
    assert 'name="priority"' in page and "set priority" in page
    path = f"/queues/{q.name}/jobs/{plain}/change_priority"
    res = c.post(path, data={"csrf": csrf, "priority": "7"}, follow_redirects=False)
    assert res.status_code == 303 and (q.get_job(plain) or {}).get("priority") == "7"
    c.post(f"/queues/{q.name}/jobs/{later}/change_priority", data={"csrf": csrf, "priority": "3"})
    assert (q.get_job(later) or {}).get("priority") == "3"
    for bad in ("x", "-1", "99999999", ""):
        refused = c.post(path, data={"csrf": csrf, "priority": bad})
        assert refused.status_code == 400, bad
    assert (q.get_job(plain) or {}).get("priority") == "7"  # nothing written
    held = q.claim()
    assert held is not None and held.id == urgent
    busy = c.post(
        f"/queues/{q.name}/jobs/{urgent}/change_priority", data={"csrf": csrf, "priority": "2"}
    )
    assert busy.status_code == 409  # an active job has no place to rescore


def test_completed_list_and_reprocess_of_a_completed_job(
    url: str, q: echomq.Queue, signed: tuple[TestClient, str]
) -> None:
    c, csrf = signed
    q.enqueue(b"x")
    empty = c.get(f"/queues/{q.name}", params={"state": "completed"})
    assert empty.status_code == 200 and "keep_completed" in empty.text  # history is off
    q.claim_batch(1)  # the first job stays active: not history
    q.keep_completed(100)
    done = []
    for i in range(3):
        jid = q.enqueue(_call("render", i)).id
        job = q.claim()
        assert job is not None and job.id == jid
        q.complete(jid, job.token)
        done.append(jid)
    page = c.get(f"/queues/{q.name}", params={"state": "completed"})
    assert page.status_code == 200 and "completed, kept (3)" in page.text
    row = _row(page.text, done[1])
    assert "render" in row and "ago" in row  # task and finish time
    api = c.get(f"/api/queues/{q.name}", params={"state": "completed"}).json()
    assert {r["id"] for r in api["rows"]} == set(done)
    job_page = c.get(f"/queues/{q.name}/jobs/{done[0]}").text
    assert 'id="reprocess"' in job_page
    c.post(f"/queues/{q.name}/jobs/{done[0]}/reprocess", data={"csrf": csrf})
    assert q.job_state(done[0]) == "pending"
    form = [("csrf", csrf), ("verb", "reprocess"), ("ids", done[1]), ("ids", done[2])]
    assert _post(c, f"/queues/{q.name}/selected", form, follow_redirects=False).status_code == 303
    assert [q.job_state(j) for j in done] == ["pending"] * 3
    found = c.get(
        f"/api/queues/{q.name}", params={"state": "completed", "find": "render", "by": "task"}
    )
    assert found.json()["find"]["total"] == 0


def test_reschedule_a_scheduled_job_from_its_page(
    url: str, q: echomq.Queue, signed: tuple[TestClient, str], r: redis.Redis
) -> None:
    from conftest import server_ms, snapshot

    c, csrf = signed
    later = q.enqueue(b"x", delay_ms=3_600_000).id
    page = c.get(f"/queues/{q.name}/jobs/{later}").text
    assert 'id="reschedule-delay_s"' in page and "seconds from now" in page
    path = f"/queues/{q.name}/jobs/{later}/reschedule"
    before = server_ms(r)
    res = c.post(path, data={"csrf": csrf, "delay_s": "90.5"}, follow_redirects=False)
    assert res.status_code == 303
    score = r.zscore(f"emq:{{{q.name}}}:schedule", later)
    assert score is not None and before + 90_500 <= score <= server_ms(r) + 90_500
    # Bad input: a 400 page, nothing written.
    kept = snapshot(r, q.name)
    for bad in ["", "-1", "soon", "1e3", "1.2345", "9" * 11, "<b>1</b>"]:
        res = c.post(path, data={"csrf": csrf, "delay_s": bad})
        assert res.status_code == 400, bad
        assert "<b>1</b>" not in res.text
    assert snapshot(r, q.name) == kept
    # A waiting job is not scheduled: 409, nothing written; an unknown job: 404.
    waiting = q.enqueue(b"y").id
    kept = snapshot(r, q.name)
    res = c.post(f"/queues/{q.name}/jobs/{waiting}/reschedule", data={"csrf": csrf, "delay_s": "5"})
    assert res.status_code == 409 and snapshot(r, q.name) == kept
    res = c.post(
        f"/queues/{q.name}/jobs/JOB00000000000/reschedule", data={"csrf": csrf, "delay_s": "5"}
    )
    assert res.status_code == 404
    # No button for a job that is not scheduled.
    assert 'id="reschedule"' not in c.get(f"/queues/{q.name}/jobs/{waiting}").text


def test_update_payload_as_text_without_an_app(
    url: str, q: echomq.Queue, signed: tuple[TestClient, str], r: redis.Redis
) -> None:
    from conftest import snapshot

    c, csrf = signed
    jid = q.enqueue(b"old text").id
    page = c.get(f"/queues/{q.name}/jobs/{jid}").text
    assert 'id="update_payload-payload"' in page and ">old text</textarea>" in page
    path = f"/queues/{q.name}/jobs/{jid}/update_payload"
    res = c.post(path, data={"csrf": csrf, "payload": "new\r\ntext é"}, follow_redirects=False)
    assert res.status_code == 303
    assert (q.get_job(jid) or {})["payload"] == "new\ntext é".encode()
    # An active job's payload cannot change: 409, nothing written.
    job = q.claim()
    assert job is not None and job.id == jid
    kept = snapshot(r, q.name)
    assert c.post(path, data={"csrf": csrf, "payload": "x"}).status_code == 409
    assert c.post(path, data={"csrf": csrf}).status_code == 400  # no payload field
    assert snapshot(r, q.name) == kept
    # A body over the bound is refused before it is read.
    big = c.post(path, data={"csrf": csrf, "payload": "x" * (MAX_FORM_BYTES + 1)})
    assert big.status_code == 413 and snapshot(r, q.name) == kept


MAX_FORM_BYTES = 65536


def test_update_payload_encodes_a_task_call_with_the_apps_serializer(
    url: str, qname: str, r: redis.Redis
) -> None:
    from conftest import snapshot

    for serializer in (JSON(), MsgPack()):
        app = echomq.App(url=url, serializer=serializer)

        @app.task(queue=qname, name="send_invoice")
        def send_invoice(customer: str, amount: int) -> None:
            pass

        q = app.queue(qname)
        jid = send_invoice.options(max_attempts=7, delay_ms=60_000).enqueue("acme", 5).id
        with _client(url, [qname], token=TOKEN, app=app) as c:
            csrf = _sign_in(c)
            page = c.get(f"/queues/{qname}/jobs/{jid}").text
            assert "A task call" in page and "&#34;acme&#34;" in page
            path = f"/queues/{qname}/jobs/{jid}/update_payload"
            text = '{"task": "send_invoice", "args": ["globex", 12], "kwargs": {}}'
            res = c.post(path, data={"csrf": csrf, "payload": text}, follow_redirects=False)
            assert res.status_code == 303
            data = (q.get_job(jid) or {})["payload"]
            assert isinstance(data, bytes)
            task, args, kwargs, opts = _envelope.parse_full(serializer, data)
            assert (task, args, kwargs, opts) == (
                "send_invoice",
                ["globex", 12],
                {},
                {"max_attempts": 7},
            )
            kept = snapshot(r, qname)
            for bad in [
                "not json",
                "[1, 2]",
                '{"task": "", "args": []}',
                '{"task": "t", "args": {}}',
                '{"task": "t", "kwargs": []}',
                '{"task": "t", "extra": 1}',
            ]:
                res = c.post(path, data={"csrf": csrf, "payload": bad})
                assert res.status_code == 400, bad
            assert snapshot(r, qname) == kept
        q.remove(jid)
        app.close()


def test_cancel_all_asks_first_then_cancels_every_job(
    url: str, q: echomq.Queue, signed: tuple[TestClient, str]
) -> None:
    c, csrf = signed
    running = q.enqueue(b"a").id
    job = q.claim()
    assert job is not None and job.id == running
    waiting = [q.enqueue(b"w").id for _ in range(3)]
    later = q.enqueue(b"s", delay_ms=60_000).id
    page = c.get(f"/queues/{q.name}").text
    assert 'id="cancel-all"' in page
    ask = c.post(f"/queues/{q.name}/cancel_all", data={"csrf": csrf})
    assert ask.status_code == 200 and "Cancel every job" in ask.text
    assert q.job_state(later) == "scheduled"
    res = c.post(
        f"/queues/{q.name}/cancel_all",
        data={"csrf": csrf, "confirm": "yes"},
        follow_redirects=False,
    )
    assert res.status_code == 303
    assert all(q.job_state(j) == "absent" for j in [*waiting, later])
    assert (q.get_job(running) or {}).get("cancel") is not None
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert c.post(f"/api/queues/{q.name}/cancel_all", headers=auth).status_code == 409
    q.enqueue(b"another")
    res = c.post(f"/api/queues/{q.name}/cancel_all", headers=auth, data={"confirm": "yes"})
    assert res.json()["result"] == {"removed": 1, "signalled": 0}  # already signalled once


def test_repeats_page_pauses_resumes_and_shows_the_last_fire(
    url: str, q: echomq.Queue, signed: tuple[TestClient, str], r: redis.Redis
) -> None:
    from conftest import server_ms, snapshot

    c, csrf = signed
    q.repeat("tick", b"t", every_ms=30_000, limit=10)
    q.repeat("nightly", _call("report"), cron="0 3 * * *")
    r.zadd(f"emq:{{{q.name}}}:repeat", {"tick": server_ms(r) - 5})
    assert q.fire_due() == 1
    page = c.get(f"/queues/{q.name}/repeats").text
    assert "at most 10 fires" in page and "ago</time>" in page  # the last fire
    res = c.post(
        f"/queues/{q.name}/pause_repeat",
        data={"csrf": csrf, "name": "tick"},
        follow_redirects=False,
    )
    assert res.status_code == 303 and res.headers["location"].endswith("/repeats")
    assert [rep.paused for rep in q.repeats() if rep.name == "tick"] == [True]
    page = c.get(f"/queues/{q.name}/repeats").text
    row = page[page.index('data-repeat="tick"') :].split("</tr>")[0]
    assert "paused" in row and "resume_repeat" in row
    api = c.get(f"/api/queues/{q.name}/repeats").json()
    (tick,) = [x for x in api["repeats"] if x["name"] == "tick"]
    assert tick["paused"] is True and tick["next_ms"] is None and tick["last_ms"] > 0
    before = server_ms(r)
    c.post(f"/queues/{q.name}/resume_repeat", data={"csrf": csrf, "name": "tick"})
    (rep,) = [x for x in q.repeats() if x.name == "tick"]
    assert not rep.paused and rep.next_ms is not None and rep.next_ms >= before + 30_000
    # Unknown name: 404; malformed: 400; without CSRF: 403; nothing written.
    kept = snapshot(r, q.name)
    assert (
        c.post(f"/queues/{q.name}/pause_repeat", data={"csrf": csrf, "name": "nope"}).status_code
        == 404
    )
    assert (
        c.post(f"/queues/{q.name}/resume_repeat", data={"csrf": csrf, "name": "nope"}).status_code
        == 404
    )
    assert (
        c.post(f"/queues/{q.name}/pause_repeat", data={"csrf": csrf, "name": "a b"}).status_code
        == 400
    )
    assert (
        c.post(f"/queues/{q.name}/pause_repeat", data={"csrf": "x", "name": "tick"}).status_code
        == 403
    )
    assert snapshot(r, q.name) == kept


def pages_of(tree: dict[str, Any]) -> set[str]:
    return {p["id"] for p in tree["chapter"]["children"]}


def test_flows_page_shows_the_tree_of_children_with_their_states(url: str, q: echomq.Queue) -> None:
    from echomq import FlowJob

    added = q.add_flow(
        FlowJob(
            _call("book"),
            children=[
                FlowJob(
                    _call("chapter", 1),
                    children=[FlowJob(_call("page", 1)), FlowJob(_call("page", 2), group="slow")],
                ),
                FlowJob(_call("cover")),
            ],
        )
    )
    q.pause_lane("slow")
    # Run one leaf to completion: it is recorded on its parent (the chapter).
    job = q.claim()
    assert job is not None
    q.complete(job.id, job.token, result=b"ok")
    with _client(url, [q.name]) as c:
        api = c.get(f"/api/queues/{q.name}/flows").json()
        # The chapter is shown inside the book's tree, not again at the top.
        (root,) = api["parents"]
        assert root["id"] == added.parent_id and root["task"] == "book"
        tree = {c["task"]: c for c in root["tree"]}
        assert set(tree) == {"chapter", "cover"}
        assert tree["chapter"]["state"] == "awaiting_children"
        assert tree["chapter"]["waiting"] == (1 if job.id in pages_of(tree) else 2)
        assert tree["cover"]["waiting"] is None
        pages = {p["id"]: p["state"] for p in tree["chapter"]["children"]}
        assert len(pages) == 2
        assert job.id in pages or job.id == tree["cover"]["id"]
        states = sorted([*pages.values(), tree["cover"]["state"]])
        assert states == ["completed", "pending", "pending"]
        page = c.get(f"/queues/{q.name}/flows").text
        for child in [tree["chapter"]["id"], tree["cover"]["id"], *pages]:
            assert f'data-child="{child}"' in page
        assert "awaiting_children" in page and "chapter" in page
