"""SIGTERM and SIGINT: the first stops gracefully, a second at once.

How a worker process answers SIGTERM and SIGINT: the first stops it gracefully (claiming
stops, in-flight jobs get ``grace_s`` to finish, the rest are handed back to pending at once);
a second exits immediately, as promised — held leases lapse and any worker's stall sweep
recovers those jobs."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Protocol, TypeVar

__all__ = ["run_with_signals"]

log = logging.getLogger("echomq.worker")
_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_T_co = TypeVar("_T_co", covariant=True)


class Stoppable(Protocol[_T_co]):
    """What this module needs of a worker: described here, not imported, so the worker
    module can use this one without an import cycle."""

    @property
    def grace_s(self) -> float: ...

    def stop(self) -> None: ...

    async def arun(self) -> _T_co: ...


async def run_with_signals(worker: Stoppable[_T_co]) -> _T_co:
    """``worker.arun()`` with the signal handlers installed for its duration."""
    loop = asyncio.get_running_loop()
    received = 0

    def on_signal(sig: int) -> None:
        nonlocal received
        received += 1
        if received == 1:
            name = signal.Signals(sig).name
            log.info("received %s: finishing in-flight jobs (grace %.1fs)", name, worker.grace_s)
            worker.stop()
            return
        log.warning("second signal: exiting now; held leases will lapse and be swept")
        logging.shutdown()
        os._exit(128 + sig)

    for sig in _SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        return await worker.arun()
    finally:
        for sig in _SIGNALS:
            loop.remove_signal_handler(sig)
