"""SpeculationPolicy: how the batch managers speculate, tuned live without restarting pods."""

from __future__ import annotations

from minedraft_operator.crds.schema import Schema, array, integer, number, obj, rule, string
from minedraft_operator.crds.status import conditions

MODES = ("psd", "sd", "ar", "auto")
SELECTIONS = ("fixed", "tetris")  # the batch manager's draft_selection
K_MIN, K_MAX = 1, 16


def spec_schema() -> Schema:
    k = obj(
        "Draft tokens per speculative step. psd and sd run `initial`; in auto, adaptive k chooses the k of "
        "each step within min..max from the measured acceptance and draft and verify costs.",
        {
            "initial": integer("k the replicas run.", minimum=K_MIN, maximum=K_MAX, default=4),
            "min": integer("Lowest k an adaptive policy may choose.", minimum=K_MIN, maximum=K_MAX, default=1),
            "max": integer("Highest k an adaptive policy may choose.", minimum=K_MIN, maximum=K_MAX, default=8),
        },
        default={},
        rules=[rule("self.min <= self.initial && self.initial <= self.max", "k must satisfy min <= initial <= max")],
    )
    batching = obj(
        "How requests are split over the two batches PSD alternates.",
        {
            "strategy": string("balanced: move sequences waiting to draft from the heavier batch (by tokens "
                               "still to generate) to the lighter one. The only strategy the batch manager has.",
                               enum=("balanced",), default="balanced"),
            "rebalanceThreshold": number("Load gap between the two batches (as the batch manager measures it) "
                                         "below which no sequence is moved; 0 = always balance.",
                                         minimum=0, default=0),
            "maxSequencesPerBatch": integer("Running sequences per batch; the batch manager's running cap "
                                            "(max_num_seqs) is twice this, both batches together.",
                                            minimum=1, maximum=4096, default=32),
            "pipelineDepth": integer("Step plans the batch manager keeps in flight ahead of the workers.",
                                     minimum=1, maximum=4, default=2),
        },
        default={},
    )
    fallback = obj(
        "What happens when speculation stops paying off or the draft fails.",
        {
            "onDraftFailure": string("fallbackToAR: keep serving by plain decoding until the draft is back "
                                     "(the operator pins a replica whose draft crash-loops to ar and restores the "
                                     "mode once it is healthy). The only behaviour the services have.",
                                     enum=("fallbackToAR",), default="fallbackToAR"),
            "onLowAcceptance": obj(
                "mode auto: when to stop speculating and how long to decode plainly before probing again.",
                {
                    "minTokensPerStep": number("Mean tokens per sequence per verify below which auto switches "
                                               "to AR.", minimum=1, default=1.3),
                    "probeSteps": integer("AR steps before auto tries speculation again.", minimum=1, default=200),
                },
                default={},
            ),
        },
        default={},
    )
    draft_selection = obj(
        "Which drafts a speculative step verifies. fixed: every sequence its k drafts; tetris: each sequence "
        "drafts k + extraDrafts and the step verifies the draft batch's k x batch most promising drafts (by the "
        "draft's cumulative confidence), so an easy sequence is verified deeper than a hard one. Output is "
        "unchanged either way; tetris pays where verifying is the bottleneck (large batches).",
        {
            "strategy": string("fixed or tetris.", enum=SELECTIONS, default="fixed"),
            "extraDrafts": integer("tetris: drafts per sequence beyond k; 0 drafts k and only leaves unverified the "
                                   "drafts not worth their verify cost.", minimum=0, maximum=8, default=3),
            "minBatch": integer("tetris: the fewest sequences in a draft batch for selection to run (smaller "
                                "batches verify their k drafts each).", minimum=1, maximum=4096, default=32),
        },
        default={},
    )
    return obj(
        "Desired speculation behaviour of every MineDraftDeployment that references this policy.",
        {
            "mode": string("psd: parallel speculative decoding over two batches; sd: standard speculative "
                           "decoding; ar: plain decoding; auto: psd while it pays off, ar otherwise.",
                           enum=MODES, default="psd"),
            "k": k,
            "batching": batching,
            "fallback": fallback,
            "draftSelection": draft_selection,
        },
    )


def status_schema() -> Schema:
    applied = obj("One replica's state for this policy.", {
        "deployment": string("MineDraftDeployment name."),
        "pod": string("Pod name."),
        "generation": integer("Policy generation the replica runs; 0 = not applied yet."),
        "error": string("Why the last push failed, if it did."),
    })
    return obj("Which replicas run which generation of this policy.", {
        "observedGeneration": integer("metadata.generation the operator last pushed."),
        "appliedReplicas": integer("Replicas running the current generation."),
        "totalReplicas": integer("Ready replicas of the deployments that reference this policy."),
        "replicas": array("Per replica.", applied),
        "conditions": conditions(("Applied",)),
    })
