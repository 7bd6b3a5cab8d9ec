"""The dashboard's job lists on a 1M-job queue (issue 26: the pending list's first and last
page each render in < 300 ms server time).

Fills one queue with N waiting jobs (task envelopes, as an app enqueues them) on a private
server, then requests the pending list's first page and its last page (``?offset=``, the
"oldest" link) through the ASGI app in-process (httpx, no network hop besides Redis), and
reports the median and p90 response times: the time the dashboard process spends on the
request, its Redis round trips included. For comparison it also times the one Redis
command each way of reading the last page: by rank (what the dashboard does) and by
``BYLEX ... LIMIT offset`` (what it did before, which walks the offset).

    python bench/console_pages.py [--jobs 1000000] [--requests 20] [--per 50]

A figure, not a test. It starts its own server (``EmbeddedServer``, AOF off) in a temp dir.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time


def _stats(ms: list[float]) -> str:
    ms = sorted(ms)
    p90 = ms[max(0, int(len(ms) * 0.9) - 1)]
    return f"median {statistics.median(ms):.1f} ms, p90 {p90:.1f} ms, max {ms[-1]:.1f} ms"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--per", type=int, default=50)
    opts = ap.parse_args()

    import httpx

    import echomq
    from echomq.protocol import envelope as _envelope
    from echomq.serializers import JSON
    from echomq.server import EmbeddedServer
    from echomq.web import create_app

    with tempfile.TemporaryDirectory() as tmp:
        srv = EmbeddedServer(tmp, appendonly=False).start()
        try:
            q = echomq.Queue("bench-console", url=srv.url)
            t0 = time.perf_counter()
            payloads = [
                _envelope.build(JSON(), "send_invoice", [f"cust-{i}", i]) for i in range(10_000)
            ]
            for _ in range(opts.jobs // len(payloads)):
                q.enqueue_many(payloads)
            filled = time.perf_counter() - t0
            total = q.counts()["pending"]
            print(f"filled {total:,} jobs in {filled:.1f} s")
            last = (total - 1) // opts.per * opts.per
            app = create_app(srv.url)
            paths = {
                "first page": f"/queues/{q.name}?per={opts.per}",
                "last page": f"/queues/{q.name}?per={opts.per}&offset={last}",
                "first page (JSON)": f"/api/queues/{q.name}?per={opts.per}",
                "last page (JSON)": f"/api/queues/{q.name}?per={opts.per}&offset={last}",
            }

            async def run() -> dict[str, list[float]]:
                out: dict[str, list[float]] = {name: [] for name in paths}
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://b") as c:
                    for name, path in paths.items():
                        res = await c.get(path)  # warm: scripts, discovery
                        res.raise_for_status()
                        assert "send_invoice" in res.text
                        for _ in range(opts.requests):
                            t0 = time.perf_counter()
                            res = await c.get(path)
                            out[name].append((time.perf_counter() - t0) * 1000)
                            res.raise_for_status()
                return out

            times = asyncio.run(run())
            for name, ms in times.items():
                print(f"{name:18s} {total:,} jobs, {opts.per}/page: {_stats(ms)}")
            raw = q.client
            key = f"emq:{{{q.name}}}:pending"
            for label, args in (
                ("rank", ("ZRANGE", key, last, last + opts.per - 1, "REV")),
                ("BYLEX LIMIT", ("ZRANGE", key, "+", "-", "BYLEX", "REV", "LIMIT", last, opts.per)),
            ):
                ms = []
                for _ in range(opts.requests):
                    t0 = time.perf_counter()
                    raw.execute_command(*args)
                    ms.append((time.perf_counter() - t0) * 1000)
                print(f"last page by {label:11s} (one Redis command): {_stats(ms)}")
            q.close()
        finally:
            srv.stop()


if __name__ == "__main__":
    main()
