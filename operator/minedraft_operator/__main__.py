"""`python -m minedraft_operator [--namespace NS]... | [--all-namespaces]`: run the operator."""

from __future__ import annotations

import argparse
import os
import sys

import kopf

from minedraft_operator.handlers import OperatorState, build_registry
from minedraft_operator.render.network import (
    DEFAULT_OPERATOR_LABELS,
    DEFAULT_OPERATOR_NAMESPACE,
    OPERATOR_LABELS_ENV,
    OPERATOR_NAMESPACE_ENV,
    OperatorPods,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="minedraft-operator", description=__doc__)
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("--namespace", "-n", action="append", default=[],
                       help="watch this namespace (repeatable; globs allowed)")
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch the whole cluster (default)")
    p.add_argument("--liveness", default="http://0.0.0.0:8080/healthz", help="liveness endpoint URL")
    p.add_argument("--sync-seconds", type=float, default=15.0,
                   help="period of the replica sync (policy retries, acceptance, transport)")
    p.add_argument("--operator-namespace", default=os.environ.get(OPERATOR_NAMESPACE_ENV, DEFAULT_OPERATOR_NAMESPACE),
                   help=f"namespace of the operator's pods: the only peers of the batch managers' admin port in "
                        f"the NetworkPolicies [{OPERATOR_NAMESPACE_ENV}]")
    p.add_argument("--operator-pod-labels", default=os.environ.get(OPERATOR_LABELS_ENV, ""),
                   help=f"labels of the operator's pods, k=v,k2=v2 (default: "
                        f"{','.join(f'{k}={v}' for k, v in DEFAULT_OPERATOR_LABELS.items())}) [{OPERATOR_LABELS_ENV}]")
    p.add_argument("--verbose", "-v", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    kopf.configure(verbose=args.verbose)
    pods = OperatorPods.from_env({OPERATOR_NAMESPACE_ENV: args.operator_namespace,
                                  OPERATOR_LABELS_ENV: args.operator_pod_labels})
    state = OperatorState(sync_seconds=args.sync_seconds, operator_pods=pods)
    # Standalone: one replica, no peering objects (the chart runs one operator pod, Recreate strategy).
    kopf.run(registry=build_registry(state), standalone=True, namespaces=args.namespace,
             clusterwide=not args.namespace, liveness_endpoint=args.liveness)
    return 0


if __name__ == "__main__":
    sys.exit(main())
