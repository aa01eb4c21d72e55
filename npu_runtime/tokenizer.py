"""Text <-> token ids for `LLM`, through the `tokenizers` package (imported lazily) and a model's tokenizer.json.

The chat template of tokenizer_config.json is rendered with jinja2 when it is installed (the way transformers
renders it); without jinja2, or without a template, the prompt is encoded as plain text.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Tokenizer"]


@dataclass
class Tokenizer:
    backend: Any  # tokenizers.Tokenizer
    chat_template: str | None = None
    special: dict[str, str] = field(default_factory=dict)  # bos_token, eos_token, ... from tokenizer_config.json

    @classmethod
    def from_dir(cls, model_dir: str | os.PathLike[str]) -> Tokenizer | None:
        """The model directory's tokenizer, or None when it has no tokenizer.json."""
        d = Path(model_dir)
        if not (d / "tokenizer.json").is_file():
            return None
        from tokenizers import Tokenizer as HFTokenizer

        tok = HFTokenizer.from_file(str(d / "tokenizer.json"))
        template, special = None, {}
        cfg_path = d / "tokenizer_config.json"
        if cfg_path.is_file():
            cfg = json.loads(cfg_path.read_text())
            template = cfg.get("chat_template")
            for k in ("bos_token", "eos_token", "pad_token", "unk_token"):
                v = cfg.get(k)
                if isinstance(v, dict):  # AddedToken form
                    v = v.get("content")
                if isinstance(v, str):
                    special[k] = v
        return cls(tok, template if isinstance(template, str) else None, special)

    def apply_chat_template(self, text: str) -> str:
        """One user message rendered with the template, ready for the assistant's turn; plain text otherwise."""
        if not self.chat_template:
            return text
        try:
            import jinja2
        except ImportError:
            return text
        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)

        def raise_exception(msg: str) -> None:
            raise ValueError(msg)

        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.chat_template).render(
            messages=[{"role": "user", "content": text}], add_generation_prompt=True, **self.special
        )

    def encode(self, text: str, *, chat: bool = False) -> list[int]:
        if chat:
            # the template already holds the special tokens; the post-processor must not add them again
            return list(self.backend.encode(self.apply_chat_template(text), add_special_tokens=False).ids)
        return list(self.backend.encode(text).ids)

    def decode(self, ids: list[int], *, skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def streamer(self, emit: Callable[[str], None]) -> Callable[[int], None]:
        """A token callback that emits the new text of each token: decodes the whole tail so far and emits what
        it adds, because one token's bytes can be half a character (BPE) or need the previous token (spaces)."""
        ids: list[int] = []
        sent = [0]

        def on_token(tok: int) -> None:
            ids.append(tok)
            text = self.decode(ids)
            if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next token
                return
            emit(text[sent[0]:])
            sent[0] = len(text)

        return on_token
