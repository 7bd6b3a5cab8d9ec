"""Memory at rest: server bytes per waiting job, side by side (issue 16, the baseline).

    bench/.venv/bin/python bench/memory.py            # 100k and 1M jobs, markers, ~10 min
    bench/.venv/bin/python bench/memory.py --quick    # 100k only, a shorter marker run
    bench/.venv/bin/python bench/memory.py --n 100000 300000 --only echomq_task,bullmq
    bench/.venv/bin/python bench/memory.py --report bench/memory.json   # re-print a run

Every measurement starts its own fresh redis-server (``EmbeddedServer``: a free port, AOF and
snapshots off, never 6379), reads ``INFO memory`` ``used_memory`` with only the measuring
connection open, has the system enqueue N no-op calls of one integer argument through the API
its users would use, closes the producer's connections and reads ``used_memory`` again:
bytes per job = (after - before) / N. ``used_memory`` is what the allocator hands out, so the
figures do not depend on CPU speed (the machine may be busy) and need no rounds; for the
same reason ``--parallel`` (default 4) runs that many measurements at once, each on its own
server, and only the marker run (which must hold a rate) runs alone, at the end.

The systems (the peers installed in ``bench/.venv``, BullMQ from ``bench/node``):

- echomq, task: ``@app.task`` + ``Task.enqueue_many([((i,), {}), ...])`` (the app layer);
- echomq, raw: ``Queue.enqueue_many([b'{"args":[i]}', ...])`` (the same data bytes BullMQ
  stores), and once more with ``retry_for=0`` (a queue that never resends: no replay markers);
- echomq, lanes: the task path spread evenly over 1,000 lanes (one ``enqueue_many(...,
  group=...)`` per lane);
- BullMQ (Node): ``Queue.addBulk([{name: 'noop', data: {args: [i]}}, ...])`` in chunks of 10k;
- RQ: ``Queue.enqueue_many([Queue.prepare_data(noop, (i,)), ...])`` in chunks of 10k;
- Celery: ``noop.apply_async((i,), producer=p)`` on one producer (Celery has no bulk API).
  Its sends run at ~1.7k/s here, so past ``--celery-max`` (default 100k) the broker LIST is
  filled up to N with copies of the messages actually sent (same byte sizes, give or take a
  digit of the argument); the table marks such a figure. ``--celery-max 0`` sends all N.

An echomq enqueue leaves a replay marker for ``retry_for`` + 60 s (70 s by default): a field
of a per-second HASH for a single enqueue, one STRING of verdict letters per ``enqueue_many``
script call; the server expires them: each echomq run is read twice, right after the load
("with its replay marker") and again after the retention ("at rest").

Then for echomq: a breakdown of the bytes (``MEMORY USAGE`` of sampled rows, of the pending
ZSET / N, of the replay-marker keys / the jobs they remember, the payload's length, the rest:
the keyspace table); the replay markers at a sustained single-enqueue rate
(``Task.enqueue`` paced at ``--rate`` for ``--marker-seconds``, sampled every 5 s: measured
until the retention of ``retry_for`` + 60 s is reached, and computed as bytes per marker x
rate x retention); the record of retired ids after ``--retired-jobs`` jobs were claimed and
completed; log lines.

The markdown report goes to stdout, the figures to ``bench/memory.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import multiprocessing
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from importlib.metadata import version as _version
from pathlib import Path
from typing import Any, cast

import redis

import echomq
from echomq.server import EmbeddedServer

BENCH = Path(__file__).resolve().parent
NODE_PKG = BENCH / "node" / "package.json"
QUEUE = "bench"
LANES = 1000
GIB = 1 << 30
CHUNK = 10_000  # the peers' bulk calls: what a user would send per call
# echomq's replay-marker retention: retry_for (its default, 10 s) + the 60 s slack, see
# echomq.client.queueopts.replay_ms; read from there so the figure follows the code.
try:
    from echomq.client.connect import DEFAULT_RETRY_FOR
    from echomq.client.queueopts import replay_ms as _replay_ms

    RETENTION_S = _replay_ms(DEFAULT_RETRY_FOR) / 1000
except Exception:  # an older or newer tree: fall back to today's value
    RETENTION_S = 70.0
try:
    from echomq.client.connect import DEFAULT_RETRY_FOR as RETRY_DEFAULT
except Exception:  # an older or newer tree
    RETRY_DEFAULT = 10.0


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ the server


@dataclass
class Fresh:
    url: str
    r: redis.Redis
    loaded_at: float = 0.0  # time.monotonic() at the end of the load

    def used(self) -> int:
        return int(self.r.info("memory")["used_memory"])

    def settle(self) -> None:
        """Wait until only the measuring connection is left (a closed client's buffers are
        freed by the server's event loop, not at once)."""
        deadline = time.monotonic() + 10
        while int(self.r.info("clients")["connected_clients"]) > 1:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)

    def mem(self, key: str) -> int:
        return int(self.r.memory_usage(key, samples=0) or 0)

    def markers(self) -> tuple[int, int, str]:
        """echomq's replay markers (``emq:{q}:recent:...``): how many jobs they remember, their
        bytes (``MEMORY USAGE`` of every marker key) and one key as an example. A single
        enqueue's marker is a field of a per-second HASH; an ``enqueue_many`` call's is one
        STRING holding a verdict letter per job."""
        count = size = 0
        example = ""
        for key in self.r.scan_iter(match="emq:{" + QUEUE + "}:recent:*", count=10_000):
            kind = self.r.type(key)
            if kind == b"hash":
                count += int(self.r.hlen(key))
            elif kind == b"string":
                count += int(self.r.strlen(key))
            size += self.mem(key.decode())
            example = example or key.decode()
        return count, size, example


@contextlib.contextmanager
def fresh_server() -> Iterator[Fresh]:
    with tempfile.TemporaryDirectory(prefix="emq-mem-") as tmp:
        srv = EmbeddedServer(tmp, appendonly=False, unix_socket=False, logfile=False).start()
        r = redis.Redis.from_url(srv.url)
        try:
            yield Fresh(srv.url, r)
        finally:
            r.close()
            srv.stop()


def measure(
    produce: Callable[[str, int], Any], n: int, detail: Callable[[Fresh, int], dict[str, Any]]
) -> dict[str, Any]:
    """One measurement on its own server: bytes per job, plus ``detail``'s figures."""
    with fresh_server() as s:
        s.settle()
        before = s.used()
        t0 = time.perf_counter()
        note = produce(s.url, n)
        elapsed = time.perf_counter() - t0
        s.loaded_at = time.monotonic()
        s.settle()
        after = s.used()
        out: dict[str, Any] = {
            "n": n,
            "bytes_per_job": (after - before) / n,
            "used_before": before,
            "used_after": after,
            "enqueue_s": round(elapsed, 2),
        }
        if note:
            out["note"] = note
        out.update(detail(s, n))
        if out.get("markers"):
            at_rest(s, n, before, out)
        return out


def at_rest(s: Fresh, n: int, before: int, out: dict[str, Any]) -> None:
    """echomq's bytes once the replay markers are gone: wait out their retention after the
    last enqueue, then one more enqueue (expired markers are dropped by the next enqueue of
    the queue, not by a timer), and read ``used_memory`` again. The one extra job (~400 B) is
    noise at N >= 100k. Also the bytes of a job *with* its marker: measured when every marker
    was still there at the end of the load, else at rest + the measured bytes per marker
    (a load that takes longer than the retention loses its first markers before the end)."""
    time.sleep(max(0.0, s.loaded_at + RETENTION_S + 1 - time.monotonic()))
    q = echomq.Queue(QUEUE, url=s.url)  # the default retry_for: an enqueue with a nonce
    q.enqueue(b"{}")
    q.close()
    s.settle()
    out["at_rest_bytes_per_job"] = (s.used() - before) / n
    out["markers_after_expiry"] = s.markers()[0]
    if out["markers"] >= n:
        out["with_marker_bytes_per_job"] = out["bytes_per_job"]
    else:
        out["with_marker_bytes_per_job"] = out["at_rest_bytes_per_job"] + out["marker_bytes_each"]
        out["with_marker_derived"] = True


def nothing(s: Fresh, n: int) -> dict[str, Any]:
    return {}


# ------------------------------------------------------------------------------ echomq


def _task(app: echomq.App) -> Any:
    @app.task(queue=QUEUE, name="noop")
    def noop(i: int) -> None:
        return None

    return noop


def echomq_task(url: str, n: int) -> None:
    app = echomq.App(url)
    noop = _task(app)
    for lo in range(0, n, 100_000):  # one call per 100k: bounds this process's memory only
        noop.enqueue_many([((i,), {}) for i in range(lo, min(n, lo + 100_000))])
    app.close()


def echomq_lanes(url: str, n: int) -> None:
    app = echomq.App(url)
    noop = _task(app)
    per = -(-n // LANES)
    for g in range(LANES):
        lo, hi = g * per, min(n, (g + 1) * per)
        noop.enqueue_many([((i,), {}) for i in range(lo, hi)], group=f"L{g:04}")
    app.close()


def _raw(retry_for: float | None) -> Callable[[str, int], None]:
    def produce(url: str, n: int) -> None:
        q = echomq.Queue(
            QUEUE, url=url, retry_for=RETRY_DEFAULT if retry_for is None else retry_for
        )
        for lo in range(0, n, 100_000):
            q.enqueue_many([b'{"args":[%d]}' % i for i in range(lo, min(n, lo + 100_000))])
        q.close()

    return produce


def _sample_rows(s: Fresh, want: int = 300) -> list[str]:
    """Random job rows (RANDOMKEY: no O(N) scan of a million keys)."""
    rows: set[str] = set()
    for _ in range(want * 20):
        k = cast("bytes | None", s.r.randomkey())
        if k is not None and b":job:" in k:
            rows.add(k.decode())
            if len(rows) >= want:
                break
    return sorted(rows)


def echomq_breakdown(s: Fresh, n: int) -> dict[str, Any]:
    """Where echomq's bytes are: the row, its pending entry, its replay marker, the rest."""
    base = "emq:{" + QUEUE + "}:"
    rows = _sample_rows(s)
    row = sum(s.mem(k) for k in rows) / max(1, len(rows))
    payload = sum(int(s.r.hstrlen(k, "payload")) for k in rows) / max(1, len(rows))
    fields = sorted(k.decode() for k in cast(list[bytes], s.r.hkeys(rows[0]))) if rows else []
    encoding = s.r.object("encoding", rows[0]).decode() if rows else ""
    # The waiting set: the flat pending ZSET, or the lanes' ZSETs (+ the lane registry).
    pending = s.mem(base + "pending")
    lane_keys = [k.decode() for k in s.r.scan_iter(match=base + "g:*", count=10_000)]
    lanes = sum(s.mem(k) for k in lane_keys)
    lane_enc = sorted({s.r.object("encoding", k).decode() for k in lane_keys[:50]})
    registry = sum(s.mem(base + k) for k in ("lanes", "ring", "inring", "ringstale"))
    markers, marker_bytes, _ = s.markers()
    out: dict[str, Any] = {
        "row_bytes": round(row, 1),
        "row_fields": fields,
        "row_encoding": encoding,
        "payload_len": round(payload, 1),
        "pending_zset_per_job": round(pending / n, 1),
        "markers": markers,
        "marker_bytes_each": round(marker_bytes / markers, 1) if markers else 0.0,
        "markers_per_job": round(marker_bytes / n, 1),
    }
    if lane_keys:
        out.update(
            lanes=len(lane_keys),
            lane_zsets_per_job=round(lanes / n, 1),
            lane_encoding=lane_enc,
            lane_registry_bytes=registry,
        )
    other_keys = [
        k.decode()
        for k in s.r.scan_iter(match=base + "*", count=10_000)
        if b":job:" not in k and b":g:" not in k
    ]
    out["other_keys"] = {k[len(base) :]: s.mem(k) for k in sorted(other_keys)}
    return out


# ------------------------------------------------------------------------------ peers


NODE_BULK = r"""
import { createRequire } from "node:module";
const require = createRequire(process.env.NODE_PKG);
const { Queue } = require("bullmq");
const [url, n, chunk] = [process.argv[1], Number(process.argv[2]), Number(process.argv[3])];
const u = new URL(url);
const queue = new Queue("bench", { connection: { host: u.hostname, port: Number(u.port) } });
await queue.waitUntilReady();
for (let lo = 0; lo < n; lo += chunk) {
  const jobs = [];
  const hi = Math.min(n, lo + chunk);
  for (let i = lo; i < hi; i++) jobs.push({ name: "noop", data: { args: [i] } });
  await queue.addBulk(jobs);
}
await queue.close();
console.log(JSON.stringify({ ok: true }));
process.exit(0);
"""


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        raise RuntimeError("node is not on PATH")
    return node


def bullmq(url: str, n: int) -> None:
    env = dict(os.environ, NODE_PKG=str(NODE_PKG))
    proc = subprocess.run(
        [_node(), "--input-type=module", "-e", NODE_BULK, url, str(n), str(CHUNK)],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"bullmq addBulk failed: {proc.stderr.strip()[-2000:]}")


def bullmq_detail(s: Fresh, n: int) -> dict[str, Any]:
    k = "bull:bench:1"
    return {
        "row_bytes": s.mem(k),
        "row_fields": sorted(f.decode() for f in cast(list[bytes], s.r.hkeys(k))),
        "wait_list_per_job": round(s.mem("bull:bench:wait") / n, 1),
        "events_stream_bytes": s.mem("bull:bench:events"),
    }


def rq_noop(i: int) -> None:
    return None


def rq(url: str, n: int) -> None:
    from rq import Queue  # type: ignore[import-not-found]

    conn = redis.Redis.from_url(url)
    q = Queue(QUEUE, connection=conn)
    for lo in range(0, n, CHUNK):
        q.enqueue_many([Queue.prepare_data(rq_noop, (i,)) for i in range(lo, min(n, lo + CHUNK))])
    conn.close()


def rq_detail(s: Fresh, n: int) -> dict[str, Any]:
    k = next(s.r.scan_iter(match="rq:job:*", count=1000)).decode()
    return {
        "row_bytes": s.mem(k),
        "row_fields": len(s.r.hkeys(k)),
        "queue_list_per_job": round(s.mem("rq:queue:" + QUEUE) / n, 1),
    }


def _celery(celery_max: int) -> Callable[[str, int], str | None]:
    def produce(url: str, n: int) -> str | None:
        from celery import Celery  # type: ignore[import-not-found]

        app = Celery("mem", broker=url)
        app.conf.update(task_default_queue=QUEUE, task_ignore_result=True)

        @app.task(name="noop")  # type: ignore[untyped-decorator]
        def noop(i: int) -> None:
            return None

        sent = n if celery_max <= 0 else min(n, celery_max)
        with app.producer_or_acquire() as producer:
            for i in range(sent):
                noop.apply_async((i,), producer=producer)
        note = None
        if sent < n:
            # Fill the broker LIST up to n with copies of the messages just sent: the same
            # byte sizes (give or take a digit of the argument), without ~10 min of sends.
            r = redis.Redis.from_url(url)
            msgs = r.lrange(QUEUE, 0, -1)
            left = n - sent
            while left > 0:
                part = msgs[: min(left, len(msgs))]
                for lo in range(0, len(part), CHUNK):
                    r.lpush(QUEUE, *part[lo : lo + CHUNK])
                left -= len(part)
            r.close()
            note = f"{sent:,} sent through apply_async, the LIST filled to {n:,} with copies"
        app.close()
        return note

    return produce


def celery_detail(s: Fresh, n: int) -> dict[str, Any]:
    return {
        "message_len": len(s.r.lindex(QUEUE, 0) or b""),
        "queue_list_per_job": round(s.mem(QUEUE) / n, 1),
    }


# ------------------------------------------------------------------------------ settings


def markers_run(rate: float, seconds: float) -> dict[str, Any]:
    """``Task.enqueue`` paced at ``rate``/s for ``seconds``: the replay markers over time."""
    with fresh_server() as s:
        app = echomq.App(s.url)
        noop = _task(app)
        noop.enqueue(-1)  # open the connection, load the scripts
        samples: list[dict[str, float]] = []
        start = time.monotonic()
        next_sample = start + 5
        i = 0
        while True:
            now = time.monotonic()
            if now - start >= seconds:
                break
            due = start + i / rate
            if due > now:
                time.sleep(due - now)
            noop.enqueue(i)
            i += 1
            if now >= next_sample:
                next_sample += 5
                count, size, _ = s.markers()
                samples.append(
                    {
                        "t": round(now - start, 1),
                        "sent": i,
                        "markers": count,
                        "marker_mib": round(size / (1 << 20), 2),
                    }
                )
        elapsed = time.monotonic() - start
        count, size, example = s.markers()
        app.close()
    achieved = i / elapsed
    each = size / count if count else 0.0
    reached = seconds >= RETENTION_S + 5
    return {
        "target_rate": rate,
        "achieved_rate": round(achieved, 1),
        "seconds": round(elapsed, 1),
        "retention_s": RETENTION_S,
        "markers_at_end": count,
        "marker_zset_bytes_at_end": size,
        "bytes_per_marker": round(each, 1),
        "key_example": example,
        "steady_state_reached": reached,
        "computed_steady_markers_10k": int(10_000 * RETENTION_S),
        "computed_steady_mib_10k": round(each * 10_000 * RETENTION_S / (1 << 20), 1),
        "samples": samples,
    }


def retired_run(jobs: int) -> dict[str, Any]:
    """The record of retired ids after ``jobs`` jobs were claimed and completed."""
    base = "emq:{" + QUEUE + "}:"
    with fresh_server() as s:
        q = echomq.Queue(QUEUE, url=s.url, retry_for=0)
        q.enqueue_many([b'{"args":[%d]}' % i for i in range(jobs)])
        s.settle()
        before = s.used()
        done = 0
        while done < jobs:
            got = q.claim_batch(500, lease_ms=600_000)
            if not got:
                break
            q.settle(completed=[(j.id, j.token) for j in got])
            done += len(got)
        ids = int(s.r.hlen(base + "retired")) + int(s.r.hlen(base + "retired:old"))
        size = s.mem(base + "retired") + s.mem(base + "retired:old")
        q.close()
        s.settle()
        after = s.used()
    return {
        "completed": done,
        "retired_ids": ids,
        "retired_bytes": size,
        "bytes_per_retired_id": round(size / ids, 1) if ids else 0.0,
        "used_after_minus_before": after - before,
        "note": "the record is two generations of 25,000 ids (the older one dropped when the "
        "newer fills): at most 50,000 ids per queue, the steady state of a busy queue",
    }


def logs_run(jobs: int = 2000, lines: int = 10, line: str = "x" * 40) -> dict[str, Any]:
    """Bytes of the first and of each further log line of a waiting job."""
    with fresh_server() as s:
        q = echomq.Queue(QUEUE, url=s.url, retry_for=0)
        ids = [e.id for e in q.enqueue_many([b"{}"] * jobs)]  # type: ignore[union-attr]
        s.settle()
        m0 = s.used()
        for jid in ids:
            q.add_log(jid, line)
        m1 = s.used()
        for _ in range(lines - 1):
            for jid in ids:
                q.add_log(jid, line)
        m2 = s.used()
        q.close()
    return {
        "line_len": len(line),
        "first_line_bytes": round((m1 - m0) / jobs, 1),
        "next_line_bytes": round((m2 - m1) / (jobs * (lines - 1)), 1),
    }


# ------------------------------------------------------------------------------ report


def versions() -> dict[str, str]:
    out = {"echomq": echomq.__version__, "python": platform.python_version()}
    for pkg in ("rq", "celery", "kombu", "redis"):
        with contextlib.suppress(Exception):
            out[pkg] = _version(pkg)
    with contextlib.suppress(Exception):
        pkg = json.loads((BENCH / "node" / "node_modules" / "bullmq" / "package.json").read_text())
        node = subprocess.run(
            [_node(), "--version"], capture_output=True, text=True, check=False
        ).stdout
        out["bullmq"] = f"{pkg['version']} (node {node.strip()})"
    with contextlib.suppress(Exception):
        from echomq.server import find_binary

        out["redis-server"] = subprocess.run(
            [find_binary(), "--version"], capture_output=True, text=True, check=False
        ).stdout.split()[2][2:]
    return out


SYSTEMS: dict[str, tuple[str, str]] = {
    "echomq_task": ("echomq", "`Task.enqueue_many` (app layer, JSON envelope)"),
    "echomq_raw": ("echomq", '`Queue.enqueue_many`, payload `{"args":[i]}`'),
    "echomq_raw_noreplay": ("echomq", "the same, `retry_for=0` (no replay markers)"),
    "echomq_lanes": ("echomq", f"`Task.enqueue_many(..., group=)`, {LANES:,} lanes"),
    "bullmq": ("BullMQ (Node)", "`Queue.addBulk`, data `{args:[i]}`, 10k per call"),
    "rq": ("RQ", "`Queue.enqueue_many`, 10k per call"),
    "celery": ("Celery", "`apply_async` on one producer (no bulk API)"),
}


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def report(res: dict[str, Any], ns: list[int], cmd: str) -> str:
    out = [f"`{cmd}` ({res['date']}, redis-server {res['versions'].get('redis-server', '?')})", ""]
    head = "| system | API | " + " | ".join(f"B/job @{n:,}" for n in ns)
    head += " | " + " | ".join(f"x BullMQ @{n:,}" for n in ns) + f" | jobs/GiB @{ns[-1]:,} |"
    out += [head, "|" + "---|" * (2 + 2 * len(ns) + 1)]
    by = res["jobs"]
    derived = False
    for key, (label, api) in SYSTEMS.items():
        if key not in by:
            continue
        # echomq with replay markers: one row with the marker (the first retry_for + 60 s
        # after the enqueue), one at rest (the markers expired and dropped).
        variants = [("bytes_per_job", "")]
        if any("at_rest_bytes_per_job" in m for m in by[key].values()):
            variants = [
                ("with_marker_bytes_per_job", ", with its replay marker"),
                ("at_rest_bytes_per_job", ", at rest (markers expired)"),
            ]
        for field, suffix in variants:
            cells, ratios = [], []
            for n in ns:
                m = by[key].get(str(n))
                b = by.get("bullmq", {}).get(str(n))
                v = m.get(field, m["bytes_per_job"]) if m else None
                mark = "*" if m and m.get("note") else ""
                if m and field == "with_marker_bytes_per_job" and m.get("with_marker_derived"):
                    mark, derived = mark + "+", True
                cells.append(fmt(v) + mark)
                ratios.append(
                    f"{v / b['bytes_per_job']:.2f}"
                    if v and b and key != "bullmq"
                    else ("1.00" if v and key == "bullmq" else "-")
                )
            last = by[key].get(str(ns[-1]))
            per_gib = fmt(GIB / last.get(field, last["bytes_per_job"])) if last else "-"
            out.append(
                f"| {label} | {api}{suffix} | " + " | ".join(cells + ratios) + f" | {per_gib} |"
            )
    notes = [
        f"{k} @{n}: {m['note']}"
        for k, per in by.items()
        for n, m in per.items()
        if isinstance(m, dict) and m.get("note")
    ]
    if notes:
        out += ["", "\\* " + "; ".join(notes) + "."]
    if derived:
        out += [
            "",
            "\\+ the load took longer than the markers' retention (its first markers were "
            "dropped before the end): at rest + the measured bytes per marker.",
        ]
    # The breakdown of echomq's bytes.
    rows = []
    for key in ("echomq_task", "echomq_raw", "echomq_lanes"):
        for n in ns:
            m = by.get(key, {}).get(str(n))
            if not m:
                continue
            waiting = m.get("lane_zsets_per_job", m["pending_zset_per_job"])
            rest = m["bytes_per_job"] - m["row_bytes"] - waiting - m["markers_per_job"]
            rows.append(
                f"| {key} @{n:,} | {m['bytes_per_job']:,.0f} | {m['row_bytes']:,.0f} "
                f"({m['payload_len']:.0f} B payload) | {waiting:,.0f}"
                + (f" ({', '.join(m['lane_encoding'])})" if "lane_encoding" in m else "")
                + f" | {m['markers_per_job']:,.0f} ({m['marker_bytes_each']:.0f} B each) "
                f"| {rest:,.0f} |"
            )
    if rows:
        out += [
            "",
            "Where echomq's bytes are (per waiting job; `MEMORY USAGE` of ~300 sampled rows, "
            "which includes the key and its keyspace entry; the waiting ZSET's and the marker "
            "ZSET's `MEMORY USAGE` / N; the rest: the keyspace table's buckets, allocator rounding "
            "that `MEMORY USAGE` does not see, the fixed costs (scripts, lane registry) / N):",
            "",
            "| run | total | row | waiting entry | replay marker | rest |",
            "|---|---|---|---|---|---|",
            *rows,
        ]
    mk = res.get("markers")
    if mk:
        steady = "steady state, measured" if mk["steady_state_reached"] else "not yet steady"
        out += [
            "",
            f"Replay markers at a sustained single enqueue (`Task.enqueue`, target "
            f"{mk['target_rate']:,.0f}/s, achieved {mk['achieved_rate']:,.0f}/s for "
            f"{mk['seconds']:.0f} s; retention retry_for + 60 s = {mk['retention_s']:.0f} s): "
            f"{mk['markers_at_end']:,} markers, {mk['marker_zset_bytes_at_end'] / (1 << 20):.1f} "
            f"MiB at the end ({steady}); "
            f"{mk['bytes_per_marker']:.0f} B per marker (a field of a per-second HASH such as "
            f"`{mk.get('key_example', '')}`). "
            f"Steady state at 10k/s, computed = {mk['bytes_per_marker']:.0f} B x 10,000/s x "
            f"{mk['retention_s']:.0f} s = **{mk['computed_steady_mib_10k']:.1f} MiB** "
            f"({mk['computed_steady_markers_10k']:,} markers) per queue.",
        ]
    rt = res.get("retired")
    if rt:
        out += [
            "",
            f"Record of retired ids after {rt['completed']:,} claimed and completed jobs: "
            f"{rt['retired_ids']:,} ids, {rt['retired_bytes'] / (1 << 20):.1f} MiB, "
            f"{rt['bytes_per_retired_id']:.0f} B per id ({rt['note']}).",
        ]
    lg = res.get("logs")
    if lg:
        out += [
            "",
            f"Job logs ({lg['line_len']}-char lines): the first line of a job "
            f"{lg['first_line_bytes']:.0f} B (a new LIST key), each further line "
            f"{lg['next_line_bytes']:.0f} B.",
        ]
    return "\n".join(out)


RUNS: dict[str, tuple[Callable[[int], Callable[[str, int], Any]], Callable[[Fresh, int], Any]]] = {
    "echomq_task": (lambda cm: echomq_task, echomq_breakdown),
    "echomq_raw": (lambda cm: _raw(None), echomq_breakdown),
    "echomq_raw_noreplay": (lambda cm: _raw(0), nothing),
    "echomq_lanes": (lambda cm: echomq_lanes, echomq_breakdown),
    "bullmq": (lambda cm: bullmq, bullmq_detail),
    "rq": (lambda cm: rq, rq_detail),
    "celery": (_celery, celery_detail),
}
# Rough cost per job of each producer here, to start the longest measurements first.
COST = {"rq": 40, "celery": 30, "bullmq": 17, "echomq_lanes": 6}


def run_one(key: str, n: int, celery_max: int, retired: int) -> tuple[str, Any]:
    """One measurement (in a pool process): a system at N, or one of the settings."""
    t = time.monotonic()
    try:
        if key == "retired":
            return key, retired_run(retired)
        if key == "logs":
            return key, logs_run()
        make, detail = RUNS[key]
        return key, measure(make(celery_max), n, detail)
    except Exception as e:  # one system failing must not lose the rest
        return key, {"error": repr(e), "n": n, "seconds": round(time.monotonic() - t, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--quick", action="store_true", help="100k only, a 20 s marker run")
    ap.add_argument("--only", default="", help="comma list of: " + ",".join(SYSTEMS))
    ap.add_argument("--celery-max", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=10_000)
    ap.add_argument("--marker-seconds", type=float, default=RETENTION_S + 10)
    ap.add_argument("--retired-jobs", type=int, default=60_000)
    ap.add_argument("--no-settings", action="store_true", help="skip markers/retired/logs")
    ap.add_argument(
        "--parallel",
        type=int,
        default=4,
        help="measurements at once, each on its own server (memory does not depend on CPU)",
    )
    ap.add_argument("--json", default=str(BENCH / "memory.json"))
    ap.add_argument("--report", metavar="JSON", help="print the report of a saved run, run nothing")
    opts = ap.parse_args()
    if opts.report:
        saved = json.loads(Path(opts.report).read_text())
        saved_ns = sorted({int(n) for per in saved["jobs"].values() for n in per})
        print(report(saved, saved_ns, saved["command"]))
        return
    ns = [100_000] if opts.quick else sorted(opts.n)
    marker_s = 20.0 if opts.quick else opts.marker_seconds
    only = [s for s in opts.only.split(",") if s] or list(SYSTEMS)
    bad = set(only) - set(SYSTEMS)
    if bad:
        ap.error(f"unknown systems {sorted(bad)}")
    t_start = time.monotonic()
    res: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "versions": versions(),
        "jobs": {},
    }
    # The markers' share is already clear at the smallest N: no 1M run without them.
    todo = [(k, n) for n in ns for k in only if not (k == "echomq_raw_noreplay" and n != ns[0])]
    todo.sort(key=lambda t: -t[1] * COST.get(t[0], 3))
    if not opts.no_settings:
        todo += [("retired", 0), ("logs", 0)]
    ctx = multiprocessing.get_context("fork")  # nothing is connected yet in this process
    with ProcessPoolExecutor(max(1, opts.parallel), mp_context=ctx) as pool:
        futs = {}
        for key, n in todo:
            log(f"queued {key} @{n:,}")
            futs[pool.submit(run_one, key, n, opts.celery_max, opts.retired_jobs)] = (key, n)
        for fut in as_completed(futs):
            key, n = futs[fut]
            _, m = fut.result()
            if "error" in m:
                log(f"{key} @{n:,} FAILED: {m['error']}")
                res.setdefault("errors", []).append({"system": key, **m})
            elif key in ("retired", "logs"):
                res[key] = m
                log(f"{key}: done")
            else:
                res["jobs"].setdefault(key, {})[str(n)] = m
                log(f"{key} @{n:,}: {m['bytes_per_job']:,.1f} B/job ({m['enqueue_s']} s)")
    res["jobs"] = {
        k: dict(sorted(v.items(), key=lambda i: int(i[0]))) for k, v in res["jobs"].items()
    }
    if not opts.no_settings:
        # Alone, after the pool: this one needs the CPU to hold the rate.
        log(f"markers: Task.enqueue at {opts.rate:,.0f}/s for {marker_s:.0f} s ...")
        res["markers"] = markers_run(opts.rate, marker_s)
    cmd = "bench/.venv/bin/python bench/memory.py " + " ".join(sys.argv[1:])
    res["command"] = cmd.strip()
    res["runtime_s"] = round(time.monotonic() - t_start, 1)
    Path(opts.json).write_text(json.dumps(res, indent=2) + "\n")
    print(report(res, ns, res["command"]))
    log(f"done in {res['runtime_s']:.0f} s; figures in {opts.json}")


if __name__ == "__main__":
    main()
