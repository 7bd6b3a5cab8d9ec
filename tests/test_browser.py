"""The dashboard in a real browser: headless Chromium (Debian ``chromium`` +
``chromium-driver``, driven by selenium) against a live uvicorn server, with a worker running.

Screenshots land in the test's tmp dir; the overview, queue and job shots are copied to
``docs/img/`` for the README.
"""

from __future__ import annotations

import asyncio
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
from conftest import wait_for
from echomq.web import create_app

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import NoAlertPresentException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

# Headless Chromium: scripts/check --fast neither runs these nor installs chromium.
pytestmark = pytest.mark.slow

TOKEN = "browser-test-token"
HOSTILE = "<script>alert(1)</script><img src=x onerror=alert(2)>"
DOCS = Path(__file__).resolve().parent.parent / "docs" / "img"


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
    wait_for(lambda: _up(base), 20, 0.1)
    yield base, [qname, hostile]
    server.should_exit = True
    thread.join(10)


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
    worker = echomq.Worker(app, [qname], 4, beat_ms=100)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(worker.arun(),))
    thread.start()
    try:
        for i in range(30):
            resize.enqueue(i)
        poison = resize.enqueue(-1).id
        wait_for(lambda: q.job_state(poison) == "dead", 20)
        q.pause_lane("tenant-p")
        lane_job = resize.options(group="tenant-p").enqueue(7).id
        q.limit_lane("tenant-q", 2)
        hostile_id = hq.enqueue(HOSTILE.encode(), group="x.-_lane").id
        hq.add_log(hostile_id, HOSTILE)
        wait_for(lambda: q.counts()["completed"] >= 30, 20)

        # The overview lists both queues; the hostile name is text, not markup.
        browser.get(base + "/")
        names = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "a.qname")]
        assert qname in names and hostile in names
        _no_alert(browser)
        _shot(browser, tmp_path, "overview")

        # Live updates: a new job shows up on the open page without a reload.
        hq.enqueue(b"live")
        cell = f'tr[data-queue="{hostile}"] [data-f="pending"]'
        wait_for(lambda: browser.find_element(By.CSS_SELECTOR, cell).text == "2", 15, 0.2)

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
        wait_for(lambda: "sign out" in browser.page_source, 10)

        # The job page shows its row; reprocess from the UI moves the dead job back.
        browser.get(f"{base}/queues/{qname}/jobs/{poison}")
        row = browser.find_element(By.ID, "row").text
        assert "attempts" in row and "<b>flaky</b> first run" in row
        assert browser.find_element(By.ID, "job-id").text == poison
        _shot(browser, tmp_path, "job")
        healed.set()
        browser.find_element(By.ID, "reprocess").click()
        wait_for(lambda: q.job_state(poison) != "dead", 10)
        wait_for(lambda: q.job_state(poison) == "absent", 20)  # it ran and completed

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
        wait_for(lambda: "cannot be undone" in browser.page_source, 10)
        assert hq.job_state(extra) == "pending"
        browser.find_element(By.ID, "confirm").click()
        wait_for(lambda: hq.job_state(extra) == "absent", 10)
    finally:
        loop.call_soon_threadsafe(worker.stop)
        thread.join(20)
        loop.close()
        hq.close()
        app.close()
