"""Every export of ``echomq`` names a public module as its home (issue 38): the ones defined
in private modules (the generated ``_sync_queue``, ``_kernel``, ...) say ``echomq``, and
pickling by reference goes through that public path."""

from __future__ import annotations

import pickle

import echomq


def test_no_export_reports_a_private_module() -> None:
    for name in echomq.__all__:
        module = getattr(getattr(echomq, name), "__module__", None)
        if module is None or not isinstance(module, str):
            continue  # a constant or a module object
        assert not module.rsplit(".", 1)[-1].startswith("_"), (name, module)
    assert echomq.Queue.__module__ == echomq.AsyncQueue.__module__ == "echomq"


def test_exported_records_pickle_through_the_public_path() -> None:
    job = echomq.Enqueued("JOB0KHTOWnGLuC", "enqueued")
    data = pickle.dumps(job)
    assert b"echomq\n" in data or b"\x8c\x06echomq" in data
    assert pickle.loads(data) == job
