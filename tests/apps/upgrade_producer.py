"""A producer of the rolling-upgrade contract test: ``python -m apps.upgrade_producer``,
run under the release PYTHONPATH names, talking to ``ECHOMQ_URL`` (the test's proxy that
drops replies). It makes ``EMQ_TEST_CALLS`` calls of the kinds in ``EMQ_TEST_KINDS``
(comma-separated, taken in turn) and appends each acknowledged job to
``emqtest:<queue>:acked`` as ``id:kind:n:tag`` (on ``EMQ_TEST_BOOKS_URL``, the server itself);
a call that raised goes to ``emqtest:<queue>:errors``, and is not acknowledged.

Kinds: ok (flat set), lane (three lanes), delayed, dedup (keys shared by every producer),
kept (a kept result), fail (retries to dead), flow (a parent on the queue, two children on
<queue>-kids), many (``enqueue_many`` of five).
"""

from __future__ import annotations

import os
import sys

from apps.upgrade_app import app, books, child, fail, kept, ok, parent

QUEUE = os.environ["EMQ_TEST_QUEUE"]
ACKED = f"emqtest:{QUEUE}:acked"
ERRORS = f"emqtest:{QUEUE}:errors"
TAG = os.environ.get("EMQ_TEST_TAG", "p")
BASE = int(os.environ.get("EMQ_TEST_BASE", "0"))


def call(kind: str, n: int) -> list[tuple[str, str]]:
    """One call of ``kind``; the (id, kind) pairs it acknowledged."""
    if kind == "ok":
        return [(ok.enqueue(n).id, kind)]
    if kind == "lane":
        return [(ok.options(group=f"lane{n % 3}").enqueue(n).id, kind)]
    if kind == "delayed":
        return [(ok.options(delay_ms=300).enqueue(n).id, kind)]
    if kind == "dedup":
        return [(ok.options(dedup=f"d{n % 5}").enqueue(n).id, kind)]
    if kind == "kept":
        return [(kept.enqueue(n).id, kind)]
    if kind == "fail":
        return [(fail.enqueue(n).id, kind)]
    if kind == "flow":
        added = app.flow(parent.s(n), [child.s(n), child.s(n + 1)])
        return [(added.parent_id, "parent")] + [(c, "child") for c in added.child_ids]
    if kind == "many":
        got = ok.enqueue_many([((n * 10 + i,), {}) for i in range(5)])
        return [(e.id, kind) for e in got if hasattr(e, "id")]
    raise SystemExit(f"unknown kind {kind!r}")


def main() -> None:
    kinds = os.environ.get("EMQ_TEST_KINDS", "ok").split(",")
    for i in range(int(os.environ["EMQ_TEST_CALLS"])):
        n = BASE + i
        kind = kinds[i % len(kinds)]
        try:
            acked = call(kind, n)
        except Exception as exc:
            books().rpush(ERRORS, f"{TAG}:{kind}:{n}:{type(exc).__name__}: {exc}")
            continue
        if acked:
            books().rpush(ACKED, *(f"{id_}:{k}:{n}:{TAG}" for id_, k in acked))
    print(f"{TAG}: done", file=sys.stderr)


if __name__ == "__main__":
    main()
