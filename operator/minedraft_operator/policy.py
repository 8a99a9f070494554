"""SpeculationPolicy -> the batch manager's live policy (PUT /admin/policy body).

Field map (contract.md): mode -> mode, k.initial -> k (in auto: k.max, the most adaptive k may
choose), k.min -> k_min (auto chooses within k_min..k), batching.maxSequencesPerBatch x 2 ->
max_num_seqs (the batch manager caps both batches together), batching.pipelineDepth ->
pipeline_depth, batching.rebalanceThreshold -> rebalance_threshold,
fallback.onLowAcceptance.{minTokensPerStep, probeSteps} -> auto_{min_tokens_per_step, probe_steps},
draftSelection.{strategy, extraDrafts, minBatch} -> draft_selection, tetris_extra, tetris_min_batch.
batching.strategy and fallback.onDraftFailure have one possible behaviour today and are not sent.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from minedraft_operator.crds import policy_crd
from minedraft_operator.defaults import apply_defaults

# The fields every batch manager understands since the policy API exists; the others arrived later.
CORE_FIELDS = ("mode", "k", "max_num_seqs", "pipeline_depth")


@cache
def _spec_schema() -> dict[str, Any]:
    return policy_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def policy_body(policy_spec: dict[str, Any] | None) -> dict[str, Any]:
    """The admin body for a policy spec (None: the defaults of an empty SpeculationPolicy)."""
    spec = apply_defaults(_spec_schema(), policy_spec or {})
    batching, low, selection = spec["batching"], spec["fallback"]["onLowAcceptance"], spec["draftSelection"]
    k = spec["k"]["max"] if spec["mode"] == "auto" else spec["k"]["initial"]
    return {
        "mode": spec["mode"],
        "k": k,
        "k_min": min(spec["k"]["min"], k),
        "max_num_seqs": 2 * batching["maxSequencesPerBatch"],
        "pipeline_depth": batching["pipelineDepth"],
        "rebalance_threshold": float(batching["rebalanceThreshold"]),
        "auto_min_tokens_per_step": float(low["minTokensPerStep"]),
        "auto_probe_steps": low["probeSteps"],
        "draft_selection": selection["strategy"],
        "tetris_extra": selection["extraDrafts"],
        "tetris_min_batch": selection["minBatch"],
    }


def pinned_to_ar(body: dict[str, Any]) -> dict[str, Any]:
    """A replica whose draft crash-loops runs plain decoding until the draft is healthy again."""
    return {**body, "mode": "ar"}


def default_policy_env() -> dict[str, str]:
    """The pod starts with the default policy; the operator pushes the referenced one once it is ready
    (so a policy change never touches the pod template, hence never restarts a pod)."""
    body = policy_body(None)
    return {"MINEDRAFT_MODE": body["mode"], "MINEDRAFT_K": str(body["k"]),
            "MINEDRAFT_MAX_NUM_SEQS": str(body["max_num_seqs"])}


def differs(effective: dict[str, Any], desired: dict[str, Any]) -> list[str]:
    """Fields of `desired` the replica's effective policy does not match (a missing field counts)."""
    out = []
    for key, want in desired.items():
        have = effective.get(key)
        if isinstance(want, float) and isinstance(have, int | float):
            if abs(have - want) > 1e-9:
                out.append(key)
        elif have != want:
            out.append(key)
    return out
