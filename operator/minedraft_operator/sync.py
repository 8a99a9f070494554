"""The two reconcile loops the handlers call: apply rendered objects, and sync replicas + status."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

from minedraft_operator.admin import AdminClient, AdminError
from minedraft_operator.admin_secret import AdminKeyError, admin_keys
from minedraft_operator.crds import API_VERSION
from minedraft_operator.kube import ApiError, KubeApi, api_path
from minedraft_operator.policy import differs, pinned_to_ar, policy_body
from minedraft_operator.pool_status import monitor_condition, pool_condition
from minedraft_operator.render import OPTIONAL_KINDS, OWNED_KINDS, OperatorPods, render
from minedraft_operator.render.admin_key import admin_key_ref
from minedraft_operator.render.names import INSTANCE_LABEL, MANAGED_BY_LABEL, MANAGER, selector_string
from minedraft_operator.rollout_status import rollout_status
from minedraft_operator.spec import DeploymentSpec
from minedraft_operator.status import PodView, ReplicaReport, conditions, merge_conditions, summary

MDD_PLURAL = "minedraftdeployments"
POLICY_PLURAL = "speculationpolicies"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def apply_objects(api: KubeApi, mdd: dict[str, Any], operator: OperatorPods | None = None) -> list[str]:
    """Apply what the resource renders into, then delete owned objects it no longer renders. The
    generated admin key Secret comes first: the pods reference it."""
    spec = DeploymentSpec.from_resource(mdd)
    if admin_key_ref(spec).generated:
        await admin_keys(api, spec)
    desired = render(mdd, operator)
    plurals = {kind: plural for _, kind, plural in OWNED_KINDS}
    applied = []
    for obj in desired:
        try:
            await api.apply(obj, plurals[obj["kind"]])
        except ApiError as err:
            if err.status != 404 or obj["kind"] not in OPTIONAL_KINDS:
                raise
            continue  # its CRD is not installed: the status says so (pool_status), the rest still applies
        applied.append(obj)
    keep = {(o["kind"], o["metadata"]["name"]) for o in desired}
    meta = mdd["metadata"]
    selector = f"{INSTANCE_LABEL}={meta['name']},{MANAGED_BY_LABEL}={MANAGER}"
    for api_version, kind, plural in OWNED_KINDS:
        try:
            existing = await api.list(api_path(api_version, plural, meta["namespace"]), selector)
        except ApiError as err:
            if err.status == 404 and kind in OPTIONAL_KINDS:
                continue  # no such kind in this cluster: nothing of it to prune
            raise
        for obj in existing:
            name = obj["metadata"]["name"]
            owned = any(ref.get("uid") == meta.get("uid") for ref in obj["metadata"].get("ownerReferences", []))
            if owned and (kind, name) not in keep:
                await api.delete(api_path(api_version, plural, meta["namespace"], name))
    return [f"{o['kind']}/{o['metadata']['name']}" for o in applied]


async def _replica(admin: AdminClient, pod: PodView, port: int, body: dict[str, Any], generation: int,
                   keys: tuple[str, ...] | AdminKeyError, stand_in: bool = False) -> ReplicaReport:
    """Bring one batch manager to the desired policy (ar while its draft crash-loops, unless the verifier
    stands in for it: draft.standIn) and read its health."""
    pin = pod.draft_crashlooping and not stand_in
    report = ReplicaReport(pod, policy_generation=generation, pinned_ar=pin)
    if isinstance(keys, AdminKeyError):
        report.error = f"admin key: {keys}"
        return report
    base = f"http://{pod.ip}:{port}"
    want = pinned_to_ar(body) if pin else body
    try:
        effective = await admin.get_policy(base, keys)
        # Send only what this batch manager knows (an older image lacks newer fields); report the rest.
        report.unsupported = sorted(set(want) - set(effective))
        want = {k: v for k, v in want.items() if k in effective}
        if differs(effective, want):
            effective = await admin.put_policy(base, want, keys)
        report.applied = not differs(effective, want)
        if not report.applied:
            report.error = f"policy not in effect after PUT: {differs(effective, want)}"
        report.health = await admin.health(base, keys)
    except AdminError as err:
        report.error = str(err)
    return report


async def _admin_keys_or_error(api: KubeApi, spec: DeploymentSpec) -> tuple[str, ...] | AdminKeyError:
    try:
        return await admin_keys(api, spec)
    except AdminKeyError as err:
        return err


async def read_policy(api: KubeApi, namespace: str, spec: DeploymentSpec) -> tuple[dict[str, Any] | None, str | None]:
    """(the referenced SpeculationPolicy or None, why it is missing)."""
    ref = spec.raw.get("policyRef")
    if not ref:
        return None, None
    policy = await api.get(api_path(API_VERSION, POLICY_PLURAL, namespace, ref["name"]))
    return policy, None if policy else f"SpeculationPolicy {ref['name']!r} not found in {namespace}"


async def sync_deployment(api: KubeApi, admin: AdminClient, mdd: dict[str, Any]) -> dict[str, Any]:
    """Push the policy to every serving replica, then write the status from what they report."""
    spec = DeploymentSpec.from_resource(mdd)
    ns = spec.namespace
    pods = [PodView.of(p) for p in await api.list(api_path("v1", "pods", ns), selector_string(spec))
            if not p["metadata"].get("deletionTimestamp")]
    policy, missing = await read_policy(api, ns, spec)
    generation = policy["metadata"].get("generation", 1) if policy else 0
    body = policy_body(policy["spec"] if policy else None)
    serving = [p for p in pods if p.serving]
    keys = await _admin_keys_or_error(api, spec) if serving else AdminKeyError("no serving replica")
    reports = list(await asyncio.gather(*(_replica(admin, p, spec.ports["admin"], body, generation, keys,
                                                   spec.draft_stand_in)
                                          for p in serving)))
    old = mdd.get("status", {}).get("conditions", [])
    gen = mdd["metadata"].get("generation", 1)
    new = conditions(spec.raw["replicas"], spec.gpu_mode, pods, reports, missing)
    for optional in (await pool_condition(api, spec), await monitor_condition(api, spec)):
        if optional is not None:
            new.append(optional)
    progress, progressing = rollout_status(await api.get(api_path("apps/v1", "deployments", ns, spec.name)))
    new.append(progressing)
    status: dict[str, Any] = {
        "replicas": len(pods),
        "readyReplicas": sum(p.ready for p in pods),
        **progress,
        "selector": selector_string(spec),
        "policy": {"name": policy["metadata"]["name"] if policy else "", "generation": generation},
        "replicaStatus": [r.entry() for r in reports],
        **summary(reports),
        "conditions": merge_conditions(old, new, _now(), gen),
    }
    await api.patch_status(api_path(API_VERSION, MDD_PLURAL, ns, spec.name), status)
    if policy:
        await sync_policy_status(api, policy)
    return status


async def sync_policy_status(api: KubeApi, policy: dict[str, Any]) -> dict[str, Any]:
    """The policy's status lists the replicas of every deployment that references it (one writer: us)."""
    meta = policy["metadata"]
    gen = meta.get("generation", 1)
    rows: list[dict[str, Any]] = []
    for mdd in await api.list(api_path(API_VERSION, MDD_PLURAL, meta["namespace"])):
        if mdd.get("spec", {}).get("policyRef", {}).get("name") != meta["name"]:
            continue
        for replica in mdd.get("status", {}).get("replicaStatus", []):
            row = {"deployment": mdd["metadata"]["name"], "pod": replica["pod"],
                   "generation": replica.get("policyGeneration", 0)}
            if replica.get("error"):
                row["error"] = replica["error"]
            rows.append(row)
    applied = sum(r["generation"] == gen and "error" not in r for r in rows)
    state = "True" if rows and applied == len(rows) else ("Unknown" if not rows else "False")
    reason = {"True": "Applied", "False": "Pending", "Unknown": "NoReplicas"}[state]
    status = {"observedGeneration": gen, "appliedReplicas": applied, "totalReplicas": len(rows), "replicas": rows,
              "conditions": merge_conditions(policy.get("status", {}).get("conditions", []),
                                             [{"type": "Applied", "status": state, "reason": reason,
                                               "message": f"generation {gen} on {applied}/{len(rows)} replicas"}],
                                             _now(), gen)}
    await api.patch_status(api_path(API_VERSION, POLICY_PLURAL, meta["namespace"], meta["name"]), status)
    return status
