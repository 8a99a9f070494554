"""Load an EAGLE head folder (SafeAILab's or the `speculators` layout) beside its target.

Checkpoint names differ by layout only in a few prefixes: SafeAILab's EAGLE-3 keeps its layer under
`midlayer.`, speculators' EAGLE-1 under `transformer.` with `fusion_fc`; everything else is already the
head's own name. Weights come from `*.safetensors` or, as SafeAILab publishes them, `pytorch_model.bin`
(read with torch's weights-only unpickler). The target's embedding, and for EAGLE-1 its lm_head, are
copied onto the head's device: the head needs them there, and the target may live on another device
(or process) altogether.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from minedraft.core.errors import ModelLoadError
from minedraft.engine.config import ModelConfig
from minedraft.engine.eagle_config import EagleConfig, load_eagle_config
from minedraft.engine.eagle_head import EagleHead

RENAMES = (("midlayer.", "layers.0."), ("transformer.", "layers.0."), ("fusion_fc.", "fc."), ("model.", ""))
SHARED = ("embed_tokens.weight", "lm_head.weight")  # from the target when the folder has none
IGNORED = ("t2d", "rotary_emb.inv_freq")
# What a head shares with its target, by the target's name, for a head on this device in this dtype:
# (embedding, lm_head, the target's config); the head copies them onto its device in its dtype either way.
TargetShared = Callable[[str | Path, str | torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor, ModelConfig]]


def _tensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    files = sorted(folder.glob("*.safetensors"))
    if files:
        for path in files:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                    yield name, f.get_tensor(name)
        return
    bins = sorted(folder.glob("pytorch_model*.bin"))
    if not bins:
        raise ModelLoadError(f"{folder}: no *.safetensors or pytorch_model.bin weights found")
    for path in bins:
        state = torch.load(path, map_location="cpu", weights_only=True)
        yield from state.items()


def head_name(name: str) -> str:
    for old, new in RENAMES:
        if name.startswith(old):
            name = new + name[len(old):]
    return name


def load_eagle_head(folder: str | Path, target_embed: torch.Tensor, target_head: torch.Tensor,
                    target_config: ModelConfig, device: str | torch.device = "cpu",
                    dtype: torch.dtype = torch.float32) -> EagleHead:
    """The head in `folder`, with the target's embedding (and EAGLE-1's lm_head) copied onto `device`."""
    path = Path(folder)
    if not path.is_dir():
        raise ModelLoadError(f"EAGLE head folder {folder} does not exist")
    eagle: EagleConfig = load_eagle_config(path, target_config)
    head = EagleHead.empty(eagle, device, dtype)
    params = {**dict(head.named_parameters()), "d2t": head.d2t}
    seen: set[str] = set()
    for raw_name, tensor in _tensors(path):
        name = head_name(raw_name)
        if name in IGNORED or name.endswith("rotary_emb.inv_freq"):
            continue
        if name == "lm_head.weight" and eagle.version == 1:
            continue  # EAGLE-1 drafts through the target's head
        if name not in params:
            raise ModelLoadError(f"{path.name}: unexpected tensor {raw_name!r} for an EAGLE-{eagle.version} head")
        dest = params[name]
        if tuple(tensor.shape) != tuple(dest.shape):
            raise ModelLoadError(f"{path.name}: tensor {raw_name!r} has shape {tuple(tensor.shape)}, "
                                 f"config.json implies {tuple(dest.shape)}")
        with torch.no_grad():
            dest.copy_(tensor.to(dest.dtype))
        seen.add(name)
    shared = {"embed_tokens.weight": target_embed, "lm_head.weight": target_head}
    for name in SHARED:
        if name not in seen and (name == "embed_tokens.weight" or eagle.version == 1):
            with torch.no_grad():
                params[name].copy_(shared[name].to(device, dtype))
            seen.add(name)
    if eagle.version == 3 and eagle.draft_vocab_size != target_config.vocab_size and "d2t" not in seen:
        raise ModelLoadError(f"{path.name}: an EAGLE-3 head with a reduced vocabulary needs its d2t map")
    seen.add("d2t")
    for name, fill in (("fc.bias", 0.0), ("layers.0.input_layernorm.weight", 1.0)):
        if name in params and name not in seen and (name == "fc.bias" or eagle.version == 1):
            with torch.no_grad():  # EAGLE-1's layer has no input norm; a head trained without fc's bias
                params[name].fill_(fill)
            seen.add(name)
    missing = sorted(set(params) - seen)
    if missing:
        raise ModelLoadError(f"EAGLE head is missing tensors: {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    head = head.fuse_projections().eval()
    head.source_dir = getattr(target_config, "source_dir", None)
    return head


def target_shared(target_folder: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
                  ) -> tuple[torch.Tensor, torch.Tensor, ModelConfig]:
    """The target's embedding, lm_head (the embedding where they are tied) and config, read from its folder's
    safetensors by name, never the whole target (as stored: the head copies them)."""
    from minedraft.engine.config import load_model_config
    from minedraft.engine.loader import safetensors_files

    target_path = Path(target_folder)
    cfg = load_model_config(target_path)
    wanted = {"model.embed_tokens.weight": None, "lm_head.weight": None}
    for file in safetensors_files(target_path):
        with safe_open(str(file), framework="pt") as f:
            for name in wanted:
                if wanted[name] is None and name in f.keys():  # noqa: SIM118
                    wanted[name] = f.get_tensor(name)
    embed = wanted["model.embed_tokens.weight"]
    if embed is None:
        raise ModelLoadError(f"{target_folder}: no model.embed_tokens.weight to share with the EAGLE head")
    lm_head = wanted["lm_head.weight"] if wanted["lm_head.weight"] is not None else embed  # tied
    return embed, lm_head, cfg


def load_head_for_target(folder: str | Path, target_folder: str | Path, device: str | torch.device = "cpu",
                         dtype: torch.dtype = torch.float32, shared: TargetShared = target_shared) -> EagleHead:
    """A draft service's load: the head plus only what it shares with the target (`shared`: from the target's
    folder; the GPU benchmark's synthetic target builds them instead)."""
    embed, lm_head, cfg = shared(target_folder, device, dtype)
    head = load_eagle_head(folder, embed, lm_head, cfg, device, dtype)
    target_path = Path(target_folder)
    head.source_dir = target_path if target_path.is_dir() else None
    return head
