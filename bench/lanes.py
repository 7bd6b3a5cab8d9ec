"""Lane transitions against the ring's length (issue 10, finding 13).

Sets up L lanes with one waiting job each (written directly, so the setup costs the same for
every version of the scripts), then claims 2,000 of the jobs and completes them: every claim
empties its lane and every lane leaves the ring. Reports the server time the claims and the
completions took (INFO commandstats, EVALSHA usec), for each lane count.

    python bench/lanes.py [--lanes 50000 100000] [--jobs 2000] [--src DIR]

``--src`` runs another checkout's ``src`` (e.g. the code before the fix) against the same
setup. It starts its own server (``EmbeddedServer``, AOF off) in a temp dir.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lanes", type=int, nargs="+", default=[50_000, 100_000])
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--src", help="import echomq from this directory instead")
    opts = ap.parse_args()
    if opts.src:
        sys.path.insert(0, opts.src)
    import redis
    from servertime import top_level_usec

    import echomq
    from echomq import ids, keyspace
    from echomq.server import EmbeddedServer

    print(f"echomq from {echomq.__file__}")
    with tempfile.TemporaryDirectory() as tmp:
        srv = EmbeddedServer(tmp, appendonly=False).start()
        try:
            r = redis.Redis.from_url(srv.url)
            for n in opts.lanes:
                name = f"lanes{n}"
                q = echomq.Queue(name, url=srv.url)

                def key(s: str, name: str = name) -> str:
                    return keyspace.queue_key(name, s)

                t = time.perf_counter()
                pipe = r.pipeline(transaction=False)
                for i in range(n):
                    g, jid = f"L{i:06}", ids.mint()
                    pipe.hset(
                        key("job:" + jid),
                        mapping={"state": "pending", "attempts": "0", "payload": "x", "group": g},
                    )
                    pipe.zadd(keyspace.lane_key(name, g), {jid: 0})
                    pipe.sadd(key("lanes"), g)
                    pipe.rpush(key("ring"), g)
                    pipe.sadd(key("inring"), g)  # read by the new scripts, ignored by the old
                    if i % 5000 == 4999:
                        pipe.execute()
                pipe.execute()
                setup = time.perf_counter() - t

                def evalsha_usec() -> float:
                    return top_level_usec(r.info("commandstats"))

                u0 = evalsha_usec()
                jobs = []
                while len(jobs) < opts.jobs:
                    jobs += q.claim_batch(min(100, opts.jobs - len(jobs)), lease_ms=600_000)
                u1 = evalsha_usec()
                for i in range(0, len(jobs), 100):
                    q.settle(completed=[(j.id, j.token) for j in jobs[i : i + 100]])
                u2 = evalsha_usec()
                assert q.counts()["completed"] == opts.jobs
                print(
                    f"{n:>7} lanes: claim {opts.jobs} {(u1 - u0) / 1000:8.1f} ms, "
                    f"complete {opts.jobs} {(u2 - u1) / 1000:8.1f} ms server time "
                    f"(setup {setup:.1f} s)"
                )
                q.pause()
                q.obliterate(force=True)
                q.close()
            r.close()
        finally:
            srv.stop()


if __name__ == "__main__":
    main()
