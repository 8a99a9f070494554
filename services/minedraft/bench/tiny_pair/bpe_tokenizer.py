"""The pair's byte-level BPE tokenizer: training, the files Hugging Face loaders read, token streams."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from minedraft.bench.tiny_pair.corpus import SourceFile

EOS_TOKEN = "<|endoftext|>"
EOS_ID = 0
VOCAB_SIZE = 2048
MAX_POSITIONS = 1024


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write pretty JSON with a trailing newline."""
    path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")


def train_bpe_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE whose id 0 is ``<|endoftext|>``."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    if tokenizer.token_to_id(EOS_TOKEN) != EOS_ID:
        raise RuntimeError(f"{EOS_TOKEN} must have id {EOS_ID}")
    return tokenizer


CHAT_TEMPLATE = Path(__file__).resolve().parents[2] / "assets" / "tiny-chat-template.jinja"


def tokenizer_config() -> dict[str, Any]:
    """The ``tokenizer_config.json`` that lets AutoTokenizer load ``tokenizer.json``, with the pair's chat
    template (Qwen-style: tools, tool calls, tool results, optional thinking)."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "unk_token": EOS_TOKEN,
        "model_max_length": MAX_POSITIONS,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            str(EOS_ID): {
                "content": EOS_TOKEN,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
        },
        "chat_template": CHAT_TEMPLATE.read_text(),
    }


def save_tokenizer(tokenizer: Tokenizer, out_dir: Path) -> None:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    write_json(out_dir / "tokenizer_config.json", tokenizer_config())
    special = {"bos_token": EOS_TOKEN, "eos_token": EOS_TOKEN, "unk_token": EOS_TOKEN}
    write_json(out_dir / "special_tokens_map.json", special)


def encode_documents(tokenizer: Tokenizer, files: list[SourceFile]) -> list[list[int]]:
    """Token ids of each file, without special tokens."""
    encodings = tokenizer.encode_batch([f.text for f in files], add_special_tokens=False)
    return [enc.ids for enc in encodings]


def concatenate_with_eos(documents: list[list[int]]) -> torch.Tensor:
    """One token stream: ``<eos> doc1 <eos> doc2 ...`` (eos separates documents)."""
    stream: list[int] = []
    for doc in documents:
        stream.append(EOS_ID)
        stream.extend(doc)
    stream.append(EOS_ID)
    return torch.tensor(stream, dtype=torch.long)
