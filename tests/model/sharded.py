"""The model machine on a sharded queue (issue 43): ModelMachine's rules, one logical queue.

``ShardedMachine`` is tests/model/test_model.py's ``ModelMachine`` with each of its two
queues opened as ``Queue(name, shards=3)``, next to the same pure model of
tests/model/core.py: the model still holds one logical queue per name. Every rule of the
machine runs unchanged (they reach the server through ``q``, ``jkey``, ``jqueue``, ``score``
and a few hooks this class answers per shard); what a sharded queue does differently by
design is modelled here, and only here:

- a job lives on one shard (its lane's, else its dedup id's, else its id's; a flow on its
  root's): every per-row check looks the row up on whichever shard holds it (the row key
  ``emq:{<shard>}:job:<id>``), and asserts it is on exactly one, the one decision 4 names
  (a flow node: its root's; a repeat's job: its lane's, else the repeat's name's);
- a claim serves the head of its set *on the shard it came from* (claims rotate over the
  shards, so the logical queue has no global order);
- the kept-history bounds (``keep_completed``, ``keep_dead``) and ``promote(limit)`` apply per
  shard (``ShardedModel`` trims per shard);
- the queue-wide ``limit(n)`` and ``rate_limit`` are refused with ``ShardsError`` and write
  nothing (every key of every shard compared before and after); ``reassign`` of a job to a
  lane on another shard likewise (a job never moves between shards);
- after every step: ``check()`` is empty on every shard (and on the logical queue),
  ``counts()`` and ``lanes()`` are the model's (the shards' sums and union), ``is_paused()``
  is the model's on every shard, the retired record is the union of the shards' (no id in
  two), each kept result, dedup key and outbox entry is on one shard at most, and
  ``job_state`` answers on the row's shard.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis
from hypothesis.stateful import RULE_MARKER, rule

import echomq
from echomq import keyspace
from echomq.client.shards import shard_of
from echomq.errors import ShardsError
from echomq.protocol import calls as _protocol
from model.core import LONG, Job, QueueModel
from model.draws import note, pick, strict
from model.rules_admin import AdminRules
from model.rules_enqueue import EnqueueClaimRules
from model.rules_settle import SettleRules
from model.test_model import FIELDS, ModelMachine, flow_agrees, place_key
from model.verbs import VerbRules

N = 3  # shards per logical queue in this leg


def _args(rule_fn: Any) -> dict[str, Any]:
    """The strategies a base rule draws its arguments from (to wrap it here)."""
    return dict(getattr(rule_fn, RULE_MARKER).arguments)


_FLOW_SIDES = (":deps", ":processed", ":failed", ":unsuccessful")


class ShardedModel(QueueModel):
    """The logical queue's model, whose kept-history bounds hold per shard (the sharded
    queue sets each shard's ``keep_completed``/``keep_dead``): ``home`` names each row's shard."""

    def __init__(self, home: Callable[[list[str]], dict[str, int]]) -> None:
        super().__init__()
        self.home = home

    def admit(self, jid: str, j: Job) -> None:
        super().admit(jid, j)
        self.home([jid])  # notes the shard it landed on, should it go within the step

    def trim(self, state: str, bound: int | None) -> None:
        if bound is None:
            return
        held = [i for i, j in self.jobs.items() if j.state == state]
        homes = self.home(held)
        for s in set(homes.values()):
            part = sorted(
                (self.jobs[i].score if state == "completed" else self.jobs[i].died, i)
                for i in held
                if homes[i] == s
            )
            for _, jid in part[: max(0, len(part) - bound)]:
                j = self.jobs.pop(jid)
                self.retired[jid] = j.attempts
                self.flows.pop(jid, None)


class ShardedMachine(ModelMachine):
    """ModelMachine on two queues of N shards each (see the module's docstring)."""

    def __init__(self, client: redis.Redis, executors: tuple[str, ...]) -> None:
        self.last: dict[tuple[int, str], int] = {}  # the shard a row was last seen on
        super().__init__(client, executors)
        self.subs = [qs[0].shards() for qs in self.handles]
        for qi, subs in enumerate(self.subs):
            assert len(subs) == N == len(set(subs)) and subs[0] == self.names[qi], subs
        self.plain = [
            [echomq.Queue(s, client=client, executor=executors[0]) for s in subs]
            for subs in self.subs
        ]
        self.w.qs = [ShardedModel(lambda ids, qi=qi: self.placed(qi, ids)) for qi in (0, 1)]
        for m, subs in zip(self.w.qs, self.subs, strict=True):
            m.layout = list(subs)

    # ------------------------------------------------------------------ where rows are

    def open_queue(self, name: str, client: redis.Redis, executor: str) -> echomq.Queue:
        return echomq.Queue(name, shards=N, client=client, executor=executor)

    def subqueues(self, qi: int) -> list[str]:
        return self.subs[qi]

    def homes(self, qi: int, ids: list[str]) -> dict[str, int | None]:
        """The shard holding each id's row (None: no shard); a row on two shards fails."""
        pipe = self.r.pipeline(transaction=False)
        for jid in ids:
            for s in self.subs[qi]:
                pipe.exists(keyspace.job_key(s, jid))
        got = pipe.execute()
        out: dict[str, int | None] = {}
        for k, jid in enumerate(ids):
            on = [i for i in range(N) if got[k * N + i]]
            assert len(on) <= 1, f"{jid} has a row on shards {on} of {self.names[qi]}"
            out[jid] = on[0] if on else None
            if on:
                self.last[(qi, jid)] = on[0]
        return out

    def placed(self, qi: int, ids: list[str]) -> dict[str, int]:
        """The shard holding each id's row; when none does, the last one that did (its kept
        outcome, its dedup key stay there), else its id's shard."""
        homes = self.homes(qi, ids)
        return {
            i: self.last.get((qi, i), shard_of(i, N)) if on is None else on
            for i, on in homes.items()
        }

    def where(self, qi: int, jid: str) -> int:
        return self.placed(qi, [jid])[jid]

    def jqueue(self, qi: int, jid: str) -> str:
        return self.subs[qi][self.where(qi, jid)]

    def parent_queue(self, j: Job) -> str | None:
        return None if j.pq is None or j.parent is None else self.jqueue(j.pq, j.parent)

    def routed(self, jid: str, j: Job) -> int | None:
        """The shard decision 4 sends a job to: a flow node its root's (``home``, set when
        the flow was added), a repeat's occurrence its lane's, else its name's; any other
        job its lane's, else its dedup id's, else its id's."""
        if getattr(j, "mark", None) is not None:
            return getattr(j, "home", None)
        key = j.group or getattr(j, "occurrence", None) or j.dedup or jid
        return shard_of(key, N)

    def fired(self, qi: int, got: int) -> None:
        known = set(self.m(qi).jobs)
        super().fired(qi, got)
        for jid in set(self.m(qi).jobs) - known:
            j = self.m(qi).jobs[jid]
            j.occurrence = j.payload.decode()  # type: ignore[attr-defined]  # the name

    def every(self, qi: int, suffix: str) -> list[str]:
        """A queue key of every shard of queue qi."""
        return [keyspace.queue_key(s, suffix) for s in self.subs[qi]]

    def dead_scores(self, qi: int) -> dict[str, float]:
        pipe = self.r.pipeline(transaction=False)
        for key in self.every(qi, "dead"):
            pipe.zrange(key, 0, -1, withscores=True)
        return {k.decode(): s for on in pipe.execute() for k, s in on}

    def waiting_ids(self, qi: int, g: str | None) -> list[str]:
        keys = [
            keyspace.lane_key(s, g) if g else keyspace.queue_key(s, "pending")
            for s in self.subs[qi]
        ]
        return [i.decode() for key in keys for i in self.r.zrange(key, 0, -1)]

    def last_event(self, qi: int) -> bytes:
        """Every shard's newest event id (one stream per shard), joined."""
        got = [self.r.xrevrange(key, count=1) for key in self.every(qi, "events")]
        return b" ".join(e[0][0] if e else b"0" for e in got)

    def events_since(self, qi: int, after: bytes) -> list[str]:
        out: list[str] = []
        for key, last in zip(self.every(qi, "events"), after.split(b" "), strict=True):
            got = self.r.xrange(key, min=b"(" + last if last != b"0" else "-")
            out += [f[b"event"].decode() for _, f in got]
        return out

    def snapshot(self, qi: int) -> dict[bytes, bytes | None]:
        """Every key of every shard of queue qi, dumped: a refused verb must write nothing."""
        keys = sorted(k for s in self.subs[qi] for k in self.r.scan_iter(match=f"emq:{{{s}}}:*"))
        pipe = self.r.pipeline(transaction=False)
        for k in keys:
            pipe.dump(k)
        return dict(zip(keys, pipe.execute(), strict=True))

    def refused(self, qi: int, fn: Callable[..., Any], *args: Any) -> None:
        before = self.snapshot(qi)
        with pytest.raises(ShardsError):
            fn(*args)
        assert self.snapshot(qi) == before, f"a refused {fn.__name__} wrote"

    # ------------------------------------------------------------------ routing findings

    def clash(self, qi: int, jid: str | None, group: str | None, did: str | None) -> bool:
        """An admission routed (lane, else dedup id, else id) away from the shard that holds
        or held its id, or holds its dedup key (FINDINGS S1; waiver ``shardroute``)."""
        t = shard_of(group or did or jid, N) if group or did or jid else None
        m = self.m(qi)
        was = [self.where(qi, jid)] if jid is not None and jid in m.seen else []
        if jid is not None and jid in m.wanted:  # a wait's marker may sit on the id's shard
            was.append(shard_of(jid, N))
        if did is not None and did in m.dedup:
            was.append(self.where(qi, m.dedup[did]))
        return t is not None and any(w != t for w in was)

    def admit_one(self, qi: int, jid: str | None, payload: bytes, group: str | None,
                  delay: int | None, did: str | None, *rest: Any, **kw: Any) -> None:  # fmt: skip
        if not strict("shardroute") and self.clash(qi, jid, group, did):
            note("waived: an admission routed away from its id's or dedup id's shard")
            return
        super().admit_one(qi, jid, payload, group, delay, did, *rest, **kw)

    @rule(**_args(VerbRules.enqueue_many))
    def enqueue_many(self, qi: int, items: list[str], n: int, group: str | None, **kw: Any) -> None:
        named = pick(sorted(self.m(qi).seen), n) if {"seen", "again"} & set(items) else None
        if not strict("shardroute") and self.clash(qi, named, group, None):
            note("waived: enqueue_many routed away from a named id's shard")
            return
        super().enqueue_many(qi=qi, items=items, n=n, group=group, **kw)

    def repeat_moves(self, qi: int, name: str, g: str | None) -> bool:
        """FINDINGS S2, fixed by a refusal: a repeat registered again with a lane whose
        shard is not the one it is registered on would move and lose its pause and fired
        count, so it is ShardsError with nothing written. (S6, fixed: each shard mints its
        repeats' slots from its own range, so repeats on several shards are drawn freely.)"""
        held = self.m(qi).repeats.get(name)
        return held is not None and shard_of(held[1] or name, N) != shard_of(g or name, N)

    def refused_rule(self, qi: int, step: Callable[[], Any]) -> None:
        """A rule whose verb the sharded queue refuses: ShardsError, nothing written, the
        model untouched (its update comes after the verb's reply)."""
        before = self.snapshot(qi)
        with pytest.raises(ShardsError):
            step()
        assert self.snapshot(qi) == before, "a refused repeat wrote"

    @rule(**_args(AdminRules.repeat))
    def repeat(self, qi: int, name: str, g: str | None) -> None:
        if self.repeat_moves(qi, name, g):
            self.refused_rule(qi, lambda: AdminRules.repeat(self, qi=qi, name=name, g=g))
        else:
            super().repeat(qi=qi, name=name, g=g)

    @rule(**_args(AdminRules.repeat_limited))
    def repeat_limited(self, qi: int, name: str, g: str | None, limit: int | None) -> None:
        if self.repeat_moves(qi, name, g):
            self.refused_rule(
                qi, lambda: AdminRules.repeat_limited(self, qi=qi, name=name, g=g, limit=limit)
            )
        else:
            super().repeat_limited(qi=qi, name=name, g=g, limit=limit)

    @rule(**_args(EnqueueClaimRules.add_flow))
    def add_flow(
        self, qi: int, shape: list[tuple[int, bool, int, str | None]], reuse: int | None = None
    ) -> None:
        """Decision 4: a flow is placed whole on its root's shard (the root's lane's, else
        its id's), its nodes on the other logical queue on that queue's shard 0 (the plain
        name a FlowJob gives, moved onto the root's shard when it names this logical queue:
        FINDINGS S3, fixed). Waiver ``shardflow`` (FINDINGS S4): no lane below a root
        without one."""
        if not strict("shardflow") and shape[0][3] is None:
            shape = [(k, fp, x, None) for k, fp, x, _ in shape]
        gone = [p for p in self.roots[qi] if p not in self.m(qi).jobs]
        # FINDINGS S1 through a flow: a gone parent's id re-used as a root routed (by the
        # root's lane) away from the shard that retired it (the deep run met it).
        if (
            reuse is not None
            and gone
            and not strict("shardroute")
            and self.clash(qi, pick(gone, reuse), shape[0][3], None)
        ):
            note("waived: a flow re-using a gone parent's id on another shard")
            return
        before = {id(j) for m in self.w.qs for j in m.jobs.values()}
        super().add_flow(qi=qi, shape=shape, reuse=reuse)
        root = self.roots[qi][-1]
        home = shard_of(self.m(qi).jobs[root].group or root, N)
        for qq in (0, 1):
            for j in self.m(qq).jobs.values():
                if id(j) not in before:
                    j.home = home if qq == qi else 0  # type: ignore[attr-defined]

    @rule(**_args(VerbRules.layout))
    def layout(self, qi: int, n: int, grow: bool) -> None:
        """``propose_shards`` of a layout that does not extend the stored one: answered the
        stored list, nothing changed. A growth (``reshard``) is not drawn here: the jobs
        queued before it stay on their shards, where a lane's limit and pause no longer
        reach them all (decision 9), which the model's exact lanes cannot follow."""
        if n > N:
            note("layout: a growth, not drawn on the sharded leg")
            return
        super().layout(qi=qi, n=n, grow=grow)

    # ------------------------------------------------------------------ claims

    def head(self, qi: int, g: str | None, jid: str) -> str:
        """The head of ``g``'s waiting set on the shard ``jid`` was claimed from."""
        on = self.where(qi, jid)
        leasable = self.m(qi).leasable(g)
        homes = self.homes(qi, leasable)
        return next((i for i in leasable if homes[i] == on), "none on its shard")

    def one_deadline(self, qi: int, ids: list[str]) -> None:
        """A sharded batch takes one lease per shard's batch (claim_batch fills from
        several shards in turn)."""
        homes = self.homes(qi, ids)
        for s in range(N):
            super().one_deadline(qi, [i for i in ids if homes[i] == s])

    # ------------------------------------------------------------------ verbs it refuses

    @rule(**_args(EnqueueClaimRules.limit_queue))
    def limit_queue(self, qi: int, n: int | None) -> None:
        """Decision 8: no queue-wide limit over shards; ``limit(None)`` clears every shard."""
        if n is None:
            self.q(qi).limit(None)
        else:
            note("limit refused")
            self.refused(qi, self.q(qi).limit, n)
        assert self.q(qi).get_limit() is None

    @rule(**_args(AdminRules.admin))
    def admin(self, qi: int, what: str, g: str, n: int | None) -> None:
        if what != "rate":
            super().admin(qi=qi, what=what, g=g, n=n)
            return
        note("rate_limit refused")
        self.refused(qi, self.q(qi).rate_limit, n or 3, LONG)
        assert self.q(qi).rate_limit_ttl() == 0

    def do_reassign(self, qi: int, jid: str, g: str) -> None:
        """A job never moves between shards: to a lane on another shard, ShardsError."""
        on = self.homes(qi, [jid])[jid]
        if on is not None and on != shard_of(g, N):
            note("reassign refused across shards")
            self.refused(qi, self.q(qi).reassign, jid, g)
            return
        super().do_reassign(qi, jid, g)

    @rule(**_args(SettleRules.promote))
    def promote(self, qi: int, limit: int = 100) -> None:
        """Every shard promotes its ``limit`` earliest due jobs."""
        self.tick("scheduled")
        now = self.now()
        m = self.m(qi)
        due = sorted((j.score, i) for i, j in m.jobs.items() if j.state == "scheduled")
        due = [(s, i) for s, i in due if s <= now]
        homes = self.homes(qi, [i for _, i in due])
        want = [i for s in range(N) for _, i in [d for d in due if homes[d[1]] == s][:limit]]
        assert self.q(qi).promote(limit) == len(want)
        for jid in want:
            m.jobs[jid].state = "pending"

    # ------------------------------------------------------------------ agreement

    def agrees(self, qi: int) -> None:
        m, q, name, subs = self.m(qi), self.handles[qi][0], self.names[qi], self.subs[qi]
        self.expired_met(qi)
        assert q.shards() == subs == m.layout, f"{name}: the stored layout moved"
        for sub in [q, *self.plain[qi]]:
            violations = sub.check()
            if not strict("negdeps"):  # FINDINGS F13
                violations = [v for v in violations if "is negative" not in v]
            assert violations == [], f"{sub.name}: check()"
        retired: dict[str, int] = {}
        for key in self.every(qi, "retired"):
            for k, v in self.r.hgetall(key).items():
                assert k.decode() not in retired, f"{name}: {k!r} retired on two shards"
                retired[k.decode()] = int(v)
        assert retired == m.retired, f"{name}: retired {retired} != model {m.retired}"
        assert q.counts() == m.counts()
        assert sorted(q.lanes()) == m.lanes()
        assert q.is_paused() == m.paused
        assert [p.is_paused() for p in self.plain[qi]] == [m.paused] * N
        seen = sorted(m.seen)
        homes = self.homes(qi, seen)
        for jid in seen:
            j = m.jobs.get(jid)
            on = homes[jid]
            assert (on is None) == (j is None), f"{name} {jid}: on shard {on}, model {j}"
            want = None if j is None else self.routed(jid, j)
            assert want is None or on == want, f"{name} {jid} ({j}) on shard {on}, not {want}"
        self.rows_agree(qi, homes)
        self.sides_agree(qi, homes)

    def rows_agree(self, qi: int, homes: dict[str, int | None]) -> None:
        """Each live row on its shard: fields, set and score, logs, errors, flow keys."""
        m, name, subs = self.m(qi), self.names[qi], self.subs[qi]
        jobs = sorted(m.jobs.items())
        pipe = self.r.pipeline(transaction=False)
        for jid, j in jobs:
            sub = subs[homes[jid] or 0]
            jk = keyspace.job_key(sub, jid)
            pipe.hmget(jk, FIELDS)
            pipe.zscore(place_key(sub, j), jid)
            pipe.lrange(jk + ":logs", 0, -1)
            pipe.lrange(jk + ":errors", 0, -1)
            if jid in m.flows:
                pipe.get(jk + ":deps")
                pipe.hgetall(jk + ":processed")
                pipe.hgetall(jk + ":failed")
                pipe.hgetall(jk + ":unsuccessful")
            elif strict("orphans") and strict("negdeps"):
                pipe.exists(*(jk + s for s in _FLOW_SIDES))
        replies = iter(pipe.execute())
        for jid, j in jobs:
            row, score, logs, errors = (next(replies) for _ in range(4))
            self.row_agrees(qi, jid, j, row, score, logs, errors)
            fl = m.flows.get(jid)
            if fl is not None:
                flow_agrees(name, jid, fl, *(next(replies) for _ in range(4)))
            elif strict("orphans") and strict("negdeps"):
                assert next(replies) == 0, f"{name}: {jid} is in no flow but has flow keys"

    def sides_agree(self, qi: int, homes: dict[str, int | None]) -> None:
        """What outlives a row, looked for on every shard: a gone id's keys (none), kept
        results and notify tokens, dedup keys (each on one shard at most), the outboxes,
        and ``job_state`` on the row's shard."""
        m, name, subs = self.m(qi), self.names[qi], self.subs[qi]
        seen = sorted(m.seen)
        gone = [jid for jid in seen if jid not in m.jobs]
        dids = sorted(d for qq, d in self.dids_used if qq == qi)
        sides: tuple[str, ...] = (":logs", ":errors")
        if strict("orphans"):
            sides += _FLOW_SIDES
        pipe = self.r.pipeline(transaction=False)
        for sub in subs:
            for jid in gone:
                jk = keyspace.job_key(sub, jid)
                pipe.exists(jk, *(jk + s for s in sides))
            for jid in seen:
                pipe.hgetall(keyspace.queue_key(sub, "result:" + jid))
                pipe.exists(keyspace.queue_key(sub, "notify:" + jid))
            for did in dids:
                pipe.get(keyspace.queue_key(sub, "de:" + did))
            pipe.llen(keyspace.queue_key(sub, "flow:outbox"))
        replies = iter(pipe.execute())
        results: dict[str, list[tuple[bytes, int, str | None]]] = {jid: [] for jid in seen}
        notified: dict[str, int] = dict.fromkeys(seen, 0)
        holders: dict[str, list[str]] = {did: [] for did in dids}
        outbox = 0
        for sub in subs:
            for jid in gone:
                assert next(replies) == 0, f"{sub}: {jid} has no row but left keys behind"
            for jid in seen:
                res, notify = next(replies), next(replies)
                notified[jid] += notify
                if res:
                    err = res[b"error"].decode() if b"error" in res else None
                    results[jid].append(
                        (res.get(b"result", b""), int(res.get(b"attempts", 0)), err)
                    )
            for did in dids:
                holder = next(replies)
                if holder is not None:
                    holders[did].append(holder.decode())
            outbox += next(replies)
        for jid in seen:
            kept = m.results.get(jid)
            want_r = [] if kept is None else [(kept.value, kept.attempts, kept.error)]
            if strict("results"):
                assert results[jid] == want_r, f"{name} result:{jid} {results[jid]} != {want_r}"
                assert not notified[jid] or kept is not None, f"notify:{jid} outlives its result"
        for did in dids:
            want_h = [m.dedup[did]] if did in m.dedup else []
            assert holders[did] == want_h, f"{name} de:{did[:8]} {holders[did]} != {want_h}"
        assert outbox == len(m.outbox), f"{name} outbox {outbox} != {m.outbox}"
        per: dict[int, list[str]] = {}
        for jid, on in self.placed(qi, seen).items():
            per.setdefault(on, []).append(jid)
        for s, ids in sorted(per.items()):
            p = self.plain[qi][s]
            states = p._x.pipeline([_protocol.job_state(p._k, jid) for jid in ids])
            want = [m.jobs[j].state if j in m.jobs else "absent" for j in ids]
            assert states == want, f"{subs[s]}: job_state {states} != {want}"

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            for qs in self.plain:
                for p in qs:
                    p.close()
