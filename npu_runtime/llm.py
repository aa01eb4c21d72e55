"""`LLM`: text generation on the compiled static-cache prefill and decode programs of an `npusim export-llm` folder.

The weights are loaded once into one `WeightSet` that both executors are bound to, and the KV cache lives on the
backend as one buffer per layer and kind, allocated once and bound to both executors. The programs write those
buffers in place (their cache outputs alias the cache inputs), so a step moves only token ids, positions and a
mask to the device and one row of logits back. No torch here: this runs where only the runtime is installed.

A program may be a partitioned artifact (ops the target lacks in CPU segments): it runs as a `DAGExecutor` bound to
the same cache and step buffers, its segments' weights read from the same checkpoint (those kept the same way by
both programs uploaded once), and a cache write made on the host copied into the cache buffer after the step. Only
a torch_ir segment needs torch.
"""

from __future__ import annotations

import functools
import json
import math
import operator
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from npu_compiler.collector import collector_paused
from npu_compiler.errors import entry_point
from npu_compiler.partitioned_program import PartitionedProgram, load_artifact
from npu_compiler.program import CompiledProgram

from . import llm_io
from .backend import Backend, DeviceBuffer, get_backend
from .dag_executor import DAGExecutor, WeightPool
from .errors import NPURuntimeError
from .weights import TensorSource, WeightSet, load_weights

__all__ = ["LLM", "LLMError", "GenerationResult", "MANIFEST_FORMAT", "SUPPORTED_MODEL_TYPES", "sample_token"]

MANIFEST_FORMAT = "npusim.llm/1"
SUPPORTED_MODEL_TYPES = ("qwen2",)


class LLMError(NPURuntimeError):
    """A bad LLM folder, model directory or generation request."""


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    tokens: list[int]  # the new tokens only
    stop_reason: str  # "stop_token" or "max_new_tokens"
    prefill_seconds: float
    decode_seconds: float
    prefill_calls: int
    backend: str
    text: str | None = None

    @property
    def decode_tokens_per_s(self) -> float:
        # the first new token comes from the prefill; the others from one decode step each
        n = max(len(self.tokens) - 1, 0)
        return n / self.decode_seconds if self.decode_seconds > 0 and n else 0.0


def check_model_dir(model_dir: str | os.PathLike[str], *, need_weights: bool = True) -> dict[str, Any]:
    """config.json of a supported architecture (and safetensors, when weights are needed); its config dict."""
    d = Path(model_dir)
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise LLMError(f"{d}: not a model directory (no config.json)")
    cfg = read_json(cfg_path)
    if not isinstance(cfg, dict):
        raise LLMError(f"{cfg_path}: expected a JSON object")
    mt = cfg.get("model_type")
    if mt not in SUPPORTED_MODEL_TYPES:
        archs = ", ".join(cfg.get("architectures") or []) or "?"
        raise LLMError(f"{d}: unsupported architecture model_type={mt!r} ({archs}); supported: "
                       f"{', '.join(SUPPORTED_MODEL_TYPES)} (Qwen2ForCausalLM family)")
    if need_weights and not any(d.glob("*.safetensors")):
        raise LLMError(f"{d}: no *.safetensors weights in the model directory (only safetensors are read; "
                       "convert a pytorch_model.bin with save_pretrained(..., safe_serialization=True))")
    return cfg


def read_json(path: Path, limit: int = 64 << 20) -> Any:
    """A JSON file of an LLM folder (manifest, cache map, config): LLMError naming the file when it is not one."""
    try:
        if path.stat().st_size > limit:
            raise LLMError(f"{path}: {path.stat().st_size} bytes is too large for this file")
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LLMError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise LLMError(f"{path}: not a readable JSON file ({str(e).splitlines()[0][:100] if str(e) else e})") \
            from None


def _field(d: Any, path: str, kind: type | tuple[type, ...], where: Path) -> Any:
    """d[a][b]... for path "a.b", of type `kind` (LLMError naming the file and field otherwise)."""
    v = d
    for key in path.split("."):
        if not isinstance(v, dict) or key not in v:
            raise LLMError(f"{where}: missing '{path}' (is this an `npusim export-llm` folder?)")
        v = v[key]
    if not isinstance(v, kind) or isinstance(v, bool) and kind in (int, (int, float)):
        raise LLMError(f"{where}: '{path}' has the wrong type ({type(v).__name__})")
    if isinstance(v, int) and not isinstance(v, bool) and (v < 1 or v > 1 << 40) and path.endswith(
            ("max_cache_len", "vocab_size", "seq_len")):
        raise LLMError(f"{where}: '{path}' is {v}, outside [1, 2**40]")
    return v


def _folder_file(out: Path, name: str, where: Path) -> Path:
    """A file the manifest names: a plain name inside the folder."""
    if not name or Path(name).name != name:
        raise LLMError(f"{where}: file name {name!r} is not a plain file name inside the folder")
    return out / name


def _check_cache_map(cache_map: Any, where: Path) -> None:
    """The fields of cache_map.json that loading and generation read."""
    _field(cache_map, "model.max_cache_len", int, where)
    _field(cache_map, "model.vocab_size", int, where)
    masked = _field(cache_map, "attention_mask.masked", (int, float), where)
    if not math.isfinite(masked):
        raise LLMError(f"{where}: 'attention_mask.masked' must be finite, got {masked!r}")
    counts = []
    for kind in ("prefill", "decode"):
        _field(cache_map, f"graphs.{kind}.seq_len", int, where)
        for name in ("input_ids", "position_ids", "cache_position", "attention_mask"):
            _field(cache_map, f"graphs.{kind}.inputs.{name}", str, where)
        _field(cache_map, f"graphs.{kind}.outputs.logits", str, where)
        layers = _field(cache_map, f"graphs.{kind}.layers", list, where)
        for i, lay in enumerate(layers):
            for key in ("k_input", "v_input"):
                if not isinstance(lay, dict) or not isinstance(lay.get(key), str):
                    raise LLMError(f"{where}: graphs.{kind}.layers[{i}] needs '{key}' (a string)")
        counts.append(len(layers))
    if counts[0] != counts[1]:
        raise LLMError(f"{where}: the prefill graph has {counts[0]} cache layers, the decode graph {counts[1]}")


def _check_sampling(temperature: float, top_k: int | None, top_p: float | None, seed: int | None) -> None:
    """The sampling options: a finite temperature >= 0, top_k >= 1, top_p in (0, 1], a seed >= 0."""
    if not isinstance(temperature, int | float) or not math.isfinite(temperature) or temperature < 0:
        raise LLMError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise LLMError(f"top_k must be an integer >= 1 (or None for all tokens), got {top_k!r}")
    if top_p is not None and not (isinstance(top_p, int | float) and 0 < top_p <= 1):
        raise LLMError(f"top_p must be in (0, 1], got {top_p!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise LLMError(f"seed must be an integer >= 0 (or None), got {seed!r}")


def sample_token(logits: np.ndarray, rng: np.random.Generator, *, temperature: float = 0.0, top_k: int | None = None,
                 top_p: float | None = None) -> int:
    """Greedy (temperature 0) or sampled next token from one row of logits, HF's order: temperature, top-k, top-p."""
    x = np.asarray(logits, dtype=np.float64).reshape(-1)
    if temperature <= 0:
        return int(np.argmax(x))
    x = x / temperature
    if top_k is not None and 0 < top_k < x.size:
        kth = np.partition(x, -top_k)[-top_k]
        x = np.where(x < kth, -np.inf, x)
    p = np.exp(x - np.max(x))
    p /= p.sum()
    if top_p is not None and 0 < top_p < 1:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        # keep the smallest prefix whose mass reaches top_p (the token that crosses it stays in)
        keep = order[: int(np.searchsorted(cum, top_p)) + 1]
        q = np.zeros_like(p)
        q[keep] = p[keep]
        p = q / q.sum()
    return int(rng.choice(p.size, p=p))


@dataclass
class _Graph:
    program: CompiledProgram | PartitionedProgram
    executor: Any
    seq_len: int
    names: dict[str, str]  # input_ids, position_ids, cache_position, attention_mask, logits
    mask_dtype: str
    logits_spec: Any
    inputs: Any = None  # the executor of the step-inputs program: positions and mask from the start slot
    greedy: Any = None  # the executor of the argmax program over the logits

    def launch(self, inputs: dict[str, Any]) -> None:
        """Run the program once, its outputs left on the device (a partitioned one's as `DAGExecutor.launch`)."""
        (self.executor.launch if hasattr(self.executor, "launch") else self.executor.run)(inputs)

    @property
    def last_logits_only(self) -> bool:
        """Whether the program returns the logits of its last position only (not all T)."""
        return self.seq_len > 1 and int(self.logits_spec.shape[-2]) == 1


@dataclass
class LLM:
    out_dir: Path
    manifest: dict[str, Any]
    cache_map: dict[str, Any]
    backend: Backend
    weights: WeightSet
    cache: dict[str, DeviceBuffer]  # by cache input name (k_cache_i / v_cache_i), bound to both executors
    prefill_graph: _Graph = field(repr=False)
    decode_graph: _Graph = field(repr=False)
    model_dir: Path | None = None  # where the tokenizer is read from, on first use
    eos_token_ids: tuple[int, ...] = ()

    @functools.cached_property
    def tokenizer(self) -> Any:
        """The model directory's tokenizer (`Tokenizer`), or None without a tokenizer.json. Read on first use, not
        at load: a real model's tokenizer.json takes 0.3 s or more to parse, and running on token ids needs none."""
        if self.model_dir is None:
            return None
        from .tokenizer import Tokenizer

        try:
            return Tokenizer.from_dir(self.model_dir)
        except Exception as e:  # noqa: BLE001  (the tokenizers package's own errors name no file)
            raise LLMError(f"{self.model_dir / 'tokenizer.json'}: cannot be read as a tokenizer ({e})") from e

    # ---- loading -----------------------------------------------------------------------------------------------
    @classmethod
    @entry_point("loading the LLM folder")
    @collector_paused()
    def load(cls, out_dir: str | os.PathLike[str], backend: Backend | str | None = None, *,
             model_dir: str | os.PathLike[str] | None = None, allow_nonfinite: bool = False) -> LLM:
        """Load an export-llm folder; `model_dir` overrides the weights folder named in the manifest;
        `allow_nonfinite` loads weights holding NaN or infinities (with a warning) instead of refusing them."""
        out = Path(out_dir)
        man_path = out / "manifest.json"
        if not man_path.is_file():
            raise LLMError(f"{out}: no manifest.json (write one with `npusim export-llm`)")
        manifest = read_json(man_path)
        if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
            found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
            raise LLMError(f"{man_path}: format {found!r}, expected {MANIFEST_FORMAT!r}")
        files = {k: _folder_file(out, _field(manifest, f"files.{k}", str, man_path), man_path)
                 for k in ("cache_map", "prefill", "decode")}
        cache_map = read_json(files["cache_map"])
        _check_cache_map(cache_map, files["cache_map"])
        if manifest.get("model_dir") is not None and not isinstance(manifest["model_dir"], str):
            raise LLMError(f"{man_path}: 'model_dir' must be a string")
        mdir = model_dir or manifest.get("model_dir")
        if not mdir:
            raise LLMError(f"{out}: graphs only (exported from a built-in config); give a model directory with "
                           "weights (--model-dir DIR; in Python, LLM.load(..., model_dir=DIR))")
        mdir = Path(mdir)
        if not mdir.is_absolute() and model_dir is None:
            mdir = out / mdir  # a manifest's relative model_dir is relative to the folder (random-weights exports)
        check_model_dir(mdir)
        be = backend if isinstance(backend, Backend) else get_backend(backend)
        progs = {}
        for kind in ("prefill", "decode"):
            prog = load_artifact(files[kind])
            if prog.target != be.compile_target():
                raise LLMError(f"{out}: programs were compiled for target '{prog.target}', backend '{be.name}' runs "
                               f"'{be.compile_target()}' programs; re-export with --target {be.compile_target()}")
            progs[kind] = prog

        # One weight set for both programs: they share placeholder names (one export, same model). The decode may
        # group some differently (the prefill's last layer computes q for its last token only, so its q is not
        # concatenated with k and v there): those are loaded too. A partitioned program's segments take theirs from
        # the same pool.
        source = TensorSource(mdir)  # (the checkpoint's files opened once for both)
        pool = WeightPool(source)
        plain = [p for p in progs.values() if isinstance(p, CompiledProgram)]
        weights = (load_weights(plain[0], source, be, allow_nonfinite=allow_nonfinite) if plain
                   else WeightSet({}, pool.report, be.name))
        for prog in plain[1:]:
            missing = {w.name for w in prog.weights if w.name not in weights.buffers}
            if missing:
                weights.buffers.update(load_weights(prog, source, be, names=missing,
                                                    allow_nonfinite=allow_nonfinite).buffers)

        for kind, prog in progs.items():  # every name the cache map gives is one of the program's
            g = cache_map["graphs"][kind]
            have = {s.name for s in prog.inputs}
            named = [*g["inputs"].values(), *(lay[f"{kv}_input"] for lay in g["layers"] for kv in "kv")]
            absent = [n for n in named if n not in have]
            if absent or g["outputs"]["logits"] not in {s.name for s in prog.outputs}:
                raise LLMError(f"{files['cache_map']}: names {absent or [g['outputs']['logits']]} that the {kind} "
                               "program does not have")
        spec = {s.name: s for s in progs["prefill"].inputs}
        cache: dict[str, DeviceBuffer] = {}
        for lay in cache_map["graphs"]["prefill"]["layers"]:
            for kv in ("k", "v"):
                s = spec[lay[f"{kv}_input"]]
                cache[s.name] = be.zeros(tuple(s.shape), s.device_dtype)

        graphs = {}
        for kind, prog in progs.items():
            g = cache_map["graphs"][kind]
            # decode inputs are matched to the shared buffers by layer index, not by name
            bindings = {}
            for lay, pl in zip(g["layers"], cache_map["graphs"]["prefill"]["layers"], strict=True):
                bindings[lay["k_input"]] = cache[pl["k_input"]]
                bindings[lay["v_input"]] = cache[pl["v_input"]]
            ins = {s.name: s for s in prog.inputs}
            names = {**g["inputs"], "logits": g["outputs"]["logits"]}
            outs = {s.name: s for s in prog.outputs}
            mask_dtype = ins[names["attention_mask"]].device_dtype
            # positions and the mask are made on the device from the step's first slot, straight into the buffers
            # the model reads: a step uploads its start slot and its token ids, nothing else
            step = be.create_executor(llm_io.step_inputs(be.compile_target(), int(g["seq_len"]),
                                                         int(cache_map["model"]["max_cache_len"]), mask_dtype,
                                                         float(cache_map["attention_mask"]["masked"])))
            made = step.outputs()
            bindings.update({names[k]: made[k] for k in ("position_ids", "cache_position", "attention_mask")})
            if isinstance(prog, CompiledProgram):
                ex = be.create_executor(prog, bindings=bindings)
                ex.bind_weights(weights)
            else:
                ex = DAGExecutor(prog, be, weights=pool, bindings=bindings, allow_nonfinite=allow_nonfinite)
            logits = outs[names["logits"]]
            greedy = be.create_executor(llm_io.greedy_token(be.compile_target(), tuple(logits.shape),
                                                            logits.device_dtype),
                                        bindings={"logits": ex.outputs()[names["logits"]]})
            for e in (step, ex, greedy):
                e.prepare()  # launches resolved and device graphs captured now, not on the first token
            graphs[kind] = _Graph(prog, ex, int(g["seq_len"]), names, mask_dtype, logits, step, greedy)

        cfg = read_json(mdir / "config.json")
        gen_cfg_path = mdir / "generation_config.json"
        gen_cfg = read_json(gen_cfg_path) if gen_cfg_path.is_file() else {}
        if not isinstance(gen_cfg, dict):
            raise LLMError(f"{gen_cfg_path}: expected a JSON object")
        eos = gen_cfg.get("eos_token_id", cfg.get("eos_token_id"))
        eos_list = eos if isinstance(eos, list) else [eos]
        if not all(e is None or (isinstance(e, int) and not isinstance(e, bool)) for e in eos_list):
            raise LLMError(f"{mdir}: eos_token_id must be an integer or a list of them, got {eos!r}")
        eos_ids = tuple(int(e) for e in eos_list if e is not None)
        return cls(out, manifest, cache_map, be, weights, cache, graphs["prefill"], graphs["decode"], mdir, eos_ids)

    # ---- facts -------------------------------------------------------------------------------------------------
    @property
    def max_cache_len(self) -> int:
        return int(self.cache_map["model"]["max_cache_len"])

    @property
    def prefill_len(self) -> int:
        return self.prefill_graph.seq_len

    @property
    def vocab_size(self) -> int:
        return int(self.cache_map["model"]["vocab_size"])

    @property
    def executors(self) -> dict[str, Any]:
        return {"prefill": self.prefill_graph.executor, "decode": self.decode_graph.executor}

    # ---- one program call --------------------------------------------------------------------------------------
    def _run(self, g: _Graph, ids: np.ndarray, start: int, front_pads: int = 0) -> None:
        """Run `g` on ids at cache slots start..start+T-1 (its logits stay on the device); with `front_pads`, the
        first rows of ids are padding and the tokens after them take slots from `start` on (see
        `llm_io.step_inputs`). The step-inputs program writes the positions and the mask (query at position p sees
        slots 0..p) where `g` reads them."""
        self._step_inputs(g, start, front_pads)
        g.launch({g.names["input_ids"]: ids.reshape(1, g.seq_len).astype(np.int64)})

    @staticmethod
    def _step_inputs(g: _Graph, start: int, front_pads: int = 0) -> None:
        """The positions and the mask of a step of `g` at slot `start`, written on the device where `g` reads them."""
        g.inputs.run({"start": np.array([start], np.int64), "front_pads": np.array([front_pads], np.int64)})

    def _logits(self, g: _Graph) -> np.ndarray:
        """The last run's logits [rows, V] as float32 on the host."""
        logits = g.executor.outputs()[g.names["logits"]].to_numpy(g.logits_spec)
        return np.asarray(logits, dtype=np.float32).reshape(-1, logits.shape[-1])

    def _greedy(self, g: _Graph) -> int:
        """The argmax of the last run's last row of logits, computed on the device (one id comes back)."""
        return int(g.greedy.run({})["token"].to_numpy().reshape(-1)[0])

    def _call(self, g: _Graph, ids: np.ndarray, start: int) -> np.ndarray:
        """Run `g` on ids at cache slots start..start+T-1; its logits as float32 [rows, V] (rows: T, or 1 for a
        program that keeps the last position's only)."""
        self._run(g, ids, start)
        return self._logits(g)

    def prefill(self, prompt_ids: Sequence[int]) -> tuple[np.ndarray, int]:
        """Write the prompt's K/V into cache slots 0..n-1; the logits after its last token and the calls made."""
        got, calls = self._prefill(prompt_ids, lambda g: self._logits(g)[-1])
        return got, calls

    def _prefill(self, prompt_ids: Sequence[int], result: Callable[[_Graph], Any]) -> tuple[Any, int]:
        """Prefill, then `result(graph)` of the call that ran the prompt's last token.

        Chunks of prefill_len run in order. A last chunk shorter than prefill_len is instead re-aligned to end at
        the prompt's end (it recomputes a few tokens that are already cached, which writes the same values), so
        no padding is needed once the prompt is at least one chunk long. A prompt shorter than one chunk is one
        call with P - n padding rows in front (`llm_io.step_inputs`): the prompt takes slots 0..n-1 and ends on the
        program's last row, whose logits a last-position-only prefill keeps; the pads take slots n..P-1, no real
        query sees them (the mask), and each decode step writes its slot before it attends to it, so they are
        overwritten before anyone reads them. A one-token prompt is one decode step. `calls` counts every program
        call spent on the prompt.
        """
        ids = np.asarray(list(prompt_ids), dtype=np.int64)
        n, P = len(ids), self.prefill_len
        self._check_ids(ids)
        g = self.prefill_graph
        if n == 1:
            self._run(self.decode_graph, ids, 0)
            return result(self.decode_graph), 1
        if n < P:
            padded = np.zeros(P, np.int64)
            padded[P - n:] = ids
            self._run(g, padded, 0, front_pads=P - n)
            return result(g), 1
        starts = list(range(0, n - P + 1, P))
        if starts[-1] + P < n:
            starts.append(n - P)
        for s in starts:
            self._run(g, ids[s:s + P], s)
        return result(g), len(starts)

    def decode_step(self, token_id: int, position: int) -> np.ndarray:
        """Feed one token at cache slot `position` (attends to slots 0..position); the next-token logits [V]."""
        if not 0 <= position < self.max_cache_len:
            raise LLMError(f"decode position {position} outside the cache (max_cache_len {self.max_cache_len})")
        return self._call(self.decode_graph, np.asarray([token_id], np.int64), position)[0]

    def _check_ids(self, ids: np.ndarray) -> None:
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise LLMError(f"token ids must be in [0, {self.vocab_size}); got min {ids.min()}, max {ids.max()}")

    # ---- generation --------------------------------------------------------------------------------------------
    @entry_point("generating")
    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        *,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop_tokens: Sequence[int] | None = None,
        stream: Callable[[int], None] | None = None,
    ) -> GenerationResult:
        """Generate up to max_new_tokens after the prompt. temperature 0 is greedy; `stop_tokens` None means the
        model's eos tokens ([] for none). `stream` is called with each new token id as soon as it exists."""
        try:
            prompt = [operator.index(t) for t in prompt_ids]
        except TypeError:
            raise LLMError(f"prompt token ids must be integers, got {list(prompt_ids)[:8]!r}") from None
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
            raise LLMError(f"max_new_tokens must be an integer, got {max_new_tokens!r}")
        n = len(prompt)
        if n == 0:
            raise LLMError("empty prompt: give at least one token")
        if max_new_tokens < 1:
            raise LLMError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        # The prompt takes n slots and every new token but the last is fed back: n + max_new_tokens - 1 slots.
        need = n + max_new_tokens - 1
        if need > self.max_cache_len:
            raise LLMError(f"prompt of {n} tokens + {max_new_tokens} new tokens needs {need} cache slots, but the "
                           f"export has max_cache_len {self.max_cache_len}; shorten the prompt, lower "
                           f"max_new_tokens or re-export with a larger --max-cache-len")
        _check_sampling(temperature, top_k, top_p, seed)
        self._check_ids(np.asarray(prompt))
        stops = set(self.eos_token_ids if stop_tokens is None else (int(t) for t in stop_tokens))
        rng = np.random.default_rng(seed)

        def pick(lg: np.ndarray) -> int:
            return sample_token(lg, rng, temperature=temperature, top_k=top_k, top_p=top_p)

        greedy = temperature <= 0

        def next_token(g: _Graph) -> int:
            # greedy: the argmax on the device, one id read back; sampling needs the logits on the host
            return self._greedy(g) if greedy else pick(self._logits(g)[-1])

        t0 = time.perf_counter()
        (tok, last), calls = self._prefill(prompt, lambda g: (next_token(g), g))
        self.backend.synchronize()
        t_prefill = time.perf_counter() - t0
        out = [tok]
        if stream:
            stream(tok)
        reason = "stop_token" if tok in stops else "max_new_tokens"
        t1 = time.perf_counter()
        pos = n
        if greedy and reason != "stop_token" and len(out) < max_new_tokens:
            reason = self._decode_ahead(out, last.greedy.outputs()["token"], pos, max_new_tokens, stops, stream)
        while reason != "stop_token" and len(out) < max_new_tokens:
            self._run(self.decode_graph, np.asarray([tok], np.int64), pos)
            tok = next_token(self.decode_graph)
            pos += 1
            out.append(tok)
            if stream:
                stream(tok)
            if tok in stops:
                reason = "stop_token"
        self.backend.synchronize()
        t_decode = time.perf_counter() - t1
        return GenerationResult(prompt, out, reason, t_prefill, t_decode, calls, self.backend.name)

    def _decode_ahead(self, out: list[int], token: Any, pos: int, max_new_tokens: int, stops: set[int],
                      stream: Callable[[int], None] | None) -> str:
        """Greedy decoding with one step queued ahead. Each step takes its input id from the device buffer the
        previous step's argmax wrote (`token` for the first), so no step waits for the host, and the host reads each
        id back while the next step runs: on a GPU the steps run back to back. A step queued after a stop token
        only writes the cache slot past the generation's end, and its id is not used. Tokens are appended to
        `out`; returns the stop reason."""
        g = self.decode_graph
        ids = g.names["input_ids"]

        def queue(source: Any, at: int) -> Callable[[], np.ndarray]:
            self._step_inputs(g, at)
            g.launch({ids: source})
            return g.greedy.run({})["token"].read_later()

        made = g.greedy.outputs()["token"]
        pending: Callable[[], np.ndarray] | None = queue(token, pos)
        queued = len(out) + 1
        while pending is not None:
            ahead = None
            if queued < max_new_tokens:
                ahead = queue(made, pos + 1)
                queued += 1
            tok = int(pending().reshape(-1)[0])
            pos += 1
            out.append(tok)
            if stream:
                stream(tok)
            if tok in stops:
                return "stop_token"
            pending = ahead
        return "max_new_tokens"

    @entry_point("generating")
    def generate_text(self, prompt: str, max_new_tokens: int, *, chat: bool = False,
                      stream_text: Callable[[str], None] | None = None, **kwargs: Any) -> GenerationResult:
        """Text in, text out through the model directory's tokenizer.json (chat template when `chat`)."""
        if self.tokenizer is None:
            raise LLMError("the model directory has no tokenizer.json: give token ids (generate / --prompt-ids)")
        ids = self.tokenizer.encode(prompt, chat=chat)
        stream = None
        if stream_text is not None:
            stream = self.tokenizer.streamer(stream_text)
        res = self.generate(ids, max_new_tokens, stream=stream, **kwargs)
        res.text = self.tokenizer.decode(res.tokens)
        return res
