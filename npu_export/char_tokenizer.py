"""A small character-level BPE tokenizer built with the `tokenizers` package, for a model with random weights: every
id of the model's vocabulary decodes to readable text, printable ASCII text encodes, and nothing is downloaded.

Ids: 0 `<unk>` (any character outside printable ASCII), 1 `<|endoftext|>` (the end-of-sequence token), then the
printable ASCII characters and newline (a space is "▁", as in SentencePiece), then merges in a fixed order (a
space and a letter, letter pairs with and without a leading space, then one letter more at a time), as many as
the vocabulary has room for.
"""

from __future__ import annotations

import json
import os
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ._atomic import atomic_write_text

__all__ = ["EOS_TOKEN", "UNK_TOKEN", "build_char_tokenizer", "save_char_tokenizer"]

UNK_TOKEN = "<unk>"
EOS_TOKEN = "<|endoftext|>"
SPACE = "\u2581"
CHARS = [SPACE, *(c for c in string.printable if c not in " \t\r\x0b\x0c")]  # 94 visible + newline + space
MIN_VOCAB = 2 + len(CHARS)


def _merges() -> Iterator[tuple[str, str]]:
    level = [""]
    while True:
        longer = []
        for p in level:
            for c in string.ascii_lowercase:
                if p:
                    yield p, c
                    yield SPACE + p, c
                else:
                    yield SPACE, c
                longer.append(p + c)
        level = longer


def build_char_tokenizer(vocab_size: int) -> Any:
    """A `tokenizers.Tokenizer` with exactly `vocab_size` ids (at least MIN_VOCAB = 98)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    if vocab_size < MIN_VOCAB:
        raise ValueError(f"the character tokenizer needs a vocabulary of at least {MIN_VOCAB}, got {vocab_size}")
    vocab = {UNK_TOKEN: 0, EOS_TOKEN: 1, **{c: 2 + i for i, c in enumerate(CHARS)}}
    merges: list[tuple[str, str]] = []
    for left, right in _merges():
        if len(vocab) >= vocab_size:
            break
        vocab[left + right] = len(vocab)
        merges.append((left, right))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=UNK_TOKEN))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="never")
    tok.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme="never")
    tok.add_special_tokens([UNK_TOKEN, EOS_TOKEN])
    return tok


def save_char_tokenizer(out_dir: str | os.PathLike[str], vocab_size: int) -> int:
    """Write tokenizer.json and tokenizer_config.json into `out_dir`; the end-of-sequence token's id."""
    tok = build_char_tokenizer(vocab_size)
    out = Path(out_dir)
    atomic_write_text(out / "tokenizer.json", tok.to_str())
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": UNK_TOKEN, "eos_token": EOS_TOKEN}
    atomic_write_text(out / "tokenizer_config.json", json.dumps(cfg, indent=2) + "\n")
    return int(tok.token_to_id(EOS_TOKEN))
