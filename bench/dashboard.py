"""The dashboard's overview over many queues (issue 11: < 300 ms for 200 queues).

Creates N queues (a few jobs each, some in lanes, some dead, some paused) on a private
server, then requests ``GET /`` and ``GET /api/queues`` through the ASGI app in-process
(httpx, no network hop besides Redis) and reports the median and p90 response times.
Discovery is cached by the app (5 s), as in production; ``--cold`` re-discovers every time.

    python bench/dashboard.py [--queues 200] [--requests 50] [--cold]

A figure, not a test. It starts its own server (``EmbeddedServer``, AOF off) in a temp dir.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queues", type=int, default=200)
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--cold", action="store_true", help="re-discover queues on every request")
    opts = ap.parse_args()

    import httpx

    import echomq
    from echomq.server import EmbeddedServer
    from echomq.web import create_app

    with tempfile.TemporaryDirectory() as tmp:
        srv = EmbeddedServer(tmp, appendonly=False).start()
        try:
            for i in range(opts.queues):
                q = echomq.Queue(f"bench-{i:04d}", url=srv.url)
                q.enqueue_many([b"x"] * 5)
                q.enqueue_many([b"y"] * 3, group=f"tenant-{i % 7}")
                if i % 10 == 0:
                    job = q.claim()
                    assert job is not None
                    q.retry(job.id, job.token, delay_ms=0, max_attempts=1, error="e")
                if i % 25 == 0:
                    q.pause()
                q.close()
            app = create_app(srv.url, discover_s=0.0 if opts.cold else 5.0)

            async def run() -> dict[str, list[float]]:
                out: dict[str, list[float]] = {"/": [], "/api/queues": []}
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://b") as c:
                    for path, ms in out.items():
                        (await c.get(path)).raise_for_status()  # warm: scripts, discovery
                        for _ in range(opts.requests):
                            t0 = time.perf_counter()
                            res = await c.get(path)
                            ms.append((time.perf_counter() - t0) * 1000)
                            res.raise_for_status()
                return out

            times = asyncio.run(run())
            mode = ", cold discovery" if opts.cold else ""
            for path, ms in times.items():
                ms.sort()
                p90 = ms[int(len(ms) * 0.9) - 1]
                print(
                    f"{path:12s} {opts.queues} queues: median {statistics.median(ms):.1f} ms, "
                    f"p90 {p90:.1f} ms ({len(ms)} requests{mode})"
                )
        finally:
            srv.stop()


if __name__ == "__main__":
    main()
