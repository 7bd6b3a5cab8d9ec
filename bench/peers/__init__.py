"""One adapter per system of the side-by-side benchmark (imported lazily by ``bench/run.py``).

Every adapter module exposes the same small surface (see ``_common.Peer``); the worker side of
a Python peer runs in its own process via ``python -m peers._worker NAME CONCURRENCY``.
"""
