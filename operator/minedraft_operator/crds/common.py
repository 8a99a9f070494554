"""Schema pieces both models and all containers share: model sources, resources, tolerations."""

from __future__ import annotations

from minedraft_operator.crds.schema import (
    Schema,
    array,
    integer,
    obj,
    quantity,
    rule,
    string,
)

BUNDLED_MODELS = ("tiny-target", "tiny-draft", "tiny-eagle")
BUNDLED_HEAD = "tiny-eagle"  # an EAGLE head for tiny-target: only draft.model with draft.kind eagle
DTYPES = ("bfloat16", "float16", "float32")
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


def model_source(role: str) -> Schema:
    return obj(
        f"Where the {role} model (a Hugging Face folder: config.json, safetensors, tokenizer.json) comes from. "
        "Exactly one of pvc, hostPath or bundled.",
        {
            "pvc": obj(
                "A PersistentVolumeClaim in the deployment's namespace, mounted read-only.",
                {
                    "claimName": string("Name of the PersistentVolumeClaim.", min_length=1, max_length=253),
                    "path": string("Folder of the model inside the volume (relative; empty = the volume root).",
                                   default="", pattern=r"^$|^[^/].*$", max_length=1024),
                },
                required=["claimName"],
                rules=[rule("!self.path.contains('..')", "path must not contain '..'")],
            ),
            "hostPath": obj(
                "A folder on the node, mounted read-only (development clusters only).",
                {"path": string("Absolute path of the model folder on the node.", pattern=r"^/.*$",
                                max_length=1024)},
                required=["path"],
            ),
            "bundled": string(
                "A tiny model shipped inside the worker image (CPU profile, float32): tiny-target or tiny-draft, or "
                f"as draft.model with draft.kind eagle {BUNDLED_HEAD}, an EAGLE head for tiny-target.",
                enum=BUNDLED_MODELS,
            ),
        },
        rules=[rule("(has(self.pvc) ? 1 : 0) + (has(self.hostPath) ? 1 : 0) + (has(self.bundled) ? 1 : 0) == 1",
                    "set exactly one of pvc, hostPath or bundled")],
    )


def resources(who: str) -> Schema:
    """A subset of core/v1 ResourceRequirements: requests and limits (GPUs are added by the operator)."""
    quantities: Schema = {"type": "object", "additionalProperties": quantity("A resource quantity.")}
    return obj(
        f"CPU and memory of {who} (GPUs come from spec.gpu; do not list them here).",
        {
            "requests": {**quantities, "description": "Minimum resources, e.g. {cpu: '4', memory: 32Gi}."},
            "limits": {**quantities, "description": "Maximum resources, e.g. {memory: 64Gi}."},
        },
        rules=[
            rule("!has(self.limits) || !('nvidia.com/gpu' in self.limits)",
                 "GPUs come from spec.gpu, not from container resources"),
        ],
    )


def tolerations() -> Schema:
    toleration = obj(
        "A core/v1 Toleration.",
        {
            "key": string("Taint key; empty with operator Exists matches all."),
            "operator": string("Exists or Equal.", enum=("Exists", "Equal")),
            "value": string("Taint value (operator Equal)."),
            "effect": string("NoSchedule, PreferNoSchedule or NoExecute; empty matches all.",
                             enum=("", "NoSchedule", "PreferNoSchedule", "NoExecute")),
            "tolerationSeconds": integer("How long a NoExecute taint is tolerated."),
        },
    )
    return array("Tolerations of the serving pods (e.g. for tainted GPU nodes).", toleration)


def worker_tuning(role: str) -> dict[str, Schema]:
    """KV cache and thread knobs shared by the verifier and the draft."""
    return {
        "numBlocks": integer(f"KV cache blocks of the {role} (MINEDRAFT_NUM_BLOCKS); unset = the service default.",
                             minimum=1),
        "blockSize": integer(f"Tokens per KV block of the {role} (MINEDRAFT_BLOCK_SIZE); unset = default.",
                             minimum=1, maximum=1024),
        "threads": integer(f"Torch CPU threads of the {role} (MINEDRAFT_THREADS); unset = torch's default.",
                           minimum=1, maximum=1024),
        "captureBatch": integer(f"On GPUs, the {role} captures the CUDA graph of every steady step of up to this many "
                                "sequences at start-up (twice the policy's batching.maxSequencesPerBatch) instead of "
                                "on first use, where each new shape stalls its step; the graphs keep their logits in "
                                "GPU memory (MINEDRAFT_CAPTURE_BATCH); unset = on first use.",
                                minimum=1, maximum=256),
        "captureK": integer(f"With captureBatch: the most draft tokens per step the {role}'s graphs are captured for "
                            "(the policy's k.max; MINEDRAFT_CAPTURE_K); unset = 8.", minimum=0, maximum=15),
        "blas": string(f"On GPUs, the library of the {role}'s half-precision projections: auto picks cuBLAS, "
                       "cuBLASLt or (at most 128 rows) the Triton few-row GEMM per GEMM shape of each CUDA graph by "
                       "timing them as it is captured; cublas or cublaslt forces one (MINEDRAFT_BLAS); unset = "
                       "auto.", enum=["auto", "cublas", "cublaslt"]),
    }


def dtype(role: str) -> Schema:
    return string(f"Weight dtype of the {role}; unset = bfloat16 on GPUs, float32 with gpu.mode none.",
                  enum=DTYPES)
