"""The FP8 layouts a checkpoint's `quantization_config` may describe, read into one typed value.

Two layouts are served: `quant_method: fp8` with 128x128 weight blocks (Qwen3-*-FP8, DeepSeek-V3;
`weight_scale_inv` multiplies despite its name) and compressed-tensors FP8 with per-channel (or
128x128 block) weight scales. Activations are always quantized on the fly per token (per 128-wide
group with block weights), never per tensor: a per-tensor scale would tie one request's logits to
the rest of the batch and SD would no longer equal AR. Anything else is refused with the field
that made it unsupported, so a checkpoint never loads as something it is not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from minedraft.core.errors import ModelLoadError

BLOCK = 128  # weight block edge and activation group width of the block layout
SCHEMES = ("block", "channel")


@dataclass(frozen=True, slots=True)
class Fp8Config:
    """How a checkpoint's linear projections are stored in FP8 (e4m3)."""

    scheme: str  # "block": [ceil(N/128), ceil(K/128)] scales; "channel": [N, 1] scales
    scale_name: str  # the scale tensor beside each `.weight`: weight_scale_inv or weight_scale
    ignore: tuple[str, ...] = ()  # module names (or "re:" patterns) kept in the model dtype

    def quantizes(self, module: str) -> bool:
        """Whether the linear named `module` (e.g. model.layers.0.mlp.down_proj) is stored in FP8."""
        for entry in self.ignore:
            if entry.startswith("re:"):
                if re.fullmatch(entry[3:], module):
                    return False
            elif module == entry or module.endswith("." + entry):
                return False
        return True


def _refuse(field: str, value: object, supported: str) -> ModelLoadError:
    return ModelLoadError(f"quantization_config.{field} = {value!r} is not supported ({supported})")


def _hf_fp8(raw: dict[str, Any]) -> Fp8Config:
    fmt = raw.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise _refuse("fmt", fmt, "only e4m3 weights")
    scheme = raw.get("activation_scheme", "dynamic")
    if scheme != "dynamic":
        raise _refuse("activation_scheme", scheme, "only dynamic activation scales, quantized per token group")
    block = raw.get("weight_block_size")
    if block is None or list(block) != [BLOCK, BLOCK]:
        raise _refuse("weight_block_size", block, f"only [{BLOCK}, {BLOCK}] blocks; per-tensor FP8 weights are not")
    ignore = [*(raw.get("ignored_layers") or []), *(raw.get("modules_to_not_convert") or [])]
    return Fp8Config("block", "weight_scale_inv", tuple(str(m) for m in ignore))


def _group_scheme(name: str, group: dict[str, Any]) -> str:
    """The scheme one compressed-tensors config group describes, or an error naming its field."""
    where = f"config_groups.{name}"
    targets = group.get("targets")
    if targets != ["Linear"]:
        raise _refuse(f"{where}.targets", targets, 'only ["Linear"]')
    weights = group.get("weights") or {}
    for key, want in (("num_bits", 8), ("type", "float"), ("symmetric", True), ("dynamic", False)):
        if weights.get(key, want) != want:
            raise _refuse(f"{where}.weights.{key}", weights.get(key), f"only {want!r}")
    strategy = weights.get("strategy")
    if strategy == "block" and list(weights.get("block_structure") or []) != [BLOCK, BLOCK]:
        raise _refuse(f"{where}.weights.block_structure", weights.get("block_structure"), f"only [{BLOCK}, {BLOCK}]")
    if strategy not in ("channel", "block"):
        raise _refuse(f"{where}.weights.strategy", strategy, "channel or block")
    acts = group.get("input_activations")
    if not acts:
        raise _refuse(f"{where}.input_activations", acts, "FP8 activations quantized on the fly are required")
    for key, want in (("num_bits", 8), ("type", "float"), ("dynamic", True)):
        if acts.get(key, want) != want:
            raise _refuse(f"{where}.input_activations.{key}", acts.get(key), f"only {want!r}")
    want_act, want_group = ("token", None) if strategy == "channel" else ("group", BLOCK)
    if acts.get("strategy") != want_act or (want_group and acts.get("group_size") != want_group):
        shown = acts.get("strategy") if acts.get("strategy") != want_act else f"group_size {acts.get('group_size')}"
        raise _refuse(f"{where}.input_activations.strategy", shown,
                      f"{strategy} weights need {want_act} activations" + (f" of {want_group}" if want_group else "")
                      + "; per-tensor activation scales would make outputs depend on the batch")
    return "channel" if strategy == "channel" else "block"


def _compressed_tensors(raw: dict[str, Any]) -> Fp8Config:
    fmt = raw.get("format", "float-quantized")
    if fmt not in ("float-quantized", "naive-quantized"):
        raise _refuse("format", fmt, "float-quantized or naive-quantized FP8")
    if raw.get("kv_cache_scheme") is not None:
        raise _refuse("kv_cache_scheme", raw["kv_cache_scheme"], "the KV cache stays in the model dtype")
    groups = raw.get("config_groups") or {}
    if not groups:
        raise _refuse("config_groups", groups, "one FP8 group targeting Linear")
    schemes = {_group_scheme(name, group) for name, group in groups.items()}
    if len(schemes) > 1:
        raise _refuse("config_groups", sorted(schemes), "one scheme for every linear")
    return Fp8Config(schemes.pop(), "weight_scale", tuple(str(m) for m in raw.get("ignore") or []))


def fp8_config_from_dict(raw: dict[str, Any] | None) -> Fp8Config | None:
    """The FP8 layout of a config.json's `quantization_config` (None: the weights are not quantized)."""
    if not raw:
        return None
    method = raw.get("quant_method")
    if method == "fp8":
        return _hf_fp8(raw)
    if method == "compressed-tensors":
        return _compressed_tensors(raw)
    raise _refuse("quant_method", method, "supported: fp8 with 128x128 blocks, compressed-tensors FP8")
