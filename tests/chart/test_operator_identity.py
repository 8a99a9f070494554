"""The chart tells the operator who it is, and the NetworkPolicy the operator renders from that admits
exactly the chart's operator pod (its namespace and labels) to the serving pods' admin port."""

from __future__ import annotations

from pathlib import Path

from minedraft_operator.render import OperatorPods, render
from tests.chart.k8s_tools import CHART, helm_template, one
from tests.chart.test_example_resources import admitted


def test_network_policy_admits_the_charts_operator_pod(helm: Path, crds) -> None:
    manifests = helm_template(helm, CHART, [CHART / "ci" / "cpu-values.yaml"], namespace="inference",
                              sets=["operator.podLabels.team=ml"])
    operator = one(manifests, "Deployment")  # the chart's only Deployment
    pod = operator["spec"]["template"]
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["MINEDRAFT_OPERATOR_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    # The kubelet fills the namespace from the pod; the labels are literal.
    identity = OperatorPods.from_env({"MINEDRAFT_OPERATOR_NAMESPACE": operator["metadata"]["namespace"],
                                      "MINEDRAFT_OPERATOR_POD_LABELS": env["MINEDRAFT_OPERATOR_POD_LABELS"]["value"]})
    assert identity.namespace == "inference"
    assert dict(identity.labels) == operator["spec"]["selector"]["matchLabels"]
    mdd = admitted(crds, one(manifests, "MineDraftDeployment"))
    policy = one(render(mdd, identity), "NetworkPolicy")
    (peer,) = policy["spec"]["ingress"][0]["from"]
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "inference"}
    assert peer["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    # The test pod (component test) and the serving pods (component server) are not operator pods.
    assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
