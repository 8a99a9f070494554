"""FP8 (e4m3) linear weights with their scales: the checkpoint layout in the model, and the fused form
`layers.linear` multiplies.

A quantized projection keeps its checkpoint names: `q_proj.weight` becomes an e4m3 parameter and
its scale (`weight_scale_inv` or `weight_scale`, a float32 multiplier) sits beside it, so the
loader fills both by name. Fusing q/k/v (or gate/up) concatenates the weights and their scales
into one `Fp8Weight`; where a part's rows do not fill whole 128-row blocks (the bundled tiny
model's MLP), the block scales are expanded to one row of scales per output row instead, which
the kernel reads the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from minedraft.core.errors import ModelLoadError
from minedraft.engine.fp8_config import BLOCK, Fp8Config

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
ACT_EPS = 1e-12  # activation amax floor: an all-zero group gets a tiny scale and quantizes to zeros
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FP8_ATTR = "fp8_layout"  # set on a quantized nn.Linear: its Fp8Config


@dataclass(slots=True)
class Fp8Weight:
    """An [N, K] e4m3 weight and the float32 scales that multiply it back to the real weight.

    block: scale[r, j] covers output rows r*scale_rows.. and input columns j*128..; scale_rows is 128
    for checkpoint blocks, 1 once unaligned parts were fused. channel: scale [N, 1], scale_rows 1.
    """

    qweight: torch.Tensor
    scale: torch.Tensor
    scheme: str
    scale_rows: int
    dense: torch.Tensor | None = None  # CPU reference path: the dequantized float32 weight (`layers.gemm_weight`)

    @property
    def out_features(self) -> int:
        return self.qweight.shape[0]

    @property
    def in_features(self) -> int:
        return self.qweight.shape[1]

    def row_scales(self) -> torch.Tensor:
        """The scales with one row per output row: [N, ceil(K/128)] (block) or [N, 1] (channel)."""
        return self.scale.repeat_interleave(self.scale_rows, 0)[: self.out_features]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The real [N, K] weight the checkpoint stands for."""
        q = self.qweight.float()
        if self.scheme == "channel":
            return (q * self.scale).to(dtype)
        n, k = q.shape
        groups = self.scale.shape[1]
        blocks = F.pad(q, (0, groups * BLOCK - k)).view(n, groups, BLOCK) * self.row_scales()[:, :, None]
        return blocks.view(n, groups * BLOCK)[:, :k].to(dtype)


def scale_shape(scheme: str, out_features: int, in_features: int) -> tuple[int, int]:
    if scheme == "block":
        return -(-out_features // BLOCK), -(-in_features // BLOCK)
    return out_features, 1


def is_fp8(linear: nn.Linear) -> bool:
    return getattr(linear, FP8_ATTR, None) is not None


def set_fp8(linear: nn.Linear, cfg: Fp8Config, qweight: torch.Tensor, scale: torch.Tensor) -> None:
    """Make `linear` an FP8 projection holding these tensors under their checkpoint names."""
    want = scale_shape(cfg.scheme, *linear.weight.shape)
    if tuple(qweight.shape) != tuple(linear.weight.shape) or tuple(scale.shape) != want:
        raise ModelLoadError(f"FP8 weight {tuple(qweight.shape)} / scale {tuple(scale.shape)} do not fit a "
                             f"{tuple(linear.weight.shape)} linear ({cfg.scheme} scales are {want})")
    linear.weight = nn.Parameter(qweight.to(E4M3), requires_grad=False)
    linear.register_parameter(cfg.scale_name, nn.Parameter(scale.float(), requires_grad=False))
    setattr(linear, FP8_ATTR, cfg)


def apply_fp8_layout(model: nn.Module, cfg: Fp8Config) -> int:
    """Swap every quantized projection's weight for an empty e4m3 one plus its scale (for a loader to
    fill); embeddings, norms and the head keep the model dtype. Returns how many were swapped."""
    count = 0
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in PROJECTIONS and cfg.quantizes(name):
            device = module.weight.device
            qweight = torch.empty(module.weight.shape, dtype=E4M3, device=device)
            scale = torch.ones(scale_shape(cfg.scheme, *module.weight.shape), device=device)
            set_fp8(module, cfg, qweight, scale)
            count += 1
    return count


def fp8_weight(linear: nn.Linear) -> Fp8Weight:
    """The projection's FP8 weight and scale as one value."""
    cfg: Fp8Config = getattr(linear, FP8_ATTR)
    rows = BLOCK if cfg.scheme == "block" else 1
    return Fp8Weight(linear.weight.detach(), getattr(linear, cfg.scale_name).detach(), cfg.scheme, rows)


def fuse_fp8(linears: list[nn.Linear]) -> Fp8Weight:
    """One FP8 weight for projections that share an input; each part's weight (and, where the blocks
    align, its scale) becomes a view into the fused tensors, as `layers.fuse_linears` does."""
    if not all(is_fp8(lin) for lin in linears):
        raise ModelLoadError("projections that share an input must all be FP8 or all unquantized "
                             "(check quantization_config's ignore list)")
    parts = [fp8_weight(lin) for lin in linears]
    scheme = parts[0].scheme
    if any(p.scheme != scheme for p in parts):
        raise ModelLoadError("fused projections mix FP8 scale schemes")
    qweight = torch.cat([p.qweight for p in parts])
    aligned = scheme == "channel" or all(p.out_features % BLOCK == 0 for p in parts[:-1])
    if aligned:
        scale = torch.cat([p.scale for p in parts])
        rows = parts[0].scale_rows
    else:
        scale = torch.cat([p.row_scales() for p in parts])
        rows = 1
    offset, scale_offset = 0, 0
    for lin, part in zip(linears, parts, strict=True):
        n = part.out_features
        lin.weight = nn.Parameter(qweight[offset : offset + n], requires_grad=False)
        cfg: Fp8Config = getattr(lin, FP8_ATTR)
        if aligned:
            s = part.scale.shape[0]
            setattr(lin, cfg.scale_name, nn.Parameter(scale[scale_offset : scale_offset + s], requires_grad=False))
            scale_offset += s
        offset += n
    return Fp8Weight(qweight, scale.contiguous(), scheme, rows)


def linear_weight(linear: nn.Linear) -> torch.Tensor | Fp8Weight:
    """What `layers.gemm_weight` prepares for a projection that is not fused with others."""
    return fp8_weight(linear) if is_fp8(linear) else linear.weight
