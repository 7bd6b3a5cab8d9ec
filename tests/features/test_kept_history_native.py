"""Kept history (issue 24) on both executors alike: the scripts (queue A) and the EMQ.*
commands (queue B) of one server, replies and keyspaces compared (a kept row's finish time
and a kept outcome's within the clock tolerance)."""

from __future__ import annotations

import time

from native_fixtures import (
    TOLERANCE_MS,
    Pair,
    diff,
    differential_fixtures,
    jid,
    settle_clock,
    snapshot,
)


class KeptPair(Pair):
    """A Pair that forgives the clock reads of each executor: a kept outcome's and a kept
    row's finished_ms and claimed_ms, within the tolerance (as scores are)."""

    def check(self, what: str = "") -> None:
        sa, sb = snapshot(self.r, self.a), snapshot(self.r, self.b)
        settle_clock(sa, sb)
        for name in set(sa) & set(sb):
            if sa[name][0] != "hash" or sb[name][0] != "hash":
                continue
            for field in (b"finished_ms", b"claimed_ms"):
                fa, fb = sa[name][1].get(field), sb[name][1].get(field)
                if fa is not None and fb is not None and abs(int(fa) - int(fb)) <= TOLERANCE_MS:
                    sb[name][1][field] = fa
        d = diff(sa, sb)
        assert not d, f"keyspaces differ {what}:\n" + "\n".join(d[:20])


QA, QB = "keptA", "keptB"
module_path, nserver, r, pair, both = differential_fixtures(
    QA, QB, tmp_name="kept", pair_class=KeptPair
)


def test_native_twins_keep_alike(pair: Pair) -> None:
    for q in (QA, QB):
        pair.r.hset(f"emq:{{{q}}}:meta", "keep_completed", "3:60000")
    for n in range(1, 7):
        args = ["@", jid(n), "p", "g" if n % 2 else "", "now", "0", "", "0", "", "", "simple", "0"]
        assert pair.run("enqueue", ["@job:" + jid(n), "@meta"], args) == ("ok", b"enqueued")
    claim = (["@meta", "@ring", "@active"], ["@", "30000"])
    for _ in (1, 2):
        _kind, job = pair.run("claim", *claim)
        jid_, token = job[0].decode(), job[2]
        done = pair.run(
            "complete", ["@active", "@job:" + jid_], ["@", jid_, str(token), "r", "60000"]
        )
        assert done == ("ok", 1)
    _kind, jobs = pair.run("claim_batch", claim[0], ["@", "30000", "4"])
    args: list[str | bytes] = ["@", "30000", "0", str(len(jobs))]
    for j in jobs:
        args += [j[0].decode(), str(j[2])]
    pair.run("settle", ["@meta", "@ring", "@active", "@schedule", "@dead"], args)
    kept = sorted(m.decode() for m in pair.r.zrange(f"emq:{{{QA}}}:completed", 0, -1))
    assert len(kept) == 3
    dead = "@dead"
    assert pair.run("reprocess", ["@job:" + kept[0], dead], ["@", kept[0], "in", "60000"]) == (
        "ok",
        1,
    )
    assert pair.run("reprocess", ["@job:" + kept[1], dead], ["@", kept[1]]) == ("ok", 1)
    assert pair.run("reprocess", ["@job:" + kept[1], dead], ["@", kept[1]])[0] == "err"
    assert pair.run("reprocess", ["@job:" + kept[2], dead], ["@", kept[2], "at", "1"]) == ("ok", 1)
    assert pair.run("reprocess", ["@job:" + kept[2], dead], ["@", kept[2], "in"])[0] == "err"
    assert pair.run("reprocess", ["@job:" + kept[2], dead], ["@", kept[2], "no", "1"])[0] == "err"
    # Lowering the bound: the next completion trims the rest (oldest first) on both.
    for q in (QA, QB):
        pair.r.hset(f"emq:{{{q}}}:meta", "keep_completed", "1:")
    _kind, job = pair.run("claim", *claim)
    jid_, token = job[0].decode(), job[2]
    assert pair.run("complete", ["@active", "@job:" + jid_], ["@", jid_, str(token), ""]) == (
        "ok",
        1,
    )
    assert pair.r.zcard(f"emq:{{{QB}}}:completed") == 1
    # An id named twice in one settle: the second mention is fenced on the kept row.
    _kind, job = pair.run("claim", *claim)
    twice = ["@", "30000", "0", "2", job[0].decode(), str(job[2]), job[0].decode(), str(job[2])]
    _kind, reply = pair.run("settle", ["@meta", "@ring", "@active", "@schedule", "@dead"], twice)
    assert reply[0][0] == 1 and b"EMQSTALE" in reply[0][1]


def test_native_twins_bound_dead_alike(pair: Pair) -> None:
    for q in (QA, QB):
        pair.r.hset(f"emq:{{{q}}}:meta", "keep_dead", "2:")
    for n in range(1, 9):
        args = ["@", jid(n), "p", "g" if n % 2 else "", "now", "0", "", "0", "", "", "simple", "0"]
        assert pair.run("enqueue", ["@job:" + jid(n), "@meta"], args) == ("ok", b"enqueued")
    claim = (["@meta", "@ring", "@active"], ["@", "30000"])
    retry_keys = ["@active", "@schedule", "@dead"]
    for _ in range(3):  # retry at the ceiling, one at a time
        _kind, job = pair.run("claim", *claim)
        jid_, token = job[0].decode(), str(job[2])
        args = ["@", jid_, token, "0", "1", "boom"]
        assert pair.run("retry", [*retry_keys, "@job:" + jid_], args) == ("ok", b"dead")
    assert pair.r.zcard(f"emq:{{{QB}}}:dead") == 2
    _kind, jobs = pair.run("claim_batch", claim[0], ["@", "30000", "3"])
    args2: list[str | bytes] = ["@", "30000", "0", "0"]
    for j in jobs:  # the worker's batch dead-letters three at once
        args2 += [j[0].decode(), str(j[2]), "0", "1", "boom"]
    pair.run("settle", ["@meta", "@ring", "@active", "@schedule", "@dead"], args2)
    assert pair.r.zcard(f"emq:{{{QB}}}:dead") == 2
    _kind, jobs = pair.run("claim_batch", claim[0], ["@", "1", "2"])
    time.sleep(0.02)
    pair.run("sweep_stalled", ["@active", "@dead"], ["@", "1", "100"])  # stall deaths
    assert pair.r.zcard(f"emq:{{{QB}}}:dead") == 2
