"""Pure status logic: what the pods and the batch managers report -> MineDraftDeployment status."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from minedraft_operator.render.names import BATCH_MANAGER, DRAFT

TRANSPORTS = ("P2P", "SHM", "NET", "gloo")


@dataclass(frozen=True, slots=True)
class PodView:
    """What the operator reads from one Pod object."""

    name: str
    ip: str
    ready: bool  # the pod's Ready condition
    serving: bool  # the batch manager container is ready: its admin port answers
    scheduled: bool
    schedule_message: str
    draft_crashlooping: bool  # the draft ran, died and is not back (restarts > 0 and not ready)
    draft_reason: str

    @classmethod
    def of(cls, pod: dict[str, Any]) -> PodView:
        status = pod.get("status", {})
        conds = {c["type"]: c for c in status.get("conditions", [])}
        cs = {c["name"]: c for c in status.get("containerStatuses", [])}
        bm, draft = cs.get(BATCH_MANAGER, {}), cs.get(DRAFT, {})
        ip = status.get("podIP", "")
        draft_down = not draft.get("ready", False)
        waiting = draft.get("state", {}).get("waiting", {}).get("reason", "")
        terminated = draft.get("lastState", {}).get("terminated", {}).get("reason", "")
        sched = conds.get("PodScheduled", {})
        return cls(
            name=pod["metadata"]["name"], ip=ip,
            ready=conds.get("Ready", {}).get("status") == "True",
            serving=bool(ip) and bm.get("ready", False) and not pod["metadata"].get("deletionTimestamp"),
            scheduled=sched.get("status") == "True", schedule_message=sched.get("message", ""),
            draft_crashlooping=draft_down and (draft.get("restartCount", 0) > 0 or waiting == "CrashLoopBackOff"),
            draft_reason=waiting or terminated or ("NotReady" if draft_down else ""),
        )


@dataclass(slots=True)
class ReplicaReport:
    """One serving replica after the operator talked to its batch manager."""

    pod: PodView
    health: dict[str, Any] | None = None
    policy_generation: int = 0  # of the policy the replica now runs (0: the defaults, or not applied)
    applied: bool = False
    pinned_ar: bool = False
    error: str = ""
    unsupported: list[str] = field(default_factory=list)  # policy fields this batch manager lacks

    def entry(self) -> dict[str, Any]:
        h = self.health or {}
        out: dict[str, Any] = {"pod": self.pod.name, "ready": self.pod.ready,
                               "draftHealthy": not self.pod.draft_crashlooping,
                               "policyGeneration": self.policy_generation if self.applied else 0}
        for key, name in (("mode", "mode"), ("k", "k"), ("acceptance_rate", "acceptanceRate"),
                          ("draft_link_transport", "transport"), ("fallbacks", "fallbacks")):
            if key in h:
                out[name] = h[key]
        if self.error:
            out["error"] = self.error
        return out


def condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
    return {"type": kind, "status": status, "reason": reason, "message": message}


def _uniform(values: list[Any], mixed: Any) -> Any:
    return values[0] if values and all(v == values[0] for v in values) else (mixed if values else None)


def summary(reports: list[ReplicaReport]) -> dict[str, Any]:
    """Deployment-wide mode, k, acceptance (weighted by drafted tokens) and transport."""
    healths = [r.health for r in reports if r.health]
    out: dict[str, Any] = {}
    # The configured mode (psd shows "sd" in its /health while a batch is empty); once the draft is gone, what
    # runs instead: ar, or sd where the verifier stands in for it (draft.standIn).
    mode = _uniform([h.get("configured_mode", h.get("mode")) if h.get("draft_connected", True) else
                     ("sd" if h.get("draft_state") == "lost_colocated" else "ar") for h in healths], "mixed")
    k = _uniform([h.get("k") for h in healths], None)
    drafted = sum(h.get("drafted_total", 0) for h in healths)
    transports = sorted({h.get("draft_link_transport") or "" for h in healths} - {""})
    if mode:
        out["mode"] = mode
    if k is not None:
        out["k"] = k
    if healths:
        out["acceptanceRate"] = round(sum(h.get("accepted_total", 0) for h in healths) / drafted, 4) if drafted \
            else round(sum(h.get("acceptance_rate", 0.0) for h in healths) / len(healths), 4)
    if transports:
        out["draftLinkTransport"] = ",".join(transports)
    return out


def conditions(desired: int, gpu_mode: str, pods: list[PodView], reports: list[ReplicaReport],
               policy_missing: str | None) -> list[dict[str, str]]:
    ready = sum(p.ready for p in pods)
    out = [condition("Ready", "True" if ready >= desired else "False",
                     "ScaledToZero" if desired == 0 else ("ReplicasReady" if ready >= desired else "ReplicasNotReady"),
                     f"{ready}/{desired} replicas ready")]

    unscheduled = [p for p in pods if not p.scheduled]
    if gpu_mode == "none":
        out.append(condition("GPUsAllocated", "True", "CPUOnly", "gpu.mode none: no GPUs requested"))
    elif unscheduled:
        p = unscheduled[0]
        out.append(condition("GPUsAllocated", "False", "Unschedulable", f"{p.name}: {p.schedule_message}".strip()))
    elif not pods:
        out.append(condition("GPUsAllocated", "Unknown", "NoPods", "no serving pods yet"))
    else:
        via = "one DRA claim per pod" if gpu_mode == "dra" else "device plugin, per container"
        out.append(condition("GPUsAllocated", "True", "Allocated", f"{len(pods)} pod(s) scheduled ({via})"))

    healths = [(r.pod.name, r.health) for r in reports if r.health]
    transports = [h.get("draft_link_transport") for _, h in healths]
    if not healths:
        out.append(condition("DraftLinkReady", "Unknown", "NoReadyReplicas", "no batch manager answered yet"))
    elif any(t is None for t in transports):
        out.append(condition("DraftLinkReady", "Unknown", "NotReported", "the batch manager does not report "
                             "draft_link_transport"))
    else:
        down = [name for name, h in healths if not h.get("draft_connected") or not h.get("draft_link_transport")]
        detail = ", ".join(f"{name}={h.get('draft_link_transport') or 'none'}" for name, h in healths)
        if down:
            out.append(condition("DraftLinkReady", "False", "NoDataPlane", detail))
        else:
            reason = _uniform([t if t in TRANSPORTS else "Other" for t in transports], "Mixed")
            out.append(condition("DraftLinkReady", "True", reason, detail))

    failed = [r for r in reports if r.error]
    applied = [r for r in reports if r.applied]
    if policy_missing:
        out.append(condition("PolicyApplied", "False", "PolicyNotFound", policy_missing))
    elif failed:
        out.append(condition("PolicyApplied", "False", "PushFailed",
                             "; ".join(f"{r.pod.name}: {r.error}" for r in failed)[:2000]))
    elif not reports:
        out.append(condition("PolicyApplied", "Unknown", "NoReadyReplicas", "no ready replica to apply it to"))
    else:
        note = sorted({f for r in reports for f in r.unsupported})
        extra = f"; the batch manager lacks {', '.join(note)}" if note else ""
        out.append(condition("PolicyApplied", "True", "Applied", f"{len(applied)}/{len(reports)} replicas{extra}"))

    crashing = [p for p in pods if p.draft_crashlooping]
    fell_back = [name for name, h in healths if h.get("draft_connected") is False]
    if crashing:
        stood_in = reports and not any(r.pinned_ar for r in reports)
        instead = "the verifier drafts itself (standIn)" if stood_in else "pinned to ar"
        out.append(condition("Degraded", "True", "DraftCrashLoop", f"{instead} until the draft is healthy: " +
                             ", ".join(f"{p.name} ({p.draft_reason})" for p in crashing)))
    elif fell_back:
        out.append(condition("Degraded", "True", "DraftDisconnected", "decoding without speculation: " +
                             ", ".join(fell_back)))
    else:
        out.append(condition("Degraded", "False", "Speculating", "every ready replica has its draft"))
    return out


def merge_conditions(old: list[dict[str, Any]], new: list[dict[str, str]], now: str,
                     generation: int) -> list[dict[str, Any]]:
    """lastTransitionTime moves only when a condition's status changes."""
    previous = {c["type"]: c for c in old}
    out = []
    for cond in new:
        before = previous.get(cond["type"])
        since = before["lastTransitionTime"] if before and before.get("status") == cond["status"] else now
        out.append({**cond, "observedGeneration": generation, "lastTransitionTime": since})
    return out
