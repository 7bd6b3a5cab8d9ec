"""echomq on its native executor: the same adapter as ``peers/echomq.py`` (the same app,
task and worker command), run with ``executor=native`` in every URL, so the transitions that
have a twin in the trafikey module run as its EMQ.* commands. run.py loads the module into
the bench's server when this system is measured."""

from __future__ import annotations

import importlib.util
from pathlib import Path

# A second instance of the echomq adapter (its own app, queues and EXECUTOR), not an import
# of peers.echomq: both systems are measured in one run, each with its own executor.
_spec = importlib.util.spec_from_file_location(
    "peers._echomq_native", Path(__file__).with_name("echomq.py")
)
assert _spec is not None and _spec.loader is not None
_impl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_impl)
_impl.EXECUTOR = "native"

LABEL = "echomq (native)"
SETTINGS = _impl.SETTINGS + "; `?executor=native` (the trafikey module, `make -C native`)"
BULK = _impl.BULK
CONCURRENCY = _impl.CONCURRENCY
echomq = _impl.echomq
version = _impl.version
enqueue_single = _impl.enqueue_single
enqueue_bulk = _impl.enqueue_bulk
worker_cmd = _impl.worker_cmd
remaining = _impl.remaining
verify = _impl.verify
latency_send = _impl.latency_send
lifecycle_loop = _impl.lifecycle_loop
