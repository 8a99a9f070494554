"""spec.routing: how gateways reach the serving pods (an optional Gateway API inference extension pool)."""

from __future__ import annotations

from minedraft_operator.crds.schema import Schema, boolean, integer, obj, string

EPP_PORT = 9002  # the endpoint picker's ext-proc port, as the inference extension's charts serve it


def routing() -> Schema:
    picker = obj(
        "The endpoint picker (a Service in this namespace, e.g. llm-d's router) the pool's gateways ask "
        "which pod serves each request; copied into the pool's endpointPickerRef.",
        {
            "name": string("Service name of the endpoint picker; unset = <name>-epp.", min_length=1, max_length=253),
            "port": integer("Service port of the endpoint picker's ext-proc gRPC.", minimum=1, maximum=65535,
                            default=EPP_PORT),
            "failureMode": string("What a gateway does while the picker does not answer: FailOpen routes to any "
                                  "pod of the pool (serving goes on), FailClose refuses the request.",
                                  enum=("FailOpen", "FailClose"), default="FailOpen"),
        },
        default={},
    )
    pool = obj(
        "An InferencePool (inference.networking.k8s.io/v1) <name> selecting the serving pods on the OpenAI HTTP "
        "port, so a conformant gateway balances each request by queue depth and KV usage instead of pinning a "
        "connection to one pod. Needs the pool's CRD in the cluster (reported in the InferencePoolReady "
        "condition when missing).",
        {"enabled": boolean("Render the InferencePool (owned; deleted when switched off).", default=False),
         "endpointPicker": picker},
        default={},
    )
    ready = boolean(
        "Keep a replica Ready while its draft service is lost: the draft container supervises the draft process "
        "(restarts it itself, with backoff, when it exits or stops answering health checks) instead of "
        "crash-looping, so the pod stays in the Service and the pool while the batch manager decodes exactly "
        "without drafts (Degraded=True DraftDisconnected, minedraft:speculation_fallback_active 1). Unset = on "
        "when inferencePool.enabled (a picker then keeps routing to the replica), off otherwise (Kubernetes "
        "restarts a failed draft container and the pod is NotReady meanwhile).")
    return obj("How gateways route to the serving pods.", {"inferencePool": pool, "readyWithoutDraft": ready},
               default={})
