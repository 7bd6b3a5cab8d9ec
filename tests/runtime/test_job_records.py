"""The per-job records the worker builds on its hot path (issue 41) are the same values the
plain constructors make: a claimed :class:`Job` built slot by slot is an equal, hashable,
still frozen Job; a :class:`Running` keys itself by ``(id, token)``."""

from __future__ import annotations

import dataclasses

import pytest

from echomq.protocol.kernel import Job, _job
from echomq.runtime.runner import Running

J = "JOB0cHNlv43FEO"
B = J.encode()


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ([B, b'["t",[]]', b"3", b"lane-a"], Job(J, b'["t",[]]', 3, "lane-a", 0)),
        ([B, None, 7, None], Job(J, b"", 7, None, 0)),
        ([B, b"p", b"9", b"", b"4"], Job(J, b"p", 9, None, 4)),
        ([J, b"p", b"2", None, None], Job(J, b"p", 2, None, 0)),
        ([b"JOB\xff", b"p", b"1", None], Job("JOB\ufffd", b"p", 1, None, 0)),
    ],
)  # fmt: skip
def test_a_claimed_job_is_the_job_its_constructor_makes(row: list[object], expected: Job) -> None:
    job = _job(row)
    assert type(job) is Job
    assert job == expected and hash(job) == hash(expected) and repr(job) == repr(expected)
    assert job.attempt == expected.attempt
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.token = 99  # type: ignore[misc]


def test_a_run_keys_itself_by_id_and_token() -> None:
    r = Running(Job(J, b"", 5, None, 2))
    assert r.key == (J, 5)
    assert (r.ctx, r.fut, r.thread, r.child) == (None, None, None, None)
    assert not r.lost and not r.cancelled and r.max_attempts == 0
    assert J in repr(r)
    with pytest.raises(AttributeError):
        r.other = 1  # type: ignore[attr-defined]
