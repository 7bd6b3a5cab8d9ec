"""Helpers shared by test_console.py and the files split from it."""

from __future__ import annotations

import re
import urllib.parse
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient
from test_dashboard import TOKEN, _sign_in

import echomq
from echomq.protocol import envelope as _envelope
from echomq.serializers import JSON
from echomq.web import create_app

HTML = "<script>alert(1)</script>"


def _client(url: str, queues: list[str] | None, **kw: Any) -> TestClient:
    return TestClient(create_app(url, queues=queues, **kw))


def _post(c: TestClient, path: str, pairs: list[tuple[str, str]], **kw: Any) -> Any:
    """A form with a repeated field (one ``ids`` per selected job), as a browser sends it."""
    body = urllib.parse.urlencode(pairs)
    headers = {"content-type": "application/x-www-form-urlencoded"}
    return c.post(path, content=body, headers=headers, **kw)


def _call(task: str, *args: Any, **kwargs: Any) -> bytes:
    return _envelope.build(JSON(), task, args, kwargs)


def _kill(q: echomq.Queue, payload: bytes, error: str = "ValueError: bad input") -> str:
    jid = q.enqueue(payload).id
    job = q.claim()
    assert job is not None and job.id == jid
    assert q.retry(jid, job.token, delay_ms=0, max_attempts=1, error=error) == "dead"
    return jid


@pytest.fixture
def signed(url: str, q: echomq.Queue) -> Iterator[tuple[TestClient, str]]:
    with _client(url, None, token=TOKEN) as c:
        yield c, _sign_in(c)


def _row(html: str, job_id: str) -> str:
    m = re.search(rf'<tr data-id="{job_id}">(.*?)</tr>', html, re.S)
    assert m, f"no row for {job_id}"
    return m.group(1)
