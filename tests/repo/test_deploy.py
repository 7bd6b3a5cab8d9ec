"""deploy/ (issue 40): the Dockerfile, compose file and Kubernetes manifests are the ones the
deployment guide shows (verbatim), they load as YAML, and what the probes and the scaler need
agrees across them — the command lines parse as ``echomq`` commands, the probe paths and
ports are the worker's, the grace periods outlast ``--grace``, the ScaledObject scales the
worker Deployment on a gauge and an endpoint that exist. No Docker, no kubectl: the image's
command line itself runs in tests/repo/test_user_install.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from docblocks import parse

from echomq import prometheus
from echomq.cli import main
from echomq.ops import backlog as _backlog

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
GUIDE = ROOT / "docs" / "guides" / "deployment.md"
FILES = [
    "Dockerfile",
    "compose.yaml",
    "k8s/worker.yaml",
    "k8s/metrics.yaml",
    "k8s/scaledobject.yaml",
]


def load(name: str) -> list[Any]:
    return list(yaml.safe_load_all((DEPLOY / name).read_text()))


def params(argv: list[str]) -> dict[str, Any]:
    """The parameters of an ``echomq ...`` command line, as click parses it (nothing runs):
    a misspelt option or a bad value fails here."""
    assert argv[0] == "echomq", argv
    command = main.commands[argv[1]]
    ctx = command.make_context(f"echomq {argv[1]}", list(argv[2:]), parent=click.Context(main))
    return dict(ctx.params)


def stages() -> dict[str, list[str]]:
    """The Dockerfile's stages: name -> its CMD (exec form)."""
    out: dict[str, list[str]] = {}
    name = ""
    for line in (DEPLOY / "Dockerfile").read_text().splitlines():
        if m := re.match(r"^FROM \S+ AS (\w+)$", line):
            name = m.group(1)
            out[name] = []
        elif m := re.match(r"^CMD (\[.*\])$", line):
            out[name] = json.loads(m.group(1))
    return out


def worker_cmd() -> list[str]:
    return stages()["worker"]


@pytest.mark.parametrize("name", FILES)
def test_the_guide_shows_each_file_verbatim(name: str) -> None:
    blocks = [b.code for b in parse(GUIDE, ROOT)]
    assert (DEPLOY / name).read_text() in blocks, f"deploy/{name} differs from the guide's block"


def test_the_image_runs_a_plain_install_and_the_worker_by_default() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    assert text.splitlines()[0].startswith("#")
    assert "FROM python:3.11-slim AS base" in text
    assert re.search(r"^RUN pip install --no-cache-dir \. ", text, re.M)  # no extras
    assert list(stages()) == ["base", "dashboard", "worker"]  # the last: the default target
    p = params(worker_cmd())
    assert p["health_port"] == 8080 and p["grace_s"] == 30
    assert "EXPOSE 8080" in text and "STOPSIGNAL SIGTERM" in text
    assert params(stages()["dashboard"])["port"] == 8808


def seconds(text: str) -> float:
    m = re.fullmatch(r"(\d+)s", text)
    assert m, text
    return float(m.group(1))


def test_compose_runs_the_images_targets_and_probes_the_worker() -> None:
    (doc,) = load("compose.yaml")
    services = doc["services"]
    assert set(services) == {"valkey", "worker", "dashboard"}
    names = set(stages())
    for svc in ("worker", "dashboard"):
        build = services[svc]["build"]
        assert build["dockerfile"] == "deploy/Dockerfile" and build["target"] in names
        assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == (
            DEPLOY / "Dockerfile"
        ).resolve()
        assert services[svc]["environment"]["ECHOMQ_URL"] == "redis://valkey:6379/0"
    worker = services["worker"]
    assert seconds(worker["stop_grace_period"]) > params(worker_cmd())["grace_s"]
    check = " ".join(worker["healthcheck"]["test"])
    port = params(worker_cmd())["health_port"]
    assert f"http://127.0.0.1:{port}/livez" in check
    assert "--maxmemory-policy noeviction" in " ".join(services["valkey"]["command"])


def named_port(container: dict[str, Any], ref: str | int) -> int:
    if isinstance(ref, int):
        return ref
    (found,) = [p["containerPort"] for p in container["ports"] if p["name"] == ref]
    return int(found)


def test_the_worker_deployment_probes_livez_and_readyz_on_the_health_port() -> None:
    (deploy,) = load("k8s/worker.yaml")
    assert (deploy["apiVersion"], deploy["kind"]) == ("apps/v1", "Deployment")
    spec = deploy["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    p = params(container["args"])
    assert p["health_port"] is not None and p["processes"] == "2"
    live, ready = container["livenessProbe"]["httpGet"], container["readinessProbe"]["httpGet"]
    assert live["path"] == "/livez" and ready["path"] == "/readyz"
    assert named_port(container, live["port"]) == p["health_port"]
    assert named_port(container, ready["port"]) == p["health_port"]
    assert spec["terminationGracePeriodSeconds"] > p["grace_s"]
    assert p["health_host"] == "0.0.0.0"  # the kubelet probes the pod's address
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert deploy["spec"]["selector"]["matchLabels"] == labels


def test_the_scaledobject_scales_the_worker_on_the_backlog() -> None:
    (worker,) = load("k8s/worker.yaml")
    dashboard, service = load("k8s/metrics.yaml")
    (scaled,) = load("k8s/scaledobject.yaml")
    assert (scaled["apiVersion"], scaled["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    spec = scaled["spec"]
    assert spec["scaleTargetRef"]["name"] == worker["metadata"]["name"]
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    triggers = {t["type"]: t for t in spec["triggers"]}
    assert set(triggers) == {"prometheus", "metrics-api"}
    query = triggers["prometheus"]["metadata"]["query"]
    exported = {m.name for m in prometheus.backlog_families([])}
    (metric,) = re.findall(r"\b(echomq_\w+)\{", query)
    assert metric in exported and 'queue="emails"' in query, query
    float(triggers["prometheus"]["metadata"]["threshold"])
    # The metrics-api scaler asks the dashboard Service for the backlog JSON's "backlog".
    api = triggers["metrics-api"]["metadata"]
    m = re.fullmatch(r"http://([\w-]+):(\d+)/api/queues/([\w-]+)/backlog", api["url"])
    assert m, api["url"]
    assert m.group(1) == service["metadata"]["name"] and service["kind"] == "Service"
    assert int(m.group(2)) in [p["port"] for p in service["spec"]["ports"]]
    assert api["valueLocation"] in _backlog.Backlog.__dataclass_fields__
    (container,) = dashboard["spec"]["template"]["spec"]["containers"]
    assert params(container["args"])["port"] == named_port(
        container, service["spec"]["ports"][0]["targetPort"]
    )
    assert service["spec"]["selector"] == dashboard["spec"]["template"]["metadata"]["labels"]
