"""Text <-> token ids for `LLM`, through the `tokenizers` package (imported lazily) and a model's tokenizer.json.

The chat template of tokenizer_config.json is text from a downloaded model folder, so it is rendered as transformers
renders it: in jinja2's immutable sandbox (`jinja2.sandbox.ImmutableSandboxedEnvironment`, jinja2 >= 3.1.6, which
has no known sandbox escapes), with the same few helpers (`raise_exception`, `strftime_now`, a `tojson` that does
not escape HTML, a `dict` and a `namespace` that refuse underscore names). A template that reaches for Python's
internals (`cycler.__init__.__globals__`) is refused with a `TemplateSecurityError`, never run. Without a template
the prompt is encoded as plain text.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

from npu_compiler.errors import InputError, NPUSimWarning

__all__ = ["Tokenizer", "render_chat_template", "TemplateSecurityError"]

MIN_JINJA2 = (3, 1, 6)  # older versions have known sandbox escapes (CVE-2024-56201, CVE-2024-56326, CVE-2025-27516)


class TemplateSecurityError(InputError):
    """A chat template tried to reach what the sandbox keeps from it (Python's internals, the file system)."""


def _jinja2_version(text: str) -> tuple[int, ...]:
    parts = []
    for p in text.split(".")[:3]:
        digits = "".join(c for c in p if c.isdigit()) if p else ""
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


@cache
def _environment() -> Any:
    """The sandboxed environment chat templates render in, made once (as transformers makes it)."""
    try:
        import jinja2
        import jinja2.ext
        import jinja2.utils
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as e:
        raise InputError("rendering a chat template needs jinja2 >= 3.1.6 (pip install 'jinja2>=3.1.6'), or give "
                         "the prompt without --chat") from e
    if _jinja2_version(jinja2.__version__) < MIN_JINJA2:
        raise InputError(f"jinja2 {jinja2.__version__} has known sandbox escapes, and a chat template is untrusted "
                         "text from a model folder: upgrade it (pip install -U 'jinja2>=3.1.6')")

    def raise_exception(message: Any) -> None:
        raise jinja2.exceptions.TemplateError(str(message))

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        # jinja2's own tojson escapes HTML characters, which a prompt must keep as they are
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    class TemplateDict:
        """`dict(...)` without the class itself (whose attributes lead to Python's internals)."""

        def __call__(self, *args: Any, **kwargs: Any) -> dict:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        """jinja2's namespace, refusing underscore names (no dunder reachable through a namespace)."""

        def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805  (jinja2's own signature trick)
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a namespace attribute may not start with '_' ({name!r})")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, dict=TemplateDict(),
                       namespace=TemplateNamespace)
    return env


def render_chat_template(template: str, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
                         where: str = "the chat template", **variables: Any) -> str:
    """`template` rendered in the sandbox over `messages`. A template that breaks out of the sandbox's rules is a
    `TemplateSecurityError`; one that fails otherwise (its own `raise_exception`, a syntax error) an `InputError`;
    both name `where`."""
    import jinja2
    from jinja2.sandbox import SecurityError

    env = _environment()
    try:
        return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                                **variables)
    except SecurityError as e:
        raise TemplateSecurityError(f"{where} tried something the sandbox forbids and was not run: {e}") from None
    except jinja2.TemplateError as e:
        raise InputError(f"{where} cannot be rendered: {type(e).__name__}: {e}") from None
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, ZeroDivisionError, OverflowError,
            RecursionError) as e:
        raise InputError(f"{where} failed while rendering: {type(e).__name__}: {e}") from None


def _named_template(value: Any) -> str | None:
    """tokenizer_config.json's `chat_template`: a string, or a list of {name, template} whose "default" is the chat
    template (as transformers reads it)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        chosen = named.get("default")
        return chosen if isinstance(chosen, str) else None
    return None


@dataclass
class Tokenizer:
    backend: Any  # tokenizers.Tokenizer
    chat_template: str | None = None
    special: dict[str, str] = field(default_factory=dict)  # bos_token, eos_token, ... from tokenizer_config.json
    template_source: str = "the chat template"  # where the template came from, for errors

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
        source = cfg_path
        if cfg_path.is_file():
            cfg = json.loads(cfg_path.read_text())
            template = _named_template(cfg.get("chat_template"))
            for k in ("bos_token", "eos_token", "pad_token", "unk_token"):
                v = cfg.get(k)
                if isinstance(v, dict):  # AddedToken form
                    v = v.get("content")
                if isinstance(v, str):
                    special[k] = v
        jinja_file = d / "chat_template.jinja"  # where transformers >= 4.50 saves it
        if jinja_file.is_file():
            template, source = jinja_file.read_text(encoding="utf-8"), jinja_file
        return cls(tok, template, special, f"the chat template of {source}")

    def apply_chat_template(self, text: str) -> str:
        """One user message rendered with the template (in the sandbox), ready for the assistant's turn; plain
        text when the model folder has no template."""
        if not self.chat_template:
            warnings.warn(NPUSimWarning("the model folder has no chat template (tokenizer_config.json's "
                                        "'chat_template' or chat_template.jinja): the prompt is encoded as plain text"),
                          stacklevel=2)
            return text
        return render_chat_template(self.chat_template, [{"role": "user", "content": text}],
                                    add_generation_prompt=True, where=self.template_source, **self.special)

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
