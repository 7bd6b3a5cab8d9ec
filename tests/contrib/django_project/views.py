"""A view that enqueues a task and one that reads a result, as a Django app would."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from django_project.tasks import add, explode

try:
    from django.tasks import default_task_backend
    from django.tasks.exceptions import TaskResultDoesNotExist
except ImportError:
    from django_tasks import default_task_backend
    from django_tasks.exceptions import TaskResultDoesNotExist


def enqueue_add(request: HttpRequest) -> JsonResponse:
    result = add.enqueue(int(request.GET["a"]), int(request.GET["b"]))
    return JsonResponse({"id": result.id, "status": result.status})


def enqueue_explode(request: HttpRequest) -> JsonResponse:
    result = explode.enqueue(request.GET.get("message", "boom"))
    return JsonResponse({"id": result.id, "status": result.status})


def result(request: HttpRequest, result_id: str) -> JsonResponse:
    try:
        found = default_task_backend.get_result(result_id)
    except TaskResultDoesNotExist:
        return JsonResponse({"error": "no such result"}, status=404)
    body: dict[str, object] = {"id": found.id, "status": found.status, "task": found.task.name}
    if found.status == "SUCCESSFUL":
        body["value"] = found.return_value
    if found.errors:
        body["error"] = found.errors[-1].exception_class_path
        body["traceback"] = found.errors[-1].traceback
    return JsonResponse(body)
