"""Train the tiny target + draft Llama pair bundled with minedraft.

Why this exists: minedraft's tests, demos and CI need a real speculative-decoding
model pair that is small enough to ship in the repository (< 15 MB), runs on a
CPU, and was produced without network access.  This script builds that pair
reproducibly from data every machine has offline -- the Python standard library
sources -- so anyone can regenerate (or audit) the bundled weights:

1. collect the stdlib ``*.py`` files, hold out ~2 % of them by path hash;
2. train a 2048-token byte-level BPE tokenizer on the training files;
3. train a 4-layer Llama target on random 256-token windows;
4. distil a 1-layer Llama draft from the target's logits;
5. save both in Hugging Face format (bfloat16 safetensors + tokenizer files);
6. measure held-out loss and greedy draft acceptance at k=4, and write
   ``services/minedraft/assets/TINY_PAIR.md``.

Run ``python -m minedraft.bench.tiny_pair`` to reproduce the bundled pair, or add
``--eval-only`` to re-measure the saved models.
"""
