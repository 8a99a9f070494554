"""Make FP8 versions of a model: checkpoint folders in the two layouts the loader reads, or an
in-memory CausalLM quantized in place (the synthetic 8B pair has no folder).

`python -m minedraft.bench.fp8_quantizer SRC DST [--scheme block|channel]` writes DST from a bf16/f32
Hugging Face folder: block is `quant_method: fp8` with 128x128 blocks and `weight_scale_inv`
(Qwen3-*-FP8's layout), channel is compressed-tensors with per-channel `weight_scale` [out, 1].
The q/k/v/o and MLP projections become e4m3; embeddings, norms and the head keep their dtype.
Scales are the round-trip multipliers (W ~ W_fp8 * scale) from each block's or row's absolute max.
"""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from minedraft.engine.fp8_config import BLOCK, Fp8Config
from minedraft.engine.fp8_weights import E4M3, E4M3_MAX, PROJECTIONS, set_fp8
from minedraft.engine.model import CausalLM

WEIGHT_FLOOR = 1e-12  # amax floor, so an all-zero block or row gets a finite scale
FUSED = ("qkv_weight", "o_weight", "gate_up_weight", "down_weight")  # what fuse() sets on each layer's modules
WEIGHT_FORMATS = {"bf16": "", "fp8": "block", "fp8-channel": "channel"}  # the benches' --weights -> scheme ("": none)


def quantize_weight(weight: torch.Tensor, scheme: str = "block") -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 [N, K], float32 scales): [ceil(N/128), ceil(K/128)] for block, [N, 1] for channel."""
    w = weight.detach().float()
    n, k = w.shape
    if scheme == "channel":
        scale = w.abs().amax(1, keepdim=True).clamp(min=WEIGHT_FLOOR) / E4M3_MAX
        return (w / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale
    nb, kb = -(-n // BLOCK), -(-k // BLOCK)
    blocks = F.pad(w, (0, kb * BLOCK - k, 0, nb * BLOCK - n)).view(nb, BLOCK, kb, BLOCK)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=WEIGHT_FLOOR) / E4M3_MAX
    q = (blocks / scale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q.view(nb * BLOCK, kb * BLOCK)[:n, :k].contiguous(), scale


def scheme_config(scheme: str) -> tuple[Fp8Config, dict[str, Any]]:
    """The loader's view of a scheme and the `quantization_config` a checkpoint of it carries."""
    if scheme == "block":
        raw: dict[str, Any] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                               "weight_block_size": [BLOCK, BLOCK]}
        return Fp8Config("block", "weight_scale_inv"), raw
    if scheme != "channel":
        raise ValueError(f"scheme {scheme!r}: use block or channel")
    group = {"targets": ["Linear"],
             "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True,
                         "dynamic": False, "group_size": None, "block_structure": None},
             "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True,
                                   "dynamic": True, "group_size": None},
             "output_activations": None}
    raw = {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
           "config_groups": {"group_0": group}, "ignore": ["lm_head"], "kv_cache_scheme": None}
    return Fp8Config("channel", "weight_scale", ("lm_head",)), raw


def quantize_model(model: CausalLM, scheme: str = "block") -> CausalLM:
    """Quantize a loaded (bf16/f32) model's projections to FP8 in place, on their device, and
    re-fuse them; returns the model, whose config now names the scheme."""
    cfg, _ = scheme_config(scheme)
    for module in model.modules():  # a weight fuse() left as-is on CUDA is a registered Parameter: unregister it
        for attr in FUSED:
            if module._parameters.pop(attr, None) is not None:
                setattr(module, attr, None)
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in PROJECTIONS:
                qweight, scale = quantize_weight(module.weight, scheme)
                set_fp8(module, cfg, qweight, scale)
    model.config = replace(model.config, quantization=cfg)
    return model.fuse_projections()


def _quantized_tensors(tensors: dict[str, torch.Tensor], cfg: Fp8Config) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and module.rsplit(".", 1)[-1] in PROJECTIONS and cfg.quantizes(module):
            out[name], out[f"{module}.{cfg.scale_name}"] = quantize_weight(tensor, cfg.scheme)
        else:
            out[name] = tensor.contiguous()
    return out


def write_fp8_checkpoint(src: str | Path, dst: str | Path, scheme: str = "block") -> Path:
    """Write an FP8 copy of the Hugging Face folder `src` into `dst` (created); returns dst."""
    from safetensors.torch import load_file, save_file

    src, dst = Path(src), Path(dst)
    cfg, raw = scheme_config(scheme)
    dst.mkdir(parents=True, exist_ok=True)
    index_path = src / "model.safetensors.index.json"
    weight_map: dict[str, str] = {}
    for path in sorted(src.glob("*.safetensors")):
        tensors = _quantized_tensors(load_file(str(path)), cfg)
        save_file(tensors, str(dst / path.name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, path.name))
    for path in src.iterdir():
        if path.is_file() and path.suffix != ".safetensors" and path.name not in ("config.json", index_path.name):
            shutil.copy2(path, dst / path.name)
    if index_path.is_file():
        index = json.loads(index_path.read_text())
        index["weight_map"] = weight_map
        (dst / index_path.name).write_text(json.dumps(index, indent=2))
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = raw
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m minedraft.bench.fp8_quantizer", description=__doc__)
    parser.add_argument("src", help="a bf16/f32 Hugging Face model folder")
    parser.add_argument("dst", help="the FP8 folder to write")
    parser.add_argument("--scheme", choices=("block", "channel"), default="block")
    args = parser.parse_args(argv)
    print(write_fp8_checkpoint(args.src, args.dst, args.scheme))


if __name__ == "__main__":
    main()
