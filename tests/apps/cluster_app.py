"""A worker app for the cluster tests: one no-op task on every queue the test names."""

from __future__ import annotations

import os

import echomq

app = echomq.App()
for name in os.environ.get("CLUSTER_TEST_QUEUES", "cluster").split(","):
    app.task(name=f"cluster.noop.{name}", queue=name)(lambda: None)


@app.task(name="cluster.noop", queue="cluster-default")
def noop() -> None:
    """The task every cluster test job names."""
