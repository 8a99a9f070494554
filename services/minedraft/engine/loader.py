"""Load a model from a Hugging Face folder (config.json + *.safetensors)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from minedraft.core.errors import ModelLoadError
from minedraft.engine.config import ModelConfig, load_model_config
from minedraft.engine.fp8_weights import E4M3, apply_fp8_layout
from minedraft.engine.model import CausalLM
from minedraft.engine.tensor_parallel import TPContext, local_config, read_shard

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def parse_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ModelLoadError(f"dtype {name!r} is not supported; use one of {sorted(DTYPES)}") from None


def safetensors_files(folder: Path) -> list[Path]:
    """The weight files of a folder, following a sharded index when present."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = sorted({folder / name for name in weight_map.values()})
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder}: no *.safetensors weights found")
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ModelLoadError(f"{folder}: weight files listed in the index are missing: {missing}")
    return files


def load_state(model: CausalLM, files: list[Path], tp: TPContext) -> None:
    """Copy every checkpoint tensor (this rank's shard of it) into the parameter of the same
    name, checking shapes."""
    params = dict(model.named_parameters(remove_duplicate=False))
    seen: set[str] = set()
    tied = model.config.tie_word_embeddings
    for path in files:
        try:
            handle = safe_open(str(path), framework="pt")
        except Exception as exc:  # safetensors raises several types for a corrupt header
            raise ModelLoadError(f"{path}: cannot read safetensors file ({exc})") from exc
        with handle as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                if name not in params:
                    if name.endswith("rotary_emb.inv_freq"):
                        continue
                    raise ModelLoadError(f"{path.name}: unexpected tensor {name!r} for this architecture")
                if tied and name == "lm_head.weight":
                    continue
                tensor = read_shard(f, name, tp)
                target = params[name]
                if (tensor.dtype == E4M3) != (target.dtype == E4M3):
                    raise ModelLoadError(
                        f"{path.name}: tensor {name!r} is {tensor.dtype}, the model expects {target.dtype} "
                        "(config.json's quantization_config and the weights disagree)"
                    )
                if tuple(tensor.shape) != tuple(target.shape):
                    raise ModelLoadError(
                        f"{path.name}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                        f"config.json implies {tuple(target.shape)}"
                        + (f" on tensor-parallel rank {tp.rank} of {tp.size}" if tp.size > 1 else "")
                    )
                with torch.no_grad():
                    target.copy_(tensor.to(target.dtype))
                seen.add(name)
    expected = set(params) - ({"lm_head.weight"} if tied else set())
    missing = sorted(expected - seen)
    if missing:
        raise ModelLoadError(f"checkpoint is missing tensors: {missing[:5]}{' ...' if len(missing) > 5 else ''}")


def load_model(
    folder: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    tp: TPContext | None = None,
) -> CausalLM:
    """Build the model a folder describes and fill it with the folder's weights."""
    tp = tp or TPContext()
    path = Path(folder)
    if not path.is_dir():
        raise ModelLoadError(f"model folder {folder} does not exist")
    cfg: ModelConfig = local_config(load_model_config(path), tp)
    files = safetensors_files(path)
    model = CausalLM.empty(cfg, tp.reducer(), device, dtype)
    if cfg.quantization is not None:
        apply_fp8_layout(model, cfg.quantization)
    load_state(model, files, tp)
    model = model.fuse_projections().eval()
    model.source_dir = path  # where grammar masks find the model's tokenizer.json
    return model
