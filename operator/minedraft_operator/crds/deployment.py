"""MineDraftDeployment: what one serving deployment (target + draft + batch manager) looks like."""

from __future__ import annotations

from minedraft_operator.crds.common import (
    BUNDLED_HEAD,
    DNS_LABEL,
    dtype,
    model_source,
    resources,
    tolerations,
    worker_tuning,
)
from minedraft_operator.crds.rollout import timing_fields
from minedraft_operator.crds.routing import routing
from minedraft_operator.crds.schema import (
    Schema,
    array,
    boolean,
    free_form,
    integer,
    number,
    obj,
    quantity,
    rule,
    string,
    string_map,
)
from minedraft_operator.crds.status import conditions

GPU_MODES = ("dra", "devicePlugin", "none")
P2P_LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")
PORT_FIELDS = ("verifier", "draft", "tensorParallel", "dataPlane", "admin")
MIN_BATCHED_TOKENS = 16  # the batch manager refuses a smaller per-step token budget


def _port(description: str, default: int) -> Schema:
    return integer(description, minimum=1, maximum=65535, default=default)


def _target() -> Schema:
    return obj(
        "The target (verified) model, served by tensorParallelSize verifier processes.",
        {
            "model": model_source("target"),
            "tensorParallelSize": integer("GPUs (and verifier processes) the target is split over; must divide "
                                          "the model's attention heads. With GPUs a replica needs "
                                          "tensorParallelSize + 1 on one node, so at most 7.",
                                          minimum=1, maximum=8, default=1),
            "dtype": dtype("target"),
            **worker_tuning("verifier"),
            "resources": resources("each verifier container"),
        },
        required=["model"],
        rules=[rule(f"!has(self.model.bundled) || self.model.bundled != '{BUNDLED_HEAD}'",
                    f"{BUNDLED_HEAD} is an EAGLE head: it drafts (draft.model with kind eagle), it is no target",
                    field_path=".model.bundled")],
    )


def _draft() -> Schema:
    return obj(
        "The draft model, served by one draft process on its own GPU.",
        {"model": model_source("draft"), "dtype": dtype("draft"), **worker_tuning("draft"),
         "kind": string("model: draft.model is a draft model. eagle: it is an EAGLE head (SafeAILab's or the "
                        "speculators layout, EAGLE-1/2 or EAGLE-3) for the target, which reads the target's hidden "
                        "states: the verifier captures them and sends them with each verdict, and the draft "
                        "process also mounts the target to copy its embedding and lm_head.",
                        enum=["model", "eagle"], default="model"),
         "resources": resources("the draft container"),
         "standIn": boolean("The verifier (rank 0) also loads the draft model on its GPU and drafts itself (fused "
                            "SD) while the draft service is lost, instead of decoding without drafts; it needs GPU "
                            "memory for the draft's weights and KV cache beside the target's.", default=False)},
        required=["model"],
        rules=[rule(f"!has(self.model.bundled) || (self.model.bundled == '{BUNDLED_HEAD}') == "
                    "(has(self.kind) && self.kind == 'eagle')",
                    f"a bundled draft with kind eagle must be the head {BUNDLED_HEAD}, and {BUNDLED_HEAD} needs "
                    "kind eagle", field_path=".model.bundled")],
    )


def _gpu() -> Schema:
    return obj(
        "How GPUs are allocated so the verifier and the draft can use NCCL peer-to-peer.",
        {
            "mode": string("dra: one ResourceClaim for all GPUs of the pod, shared by the GPU containers (NVLink "
                           "P2P works). devicePlugin: nvidia.com/gpu per container (isolated; NCCL uses SHM or NET "
                           "between containers). none: CPU only (gloo data plane, float32).",
                           enum=GPU_MODES, default="dra"),
            "deviceClassName": string("DRA DeviceClass of the GPUs.", default="gpu.nvidia.com", min_length=1),
            "deviceSelectors": array("CEL device selectors added to the DRA request, e.g. "
                                     "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'.",
                                     string("A CEL expression over `device`.", min_length=1), max_items=8),
            "resourceName": string("Extended resource requested per GPU container in devicePlugin mode.",
                                   default="nvidia.com/gpu", min_length=1),
            "nodeSelector": string_map("Node labels the serving pods must match."),
            "tolerations": tolerations(),
            "affinity": free_form("A core/v1 Affinity for the serving pods."),
        },
        default={},
        rules=[rule("!has(self.deviceSelectors) || self.mode == 'dra'", "deviceSelectors need mode dra")],
    )


def _nccl() -> Schema:
    return obj(
        "NCCL environment of the GPU containers (ignored with gpu.mode none).",
        {
            "p2pLevel": string("NCCL_P2P_LEVEL: the farthest topology distance that still uses peer-to-peer; "
                               "unset = NCCL's choice.", enum=P2P_LEVELS),
            "cumemEnable": boolean("NCCL_CUMEM_ENABLE; false is the fallback when cuMem handle passing between "
                                   "processes fails. Unset = NCCL's default."),
            "nvlsEnable": boolean("NCCL_NVLS_ENABLE (NVLink SHARP); off by default: it needs multicast "
                                  "support inside containers and the draft link does not use it.", default=False),
            "debug": string("NCCL_DEBUG level; unset = not set.", enum=("VERSION", "WARN", "INFO", "TRACE")),
        },
        default={},
    )


def _images() -> Schema:
    return obj(
        "Container images (the Helm chart fills the defaults of its release).",
        {
            "worker": string("Image of the verifier and draft containers (minedraft with torch).", min_length=1),
            "batchManager": string("Image of the batch manager (minedraft[batch-manager], no torch).", min_length=1),
            "pullPolicy": string("imagePullPolicy of all containers.", enum=("Always", "IfNotPresent", "Never"),
                                 default="IfNotPresent"),
            "pullSecrets": array("Names of image pull secrets.", string("A Secret name.", pattern=DNS_LABEL)),
            "bundledModelsDir": string("Folder inside the worker image holding the bundled tiny-target, tiny-draft "
                                       "and tiny-eagle folders.", default="/opt/minedraft/models", pattern=r"^/.*$"),
        },
        required=["worker", "batchManager"],
    )


def _service() -> Schema:
    return obj(
        "The Service in front of the batch managers (public gRPC and OpenAI HTTP).",
        {
            "type": string("Service type.", enum=("ClusterIP", "NodePort", "LoadBalancer"), default="ClusterIP"),
            "grpcPort": _port("Public gRPC port (minedraft.v1.Generation).", 50051),
            "httpPort": _port("OpenAI-compatible HTTP port.", 8000),
            "annotations": string_map("Annotations of the Service (e.g. for a cloud load balancer)."),
        },
        default={},
        rules=[rule("self.grpcPort != self.httpPort", "grpcPort and httpPort must differ")],
    )


def _ports() -> Schema:
    return obj(
        "Pod-internal ports (the pod's containers share one network namespace).",
        {
            "verifier": _port("Verifier rank 0 control gRPC port.", 50061),
            "draft": _port("Draft service control gRPC port.", 50062),
            "tensorParallel": _port("Tensor-parallel rendezvous of the verifier ranks (localhost).", 29650),
            "dataPlane": _port("Data-plane rendezvous between draft and verifier.", 29651),
            "admin": _port("Batch manager admin port (policy, /health); reached by the operator only.", 8081),
        },
        default={},
    )


def _batch_manager() -> Schema:
    return obj("The CPU batch manager container.", {
        "resources": resources("the batch manager container"),
        "maxQueue": integer("Waiting requests before 429 (MINEDRAFT_MAX_QUEUE).", minimum=1, default=1024),
        "streamInterval": integer("Tokens a streamed chunk waits for; the first and last go at once. Above 1 "
                                  "the batch manager spends less CPU per token on many streams "
                                  "(MINEDRAFT_STREAM_INTERVAL).", minimum=1, maximum=1024, default=1),
        "servedModelName": string("Model name in the APIs; unset = the target folder's name.", max_length=256),
        "prefixCaching": boolean("Automatic prefix caching: a request whose prompt starts like an earlier one's "
                                 "(a shared system prompt, a conversation's earlier turns) reuses those KV blocks "
                                 "on both workers instead of computing them again; output is unchanged. vLLM's "
                                 "--enable-prefix-caching (MINEDRAFT_ENABLE_PREFIX_CACHING). Fixed for a pod's "
                                 "life: changing it rolls the pods.", default=True),
        "maxNumBatchedTokens": integer(
            "Chunked prefill's budget: the most tokens the verifier computes in one step, verify rows (k + 1 per "
            "sequence) plus prompt chunks, so a long prompt is prefilled over several steps while running streams "
            "keep their pace. 0 = the verifier device's default (96 on a CPU, 2048 on a GPU), else at least "
            f"{MIN_BATCHED_TOKENS}. vLLM's --max-num-batched-tokens (MINEDRAFT_MAX_NUM_BATCHED_TOKENS). Fixed for a "
            "pod's life: changing it rolls the pods.", minimum=0, default=0),
    }, default={}, rules=[rule("!has(self.maxNumBatchedTokens) || self.maxNumBatchedTokens == 0 || "
                               f"self.maxNumBatchedTokens >= {MIN_BATCHED_TOKENS}",
                               f"maxNumBatchedTokens must be 0 (the device's default) or at least {MIN_BATCHED_TOKENS}",
                               field_path=".maxNumBatchedTokens")])


def _secret_key_ref(description: str, default_key: str) -> Schema:
    return obj(description, {"name": string("Secret name (same namespace).", min_length=1, max_length=253),
                             "key": string("Key inside the Secret.", default=default_key, min_length=1)},
               required=["name"])


def _auth() -> Schema:
    return obj("API keys: of the public endpoints, and of the batch manager's admin API.", {
        "secretRef": _secret_key_ref("Secret key holding the API key(s) of the public endpoints, one per line, "
                                     "mounted read-only (MINEDRAFT_API_KEY_FILE): editing the Secret rotates the "
                                     "key without a restart; unset = no key.", "api-key"),
        "adminSecretRef": _secret_key_ref(
            "Secret key holding the admin API key(s), one per line (new first while rotating), mounted read-only "
            "(MINEDRAFT_ADMIN_API_KEY_FILE) and sent by the operator with every policy push; editing the Secret "
            "rotates the key without a restart; unset = the operator generates the Secret <name>-admin-key "
            "(owned by this resource).",
            "admin-api-key"),
    })


def spec_schema() -> Schema:
    ports = "[" + ", ".join(f"self.ports.{name}" for name in PORT_FIELDS) + ", self.service.grpcPort, " \
        "self.service.httpPort]"
    return obj(
        "Desired state of a MineDraftDeployment.",
        {
            "replicas": integer("Serving pods (each: verifier, draft, batch manager). Driven by the scale "
                                "subresource (HPA/KEDA).", minimum=0, default=1),
            "target": _target(),
            "draft": _draft(),
            "batchManager": _batch_manager(),
            "images": _images(),
            "gpu": _gpu(),
            "nccl": _nccl(),
            "sharedMemorySize": quantity("Size of the memory-backed /dev/shm of the worker containers.", default="8Gi"),
            "service": _service(),
            "ports": _ports(),
            "policyRef": obj("The SpeculationPolicy (same namespace) pushed live to every ready replica; unset = "
                             "the policy defaults.", {"name": string("SpeculationPolicy name.", min_length=1,
                                                                      max_length=253)}, required=["name"]),
            "auth": _auth(),
            "routing": routing(),
            "networkPolicy": obj("A NetworkPolicy that lets only the operator's pods reach the batch manager's "
                                 "admin port (every other port stays open as without it).", {
                                     "enabled": boolean("Render the NetworkPolicy (clusters without a NetworkPolicy "
                                                        "controller ignore it).", default=True)}, default={}),
            "disruptionBudget": obj("A PodDisruptionBudget for the serving pods (node drains, evictions).", {
                "enabled": boolean("Render the PodDisruptionBudget.", default=True),
                "maxUnavailable": integer("Serving pods a voluntary disruption may take down at once.", minimum=1,
                                          default=1)}, default={}),
            "podMonitor": obj(
                "A PodMonitor (monitoring.coreos.com/v1, the Prometheus Operator) <name> scraping /metrics on the "
                "port named http of this deployment's serving pods. Needs the PodMonitor CRD in the cluster "
                "(reported in the PodMonitorReady condition when missing).",
                {"enabled": boolean("Render the PodMonitor (owned; deleted when switched off).", default=False)},
                default={}),
            "observability": obj("Traces and metrics.", {
                "otlpEndpoint": string("OTLP endpoint for traces and metrics (OTEL_EXPORTER_OTLP_ENDPOINT).",
                                       pattern=r"^https?://.+$"),
                "metrics": boolean("Annotate pods for Prometheus scraping of /metrics on the HTTP port.",
                                   default=True),
            }, default={}),
            **timing_fields(),
        },
        required=["target", "draft", "images"],
        rules=[
            rule(f"{ports}.all(p, {ports}.exists_one(q, q == p))", "all ports of the pod must differ"),
            rule("self.gpu.mode != 'none' || ((!has(self.target.dtype) || self.target.dtype == 'float32') && "
                 "(!has(self.draft.dtype) || self.draft.dtype == 'float32'))",
                 "gpu.mode none runs on CPU: dtype must be float32"),
            rule("self.gpu.mode == 'none' || !has(self.target.tensorParallelSize) || "
                 "self.target.tensorParallelSize + 1 <= 8",
                 "a replica must fit on one node: it needs tensorParallelSize + 1 GPUs (the draft has its own GPU) "
                 "and nodes have at most 8, so tensorParallelSize 8 needs gpu.mode none"),
        ],
    )


def status_schema() -> Schema:
    replica = obj("What one serving pod reports.", {
        "pod": string("Pod name."),
        "ready": boolean("The pod is Ready."),
        "mode": string("Effective mode (psd, sd, ar)."),
        "k": integer("Draft tokens per step."),
        "acceptanceRate": number("Accepted / drafted tokens since the batch manager started."),
        "transport": string("Data-plane transport the draft link uses (P2P, SHM, NET, gloo)."),
        "fallbacks": integer("Times the batch manager fell back to AR."),
        "draftHealthy": boolean("The draft container runs and is not crash-looping."),
        "policyGeneration": integer("SpeculationPolicy generation this replica runs (0 = defaults)."),
        "error": string("Last failure reaching or updating this replica."),
    })
    return obj("Observed state of a MineDraftDeployment.", {
        "observedGeneration": integer("metadata.generation the operator last reconciled."),
        "replicas": integer("Serving pods that exist."),
        "readyReplicas": integer("Serving pods that are Ready."),
        "updatedReplicas": integer("Serving pods of the current pod template (the Deployment's)."),
        "availableReplicas": integer("Serving pods Ready for minReadySeconds (the Deployment's)."),
        "selector": string("Label selector of the serving pods (scale subresource)."),
        "mode": string("Effective mode of the replicas (psd, sd, ar; 'mixed' when they differ)."),
        "k": integer("k of the replicas."),
        "acceptanceRate": number("Measured acceptance rate over all ready replicas."),
        "draftLinkTransport": string("NCCL transport of the draft link (P2P, SHM, NET, gloo; joined if mixed)."),
        "policy": obj("The SpeculationPolicy in force.", {
            "name": string("Policy name (empty: defaults)."),
            "generation": integer("Its metadata.generation."),
        }),
        "replicaStatus": array("Per-pod report.", replica),
        "conditions": conditions(("Ready", "GPUsAllocated", "DraftLinkReady", "PolicyApplied", "Degraded",
                                 "InferencePoolReady", "PodMonitorReady", "Progressing")),
    })
