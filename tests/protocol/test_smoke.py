from __future__ import annotations

import echomq


def test_roundtrip(anyq) -> None:
    e = anyq.enqueue(b"hi")
    assert e.status == "enqueued"
    job = anyq.claim(lease_ms=1000)
    assert job.id == e.id and job.payload == b"hi" and job.token == 1
    anyq.complete(job.id, job.token)
    assert anyq.counts()["completed"] == 1
    assert anyq.check() == []
    assert isinstance(anyq.claim(), type(None))
    assert echomq.ids.is_valid(e.id)
