"""The dashboard in a real browser: headless Chromium (Debian ``chromium`` +
``chromium-driver``, driven by selenium) against a live uvicorn server, with a worker running.

Screenshots land in the test's tmp dir; the overview, queue and job shots are copied to
``docs/img/`` for the README.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

import echomq
from conftest import running, wait_for
from echomq.web import create_app

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import NoAlertPresentException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

# Headless Chromium: scripts/check --fast neither runs these nor installs chromium.
pytestmark = pytest.mark.slow

TOKEN = "browser-test-token"
HOSTILE = "<script>alert(1)</script><img src=x onerror=alert(2)>"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "img"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    if not shutil.which("chromedriver"):
        pytest.fail("chromedriver is missing: scripts/check installs chromium-driver")
    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        opts.add_argument(arg)
    opts.add_argument("--window-size=1280,860")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium:
        opts.binary_location = chromium
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"))
    driver = webdriver.Chrome(options=opts, service=service)
    driver.set_page_load_timeout(30)
    # A click that submits a form returns before the next page has loaded: a lookup right
    # after it waits (up to 10 s) for the element to appear instead of failing at once.
    driver.implicitly_wait(10)
    yield driver
    driver.quit()


@pytest.fixture
def live_dashboard(url: str, qname: str) -> Iterator[tuple[str, list[str]]]:
    port = _free_port()
    hostile = "x.-_" + qname[:40]
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(url, token=TOKEN, queues=[qname, hostile]),
            host="127.0.0.1",
            port=port,
            log_level="warning",
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: _up(base), 60, 0.1)
    yield base, [qname, hostile]
    server.should_exit = True
    thread.join(60)


def _up(base: str) -> bool:
    try:
        return httpx.get(base + "/api/queues", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _no_alert(driver: Any) -> None:
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert  # noqa: B018 - the property raises when no alert is open


def _shot(driver: Any, tmp_path: Path, name: str) -> None:
    path = tmp_path / f"dashboard-{name}.png"
    driver.save_screenshot(str(path))
    assert path.stat().st_size > 5_000
    DOCS.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, DOCS / path.name)


def test_dashboard_in_a_browser(
    url: str, live_dashboard: tuple[str, list[str]], browser: Any, tmp_path: Path
) -> None:
    base, (qname, hostile) = live_dashboard
    app = echomq.App(url=url)
    healed = threading.Event()

    @app.task(queue=qname, name="resize", max_attempts=1)
    def resize(n: int) -> int:
        if n < 0 and not healed.is_set():
            raise RuntimeError("<b>flaky</b> first run")
        time.sleep(0.01)
        return n

    q = app.queue(qname)
    hq = echomq.Queue(hostile, url=url)
    stack = contextlib.ExitStack()
    stack.enter_context(running(echomq.Worker(app, [qname], 4, beat_ms=100)))
    try:
        for i in range(30):
            resize.enqueue(i)
        poison = resize.enqueue(-1).id
        wait_for(lambda: q.job_state(poison) == "dead", 60)
        q.pause_lane("tenant-p")
        lane_job = resize.options(group="tenant-p").enqueue(7).id
        q.limit_lane("tenant-q", 2)
        hostile_id = hq.enqueue(HOSTILE.encode(), group="x.-_lane").id
        hq.add_log(hostile_id, HOSTILE)
        wait_for(lambda: q.counts()["completed"] >= 30, 60)

        # The overview lists both queues; the hostile name is text, not markup.
        browser.get(base + "/")
        names = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "a.qname")]
        assert qname in names and hostile in names
        _no_alert(browser)
        _shot(browser, tmp_path, "overview")

        # Live updates: a new job shows up on the open page without a reload.
        hq.enqueue(b"live")
        cell = f'tr[data-queue="{hostile}"] [data-f="pending"]'
        wait_for(lambda: browser.find_element(By.CSS_SELECTOR, cell).text == "2", 60, 0.2)

        # A request without the token is refused, and the page offers no action.
        refused = httpx.post(f"{base}/queues/{qname}/jobs/{poison}/reprocess", timeout=5)
        assert refused.status_code == 401
        browser.get(f"{base}/queues/{qname}/jobs/{poison}")
        assert not browser.find_elements(By.ID, "reprocess")
        assert browser.find_element(By.ID, "job-place").text == "dead"

        # Sign in with the token.
        browser.get(base + "/login")
        browser.find_element(By.ID, "token").send_keys(TOKEN)
        browser.find_element(By.ID, "sign-in").click()
        wait_for(lambda: "sign out" in browser.page_source, 60)

        # The job page shows its row; reprocess from the UI moves the dead job back.
        browser.get(f"{base}/queues/{qname}/jobs/{poison}")
        row = browser.find_element(By.ID, "row").text
        assert "attempts" in row and "<b>flaky</b> first run" in row
        assert browser.find_element(By.ID, "job-id").text == poison
        _shot(browser, tmp_path, "job")
        healed.set()
        browser.find_element(By.ID, "reprocess").click()
        wait_for(lambda: q.job_state(poison) != "dead", 60)
        wait_for(lambda: q.job_state(poison) == "absent", 60)  # it ran and completed

        # The queue page: the paused lane shows paused, with its waiting job.
        browser.get(f"{base}/queues/{qname}")
        lane_row = browser.find_element(By.CSS_SELECTOR, 'tr[data-lane="tenant-p"]')
        assert "paused" in lane_row.find_element(By.CLASS_NAME, "lane-state").text
        assert q.job_state(lane_job) == "pending"
        _shot(browser, tmp_path, "queue")

        # The HTML payload and log line of the hostile queue render as text.
        browser.get(f"{base}/queues/{hostile}/jobs/{hostile_id}")
        _no_alert(browser)
        assert browser.find_element(By.ID, "payload").text == HOSTILE
        assert HOSTILE in browser.find_element(By.ID, "logs").text
        assert not browser.find_elements(By.CSS_SELECTOR, "main script, main img")
        browser.get(f"{base}/queues/{hostile}")
        _no_alert(browser)
        assert browser.find_element(By.ID, "queue-name").text == hostile

        # A destructive action asks first; nothing happens until it is confirmed.
        extra = hq.enqueue(b"remove me").id
        browser.get(f"{base}/queues/{hostile}/jobs/{extra}")
        browser.find_element(By.ID, "remove").click()
        wait_for(lambda: "cannot be undone" in browser.page_source, 60)
        assert hq.job_state(extra) == "pending"
        browser.find_element(By.ID, "confirm").click()
        wait_for(lambda: hq.job_state(extra) == "absent", 60)
    finally:
        stack.close()
        hq.close()
        app.close()


def _click(browser: Any, css: str) -> None:
    browser.find_element(By.CSS_SELECTOR, css).click()


def _invoicing(url: str, qname: str) -> tuple[echomq.App, Any]:
    """An app with the task ``send_invoice(customer, amount)`` on ``qname``: a negative
    amount raises (one attempt: the job is dead at once)."""
    app = echomq.App(url=url)

    @app.task(queue=qname, name="send_invoice", max_attempts=1)
    def send_invoice(customer: str, amount: int) -> None:
        if amount < 0:
            raise ValueError(f"negative amount for {customer}: {amount}")

    return app, send_invoice


def test_console_pages_and_actions_in_a_browser(
    url: str, live_dashboard: tuple[str, list[str]], browser: Any, tmp_path: Path
) -> None:
    """Issue 26: every console page and action, in Chromium, with a worker running."""
    base, (qname, _hostile) = live_dashboard
    app, send_invoice = _invoicing(url, qname)
    release = threading.Event()

    @app.task(queue=qname, name="render_video")
    def render_video(clip: str) -> None:
        # A sync handler cannot be interrupted: it stops when it sees its cancel (D22).
        deadline = time.monotonic() + 120  # ended by release; a loaded machine is slow
        while not release.is_set() and not echomq.current_job().cancelled:
            if time.monotonic() > deadline:
                return
            release.wait(0.05)

    q = app.queue(qname)
    stack = contextlib.ExitStack()
    stack.enter_context(running(echomq.Worker(app, [qname], 4, beat_ms=100)))
    try:
        q.keep_completed(1000)  # kept history: the completed list (D25)
        for i in range(40):
            send_invoice.enqueue(f"cust-{i}", 100 + i)
        dead = [send_invoice.enqueue(f"bad-{i}", -1 - i).id for i in range(4)]
        held = render_video.enqueue("intro.mp4").id
        later = send_invoice.options(delay_ms=3_600_000).enqueue("later", 5).id
        moved = send_invoice.options(delay_ms=3_600_000).enqueue("moved", 8).id
        q.pause_lane("paused-lane")  # the flow's children wait there: its parent too
        q.repeat("nightly-report", b'["report", []]', cron="0 3 * * *")
        q.repeat("heartbeat", b'["beat", []]', every_ms=60_000)
        flow = q.add_flow(
            echomq.FlowJob(
                b'["assemble", ["book"]]',
                children=[
                    echomq.FlowJob(
                        b'["chapter", [1]]',
                        children=[
                            echomq.FlowJob(b'["page", [1]]', group="paused-lane"),
                            echomq.FlowJob(b'["page", [2]]', group="paused-lane"),
                        ],
                    ),
                    echomq.FlowJob(b'["chapter", [2]]', group="paused-lane"),
                ],
            )
        )
        wait_for(lambda: all(q.job_state(j) == "dead" for j in dead), 60)
        wait_for(lambda: q.job_state(held) == "active", 60)
        wait_for(lambda: any(w.jobs for w in q.workers()), 60)
        for _ in range(3):
            send_invoice.options(group="paused-lane").enqueue("waits", 1)

        browser.get(base + "/login")
        browser.find_element(By.ID, "token").send_keys(TOKEN)
        browser.find_element(By.ID, "sign-in").click()
        wait_for(lambda: "sign out" in browser.page_source, 60)

        # The active list: task, arguments, and the worker holding the job.
        browser.get(f"{base}/queues/{qname}?state=active")
        row = browser.find_element(By.CSS_SELECTOR, f'tr[data-id="{held}"]').text
        assert "render_video" in row and "'intro.mp4'" in row
        assert f":{os.getpid()}" in row  # host:pid of the worker
        browser.execute_script("document.getElementById('jobs-heading').scrollIntoView()")
        _shot(browser, tmp_path, "active")

        # The workers page.
        browser.get(f"{base}/queues/{qname}/workers")
        table = browser.find_element(By.ID, "workers").text
        assert socket.gethostname() in table and held in table and "render_video" in table
        _shot(browser, tmp_path, "workers")

        # The dead list: the error's one line; find by error text says what it searched.
        browser.get(f"{base}/queues/{qname}?state=dead")
        row = browser.find_element(By.CSS_SELECTOR, f'tr[data-id="{dead[2]}"]').text
        assert "send_invoice" in row and "ValueError: negative amount for bad-2" in row
        browser.execute_script("document.getElementById('jobs-heading').scrollIntoView()")
        _shot(browser, tmp_path, "dead")
        browser.find_element(By.ID, "find").send_keys("bad-3")
        Select(browser.find_element(By.ID, "find-by")).select_by_value("error")
        browser.find_element(By.ID, "find-go").click()
        found = browser.find_element(By.ID, "find-result").text
        assert "1 match" in found and "searched all 4 dead jobs" in found and dead[3] in found

        # A selection: reprocess two of the dead (they run again and die again).
        browser.get(f"{base}/queues/{qname}?state=dead")
        for jid in dead[:2]:
            _click(browser, f'input[value="{jid}"]')
        Select(browser.find_element(By.ID, "bulk-verb")).select_by_value("reprocess")
        browser.find_element(By.ID, "bulk-go").click()
        # Both ran again and died again: six dead-letters in all.
        wait_for(lambda: q.counts()["failed"] == 6 and q.counts()["dead"] == 4, 60)
        # Delete a selection asks first.
        browser.get(f"{base}/queues/{qname}?state=dead")
        _click(browser, f'input[value="{dead[3]}"]')
        Select(browser.find_element(By.ID, "bulk-verb")).select_by_value("remove")
        browser.find_element(By.ID, "bulk-go").click()
        assert dead[3] in browser.find_element(By.ID, "confirm-ids").text
        assert q.job_state(dead[3]) == "dead"
        browser.find_element(By.ID, "confirm").click()
        wait_for(lambda: q.job_state(dead[3]) == "absent", 60)

        # Retry all dead, then delete all dead (confirmed).
        browser.get(f"{base}/queues/{qname}?state=dead")
        browser.find_element(By.ID, "retry-dead").click()
        wait_for(lambda: q.counts()["failed"] == 9 and q.counts()["dead"] == 3, 60)
        browser.get(f"{base}/queues/{qname}?state=dead")
        browser.find_element(By.ID, "delete-dead").click()
        assert "Delete every dead job" in browser.find_element(By.ID, "confirm-what").text
        browser.find_element(By.ID, "confirm").click()
        wait_for(lambda: q.counts()["dead"] == 0, 60)

        # Run a scheduled job now, from its page.
        browser.get(f"{base}/queues/{qname}/jobs/{later}")
        browser.find_element(By.ID, "retry-now").click()
        wait_for(lambda: q.job_state(later) == "completed", 60)  # it ran (history is kept)

        # Reschedule a scheduled job (seconds from now), then edit its payload (the text as
        # shown: this dashboard has no App, so the bytes are the text's).
        browser.get(f"{base}/queues/{qname}/jobs/{moved}")
        t0 = int(time.time() * 1000)
        browser.find_element(By.ID, "reschedule-delay_s").send_keys("120")
        browser.find_element(By.ID, "reschedule").click()
        runs = f"emq:{{{qname}}}:schedule"
        wait_for(lambda: (q.client.zscore(runs, moved) or 0) < t0 + 3_600_000 - 60_000, 60)
        assert t0 + 115_000 <= q.client.zscore(runs, moved) <= t0 + 130_000
        browser.get(f"{base}/queues/{qname}/jobs/{moved}")
        browser.find_element(By.CSS_SELECTOR, "#update_payload-edit summary").click()
        area = browser.find_element(By.ID, "update_payload-payload")
        assert "moved" in area.get_attribute("value")
        area.clear()
        area.send_keys('["send_invoice",["moved",9]]')
        browser.find_element(By.ID, "update_payload").click()
        wait_for(
            lambda: (q.get_job(moved) or {}).get("payload") == b'["send_invoice",["moved",9]]', 60
        )
        assert (
            "moved&quot;,9" in browser.page_source
            or '"moved",9' in browser.find_element(By.ID, "payload").text
        )

        # Cancel the running job: asked first, then its handler is signalled.
        browser.get(f"{base}/queues/{qname}/jobs/{held}")
        browser.find_element(By.ID, "cancel").click()
        browser.find_element(By.ID, "confirm").click()
        wait_for(lambda: q.job_state(held) in ("dead", "absent"), 60)
        release.set()

        # The repeats page: both listed; pause one (it shows paused), resume it, remove the
        # other (confirmed).
        browser.get(f"{base}/queues/{qname}/repeats")
        assert "0 3 * * *" in browser.find_element(By.ID, "repeats").text
        _click(browser, 'tr[data-repeat="nightly-report"] button.pause')
        wait_for(lambda: [r.paused for r in q.repeats() if r.paused] == [True], 60)
        row = 'tr[data-repeat="nightly-report"] .repeat-state'
        wait_for(lambda: browser.find_element(By.CSS_SELECTOR, row).text == "paused", 60)
        _shot(browser, tmp_path, "repeats")
        _click(browser, 'tr[data-repeat="nightly-report"] button.resume')
        wait_for(lambda: not any(r.paused for r in q.repeats()), 60)
        _click(browser, 'tr[data-repeat="heartbeat"] button.remove')
        browser.find_element(By.ID, "confirm").click()
        wait_for(lambda: [r.name for r in q.repeats()] == ["nightly-report"], 60)
        assert q.repeats()[0].next_ms is not None

        # The flows page: the parent and its tree of children, waiting in the paused lane.
        browser.get(f"{base}/queues/{qname}/flows")
        tree = browser.find_element(By.ID, "flows").text
        assert flow.parent_id in tree and "assemble" in tree and "2 of 2 children" in tree
        inner, leaf = flow.child_ids
        item = browser.find_element(By.CSS_SELECTOR, f'li[data-child="{inner}"]').text
        assert "chapter" in item and "awaiting_children" in item and item.count("page") == 2
        item = browser.find_element(By.CSS_SELECTOR, f'li[data-child="{leaf}"]').text
        assert "chapter" in item and "pending" in item
        _shot(browser, tmp_path, "flows")

        # The charts: completed and failed per minute, depth, oldest waiting.
        browser.get(f"{base}/queues/{qname}/charts")
        assert len(browser.find_elements(By.CSS_SELECTOR, ".chart svg")) == 4
        done = browser.find_element(By.ID, "chart-completed").text
        assert "in 60 min" in done
        _shot(browser, tmp_path, "charts")

        # The completed list (kept history): reprocess one from its page; it runs again.
        browser.get(f"{base}/queues/{qname}?state=completed")
        rows = browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr[data-id]")
        assert len(rows) == 41 and "send_invoice" in rows[0].text  # 40 invoices, the run-now one
        again = rows[0].get_attribute("data-id")
        _shot(browser, tmp_path, "completed")
        browser.get(f"{base}/queues/{qname}/jobs/{again}")
        browser.find_element(By.ID, "reprocess").click()
        wait_for(lambda: q.counts()["completed"] == 42, 60)

        # Change a waiting job's priority from its page; the list's priority column shows it.
        waiting = send_invoice.options(group="paused-lane").enqueue("vip", 1).id
        browser.get(f"{base}/queues/{qname}/jobs/{waiting}")
        browser.find_element(By.ID, "change_priority-priority").send_keys("5")
        browser.find_element(By.ID, "change_priority").click()
        wait_for(lambda: (q.get_job(waiting) or {}).get("priority") == "5", 60)
        browser.get(f"{base}/queues/{qname}?state=pending&lane=paused-lane")
        cells = browser.find_elements(By.CSS_SELECTOR, f'tr[data-id="{waiting}"] td.n')
        assert [c.text for c in cells] == ["0", "5"]  # attempts, priority

        # The pending list, paged, then the lane's list; an unknown queue is a 404 page.
        browser.get(f"{base}/queues/{qname}?state=pending&lane=paused-lane&per=10")
        # three waiting jobs, the three flow leaves and the vip job
        assert len(browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr[data-id]")) == 7

        # Cancel all (confirmed): nothing waits or is scheduled afterwards.
        browser.get(f"{base}/queues/{qname}")
        browser.find_element(By.ID, "cancel-all").click()
        assert "Cancel every job" in browser.find_element(By.ID, "confirm-what").text
        assert q.counts()["pending"] > 0
        browser.find_element(By.ID, "confirm").click()
        wait_for(lambda: q.counts()["pending"] == 0 and q.counts()["schedule"] == 0, 60)
        browser.get(f"{base}/queues/no-such-queue")
        assert "no such queue" in browser.find_element(By.ID, "error").text
    finally:
        release.set()
        stack.close()
        app.close()


def test_read_only_badge_and_unreachable_page(url: str, qname: str, browser: Any) -> None:
    """The read-only badge reads clearly on the dark bar; a server that does not answer
    gets a page that says so (503), never a traceback."""
    port = _free_port()
    dead = f"redis://127.0.0.1:{_free_port()}/0"
    server = uvicorn.Server(
        uvicorn.Config(create_app(dead, read_only=True), host="127.0.0.1", port=port)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answers(base + "/healthz"), 60, 0.1)
        assert httpx.get(base + "/healthz", timeout=10).status_code == 503
        browser.get(base + "/")
        assert "unreachable" in browser.find_element(By.ID, "error").text
        badge = browser.find_element(By.ID, "read-only")
        assert badge.text == "read-only"
        assert badge.value_of_css_property("color") != badge.value_of_css_property(
            "background-color"
        )
        assert badge.value_of_css_property("background-color") == "rgba(255, 216, 102, 1)"
    finally:
        server.should_exit = True
        thread.join(60)


def _answers(target: str) -> bool:
    try:
        httpx.get(target, timeout=10)
        return True
    except httpx.HTTPError:
        return False


def _width(browser: Any, width: int, height: int) -> None:
    """The viewport ``width`` x ``height`` CSS px, as a phone (below 700 px) or a desktop."""
    browser.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 700},
    )


def _fits(browser: Any, css: str) -> None:
    """Nothing scrolls sideways, and the element ``css`` is inside the viewport."""
    inner = browser.execute_script("return window.innerWidth")
    wide = browser.execute_script("return document.documentElement.scrollWidth")
    assert wide <= inner, (css, wide, inner)
    for el in browser.find_elements(By.CSS_SELECTOR, ".wide"):
        inside = browser.execute_script(
            "return [arguments[0].scrollWidth, arguments[0].clientWidth]", el
        )
        assert inside[0] <= inside[1] + 1, (css, inside)
    rect = browser.execute_script(
        "return arguments[0].getBoundingClientRect().right",
        browser.find_element(By.CSS_SELECTOR, css),
    )
    assert 0 < rect <= inner, (css, rect, inner)


def test_issue_36_pages_at_1400_and_400_px(
    url: str, live_dashboard: tuple[str, list[str]], browser: Any, tmp_path: Path
) -> None:
    """Issue 36 #3, #6: the overview, a running job with a cancel requested, the dead list
    and a flash message, at 1400 and at 400 px: no table scrolls sideways on a phone (the
    low-value columns give way), the dead column stays in view."""
    base, (qname, _hostile) = live_dashboard
    app, send_invoice = _invoicing(url, qname)
    release = threading.Event()

    @app.task(queue=qname, name="render_video")
    def render_video(clip: str, quality: str = "hd") -> None:
        release.wait(60)  # does not look at its cancel: it stays flagged while it runs

    q = app.queue(qname)
    q.enable_events()
    stack = contextlib.ExitStack()
    stack.enter_context(running(echomq.Worker(app, [qname], 4, beat_ms=100)))
    try:
        for i in range(12):
            send_invoice.enqueue(f"cust-{i}", 100 + i)
        dead = [send_invoice.enqueue(f"acme-{i}", -10 * (i + 1)).id for i in range(5)]
        held = render_video.enqueue("launch-teaser.mp4", quality="4k").id
        q.pause_lane("tenant-b")
        for i in range(3):
            send_invoice.options(group="tenant-b").enqueue(f"b-{i}", 5)
        wait_for(lambda: all(q.job_state(j) == "dead" for j in dead), 20)
        wait_for(lambda: any(j.id == held for w in q.workers() for j in w.jobs), 20)
        for pct in (10, 35, 60):  # as its handler would report them
            q.update_progress(held, f"{pct}%")
        assert q.cancel(held) == "signalled"

        browser.get(base + "/login")
        browser.find_element(By.ID, "token").send_keys(TOKEN)
        browser.find_element(By.ID, "sign-in").click()
        wait_for(lambda: "sign out" in browser.page_source, 10)

        for width, height in ((1400, 900), (400, 1000)):
            _width(browser, width, height)
            browser.get(base + "/")
            _fits(browser, f'tr[data-queue="{qname}"] [data-f="dead"]')
            _shot(browser, tmp_path, f"overview-{width}")

            browser.get(f"{base}/queues/{qname}/jobs/{held}")
            assert browser.find_element(By.ID, "cancel-requested").text == "cancel requested"
            assert ":" in browser.find_element(By.ID, "job-worker").text
            assert browser.find_element(By.ID, "job-lease").text.startswith("in ")
            _fits(browser, "#row")
            _shot(browser, tmp_path, f"job-active-{width}")

            browser.get(f"{base}/queues/{qname}?state=dead")
            died = f'tr[data-id="{dead[0]}"] td:last-child'
            row = browser.find_element(By.CSS_SELECTOR, f'tr[data-id="{dead[0]}"]').text
            assert "send_invoice" in row and "ago" in row and "negative amount" in row
            _fits(browser, f'tr[data-id="{dead[0]}"] td.err')
            browser.execute_script("document.getElementById('jobs-heading').scrollIntoView()")
            _shot(browser, tmp_path, f"dead-{width}")
            assert died  # the died column is the row's last visible one (lane is hidden)

            # A flash message: reprocess two dead jobs from the list (they die again).
            for jid in dead[:2]:
                _click(browser, f'input[value="{jid}"]')
            Select(browser.find_element(By.ID, "bulk-verb")).select_by_value("reprocess")
            browser.find_element(By.ID, "bulk-go").click()
            flash = browser.find_element(By.ID, "flash").text
            assert flash == "reprocessed 2 jobs", flash
            _fits(browser, "#flash")
            _shot(browser, tmp_path, f"flash-{width}")
            wait_for(lambda: all(q.job_state(j) == "dead" for j in dead), 20)
    finally:
        release.set()
        stack.close()
        app.close()
