"""The dashboard's pages say what they should (issue 36, items 3 and 6) against a real server
through Starlette's TestClient: "cancel requested" on a running job, a flash message after
each action, a job page in words (times, the worker and its lease end, the kept result, the
internal fields under "details", progress updates folded), a bulk action with no default
verb, a confirm page whose way out says "Back", and a pending card that counts its lanes."""

from __future__ import annotations

import re
import threading
import time

from console_support import _call, _client, _kill, _post
from test_dashboard import TOKEN, _sign_in

import echomq
from conftest import running, wait_for
from echomq.serializers import JSON


def _text(html: str) -> str:
    """A page's visible text, one space between words (markup and entities kept out)."""
    body = html.split("<main>", 1)[1].split("</main>", 1)[0]
    return " ".join(re.sub(r"<[^>]+>", " ", body).split())


def test_a_running_job_with_a_cancel_requested_says_so(url: str, q: echomq.Queue) -> None:
    app = echomq.App(url=url)
    started, release = threading.Event(), threading.Event()

    @app.task(queue=q.name, name="render_video")
    def render_video(clip: str) -> None:
        started.set()
        # A sync handler stops when it sees its cancel, or when the test lets it go.
        deadline = time.monotonic() + 60
        while not release.is_set() and time.monotonic() < deadline:
            release.wait(0.05)

    try:
        with running(echomq.Worker(app, [q.name], 1, beat_ms=100)), _client(url, [q.name]) as c:
            jid = render_video.enqueue("intro.mp4").id
            assert started.wait(30)
            # Seen by a beat of its worker: the registry names the holder.
            wait_for(lambda: any(j.id == jid for w in q.workers() for j in w.jobs), 20)
            before = c.get(f"/queues/{q.name}/jobs/{jid}").text
            assert "cancel requested" not in before
            assert q.cancel(jid) == "signalled"
            # The handler does not look at its cancel: the job stays active, flagged.
            page = c.get(f"/queues/{q.name}/jobs/{jid}").text
            assert 'id="cancel-requested"' in page and "cancel requested" in _text(page)
            listed = c.get(f"/queues/{q.name}", params={"state": "active"}).text
            row = listed.split(f'<tr data-id="{jid}">', 1)[1].split("</tr>", 1)[0]
            assert "cancel requested" in row
            # The job page names the worker holding it and when its lease ends.
            worker = re.search(r'<td id="job-worker">(.*?)</td>', page, re.S)
            assert worker and re.search(r":\d+</span>", worker[1]) and "running for" in worker[1]
            lease = re.search(r'<td id="job-lease"><time [^>]*title="([^"]+)">in ', page)
            assert lease and "unix ms" in lease[1], page
            release.set()
            wait_for(lambda: q.job_state(jid) != "active", 20)
    finally:
        release.set()
        app.close()


def test_the_job_page_speaks_in_words(url: str, q: echomq.Queue) -> None:
    q.enable_events()
    q.keep_completed(100)
    jid = q.enqueue(_call("resize", 640, w=2), group="tenant-a").id
    job = q.claim()
    assert job is not None and job.id == jid
    for pct in (10, 40, 70, 90):
        q.update_progress(jid, f"{pct}%")
    q.complete(
        jid, job.token, result=JSON().dumps({"width": 640, "ok": True}), keep_result_ms=600_000
    )
    with _client(url, [q.name]) as c:
        page = c.get(f"/queues/{q.name}/jobs/{jid}").text
        api = c.get(f"/api/queues/{q.name}/jobs/{jid}").json()
    assert api["result"]["error"] is None and '"width": 640' in api["result"]["value"]
    text = _text(page)
    # Times are read as times: relative, the UTC date and the unix ms on hover.
    assert not re.search(r">\s*1\d{12}\s*<", page), "a raw unix ms shown as a value"
    assert re.search(
        r'<time datetime="[^"]+" title="\d{4}-\d\d-\d\d [\d:]+ UTC \(\d{13} unix ms\)">', page
    )
    # The kept result, decoded; a completed job with a kept row shows its finish.
    result = re.search(r'<pre id="result-value">(.*?)</pre>', page, re.S)
    assert result, text
    assert "&#34;width&#34;: 640" in result[1] and "&#34;ok&#34;: true" in result[1]
    # The task and its arguments up top; the protocol's bookkeeping under "details".
    summary = page.split('id="row"', 1)[1].split("</table>", 1)[0]
    assert "resize" in summary and "640, w=2" in summary and "tenant-a" in summary
    for internal in ("lease_epoch", "claimed_ms", "finished_ms<", "floor"):
        assert internal not in summary
    details = page.split('<details class="details" id="details">', 1)[1].split("</details>", 1)[0]
    assert "claimed_ms" in details
    # Four progress updates in a row are one events row: their count and the last value.
    rows = re.findall(r'<tr data-event="([a-z_]+)">(.*?)</tr>', page, re.S)
    assert [e for e, _ in rows] == ["enqueued", "active", "progress", "completed"], rows
    progress = rows[2][1]
    assert "\u00d74" in progress and "progress=90%" in progress and "10%" not in progress


def test_every_action_leaves_a_flash_message_shown_once(url: str, q: echomq.Queue) -> None:
    dead = [_kill(q, b"x") for _ in range(3)]
    q.remove(dead[2])  # listed a moment ago, gone by the time the selection is applied
    with _client(url, [q.name], token=TOKEN) as c:
        csrf = _sign_in(c)
        form = [("csrf", csrf), ("verb", "remove"), ("confirm", "yes")]
        form += [("ids", j) for j in dead] + [("back", "?state=dead")]
        res = _post(c, f"/queues/{q.name}/selected", form)
        assert res.status_code == 200 and str(res.url).endswith("?state=dead")
        flash = re.search(r'<p class="flash" id="flash" role="status">(.*?)</p>', res.text)
        assert flash and flash[1].startswith("removed 2 jobs, skipped 1"), res.text
        assert 'id="flash"' not in c.get(f"/queues/{q.name}").text  # once
        res = c.post(f"/queues/{q.name}/pause", data={"csrf": csrf})
        assert re.search(r'id="flash"[^>]*>paused the queue</p>', res.text)
        jid = q.enqueue(b"y").id
        res = c.post(f"/queues/{q.name}/jobs/{jid}/remove", data={"csrf": csrf, "confirm": "yes"})
        assert f"removed job {jid}" in res.text
        # The JSON twin answers with the result itself, and leaves no message behind.
        auth = {"authorization": f"Bearer {TOKEN}"}
        assert c.post(f"/api/queues/{q.name}/resume", headers=auth).json()["ok"] is True
        assert 'id="flash"' not in c.get(f"/queues/{q.name}").text


def test_a_selection_starts_on_no_verb(url: str, q: echomq.Queue) -> None:
    dead = _kill(q, b"x")
    with _client(url, [q.name], token=TOKEN) as c:
        csrf = _sign_in(c)
        page = c.get(f"/queues/{q.name}", params={"state": "dead"}).text
        select = page.split('id="bulk-verb"', 1)[1].split("</select>", 1)[0]
        options = re.findall(r"<option([^>]*)>", select)
        assert "required" in select.split(">", 1)[0]
        assert options[0] == ' value="" selected disabled'  # nothing picked to begin with
        assert all("selected" not in o for o in options[1:])
        assert [re.search(r'value="(\w+)"', o)[1] for o in options[1:]] == ["reprocess", "remove"]
        # No verb (a form sent past the browser's check) is refused, nothing moved.
        res = _post(c, f"/queues/{q.name}/selected", [("csrf", csrf), ("ids", dead)])
        assert res.status_code == 400 and "choose what to do" in res.text
        assert q.job_state(dead) == "dead"
        # A dead job whose outcome is not kept shows its death once (its row), no "Result"
        # finished at the epoch.
        page = c.get(f"/queues/{q.name}/jobs/{dead}").text
        assert 'id="result"' not in page and "ValueError: bad input" in page


def test_the_confirm_page_offers_back_not_cancel(url: str, q: echomq.Queue) -> None:
    jid = q.enqueue(b"x").id
    with _client(url, [q.name], token=TOKEN) as c:
        csrf = _sign_in(c)
        ask = c.post(f"/queues/{q.name}/jobs/{jid}/remove", data={"csrf": csrf}).text
        way_out = re.search(r'<a class="back" id="back" href="[^"]+">([^<]+)</a>', ask)
        assert way_out and way_out[1] == "Keep the job"
        assert ">cancel</a>" not in ask
        ask = c.post(f"/queues/{q.name}/drain", data={"csrf": csrf}).text
        way_out = re.search(r'<a class="back" id="back" href="[^"]+">([^<]+)</a>', ask)
        assert way_out and way_out[1] == "Back"
    assert q.job_state(jid) == "pending"


def test_the_pending_card_counts_the_jobs_in_lanes(url: str, q: echomq.Queue) -> None:
    q.enqueue(b"flat")
    for lane in ("tenant-a", "tenant-a", "tenant-b"):
        q.enqueue(b"laned", group=lane)
    with _client(url, [q.name]) as c:
        page = c.get(f"/queues/{q.name}").text
    card = page.split('id="card-pending"', 1)[1].split("</div></div>", 1)[0] + "</div>"
    assert re.search(r'<a href="#lanes" id="pending-in-lanes">\(3 in lanes\)</a>', card), card
    assert 'data-f="pending">4</div>' in card
    note = re.search(r'id="lanes-note">(.*?)</p>', page, re.S)
    assert note and "1 pending jobs outside lanes; the other 3 wait in lanes" in _text(
        f"<main>{note[1]}</main>"
    )
    assert len(re.findall(r'<tr data-id="', page)) == 1  # the list: the flat one
