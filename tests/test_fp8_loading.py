"""FP8 checkpoints: both layouts the quantizer writes load from the bundled tiny target, every FP8
linear stays within 3% of its bf16 dequantized reference, and layouts or configs that cannot be
served fail at load with the field that is wrong."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from minedraft.bench.fp8_quantizer import quantize_weight, scheme_config, write_fp8_checkpoint
from minedraft.bundled import TINY_TARGET
from minedraft.core.errors import ModelLoadError
from minedraft.engine.config import model_config_from_dict
from minedraft.engine.fp8_weights import E4M3, Fp8Weight
from minedraft.engine.layers import linear
from minedraft.engine.loader import load_model
from minedraft.engine.tensor_parallel import TPContext, local_config, read_shard

SCHEMES = ("block", "channel")


@pytest.fixture(scope="module")
def fp8_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fp8")
    return {scheme: write_fp8_checkpoint(TINY_TARGET, root / scheme, scheme) for scheme in SCHEMES}


def projection_weights(model) -> list[tuple[str, object]]:
    layer = model.model.layers[0]
    return [("qkv", layer.self_attn.qkv_weight), ("o", layer.self_attn.o_weight),
            ("gate_up", layer.mlp.gate_up_weight), ("down", layer.mlp.down_weight)]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_both_layouts_load_with_fp8_projections_and_dense_rest(fp8_folders: dict[str, Path], scheme: str) -> None:
    model = load_model(fp8_folders[scheme])
    assert model.config.quantization is not None and model.config.quantization.scheme == scheme
    scale_name = "weight_scale_inv" if scheme == "block" else "weight_scale"
    params = dict(model.named_parameters())
    assert params["model.layers.0.self_attn.q_proj.weight"].dtype == E4M3
    assert params[f"model.layers.3.mlp.down_proj.{scale_name}"].dtype == torch.float32
    assert params["model.embed_tokens.weight"].dtype == torch.float32
    assert params["model.norm.weight"].dtype == torch.float32
    for _, weight in projection_weights(model):
        assert isinstance(weight, Fp8Weight) and weight.scheme == scheme and weight.dense is not None
    with safe_open(str(fp8_folders[scheme] / "model.safetensors"), "pt") as f:
        shape = f.get_slice(f"model.layers.0.self_attn.q_proj.{scale_name}").get_shape()
    assert shape == ([2, 2] if scheme == "block" else [256, 1])  # q_proj is [256, 256]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("tails", [False, True], ids=["normal", "outliers"])
def test_each_fp8_linear_is_within_3_percent_of_its_bf16_dequantized_reference(
        fp8_folders: dict[str, Path], scheme: str, tails: bool) -> None:
    model = load_model(fp8_folders[scheme])
    gen = torch.Generator().manual_seed(3)
    for name, weight in projection_weights(model):
        assert isinstance(weight, Fp8Weight)
        x = torch.randn(24, weight.in_features, generator=gen)
        if tails:  # heavy-tailed activations, as hidden states with outlier features have
            x = x * torch.exp(torch.randn(weight.in_features, generator=gen))
        want = x.bfloat16().float() @ weight.dequantize(torch.bfloat16).float().T
        got = linear(x, weight)
        assert float((got - want).norm() / want.norm()) < 0.03, name


def test_block_scales_round_trip_a_weight_blockwise() -> None:
    w = torch.randn(300, 200) * torch.linspace(0.1, 10, 300)[:, None]
    q, scale = quantize_weight(w, "block")
    assert q.dtype == E4M3 and scale.shape == (3, 2)
    back = Fp8Weight(q, scale, "block", 128).dequantize()
    assert float((back - w).norm() / w.norm()) < 0.04
    assert float(scale[2, 0]) == pytest.approx(float(w[256:, :128].abs().max()) / 448)


def test_in_memory_quantization_matches_the_written_checkpoint(fp8_folders: dict[str, Path]) -> None:
    from minedraft.bench.fp8_quantizer import quantize_model

    loaded = load_model(fp8_folders["channel"])
    quantized = quantize_model(load_model(TINY_TARGET), "channel")
    for (name, a), (_, b) in zip(projection_weights(loaded), projection_weights(quantized), strict=True):
        assert torch.equal(a.qweight.float(), b.qweight.float()) and torch.equal(a.scale, b.scale), name


def test_weights_that_disagree_with_the_quantization_config_are_refused(tmp_path: Path) -> None:
    shutil.copytree(TINY_TARGET, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["quantization_config"] = scheme_config("block")[1]
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"_proj.weight' is torch.bfloat16, the model expects "
                                             r"torch.float8_e4m3fn"):
        load_model(tmp_path / "m")


def raw_config(quantization: dict) -> dict:
    return {**json.loads((TINY_TARGET / "config.json").read_text()), "quantization_config": quantization}


CHANNEL = scheme_config("channel")[1]
BAD_CONFIGS = [
    ({"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]},
     r"activation_scheme = 'static' is not supported"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, r"weight_block_size = None .*per-tensor"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [64, 64]},
     r"weight_block_size = \[64, 64\]"),
    ({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]}, r"fmt = 'e5m2'"),
    ({"quant_method": "fbgemm_fp8"}, r"quant_method = 'fbgemm_fp8' is not supported"),
    ({**CHANNEL, "kv_cache_scheme": {"num_bits": 8}}, r"kv_cache_scheme"),
    ({**CHANNEL, "config_groups": {"g": {**CHANNEL["config_groups"]["group_0"],
                                         "weights": {"num_bits": 8, "type": "float", "strategy": "tensor"}}}},
     r"config_groups.g.weights.strategy = 'tensor'"),
    ({**CHANNEL, "config_groups": {"g": {**CHANNEL["config_groups"]["group_0"],
                                         "input_activations": {"num_bits": 8, "type": "float", "dynamic": True,
                                                               "strategy": "tensor"}}}},
     r"input_activations.strategy = 'tensor' .*per-tensor activation scales"),
    ({**CHANNEL, "config_groups": {"g": {**CHANNEL["config_groups"]["group_0"], "input_activations": None}}},
     r"input_activations = None"),
    ({**CHANNEL, "config_groups": {"g": {**CHANNEL["config_groups"]["group_0"],
                                         "weights": {"num_bits": 4, "type": "int", "strategy": "channel"}}}},
     r"weights.num_bits = 4"),
]


@pytest.mark.parametrize("quantization, message", BAD_CONFIGS, ids=[m.split(" ")[0] for _, m in BAD_CONFIGS])
def test_unsupported_quantization_configs_name_the_field(quantization: dict, message: str) -> None:
    with pytest.raises(ModelLoadError, match=message):
        model_config_from_dict(raw_config(quantization))


def test_block_weights_that_do_not_split_into_whole_blocks_refuse_tensor_parallelism() -> None:
    cfg = model_config_from_dict(raw_config(scheme_config("block")[1]))
    with pytest.raises(ModelLoadError, match=r"cannot be split 2 ways: num_key_value_heads \* head_dim \(128\)"):
        local_config(cfg, TPContext(rank=0, size=2))
    channel = model_config_from_dict(raw_config(CHANNEL))
    assert local_config(channel, TPContext(rank=0, size=2)).num_kv_heads == 1


def test_fp8_scales_shard_with_their_weights(tmp_path: Path) -> None:
    tensors = {"model.layers.0.self_attn.q_proj.weight_scale": torch.arange(8.0)[:, None],
               "model.layers.0.self_attn.o_proj.weight_scale": torch.arange(8.0)[:, None],
               "model.layers.0.mlp.down_proj.weight_scale_inv": torch.arange(8.0).view(2, 4)}
    save_file(tensors, str(tmp_path / "s.safetensors"))
    tp = TPContext(rank=1, size=2)
    with safe_open(str(tmp_path / "s.safetensors"), "pt") as f:
        q = read_shard(f, "model.layers.0.self_attn.q_proj.weight_scale", tp)
        o = read_shard(f, "model.layers.0.self_attn.o_proj.weight_scale", tp)
        down = read_shard(f, "model.layers.0.mlp.down_proj.weight_scale_inv", tp)
    assert q.flatten().tolist() == [4.0, 5.0, 6.0, 7.0]  # column-parallel: this rank's output rows
    assert o.flatten().tolist() == list(range(8))  # row-parallel, per output row: every rank needs all
    assert down.tolist() == [[2.0, 3.0], [6.0, 7.0]]  # row-parallel blocks: this rank's input columns


def test_quantize_model_replaces_fused_weights_registered_as_parameters() -> None:
    """On CUDA `fuse()` keeps o/down weights as the registered Parameters themselves; re-fusing as FP8 replaces them."""
    from torch import nn

    from minedraft.bench.fp8_quantizer import quantize_model

    model = load_model(TINY_TARGET)
    for layer in model.model.layers:
        layer.self_attn.o_weight = nn.Parameter(layer.self_attn.o_proj.weight, requires_grad=False)
        layer.mlp.down_weight = nn.Parameter(layer.mlp.down_proj.weight, requires_grad=False)
    quantize_model(model, "block")
    assert all(isinstance(w, Fp8Weight) for _, w in projection_weights(model))
    assert "model.layers.0.self_attn.o_weight" not in dict(model.named_parameters())
