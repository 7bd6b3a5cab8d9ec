"""Test apps run by ``echomq worker`` subprocesses (``apps.basic:app``, run with the tests dir
as the working directory)."""
