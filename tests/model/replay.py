"""Replay a failing sequence that hypothesis printed for tests/model/test_model.py, step by step,
checking the server against the model after each step (a triage aid for FINDINGS.md).

    .venv/bin/python tests/model/replay.py SEQUENCE_FILE [--executor lua|native|both]

SEQUENCE_FILE holds the ``state.<rule>(...)`` lines (``state = ModelMachine()`` and the
``server_agrees_with_model``/``teardown`` lines may stay). It starts its own server (with the
native module for ``native``/``both``) in a temp dir and stops it at the end.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for test_model

import redis

from echomq.client import native as _native
from echomq.server import EmbeddedServer
from model import test_model


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("sequence")
    ap.add_argument("--executor", default="lua", choices=("lua", "native", "both"))
    args = ap.parse_args()
    steps = [
        line.strip()
        for line in Path(args.sequence).read_text().splitlines()
        if line.strip().startswith("state.")
        and "server_agrees_with_model" not in line
        and "teardown" not in line
    ]
    executors = ("lua", "native") if args.executor == "both" else (args.executor,)
    with tempfile.TemporaryDirectory() as tmp:
        extra = []
        if args.executor != "lua":
            extra = ["--loadmodule", str(_native.build(Path(tmp) / "so"))]
        with EmbeddedServer(Path(tmp) / "srv", appendonly=False, args=extra) as srv:
            client = redis.Redis.from_url(srv.url)
            state = test_model.ModelMachine(client, executors)
            for n, step in enumerate(steps, 1):
                print(f"{n:3} {step[:150]}")
                try:
                    eval(step, {"state": state})
                    state.server_agrees_with_model()
                except Exception:
                    traceback.print_exc()
                    return 1
            state.teardown()
    print("the sequence passes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
