"""The chart's `helm test` command passes against the chart's own CPU example, run as a real pod would.

The example MineDraftDeployment (ci/cpu-values.yaml) is rendered by helm, reconciled by the
operator's pure render function, and its pod runs as local processes through the operator
tests' pod runner; then the helm test pod's command and args, as the chart rendered them, run
against it with only the Service host names pointed at this machine. Ports are free ones
(set through the chart's values, so the chart wires them end to end); the bundled models folder
is laid out as the images lay out /opt/minedraft/models: links to the installed package's pair.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from minedraft.bundled import TINY_DRAFT, TINY_TARGET
from minedraft_operator.render import render
from minedraft_operator.render.admin_key import admin_key_ref
from minedraft_operator.spec import DeploymentSpec
from tests.chart.k8s_tools import CHART, Manifest, by_kind, helm_template, one
from tests.operator.pod_runner import HOST, PATH, LocalPod, free_ports

ADMIN_KEY = "chart-test-admin-key-5d2e"
PORT_KEYS = ("ports.verifier", "ports.draft", "ports.tensorParallel", "ports.dataPlane", "ports.admin",
             "service.grpcPort", "service.httpPort")


@pytest.fixture(scope="module")
def chart_pod(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Manifest], LocalPod]]:
    root = tmp_path_factory.mktemp("chart-pod")
    models = root / "opt-minedraft" / "models"  # what docker/*.Dockerfile build: links into the package
    models.mkdir(parents=True)
    for folder in (TINY_TARGET, TINY_DRAFT):
        (models / folder.name).symlink_to(folder)
    sets = [f"deployment.spec.{key}={port}" for key, port in zip(PORT_KEYS, free_ports(len(PORT_KEYS)), strict=True)]
    sets.append(f"deployment.spec.images.bundledModelsDir={models}")
    manifests = helm_template(helm, CHART, [CHART / "ci" / "cpu-values.yaml"], sets)
    mdd = one(manifests, "MineDraftDeployment")
    mdd["metadata"]["uid"] = "5e1c2a8e-chart-test"
    deployment = one(render(mdd), "Deployment")
    # HOME is a volume of its own; /tmp stays this machine's (mapping it would also move the models folder).
    mounts = {"home": root / "home"}
    mounts["home"].mkdir()
    # The example names no admin Secret: the pod reads the one the operator generates (made here as it would be).
    ref = admin_key_ref(DeploymentSpec.from_resource(mdd))
    assert ref.generated
    pod = LocalPod(deployment["spec"]["template"], mounts, root / "logs", secrets={ref.name: {ref.key: ADMIN_KEY}})
    pod.start()
    try:
        pod.wait_ready(timeout_s=180)
        yield manifests, pod
    finally:
        pod.stop()


def helm_test_command(manifests: list[Manifest], workdir: Path) -> list[str]:
    """The test pod's command line, with its ConfigMap-mounted script and Service hosts made local."""
    pod = one(manifests, "Pod")
    (container,) = pod["spec"]["containers"]
    (mount,) = container["volumeMounts"]
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
    (config_map,) = [c for c in by_kind(manifests, "ConfigMap")
                     if c["metadata"]["name"] == volume["configMap"]["name"]]
    for name, content in config_map["data"].items():
        (workdir / name).write_text(content)
    hosts = {one(manifests, "MineDraftDeployment")["metadata"]["name"]}
    hosts |= {f"{s['metadata']['name']}.{s['metadata']['namespace']}.svc" for s in by_kind(manifests, "Service")}
    args = []
    for arg in container["args"]:
        for host in hosts:
            arg = arg.replace(f"={host}:", f"={HOST}:").replace(f"//{host}:", f"//{HOST}:")
        args.append(arg)
    python, script = container["command"]
    assert python == "python"  # the batch-manager image's venv python; the test's venv stands in for it
    return [sys.executable, script.replace(mount["mountPath"], str(workdir)), *args]


def run_helm_test(manifests: list[Manifest], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(helm_test_command(manifests, tmp_path), capture_output=True, text=True, timeout=240,
                          env={"PATH": PATH, "LANG": "C.UTF-8"}, cwd=tmp_path)


def put_policy(pod: LocalPod, body: dict[str, Any]) -> dict[str, Any]:
    url = f"http://{HOST}:{pod.port('batch-manager', 'admin')}/admin/policy"
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {ADMIN_KEY}"}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="PUT", headers=headers)
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read())


def test_helm_test_command_passes_against_the_chart_example(chart_pod, tmp_path: Path) -> None:
    manifests, _ = chart_pod
    result = run_helm_test(manifests, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = result.stdout.strip()
    assert summary.startswith("ok: model 'tiny-target', greedy text ")
    drafted = int(summary.split("drafted +")[1].split(",")[0])
    assert drafted > 0


def test_helm_test_fails_when_speculation_is_off(chart_pod, tmp_path: Path) -> None:
    """The same command fails once the replica decodes without drafting (policy mode ar)."""
    manifests, pod = chart_pod
    assert put_policy(pod, {"mode": "ar"})["mode"] == "ar"
    try:
        result = run_helm_test(manifests, tmp_path)
    finally:
        assert put_policy(pod, {"mode": "psd"})["mode"] == "psd"
    assert result.returncode == 1
    assert "speculation counters did not move" in result.stderr and "configured 'ar'" in result.stderr
