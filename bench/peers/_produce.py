"""Runs the producer side of a peer that lives in its own venv (``python -m peers._produce NAME
MODE URL ARG...``) and prints the result as JSON on the last line."""

from __future__ import annotations

import importlib
import json
import sys


def main() -> None:
    name, mode, url, *args = sys.argv[1:]
    module = importlib.import_module(f"peers.{name}")
    if mode == "version":
        out: object = module.local_version()
    elif mode == "latency_send":
        import redis

        r = redis.Redis.from_url(url)
        out = module.local_latency_send(url, r, float(args[0]), float(args[1]))
    else:
        out = getattr(module, f"local_{mode}")(url, int(args[0]))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
