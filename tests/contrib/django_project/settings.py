"""The test project's settings: echomq's task backend on two queues. ``OPTIONS`` names no
URL: echomq finds the server as everywhere (``ECHOMQ_URL`` in the worker's environment);
the test process overrides ``TASKS`` with its server's URL."""

SECRET_KEY = "echomq-django-test-project"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "127.0.0.1", "localhost"]
USE_TZ = True
ROOT_URLCONF = "django_project.urls"
INSTALLED_APPS = ["django.contrib.contenttypes"]
DATABASES: dict[str, dict[str, str]] = {}
MIDDLEWARE: list[str] = []

TASKS = {
    "default": {
        "BACKEND": "echomq.contrib.django.backend.EchoMQBackend",
        "QUEUES": ["default", "reports"],
        "OPTIONS": {"RESULT_TTL_MS": 600_000},
    }
}
