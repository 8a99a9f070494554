"""Synthetic target/draft pairs with real model shapes and a controlled agreement.

No pretrained weights can be downloaded onto the benchmark machines, so the pair is built:
the draft is the target's embedding, first `draft_layers` layers, final norm and head
(its own copy); in the target's remaining layers the residual output projections
(o_proj, down_proj) are multiplied by `alpha`. With alpha = 0 the two models compute the
same function (acceptance 1); larger alpha lets the deep layers move the target's
predictions away from the draft's, lowering acceptance. Every tensor is drawn from its
own generator seeded by (seed, tensor name), so the draft service and the verifier build
identical shared weights in separate processes without exchanging them.

A pair member is named by a spec string, `synthetic:<shape>:<role>[:alpha=A][:draft_layers=L]`
(e.g. `synthetic:llama3-8b:target:alpha=0.3`; `:agree=A` gives both members peaked heads that agree
on a share A of tokens; with them `:calib=C` and `:miscal=M` set where the draft is unsure,
bench/draft_confidence.py; `:fp8=block|channel` quantizes the member's projections in memory after it is
built, bench/fp8_quantizer.py, as an FP8 checkpoint of it would load), which the benchmark passes where a model folder
would go; `load_synthetic` is the model loader the benchmark injects into the services
(`minedraft.bench.synthetic_workers`). The product loader knows nothing of it.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from minedraft.bench.draft_confidence import damped_tokens, sink_embedding, sink_norm_gain
from minedraft.bench.peaked_head import peaked_head
from minedraft.core.errors import ModelLoadError
from minedraft.engine.config import ModelConfig, RopeConfig
from minedraft.engine.model import CausalLM
from minedraft.engine.tensor_parallel import TPContext, local_config, take_shard

SHAPES: dict[str, ModelConfig] = {
    "llama3-8b": ModelConfig(
        family="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
        num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5, max_position_embeddings=8192,
        tie_word_embeddings=False, qkv_bias=False, qk_norm=False, rope=RopeConfig(theta=500000.0),
        eos_token_ids=(128001,),
    ),
    "tiny": ModelConfig(
        family="llama", vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=4, num_heads=4,
        num_kv_heads=2, head_dim=32, rms_norm_eps=1e-5, max_position_embeddings=2048, tie_word_embeddings=False,
        qkv_bias=False, qk_norm=False,
    ),
    # Wide enough that a peaked head's choice is ~100% sure (tiny's is not: its flat rest has std ~1.7
    # against a peak of ~11), small enough for CPU tests of confidence-driven selection.
    "small": ModelConfig(
        family="llama", vocab_size=1024, hidden_size=512, intermediate_size=1024, num_layers=4, num_heads=8,
        num_kv_heads=4, head_dim=64, rms_norm_eps=1e-5, max_position_embeddings=2048, tie_word_embeddings=False,
        qkv_bias=False, qk_norm=False,
    ),
}


ROLES = ("target", "draft")
FP8_SCHEMES = ("block", "channel")  # bench/fp8_quantizer.py's layouts


@dataclass(frozen=True, slots=True)
class SyntheticSpec:
    """One member of a synthetic pair: its shape, its role and the pair's agreement knobs."""

    shape: str
    role: str
    alpha: float = 0.3
    draft_layers: int = 2
    agree: float = -1.0  # >= 0: peaked heads whose greedy choices agree on this share of tokens (peaked_head.py)
    calib: float = 0.0  # share of the draft's wrong choices where it is unsure (draft_confidence.py)
    miscal: float = 0.0  # share of its right choices where it is unsure anyway
    fp8: str = ""  # FP8_SCHEMES: this member's projections quantized after it is built ("": as built)

    def __str__(self) -> str:
        peaked = f":agree={self.agree}" if self.agree >= 0 else ""
        peaked += f":calib={self.calib}" if self.calib > 0 else ""
        peaked += f":miscal={self.miscal}" if self.miscal > 0 else ""
        peaked += f":fp8={self.fp8}" if self.fp8 else ""
        return f"synthetic:{self.shape}:{self.role}:alpha={self.alpha}:draft_layers={self.draft_layers}{peaked}"

    def __post_init__(self) -> None:
        if not (0 <= self.calib <= 1 and 0 <= self.miscal <= 1) or ((self.calib or self.miscal) and self.agree < 0):
            raise ModelLoadError(f"bad synthetic model spec {self}: calib and miscal are shares in [0, 1] "
                                 "of a peaked pair's tokens (they need agree)")
        if self.fp8 and self.fp8 not in FP8_SCHEMES:
            raise ModelLoadError(f"bad synthetic model spec {self}: fp8 is one of {', '.join(FP8_SCHEMES)}")

    @property
    def damped(self) -> bool:
        """Whether this member is a draft that is unsure after some tokens."""
        return self.role == "draft" and (self.calib > 0 or self.miscal > 0)

    @classmethod
    def parse(cls, text: str) -> SyntheticSpec:
        parts = text.split(":")
        if len(parts) < 3 or parts[0] != "synthetic" or parts[1] not in SHAPES or parts[2] not in ROLES:
            raise ModelLoadError(
                f"bad synthetic model spec {text!r}; expected synthetic:<{'|'.join(SHAPES)}>:<target|draft>"
                "[:alpha=A][:draft_layers=L][:agree=A[:calib=C][:miscal=M]][:fp8=block|channel]"
            )
        try:
            options = dict(p.split("=", 1) for p in parts[3:])
            spec = cls(parts[1], parts[2], float(options.pop("alpha", 0.3)), int(options.pop("draft_layers", 2)),
                       float(options.pop("agree", -1.0)), float(options.pop("calib", 0.0)),
                       float(options.pop("miscal", 0.0)), options.pop("fp8", ""))
        except ValueError as exc:
            raise ModelLoadError(f"bad synthetic model spec {text!r}: {exc}") from None
        if options:
            raise ModelLoadError(f"bad synthetic model spec {text!r}: unknown options {sorted(options)}")
        return spec

    def pair(self) -> tuple[SyntheticSpec, SyntheticSpec]:
        """(target, draft) of the pair this member belongs to; `fp8` stays this member's own (the draft of an FP8
        target is bf16 unless its spec says otherwise, as a checkpoint's draft has its own config)."""
        return (replace(self, role="target"), replace(self, role="draft", fp8="")) if self.role == "target" else \
            (replace(self, role="target", fp8=""), replace(self, role="draft"))


def _seeded_normal(shape: tuple[int, ...], name: str, seed: int, std: float, device, dtype) -> torch.Tensor:
    gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * std).to(dtype)


def _layer_index(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[2]) if len(parts) > 2 and parts[1] == "layers" else None


def full_parameter_shapes(cfg: ModelConfig) -> list[tuple[str, torch.Size]]:
    """Full (unsharded) parameter shapes, without allocating anything."""
    with torch.device("meta"):
        return [(n, p.shape) for n, p in CausalLM(cfg).named_parameters()]


def _member_tensor(spec: SyntheticSpec, name: str, full_shapes: dict[str, torch.Size], device: str | torch.device,
                   dtype: torch.dtype, seed: int, damped: torch.Tensor | None) -> torch.Tensor:
    """Parameter `name` of the member, whole (before any tensor-parallel shard and the deep layers' alpha)."""
    shape_full = full_shapes[name]
    hidden = full_shapes["model.embed_tokens.weight"][1]
    std = hidden**-0.5 if shape_full[-1] == hidden else shape_full[-1] ** -0.5
    if name == "model.embed_tokens.weight":
        std = 1.0
    # Every rank draws the full tensor from the same generator and keeps its shard,
    # so any tensor-parallel size reproduces the same model.
    value = _seeded_normal(tuple(shape_full), name, seed, std, device, dtype)
    if name == "lm_head.weight" and spec.agree >= 0:
        embedding = _seeded_normal(full_shapes["model.embed_tokens.weight"], "model.embed_tokens.weight",
                                   seed, 1.0, device, torch.float32)
        value = peaked_head(value, embedding, spec.role == "draft", spec.agree, seed)
    if name == "model.embed_tokens.weight" and damped is not None:
        value = sink_embedding(value, damped)
    return value


def build_synthetic(
    spec: SyntheticSpec,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    tp: TPContext | None = None,
) -> CausalLM:
    tp = tp or TPContext()
    full = SHAPES[spec.shape]
    if spec.role == "draft":
        full = replace(full, num_layers=spec.draft_layers)
    cfg = local_config(full, tp)
    model = CausalLM.empty(cfg, tp.reducer(), device, dtype)
    full_shapes = dict(full_parameter_shapes(full))
    damped = damped_tokens(full.vocab_size, spec.agree, spec.calib, spec.miscal, seed) if spec.damped else None
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
                if damped is not None and name.endswith(("layernorm.weight", "model.norm.weight")):
                    # every norm of the stream: the sink channel only sets the scale (draft_confidence.py)
                    param.copy_(sink_norm_gain(param))
                continue
            value = _member_tensor(spec, name, full_shapes, device, dtype, seed, damped)
            value = take_shard(value, name, tp)
            layer = _layer_index(name)
            deep = layer is not None and layer >= spec.draft_layers
            if deep and name.endswith(("o_proj.weight", "down_proj.weight")):
                value = value * spec.alpha
            param.copy_(value)
    if spec.fp8:
        if tp.size > 1:  # a shard's channel scales would be its own rows' maxima, not the whole model's
            raise ModelLoadError(f"synthetic spec {spec}: an FP8 member builds on one device only (tp {tp.size})")
        from minedraft.bench.fp8_quantizer import quantize_model

        return quantize_model(model, spec.fp8).eval()  # fuses the quantized projections
    return model.fuse_projections().eval()


def synthetic_shared(spec: str | Path, device: str | torch.device, dtype: torch.dtype
                     ) -> tuple[torch.Tensor, torch.Tensor, ModelConfig]:
    """What an EAGLE head shares with a synthetic target (`eagle_loader.TargetShared`): its embedding and lm_head,
    the same bits as `build_synthetic` gives the target on this device type in this dtype (CPU and CUDA draw
    different numbers), and its config; nothing else of the target is built."""
    member = SyntheticSpec.parse(str(spec))
    if member.role != "target":
        raise ModelLoadError(f"{spec}: an EAGLE head drafts for a target, not a {member.role}")
    full = SHAPES[member.shape]
    shapes = dict(full_parameter_shapes(full))
    with torch.no_grad():
        embed, head = (_member_tensor(member, name, shapes, device, dtype, 0, None)
                       for name in ("model.embed_tokens.weight", "lm_head.weight"))
    return embed, head, full


def load_synthetic(
    spec: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    tp: TPContext | None = None,
) -> CausalLM:
    """The services' model loader for synthetic specs (same call shape as `engine.loader.load_model`)."""
    return build_synthetic(SyntheticSpec.parse(str(spec)), device, dtype, tp=tp)
