"""Issue 37 item 5: a dashboard action acts on the job the page showed, not on whatever the
id holds by the time the form comes back. The page's forms carry the state (and attempts)
they saw; remove and cancel skip, in their script, a job that moved since, and the action's
JSON result counts what it did and what it skipped. Runs on both executors."""

from __future__ import annotations

import re
import urllib.parse
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import echomq
from conftest import snapshot
from echomq.errors import InvalidArgument, StateError
from echomq.ops import console as _console
from echomq.web import create_app

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

pytestmark = pytest.mark.executors

TOKEN = "t0ken-for-tests"
AUTH = {"authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def c(url: str, q: echomq.Queue) -> Iterator[TestClient]:
    with TestClient(create_app(url, queues=[q.name], token=TOKEN)) as client:
        yield client


def dead(q: echomq.Queue, payload: bytes = b"x") -> str:
    jid = q.enqueue(payload).id
    job = q.claim()
    assert job is not None and job.id == jid
    assert q.retry(job.id, job.token, delay_ms=0, max_attempts=1, error="boom") == "dead"
    return jid


def die_again(q: echomq.Queue, jid: str) -> None:
    q.reprocess(jid)
    job = q.claim()
    assert job is not None and job.id == jid
    assert q.retry(job.id, job.token, delay_ms=0, max_attempts=1, error="boom") == "dead"


def sign_in(c: TestClient) -> None:
    """A browser's sign-in: the pages then draw their action forms."""
    c.get("/login")
    csrf = c.cookies.get("echomq_csrf")
    c.post("/login", data={"token": TOKEN, "csrf": csrf})


def page_fields(c: TestClient, q: echomq.Queue, jid: str, action: str) -> dict[str, str]:
    """The hidden fields of the job page's form for ``action`` (as a signed-in browser
    would post them, minus the CSRF token)."""
    sign_in(c)
    html = c.get(f"/queues/{q.name}/jobs/{jid}").text
    form = re.search(rf'<form[^>]*/jobs/{jid}/{action}">(.*?)</form>', html, re.S)
    assert form is not None, f"no {action} form on the page"
    hidden = re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form.group(1))
    fields = {k: v for k, v in hidden if k != "csrf"}
    assert "seen_state" in fields, "the form does not say what the page saw"
    return fields


def act(c: TestClient, q: echomq.Queue, path: str, data: Any) -> Any:
    pairs = list(data.items()) if isinstance(data, dict) else data
    headers = {**AUTH, "content-type": "application/x-www-form-urlencoded"}
    body = urllib.parse.urlencode(pairs)
    res = c.post(f"/api/queues/{q.name}/{path}", headers=headers, content=body)
    assert res.status_code == 200, res.text
    return res.json()["result"]


# --------------------------------------------------------------------------- the verbs


def test_remove_if_state_skips_a_moved_job_and_writes_nothing(
    q: echomq.Queue, r: redis.Redis
) -> None:
    jid = dead(q)
    q.reprocess(jid)
    before = snapshot(r, q.name)
    with pytest.raises(StateError, match="moved"):
        q.remove(jid, if_state="dead")
    assert snapshot(r, q.name) == before
    q.remove(jid, if_state="pending")
    assert q.job_state(jid) == "absent"


def test_remove_if_attempts_tells_a_job_that_died_again(q: echomq.Queue) -> None:
    jid = dead(q)
    die_again(q, jid)  # dead again, on its second attempt
    with pytest.raises(StateError, match="moved"):
        q.remove(jid, if_state="dead", if_attempts=1)
    q.remove(jid, if_state="dead", if_attempts=2)
    assert q.job_state(jid) == "absent"


def test_cancel_if_state_skips_a_job_back_in_the_schedule(q: echomq.Queue) -> None:
    jid = q.enqueue(b"x").id
    job = q.claim()
    assert job is not None
    assert q.retry(job.id, job.token, delay_ms=600_000, max_attempts=5, error="later") == (
        "scheduled"
    )
    with pytest.raises(StateError, match="moved"):
        q.cancel(jid, if_state="active")
    assert q.job_state(jid) == "scheduled"


def test_a_malformed_seen_state_is_refused_before_any_io(q: echomq.Queue) -> None:
    jid = q.enqueue(b"x").id
    with pytest.raises(InvalidArgument):
        q.remove(jid, if_state="waiting")
    with pytest.raises(InvalidArgument):
        q.cancel(jid, if_attempts=1)
    assert q.job_state(jid) == "pending"


# --------------------------------------------------------------------------- the dashboard


def test_remove_from_a_dead_page_skips_a_job_reprocessed_meanwhile(
    c: TestClient, q: echomq.Queue
) -> None:
    jid = dead(q)
    fields = page_fields(c, q, jid, "remove")
    q.reprocess(jid)  # another operator, after the page was drawn
    assert act(c, q, f"jobs/{jid}/remove", {**fields, "confirm": "yes"}) == {
        "done": 0,
        "skipped": 1,
    }
    assert q.job_state(jid) == "pending"


def test_remove_from_a_dead_page_skips_a_job_that_died_again(
    c: TestClient, q: echomq.Queue
) -> None:
    jid = dead(q)
    fields = page_fields(c, q, jid, "remove")
    die_again(q, jid)  # same place, another run: not the failure the page showed
    assert act(c, q, f"jobs/{jid}/remove", {**fields, "confirm": "yes"})["skipped"] == 1
    assert q.job_state(jid) == "dead"
    fields = page_fields(c, q, jid, "remove")  # a fresh page removes it
    assert act(c, q, f"jobs/{jid}/remove", {**fields, "confirm": "yes"})["done"] == 1
    assert q.job_state(jid) == "absent"


def test_cancel_from_an_active_page_skips_a_job_back_in_the_schedule(
    c: TestClient, q: echomq.Queue
) -> None:
    jid = q.enqueue(b"x").id
    job = q.claim()
    assert job is not None
    fields = page_fields(c, q, jid, "cancel")
    q.retry(job.id, job.token, delay_ms=600_000, max_attempts=5, error="later")
    assert act(c, q, f"jobs/{jid}/cancel", {**fields, "confirm": "yes"}) == {
        "done": 0,
        "skipped": 1,
    }
    assert q.job_state(jid) == "scheduled"


def test_a_dead_selection_skips_the_jobs_that_moved(c: TestClient, q: echomq.Queue) -> None:
    stays, moves = dead(q, b"a"), dead(q, b"b")
    sign_in(c)
    html = c.get(f"/queues/{q.name}?state=dead").text
    seen = re.search(r'<input type="hidden" name="seen_state" value="([^"]*)">', html)
    assert seen is not None and seen.group(1) == "dead"
    q.reprocess(moves)
    form = [("verb", "remove"), ("seen_state", "dead"), ("confirm", "yes")]
    form += [("ids", stays), ("ids", moves)]
    assert act(c, q, "selected", form) == {"done": 1, "skipped": 1}
    assert q.job_state(stays) == "absent" and q.job_state(moves) == "pending"


class _StaleList:
    """The queue as the dead list saw it a moment ago: ``browse`` answers the ids it held
    then (one of them reprocessed since); every verb goes to the real queue."""

    def __init__(self, q: echomq.Queue, listed: list[str]) -> None:
        self._q, self._listed = q, listed

    def browse(self, state: str, n: int) -> list[str]:
        listed, self._listed = self._listed, []
        return listed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._q, name)


def test_delete_all_dead_skips_a_job_reprocessed_meanwhile(q: echomq.Queue) -> None:
    stays, moves = dead(q, b"a"), dead(q, b"b")
    listed = q.browse("dead", 1000)
    q.reprocess(moves)  # between the list's read and the removes
    stale: Any = _StaleList(q, listed)
    assert _console.bulk(stale, "remove") == {"done": 1, "skipped": 1}
    assert q.job_state(stays) == "absent" and q.job_state(moves) == "pending"
