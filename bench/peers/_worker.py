"""Runs the worker side of a Python peer in this process: ``python -m peers._worker NAME C``."""

from __future__ import annotations

import importlib
import logging
import sys


def main() -> None:
    name, concurrency = sys.argv[1], int(sys.argv[2])
    logging.basicConfig(level=logging.WARNING)
    module = importlib.import_module(f"peers.{name}")
    module.run_worker(concurrency)


if __name__ == "__main__":
    main()
