"""AsyncShardedQueue, by hand: a logical queue over N ordinary queues (issue 43).

``AsyncQueue(name, shards=N)`` (N > 1) returns one. Its base class (``client/async_shardfan.py``)
holds the layout and the verbs that fan out, follow a lane or are refused; this one adds the
verbs that find a job's shard: producers (decision 4: the lane's shard, else the dedup id's,
else the job id's), claims (a rotating start) and settles, and every verb by id (decision 5).
The source ``scripts/gen-sync`` derives ``ShardedQueue`` (``client/sync_sharded.py``) from.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from echomq import keyspace
from echomq.client.async_queue import AsyncQueue
from echomq.client.async_shardfan import AsyncShardFanout
from echomq.client.queueopts import replay_ms
from echomq.client.renamed import renamed
from echomq.client.shardkit import SHARDED, Minted, check_items, onto, order, per_pair
from echomq.client.shards import shard_of
from echomq.errors import EchoMQError, ShardsError
from echomq.protocol import calls as _p
from echomq.protocol import compose as _c
from echomq.protocol import control as _ctl
from echomq.protocol.joboptions import JobOptions
from echomq.protocol.kernel import Completed, Enqueued, Job, Retried, Settled, _payload
from echomq.protocol.produce import mint

__all__ = ["AsyncShardedQueue"]

_HELD_MAX = 100_000  # claimed ids remembered for their settles (then located again)


class AsyncShardedQueue(AsyncShardFanout):
    """A sharded logical queue: ``AsyncQueue(name, shards=N)`` with N > 1 (the arguments of
    ``AsyncQueue``). ``shards`` means at least N: a stored list of more is used as it is,
    never shrunk; fewer is grown to N at first use (``reshard`` grows later). Every verb of
    ``AsyncQueue`` is routed to one shard, fanned out, or refused (``shardkit.VERBS``)."""

    def __repr__(self) -> str:
        return f"AsyncShardedQueue({self.name!r}, shards={self._want})"

    async def _locate(self, id: str) -> AsyncQueue:
        """The shard holding job ``id``: the one that handed it out here, else the id's own
        shard, then the others (the list read again before giving up); the id's own shard
        when none has it (the verb then answers as a plain queue does for no such job)."""
        keyspace.check_id(id)  # a bad id refused before the layout is read
        subs = await self._resolve()
        held = self._held.get(id)
        if held is not None and held < len(subs):
            return subs[held]
        for _ in range(2):
            for i in order(shard_of(id, len(subs)), len(subs)):
                if await subs[i].job_state(id) != "absent":
                    return subs[i]
            if len(await self.shards()) == len(subs):
                break
            subs = await self._resolve()
        return subs[shard_of(id, len(subs))]

    def _holds(self, job: Job, shard: int) -> Job:
        if len(self._held) >= _HELD_MAX:
            self._held.clear()
        self._held[job.id] = shard
        return job

    async def aclose(self) -> None:
        """Close the shards (their result waiters, on asyncio), then the client if this queue
        made it."""
        for q in self._subs or ():  # async-only
            if q._waiters is not None:  # async-only
                await q._waiters.close()  # async-only
        await super().aclose()

    # -- producers (decision 4)

    async def _enqueue_job(self, payload: bytes | str, opts: JobOptions) -> Enqueued:
        """One job on its shard: the lane's, else the dedup id's, else the job id's (minted
        here first when none is given); ``enqueue`` comes here."""
        _payload(payload, self._k.max_payload)  # refused before the layout is read
        subs = await self._resolve()
        key, minter = opts.group or opts.dedup or opts.id, self._x.minter
        if key is None:
            key = await self._x.run(mint(minter))
            minter = Minted([key], minter).as_minter()
        q = subs[shard_of(key, len(subs))]
        plan = _p.enqueue(
            q._k, payload, opts, replay_ms=replay_ms(self._x.retry_for), minter=minter
        )
        return await q._pipe.run(plan)  # sync: return q._x.run(plan)

    async def _enqueue_many_job(
        self, items: Iterable[bytes | str | tuple[str, bytes | str]], opts: JobOptions
    ) -> list[Enqueued | EchoMQError]:
        """The jobs split by shard (the lane's for all with a lane, else each one's id's), one
        call per shard, the verdicts in input order; ``enqueue_many`` comes here."""
        todo = check_items(items, self._k.max_payload)
        subs = await self._resolve()
        per: dict[int, tuple[list[int], list[str]]] = {}
        for i, item in enumerate(todo):
            minted = None
            if opts.group is not None:
                key = opts.group  # the lane's shard; its plan mints the ids itself
            elif isinstance(item, tuple):
                key = item[0]
            else:
                minted = key = await self._x.run(mint(self._x.minter))
            idx, fresh = per.setdefault(shard_of(key, len(subs)), ([], []))
            idx.append(i)
            if minted is not None:
                fresh.append(minted)  # minted in item order, as the plan takes them
        out: list[Enqueued | EchoMQError | None] = [None] * len(todo)
        for s, (idx, fresh) in per.items():
            minter = Minted(fresh, self._x.minter).as_minter()
            part = [todo[i] for i in idx]
            plan = _p.enqueue_many(
                subs[s]._k, part, opts, replay_ms=replay_ms(self._x.retry_for), minter=minter
            )
            for i, verdict in zip(idx, await self._x.run(plan), strict=True):
                out[i] = verdict
        return [v for v in out if v is not None]

    async def add_flow(self, parent: _c.FlowJob) -> _c.FlowAdded:
        """The whole flow on one shard: its root's lane's, else its root id's, else the next
        shard in rotation. Its nodes with ``queue=None`` or naming this logical queue are on
        that shard (a node naming another queue is placed there, a cross-queue edge)."""
        subs = await self._resolve()
        key = parent.group or parent.id if isinstance(parent, _c.FlowJob) else None
        if key is None:
            self._next, s = self._next + 1, self._next % len(subs)
        else:
            s = shard_of(key, len(subs))
        return await subs[s].add_flow(onto(parent, self.name, subs[s].name))

    # -- workers: claims rotate over the shards, settles go to the job's shard

    async def claim(self, *, lease_ms: int = 30_000) -> Job | None:
        """The first job found over the shards, starting one shard later each call."""
        _p.claim(self._k, lease_ms)  # lease_ms refused before any I/O
        subs = await self._resolve()
        start, self._next = self._next % len(subs), self._next + 1
        for s in order(start, len(subs)):
            job = await subs[s].claim(lease_ms=lease_ms)
            if job is not None:
                return self._holds(job, s)
        return None

    async def claim_batch(self, n: int, *, lease_ms: int = 30_000) -> list[Job]:
        """Up to ``n`` jobs from as many shards as it takes, starting one shard later each call
        (one lease per shard's batch)."""
        _p.claim_batch(self._k, n, lease_ms)
        subs = await self._resolve()
        start, self._next = self._next % len(subs), self._next + 1
        jobs: list[Job] = []
        for s in order(start, len(subs)):
            if len(jobs) >= n:
                break
            got = await subs[s].claim_batch(n - len(jobs), lease_ms=lease_ms)
            jobs += [self._holds(j, s) for j in got]
        return jobs

    async def _by_shard(self, ids: Iterable[str]) -> dict[AsyncQueue, list[int]]:
        """Item indices grouped by the shard holding each id."""
        per: dict[AsyncQueue, list[int]] = {}
        for i, jid in enumerate(ids):
            per.setdefault(await self._locate(jid), []).append(i)
        return per

    async def settle(
        self,
        *,
        completed: Iterable[Completed | tuple[Any, ...]] = (),
        retried: Iterable[Retried | tuple[Any, ...]] = (),
        n: int = 0,
        lease_ms: int = 30_000,
    ) -> Settled:
        """``settle`` on each shard holding some of the jobs, then claims as ``claim_batch``."""
        done, failed = list(completed), list(retried)
        _p.settle(self._k, done, failed, n, lease_ms)  # every item checked before any I/O
        oks: list[EchoMQError | None] = [None] * len(done)
        rets: list[str | EchoMQError] = [""] * len(failed)
        for q, idx in (await self._by_shard(c[0] for c in done)).items():
            got = await q.settle(completed=[done[i] for i in idx], lease_ms=lease_ms)
            for i, v in zip(idx, got.completed, strict=True):
                oks[i] = v
                self._held.pop(done[i][0], None)
        for q, idx in (await self._by_shard(r[0] for r in failed)).items():
            got = await q.settle(retried=[failed[i] for i in idx], lease_ms=lease_ms)
            for i, w in zip(idx, got.retried, strict=True):
                rets[i] = w
                self._held.pop(failed[i][0], None)
        jobs = await self.claim_batch(n, lease_ms=lease_ms) if n else []
        return Settled(oks, rets, jobs)

    async def complete(
        self,
        id: str,
        token: int,
        *,
        result: bytes | str | None = None,
        keep_result_ms: int = 0,
    ) -> None:
        """``complete`` on the job's shard."""
        q = await self._locate(id)
        self._held.pop(id, None)
        return await q.complete(id, token, result=result, keep_result_ms=keep_result_ms)

    async def complete_many(self, pairs: Iterable[tuple[str, int]]) -> list[str]:
        """``complete_many`` per shard; the ids refused, in input order."""
        todo = list(pairs)
        refused: list[int] = []
        for q, idx in (await self._by_shard(p[0] for p in todo)).items():
            refused += per_pair(todo, idx, await q.complete_many([todo[i] for i in idx]))
        for jid, _ in todo:
            self._held.pop(jid, None)
        return [todo[i][0] for i in sorted(refused)]

    async def retry(
        self,
        id: str,
        token: int,
        *,
        delay_ms: int,
        max_attempts: int,
        error: str,
        keep_result_ms: int = 0,
    ) -> str:
        """``retry`` on the job's shard."""
        q = await self._locate(id)
        self._held.pop(id, None)
        return await q.retry(id, token, delay_ms=delay_ms, max_attempts=max_attempts,
                             error=error, keep_result_ms=keep_result_ms)  # fmt: skip

    async def delay(self, id: str, token: int, delay_ms: int) -> None:
        """``delay`` on the job's shard."""
        return await (await self._locate(id)).delay(id, token, delay_ms)

    async def extend(self, id: str, token: int, *, lease_ms: int) -> None:
        """``extend`` on the job's shard."""
        return await (await self._locate(id)).extend(id, token, lease_ms=lease_ms)

    async def extend_many(self, pairs: Iterable[tuple[str, int]], *, lease_ms: int) -> list[str]:
        """``extend_many`` per shard; the ids that failed, in input order."""
        failed, _ = await self.extend_leases(pairs, lease_ms=lease_ms)
        return failed

    async def extend_leases(
        self, pairs: Iterable[tuple[str, int]], *, lease_ms: int
    ) -> tuple[list[str], list[str]]:
        """``extend_leases`` per shard: ``(failed ids, cancelled ids)``, in input order."""
        todo = list(pairs)
        failed: list[int] = []
        cancelled: list[int] = []
        for q, idx in (await self._by_shard(p[0] for p in todo)).items():
            f, c = await q.extend_leases([todo[i] for i in idx], lease_ms=lease_ms)
            failed += per_pair(todo, idx, f)
            cancelled += per_pair(todo, idx, c)
        return [todo[i][0] for i in sorted(failed)], [todo[i][0] for i in sorted(cancelled)]

    # -- by id (decision 5): the id's shard first, then the others

    async def cancel(
        self,
        id: str,
        *,
        remove: bool = False,
        if_state: str | None = None,
        if_attempts: int | None = None,
    ) -> str:
        """``cancel`` on the job's shard (``"absent"`` when no shard has it)."""
        q = await self._locate(id)
        return await q.cancel(id, remove=remove, if_state=if_state, if_attempts=if_attempts)

    async def remove(
        self,
        id: str,
        *,
        children: bool = True,
        if_state: str | None = None,
        if_attempts: int | None = None,
    ) -> None:
        """``remove`` on the job's shard."""
        q = await self._locate(id)
        return await q.remove(id, children=children, if_state=if_state, if_attempts=if_attempts)

    async def get_job(self, id: str) -> dict[str, str | bytes] | None:
        """The job's row on whichever shard holds it, or None."""
        return await (await self._locate(id)).get_job(id)

    async def job_state(self, id: str) -> str:
        """The job's state on whichever shard holds it, ``"absent"`` when none does."""
        return await (await self._locate(id)).job_state(id)

    async def change_priority(self, id: str, priority: int) -> None:
        """``change_priority`` on the job's shard."""
        return await (await self._locate(id)).change_priority(id, priority)

    async def run_now(self, id: str) -> None:
        """``run_now`` on the job's shard."""
        return await (await self._locate(id)).run_now(id)

    async def reschedule(
        self, id: str, delay_ms: int | None = None, *, at_ms: int | None = None
    ) -> None:
        """``reschedule`` on the job's shard."""
        return await (await self._locate(id)).reschedule(id, delay_ms, at_ms=at_ms)

    async def update_payload(self, id: str, payload: bytes | str) -> None:
        """``update_payload`` on the job's shard."""
        return await (await self._locate(id)).update_payload(id, payload)

    async def reprocess(
        self, id: str, *, delay_ms: int | None = None, at_ms: int | None = None
    ) -> None:
        """``reprocess`` on the job's shard."""
        return await (await self._locate(id)).reprocess(id, delay_ms=delay_ms, at_ms=at_ms)

    async def update_progress(self, id: str, value: str) -> None:
        """``update_progress`` on the job's shard."""
        return await (await self._locate(id)).update_progress(id, value)

    async def add_log(self, id: str, line: str, *, keep: int | None = None) -> int:
        """``add_log`` on the job's shard."""
        return await (await self._locate(id)).add_log(id, line, keep=keep)

    async def clear_logs(self, id: str, *, keep: int = 0) -> int:
        """``clear_logs`` on the job's shard."""
        return await (await self._locate(id)).clear_logs(id, keep=keep)

    async def logs(self, id: str) -> list[bytes]:
        """The job's log lines, from its shard."""
        return await (await self._locate(id)).logs(id)

    async def errors(self, id: str) -> list[str]:
        """The job's errors, from its shard."""
        return await (await self._locate(id)).errors(id)

    async def result(self, id: str) -> _ctl.Result | None:
        """The job's kept outcome on whichever shard keeps it, or None."""
        keyspace.check_id(id)
        subs = await self._resolve()
        for i in order(shard_of(id, len(subs)), len(subs)):
            found = await subs[i].result(id)
            if found is not None:
                return found
        return None

    async def _holder(self, id: str) -> AsyncQueue:
        """The shard holding the job or its kept outcome (the id's own when none does yet);
        ``App.result`` reads the outcome there."""
        keyspace.check_id(id)
        subs = await self._resolve()
        for i in order(shard_of(id, len(subs)), len(subs)):
            q = subs[i]
            if await q.job_state(id) != "absent" or await q.result(id) is not None:
                return q
        return subs[shard_of(id, len(subs))]

    async def wait(self, id: str, *, timeout_s: float) -> _ctl.Result:
        """``wait`` on the shard holding the job or its outcome (the id's when none does yet)."""
        return await (await self._holder(id)).wait(id, timeout_s=timeout_s)

    async def children_values(self, parent_id: str) -> dict[str, bytes]:
        """``children_values`` on the parent's shard."""
        return await (await self._locate(parent_id)).children_values(parent_id)

    async def dependencies(self, parent_id: str) -> int:
        """``dependencies`` on the parent's shard."""
        return await (await self._locate(parent_id)).dependencies(parent_id)

    async def ignored_failures(self, parent_id: str) -> dict[str, str]:
        """``ignored_failures`` on the parent's shard."""
        return await (await self._locate(parent_id)).ignored_failures(parent_id)

    # -- lanes (decision 6): reassign's job must be on the lane's shard

    @renamed(g="lane")
    async def reassign(self, id: str, lane: str) -> str:
        """Move a waiting job to ``lane``, when the job is on the lane's shard; a job elsewhere
        raises ShardsError (a job never moves between shards: enqueue it again in the lane)."""
        home = await self._shard(lane)
        q = await self._locate(id)
        if q is not home and await q.job_state(id) != "absent":
            raise ShardsError(
                f"job {id} is on shard {q.name!r}, lane {lane!r} on {home.name!r}: a job "
                "never moves between shards (remove it and enqueue it again with group=)"
            )
        return await home.reassign(id, lane)


SHARDED[AsyncQueue] = AsyncShardedQueue  # AsyncQueue(name, shards=N) makes one (its __new__)
