"""``EchoMQBackend``: Django's task backend interface on echomq queues.

``settings.TASKS = {"default": {"BACKEND": "echomq.contrib.django.backend.EchoMQBackend",
"QUEUES": ["default"], "OPTIONS": {"URL": "redis://..."}}}``; the guide is
docs/guides/django.md. A Django task's ``enqueue`` is an echomq job on the queue named by
its ``queue_name`` (one of ``QUEUES``), and ``get_result(id)`` reads the job's state, or its
kept outcome once it finished.

Priorities: Django's run from -100 to 100, higher first; echomq's from 0 up, lower first.
A task of Django priority ``p`` gets echomq priority ``100 - p`` (Django's default 0 is
echomq's 100; Django's 100 is echomq's 0, the most urgent).
"""

from __future__ import annotations

from typing import Any

from echomq import keyspace
from echomq.contrib.django import _api, _jobs
from echomq.errors import EchoMQError, InvalidId

# Django's priority p -> echomq's PRIORITY_OFFSET - p: higher-first becomes lower-first.
PRIORITY_OFFSET = 100

# echomq's job states and the Django status each stands for (finished ones come from the kept
# outcome, read first).
_STATUS = {
    "pending": _api.TaskResultStatus.READY,
    "scheduled": _api.TaskResultStatus.READY,
    "awaiting_children": _api.TaskResultStatus.READY,
    "active": _api.TaskResultStatus.RUNNING,
}


def echomq_priority(priority: int) -> int:
    """The echomq priority of a Django priority (-100..100, higher first)."""
    return PRIORITY_OFFSET - priority


class EchoMQBackend(_api.BaseTaskBackend):
    """Django tasks as echomq jobs: deferred (``run_after``), prioritized, async tasks
    allowed, results readable from any process."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        for queue in self.queues:  # a queue echomq cannot name fails here, at startup
            try:
                keyspace.check_queue(queue)
            except EchoMQError as exc:
                raise _api.InvalidTaskError(f"QUEUES: {exc}") from exc
        self.app = _jobs.build_app(sorted(self.queues), dict(self.options))

    def validate_task(self, task: Any) -> None:
        super().validate_task(task)
        try:
            keyspace.check_queue(task.queue_name)
        except EchoMQError as exc:
            raise _api.InvalidTaskError(f"queue_name: {exc}") from exc

    # -- enqueue ---------------------------------------------------------------------------

    def _prepare(self, task: Any, args: Any, kwargs: Any) -> tuple[Any, Any, list[Any]]:
        """Everything checked before anything is written: the task, its arguments as JSON
        (``TaskResult`` normalizes them, raising ``TypeError`` for a value JSON cannot hold),
        and the job's options."""
        self.validate_task(task)
        draft = _api.TaskResult(
            task=task,
            id="",
            status=_api.TaskResultStatus.READY,
            enqueued_at=None,
            started_at=None,
            last_attempted_at=None,
            finished_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        at_ms = None
        if task.run_after is not None:
            at_ms = int(task.run_after.timestamp() * 1000)
        runner = self.app.tasks[_jobs.task_name(task.queue_name)]
        bound = runner.options(at_ms=at_ms, priority=echomq_priority(task.priority))
        meta = {"enqueued_ms": _jobs.now_ms(), "priority": task.priority}
        return draft, bound, [task.module_path, draft.args, draft.kwargs, meta]

    def _enqueued(self, draft: Any, job_id: str, meta: dict[str, Any]) -> Any:
        _api.set_field(draft, "id", job_id)
        _api.set_field(draft, "enqueued_at", _jobs.to_datetime(meta["enqueued_ms"]))
        _api.task_enqueued.send(type(self), task_result=draft)
        return draft

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        draft, bound, call = self._prepare(task, args, kwargs)
        e = bound.enqueue(*call)
        return self._enqueued(draft, e.id, call[3])

    async def aenqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        draft, bound, call = self._prepare(task, args, kwargs)
        e = await bound.aenqueue(*call)
        return self._enqueued(draft, e.id, call[3])

    # -- results ---------------------------------------------------------------------------

    def get_result(self, result_id: str) -> Any:
        """The task's result by id: READY (waiting or scheduled), RUNNING, SUCCESSFUL with
        its return value, or FAILED with its errors; ``TaskResultDoesNotExist`` for an id no
        queue of the backend knows (or whose kept outcome outlived ``RESULT_TTL_MS``)."""
        for queue in sorted(self.queues):
            found = self._read(queue, result_id)
            if found is not None:
                return found
        raise _api.TaskResultDoesNotExist(result_id)

    def _read(self, queue: str, job_id: str) -> Any:
        q = self.app.queue(queue)
        for _ in range(2):  # a job that finishes between the two reads is read again
            try:
                kept = q.result(job_id)
            except InvalidId as exc:
                raise _api.TaskResultDoesNotExist(job_id) from exc
            if kept is not None and kept.error is None:
                return self._finished(job_id, kept, self.app.serializer.loads(kept.value))
            row = q.get_job(job_id)
            if row is None:
                if kept is not None:  # a kept death whose row is gone
                    return self._failed_without_row(job_id, kept)
                continue
            state = q.job_state(job_id)
            name, call = self._call(row)
            if name != _jobs.task_name(queue):
                return None  # a job of this queue, but not a Django task's
            status = _api.TaskResultStatus.FAILED if state == "dead" else _STATUS.get(state)
            if status is None:
                continue
            path, args, kwargs, meta = call
            errors = []
            if status == _api.TaskResultStatus.FAILED:
                text = kept.error if kept is not None and kept.error else row.get("last_error")
                errors.append(_jobs.task_error(str(text or "")))
            return self._result(job_id, path, args, kwargs, meta, status, errors=errors)
        return None

    def _call(self, row: dict[str, Any]) -> tuple[str, list[Any]]:
        from echomq.protocol import envelope as _envelope

        name, args, _kwargs = _envelope.parse(self.app.serializer, row["payload"])
        return name, list(args)

    def _finished(self, job_id: str, kept: Any, out: dict[str, Any]) -> Any:
        result = self._result(
            job_id, out["task"], out["args"], out["kwargs"], out.get("meta", {}),
            _api.TaskResultStatus.SUCCESSFUL,
            started_ms=out.get("started_ms"), finished_ms=kept.finished_ms,
            workers=[out.get("worker", "")],
        )  # fmt: skip
        _api.set_field(result, "_return_value", out.get("value"))
        return result

    def _failed_without_row(self, job_id: str, kept: Any) -> Any:
        raise _api.TaskResultDoesNotExist(
            f"{job_id}: failed ({str(kept.error).splitlines()[0]}) and its job row is gone"
        )

    def _result(
        self,
        job_id: str,
        path: str,
        args: list[Any],
        kwargs: dict[str, Any],
        meta: dict[str, Any],
        status: Any,
        *,
        errors: list[Any] | None = None,
        started_ms: int | None = None,
        finished_ms: int | None = None,
        workers: list[str] | None = None,
    ) -> Any:
        from django.utils.module_loading import import_string

        try:
            task = import_string(path)
        except ImportError as exc:
            raise _api.TaskResultDoesNotExist(f"{job_id}: task {path} cannot be imported") from exc
        return _api.TaskResult(
            task=task,
            id=job_id,
            status=status,
            enqueued_at=_jobs.to_datetime(meta.get("enqueued_ms")),
            started_at=_jobs.to_datetime(started_ms),
            last_attempted_at=_jobs.to_datetime(started_ms),
            finished_at=_jobs.to_datetime(finished_ms),
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=errors or [],
            worker_ids=workers or [],
        )


__all__ = ["PRIORITY_OFFSET", "EchoMQBackend", "echomq_priority"]
