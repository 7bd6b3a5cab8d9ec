"""The contract test's reader, run under a release: ``python -m apps.upgrade_inspect`` reads a
JSON object from stdin (``{"dead": [ids], "kept": [ids]}``) and prints one JSON object: each
queue's ``check()`` (Q and its kids' queue), each ``dead`` id's state, each ``kept`` id's
result value (null when none is kept)."""

from __future__ import annotations

import json
import sys

from apps.upgrade_app import KIDS, QUEUE, app


def main() -> None:
    ask = json.load(sys.stdin)
    q = app.queue(QUEUE)
    results = {}
    for id_ in ask["kept"]:
        got = q.result(id_)
        results[id_] = None if got is None else got.value.decode()
    out = {
        "check": {name: app.queue(name).check() for name in (QUEUE, KIDS)},
        "states": {id_: q.job_state(id_) for id_ in ask["dead"]},
        "results": results,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
