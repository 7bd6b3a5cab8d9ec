"""A real Django project for tests/contrib/test_django.py: settings, tasks, a view that
enqueues and a view that reads the result, on echomq's task backend."""
