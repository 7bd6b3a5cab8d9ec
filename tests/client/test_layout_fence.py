"""The data-layout fence (issue 39): ``{emq}:layout`` beside the wire version.

A client serves the layouts ``MIN_LAYOUT..LAYOUT``: an absent key (a deployment written
before 0.6) and N-1's layout are served, a layout above its own or below its oldest is
refused with one line saying what to upgrade, and nothing is written. Each test runs on a
server of its own (the two keys are deployment-wide), on both executors."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import echomq
import releases
from conftest import SyncOverAsync
from echomq.client import fence as _fence
from echomq.client import layout as _layout
from echomq.errors import LayoutFenceError, VersionFenceError

VERSION = "{emq}:version"
LAYOUT = "{emq}:layout"
LEGS = ["lua", "native"]


@pytest.fixture(params=LEGS)
def own(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, redis.Redis]]:
    """A fresh server of this test's own (with trafikey on the native leg): its echomq URL
    and a raw client."""
    with releases.own_server(request, request.param, tmp_path / "srv") as found:
        yield found


def _queues(url: str, name: str) -> list[object]:
    return [echomq.Queue(name, url=url), SyncOverAsync(echomq.AsyncQueue(name, url=url))]


def _close(queues: list[object]) -> None:
    for q in queues:
        q.close()  # type: ignore[attr-defined]


def test_a_fresh_deployment_records_this_releases_layout(own: tuple[str, redis.Redis]) -> None:
    url, raw = own
    q = echomq.Queue("fresh", url=url)
    try:
        q.enqueue(b"x")
        assert raw.get(VERSION) == echomq.WIRE_VERSION.encode()
        assert raw.get(LAYOUT) == str(_layout.LAYOUT).encode()
    finally:
        q.close()


def test_an_unrecorded_layout_is_served_and_left_alone(
    own: tuple[str, redis.Redis], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A deployment written before 0.6: the version is there, no layout. It is layout 1,
    # which this release serves; the client says once that `echomq migrate` is due.
    url, raw = own
    raw.set(VERSION, echomq.WIRE_VERSION)
    monkeypatch.setattr(_fence, "_told_behind", False)
    queues = _queues(url, "old")
    try:
        with caplog.at_level(logging.WARNING, logger="echomq"):
            for q in queues:
                q.enqueue(b"x")  # type: ignore[attr-defined]
        assert raw.get(LAYOUT) is None  # only `echomq migrate` records a layout
        told = [r.getMessage() for r in caplog.records if "echomq migrate" in r.getMessage()]
        assert len(told) == 1, told
        assert raw.zcard("emq:{old}:pending") == 2
    finally:
        _close(queues)


def test_the_previous_layout_is_served(own: tuple[str, redis.Redis]) -> None:
    url, raw = own
    assert _layout.MIN_LAYOUT <= _layout.LAYOUT - 1  # the contract: N serves N-1's layout
    raw.set(VERSION, echomq.WIRE_VERSION)
    raw.set(LAYOUT, str(_layout.LAYOUT - 1))
    queues = _queues(url, "prev")
    try:
        for q in queues:
            q.enqueue(b"x")  # type: ignore[attr-defined]
        assert raw.zcard("emq:{prev}:pending") == 2
        assert raw.get(LAYOUT) == str(_layout.LAYOUT - 1).encode()  # never raised by a client
    finally:
        _close(queues)


@pytest.mark.parametrize(
    ("stored", "says"),
    [
        (
            str(_layout.LAYOUT + 1),
            f"upgrade echomq on this host to a release that serves layout {_layout.LAYOUT + 1}",
        ),
        (
            str(_layout.MIN_LAYOUT - 1),
            "migrate it first with `echomq migrate` of a release that serves it",
        ),
        ("two", "not a data layout number"),
    ],
)
def test_a_layout_it_cannot_serve_is_refused_in_one_line(
    own: tuple[str, redis.Redis], stored: str, says: str
) -> None:
    url, raw = own
    raw.set(VERSION, echomq.WIRE_VERSION)
    raw.set(LAYOUT, stored)
    queues = _queues(url, "refused")
    try:
        for q in queues:
            with pytest.raises(LayoutFenceError) as info:
                q.enqueue(b"x")  # type: ignore[attr-defined]
            err = info.value
            assert isinstance(err, VersionFenceError)  # existing handlers keep working
            text = str(err)
            assert "\n" not in text and says in text, text
            assert f"echomq {echomq.__version__} serves layouts" in text
            assert err.found == stored
        assert raw.keys("emq:*") == []  # nothing written
        assert raw.get(LAYOUT) == stored.encode()  # never overwritten
    finally:
        _close(queues)


def test_a_running_client_refuses_a_layout_raised_past_it_on_its_next_connect(
    own: tuple[str, redis.Redis],
) -> None:
    url, raw = own
    q = echomq.Queue("raised", url=url)
    try:
        q.enqueue(b"x")
        raw.set(LAYOUT, str(_layout.LAYOUT + 1))
        assert raw.client_kill_filter(_type="normal", skipme=True) >= 1
        with pytest.raises((LayoutFenceError, redis.ConnectionError)):
            q.enqueue(b"y")
        with pytest.raises(LayoutFenceError):
            q.enqueue(b"y")
        assert raw.zcard("emq:{raised}:pending") == 1
    finally:
        q.close()
