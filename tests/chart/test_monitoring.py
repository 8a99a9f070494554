"""The chart's Prometheus and Grafana parts: they scrape what the operator serves and chart what
the batch manager exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import kubernetes_validate
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from minedraft.observability.metrics import ServingMetrics
from tests.chart.k8s_tools import CHART, KUBE_VERSION, Manifest, by_kind, helm_template, one
from tests.chart.test_example_resources import operator_objects

ENABLED = ["monitoring.serviceMonitor.enabled=true", "monitoring.grafanaDashboard.enabled=true"]
METRIC = re.compile(r"\b((?:vllm|minedraft):[a-z0-9_]+)")


def exported_names() -> set[str]:
    """Every sample name the batch manager's registry exposes once each kind of event happened."""
    status = {"running": 1, "waiting": 0, "block_budget": 10, "reserved_blocks": 1, "k": 4, "mode": "psd",
              "configured_mode": "psd", "draft_connected": True, "batch_sizes": [1, 0], "draft_link_transport": "gloo"}
    metrics = ServingMetrics("m", lambda: status)
    metrics.request_admitted(0.1)
    metrics.first_token(0.1)
    metrics.tokens_streamed(2, 0.1)
    metrics.request_finished("stop", 3, 4, 1.0, 0.5)
    metrics.verdicts(4, [1, 2])
    metrics.step("psd", 0.01, 0.008, 0.007, 0.001)
    metrics.moved(1)
    metrics.fell_back()
    text = generate_latest(metrics.registry).decode()
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def test_dashboard_configmap_for_the_sidecar_charts_only_exported_metrics(helm: Path) -> None:
    manifests = helm_template(helm, CHART, sets=ENABLED)
    configmap = next(m for m in manifests if m["kind"] == "ConfigMap" and "minedraft.json" in m.get("data", {}))
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    kubernetes_validate.validate(configmap, KUBE_VERSION, strict=True)
    dashboard = json.loads(configmap["data"]["minedraft.json"])
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {name for expr in exprs for name in METRIC.findall(expr)}
    assert used, "the dashboard queries no minedraft or vLLM metric"
    assert used <= exported_names(), f"the dashboard queries metrics nobody exports: {used - exported_names()}"
    titles = {panel["title"] for panel in dashboard["panels"]}
    assert {"Generation throughput", "Time to first token", "Inter-token latency", "Acceptance by draft position",
            "PSD overlap efficiency", "Mode and fallback"} <= titles


def test_service_monitor_selects_the_service_the_operator_creates(helm: Path, rendered: dict[str, list[Manifest]],
                                                                  crds: dict[str, Manifest]) -> None:
    monitor = one(helm_template(helm, CHART, sets=ENABLED), "ServiceMonitor")
    service, headless = by_kind(operator_objects(rendered, crds, "cpu-values.yaml"), "Service")
    assert headless["spec"]["clusterIP"] == "None"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert not selector.items() <= headless["metadata"]["labels"].items()  # each pod scraped once
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}


def test_monitoring_is_off_by_default(rendered: dict[str, list[Manifest]]) -> None:
    kinds = {m["kind"] for m in rendered["default"]}
    assert "ServiceMonitor" not in kinds
    assert not any("minedraft.json" in m.get("data", {}) for m in rendered["default"] if m["kind"] == "ConfigMap")
