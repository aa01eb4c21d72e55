"""A zoo of small random-weight models of many architectures, built from `transformers` config classes.

Each entry builds a real Hugging Face model at a tiny size (2 layers, hidden 64, small vocabularies and images) with
random weights, wraps its forward so that it takes tensors and returns tensors, and exports it with `torch_ir` on the
meta device. The test suite verifies every entry against PyTorch on every backend (`tests/test_zoo.py`), and
`python bench/op_coverage.py` reports the ops they use (`docs/op_coverage.md`).

    from npu_export.zoo import ZOO, export_zoo_model
    ex = export_zoo_model("llama-eager")      # ex.ir (dict), ex.weights, ex.inputs, ex.eager (PyTorch's outputs)

An entry whose `transformers` classes are missing (an older or newer release) raises `ZooUnavailable` naming them.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from . import zoo_nn
from ._meta import lifted_constants, meta_clone
from ._quiet import quiet_transformers
from .ir_io import ir_to_dict

__all__ = ["FAMILIES", "ZOO", "ZooExport", "ZooModel", "ZooUnavailable", "build_zoo_model", "export_zoo_model",
           "zoo_names"]

# Families share a tolerance policy (tests/test_zoo.py) and a story: what kind of graph they make.
FAMILIES = {
    "encoder": "text encoders (BERT-like): layer_norm, GELU, bidirectional attention with a padding mask",
    "decoder": "causal LMs: RMSNorm or layer_norm, RoPE or learned positions, causal masks built in the graph",
    "moe": "mixture-of-experts causal LM: router top-k, experts as batched matmuls",
    "ssm": "state-space LM (Mamba): depthwise conv1d, softplus, a selective scan unrolled over time",
    "audio": "audio encoder (Whisper): conv1d front end, then a transformer encoder",
    "vit": "vision transformers: patch embedding conv, layer_norm, windows (Swin: roll, pad)",
    "cnn": "convolutional networks: conv/BN/activation blocks, depthwise convs, squeeze-excite, upsampling",
    "recurrent": "recurrent sequence models: LSTM/GRU layers and cells, unrolled over the sequence",
}


class ZooUnavailable(Exception):
    """The installed `transformers` lacks a class (or an option) this zoo entry needs."""


@dataclass(frozen=True)
class ZooModel:
    name: str
    family: str
    config: str  # the transformers config class
    model: str  # the transformers model class
    config_kwargs: dict[str, Any]
    inputs: Callable[[Any], tuple[torch.Tensor, ...]]  # config -> example inputs (random, seeded by the caller)
    output: str = "logits"  # which field of the model's output the graph returns
    attn: str | None = None  # attn_implementation
    from_config_kwargs: dict[str, Any] = field(default_factory=dict)
    forward_kwargs: dict[str, Any] = field(default_factory=dict)
    input_names: tuple[str, ...] = ("input_ids",)
    submodule: str | None = None  # export this attribute of the model (Whisper's encoder)
    seed: int = 0  # weights and inputs
    build: Callable[[], nn.Module] | None = None  # a model of torch.nn modules alone (config and model unused)

    @property
    def requires(self) -> tuple[str, ...]:
        return () if self.build is not None else (self.config, self.model)


# ---- inputs --------------------------------------------------------------------------------------------------------

SEQ = 8  # tokens per text input
IMAGE = 32  # pixels per side of an image input


def _ids(cfg: Any) -> tuple[torch.Tensor, ...]:
    return (torch.randint(0, cfg.vocab_size, (1, SEQ)),)


def _ids_and_mask(cfg: Any) -> tuple[torch.Tensor, ...]:
    mask = torch.ones(1, SEQ, dtype=torch.int64)
    mask[0, -2:] = 0  # two padding tokens at the end: the mask is not all ones
    return (torch.randint(0, cfg.vocab_size, (1, SEQ)), mask)


def _image(cfg: Any) -> tuple[torch.Tensor, ...]:
    return (torch.randn(1, cfg.num_channels, IMAGE, IMAGE),)


def _audio(cfg: Any) -> tuple[torch.Tensor, ...]:
    return (torch.randn(1, cfg.num_mel_bins, 2 * cfg.max_source_positions),)


def _waveform(cfg: Any) -> tuple[torch.Tensor, ...]:
    return (torch.randn(1, 400),)


def _nn(name: str, family: str, build: Callable[[], nn.Module], inputs: Callable[[], tuple[torch.Tensor, ...]]
        ) -> ZooModel:
    """An entry made of torch.nn modules alone."""
    return ZooModel(name, family, "", "", {}, lambda cfg: inputs(), build=build)


# ---- the entries ---------------------------------------------------------------------------------------------------

_LM = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
_ENC = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=64, pad_token_id=0)


def _decoders() -> list[ZooModel]:
    specs: list[tuple[str, str, str, dict[str, Any], dict[str, Any]]] = [
        ("gpt2", "GPT2Config", "GPT2LMHeadModel",
         dict(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64, bos_token_id=1, eos_token_id=2), {}),
        ("opt", "OPTConfig", "OPTForCausalLM",
         dict(vocab_size=128, hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=64, word_embed_proj_dim=64, pad_token_id=0, bos_token_id=1,
              eos_token_id=2), {}),
        ("llama", "LlamaConfig", "LlamaForCausalLM", dict(_LM), {}),
        ("mistral", "MistralConfig", "MistralForCausalLM", dict(_LM, sliding_window=4), {}),
        ("qwen2", "Qwen2Config", "Qwen2ForCausalLM", dict(_LM, tie_word_embeddings=True), {}),
        ("phi3", "Phi3Config", "Phi3ForCausalLM", dict(_LM), {}),
        ("gemma", "GemmaConfig", "GemmaForCausalLM", dict(_LM, head_dim=16), {}),
        ("mixtral", "MixtralConfig", "MixtralForCausalLM",
         dict(_LM, num_local_experts=4, num_experts_per_tok=2), {"experts_implementation": "batched_mm"}),
        # multi-query attention, attention and MLP in parallel off one layer norm
        ("falcon", "FalconConfig", "FalconForCausalLM",
         dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, multi_query=True,
              parallel_attn=True, bias=False, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
              eos_token_id=2), {}),
    ]
    out = []
    for name, cfg, model, kw, fkw in specs:
        family = "moe" if name == "mixtral" else "decoder"
        # Mixtral: with seed 0 two bf16 router probabilities tie at the top-2 boundary, and which of two equal
        # experts top-k picks is the implementation's choice (ATen's nth_element or ours); seed 1 has no tie.
        seed = 1 if name == "mixtral" else 0
        for attn in ("eager", "sdpa"):
            out.append(ZooModel(f"{name}-{attn}", family, cfg, model, kw, _ids, attn=attn, from_config_kwargs=fkw,
                                forward_kwargs={"use_cache": False}, seed=seed))
    return out


ZOO_MODELS: list[ZooModel] = [
    ZooModel("bert-eager", "encoder", "BertConfig", "BertModel", dict(_ENC), _ids_and_mask, "last_hidden_state",
             attn="eager", input_names=("input_ids", "attention_mask")),
    ZooModel("bert-sdpa", "encoder", "BertConfig", "BertModel", dict(_ENC), _ids_and_mask, "last_hidden_state",
             attn="sdpa", input_names=("input_ids", "attention_mask")),
    ZooModel("distilbert", "encoder", "DistilBertConfig", "DistilBertModel",
             dict(vocab_size=128, dim=64, hidden_dim=128, n_layers=2, n_heads=4, max_position_embeddings=64,
                  pad_token_id=0), _ids_and_mask, "last_hidden_state", input_names=("input_ids", "attention_mask")),
    ZooModel("t5-encoder", "encoder", "T5Config", "T5EncoderModel",
             dict(vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, pad_token_id=0,
                  relative_attention_num_buckets=8, relative_attention_max_distance=16),
             _ids_and_mask, "last_hidden_state", input_names=("input_ids", "attention_mask")),
    *_decoders(),
    ZooModel("mamba", "ssm", "MambaConfig", "MambaForCausalLM",
             dict(vocab_size=128, hidden_size=64, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2, use_mambapy=False),
             _ids, forward_kwargs={"use_cache": False}),
    ZooModel("whisper-encoder", "audio", "WhisperConfig", "WhisperModel",
             dict(vocab_size=128, d_model=64, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16,
                  max_source_positions=16, max_target_positions=16, pad_token_id=0, bos_token_id=1,
                  eos_token_id=2, decoder_start_token_id=1),
             _audio, "last_hidden_state", input_names=("input_features",), submodule="encoder"),
    ZooModel("vit", "vit", "ViTConfig", "ViTModel",
             dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=IMAGE,
                  patch_size=8, num_channels=3), _image, "last_hidden_state", input_names=("pixel_values",)),
    ZooModel("swin", "vit", "SwinConfig", "SwinModel",
             dict(image_size=IMAGE, patch_size=2, num_channels=3, embed_dim=16, depths=[2, 2], num_heads=[2, 4],
                  window_size=4, mlp_ratio=2.0), _image, "last_hidden_state", input_names=("pixel_values",)),
    ZooModel("convnext", "cnn", "ConvNextConfig", "ConvNextModel",
             dict(num_channels=3, num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], patch_size=2,
                  image_size=IMAGE),
             _image, "last_hidden_state", input_names=("pixel_values",)),
    ZooModel("resnet", "cnn", "ResNetConfig", "ResNetModel",
             dict(num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="bottleneck"),
             _image, "last_hidden_state", input_names=("pixel_values",)),
    ZooModel("mobilenet-v2", "cnn", "MobileNetV2Config", "MobileNetV2Model",
             dict(num_channels=3, image_size=IMAGE, depth_multiplier=0.25), _image, "last_hidden_state",
             input_names=("pixel_values",)),
    ZooModel("efficientnet", "cnn", "EfficientNetConfig", "EfficientNetModel",
             dict(num_channels=3, image_size=IMAGE, width_coefficient=0.25, depth_coefficient=0.2, hidden_dim=320),
             _image, "last_hidden_state", input_names=("pixel_values",)),
    ZooModel("segformer", "cnn", "SegformerConfig", "SegformerForSemanticSegmentation",
             dict(num_channels=3, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                  patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                  decoder_hidden_size=32, num_labels=4), _image, "logits", input_names=("pixel_values",)),
    # one layer's weights shared by every layer
    ZooModel("albert", "encoder", "AlbertConfig", "AlbertModel", dict(_ENC, embedding_size=32), _ids_and_mask,
             "last_hidden_state", attn="eager", input_names=("input_ids", "attention_mask")),
    # relative position bias tables, layer scale, mean pooling
    ZooModel("beit", "vit", "BeitConfig", "BeitModel",
             dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=IMAGE,
                  patch_size=8, num_channels=3, use_relative_position_bias=True, use_mean_pooling=True),
             _image, "last_hidden_state", input_names=("pixel_values",)),
    ZooModel("siglip-vision", "vit", "SiglipVisionConfig", "SiglipVisionModel",
             dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=IMAGE,
                  patch_size=8, num_channels=3), _image, "last_hidden_state", input_names=("pixel_values",)),
    # inverted residuals with transformer blocks over unfolded patches
    ZooModel("mobilevit", "cnn", "MobileViTConfig", "MobileViTModel",
             dict(num_channels=3, image_size=IMAGE, patch_size=2, hidden_sizes=[32, 40, 48],
                  neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64], num_attention_heads=2, mlp_ratio=2.0),
             _image, "last_hidden_state", input_names=("pixel_values",)),
    # a conv feature encoder over the waveform (group norm), a weight-normed positional conv, a transformer
    ZooModel("wav2vec2", "audio", "Wav2Vec2Config", "Wav2Vec2Model",
             dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, conv_dim=(16, 16),
                  conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                  num_conv_pos_embedding_groups=4, vocab_size=32), _waveform, "last_hidden_state",
             input_names=("input_values",)),
    _nn("mtcnn-prelu", "cnn", zoo_nn.PReluCNN, zoo_nn.prelu_cnn_inputs),
    _nn("lstm-tagger", "recurrent", zoo_nn.LSTMTagger, zoo_nn.steps_inputs),
    _nn("torch-transformer-encoder", "encoder", zoo_nn.TorchTransformerEncoder, zoo_nn.ids_and_mask_inputs),
]
ZOO: dict[str, ZooModel] = {m.name: m for m in ZOO_MODELS}


def zoo_names(spec: str | None = None) -> list[str]:
    """The zoo's model names, or those of a comma-separated `spec` (ValueError naming any the zoo lacks)."""
    if not spec:
        return list(ZOO)
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in ZOO]
    if unknown or not names:
        raise ValueError(f"no zoo model {', '.join(unknown) or repr(spec)}; known: {', '.join(ZOO)}")
    return names


# ---- building ------------------------------------------------------------------------------------------------------


class _Forward(nn.Module):
    """`model(**named inputs, **forward_kwargs)` -> one tensor (the chosen output field)."""

    def __init__(self, model: nn.Module, names: tuple[str, ...], output: str, kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.model = model
        self.names = names
        self.output = output
        self.kwargs = kwargs

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        out = self.model(**dict(zip(self.names, inputs)), **self.kwargs)
        return out[self.output] if not isinstance(out, tuple) else out[0]


def _transformers_class(name: str, entry: str) -> Any:
    import transformers

    cls = getattr(transformers, name, None)
    if cls is None:
        raise ZooUnavailable(f"zoo model '{entry}': transformers {transformers.__version__} has no {name}")
    return cls


def _randomize(model: nn.Module, seed: int) -> None:
    """Weights that make every part of the model matter: fan-in scaled linear and conv weights (activations stay
    O(1) and attention is not uniform, as it nearly is with HF's std 0.02), norm scales in [0.8, 1.2], small random
    biases and BatchNorm statistics. Parameters of other modules keep the model's own initialisation (Mamba's A and
    dt, position tables)."""
    g = torch.Generator().manual_seed(seed)

    def normal(t: torch.Tensor, std: float) -> None:
        t.copy_(torch.randn(t.shape, generator=g) * std)

    def uniform(t: torch.Tensor, lo: float, hi: float) -> None:
        t.copy_(torch.rand(t.shape, generator=g) * (hi - lo) + lo)

    with torch.no_grad():
        for mod in model.modules():
            w = getattr(mod, "weight", None)
            b = getattr(mod, "bias", None)
            if isinstance(mod, nn.Linear | nn.Conv1d | nn.Conv2d):
                normal(w, 1.0 / math.sqrt(max(w[0].numel(), 1)))
                if isinstance(b, torch.Tensor):
                    normal(b, 0.1)
            elif isinstance(mod, nn.Embedding):
                normal(w, 1.0)
            elif isinstance(w, torch.Tensor) and w.dim() == 1 and "norm" in type(mod).__name__.lower():
                uniform(w, 0.8, 1.2)
                if isinstance(b, torch.Tensor):
                    normal(b, 0.1)
            if isinstance(mod, nn.BatchNorm2d | nn.BatchNorm1d) and mod.running_mean is not None:
                normal(mod.running_mean, 0.1)
                uniform(mod.running_var, 0.5, 1.5)
        for name, p in model.named_parameters():
            # MoE routers (Mixtral's gate) are plain parameters in transformers 5: fan-in scaled too.
            if p.dim() == 2 and name.endswith("gate.weight"):
                normal(p, 1.0 / math.sqrt(p.shape[1]))
            elif p.dim() == 3 and "experts" in name:
                normal(p, 1.0 / math.sqrt(p.shape[-1]))


def build_zoo_model(name: str, seed: int | None = None) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The entry's model (eval mode, random fp32 weights) wrapped to take and return tensors, and example inputs."""
    if name not in ZOO:
        raise KeyError(f"no zoo model '{name}'; known: {', '.join(ZOO)}")
    z = ZOO[name]
    seed = z.seed if seed is None else seed
    if z.build is not None:
        torch.manual_seed(seed)
        model = z.build()
        _randomize(model, seed)
        torch.manual_seed(seed + 1)
        return model.eval(), z.inputs(None)
    cfg_cls = _transformers_class(z.config, name)
    model_cls = _transformers_class(z.model, name)
    torch.manual_seed(seed)
    with quiet_transformers():
        cfg = cfg_cls(**copy.deepcopy(z.config_kwargs))
        kwargs = dict(z.from_config_kwargs)
        if z.attn is not None:
            kwargs["attn_implementation"] = z.attn
        try:
            model = model_cls._from_config(cfg, dtype=torch.float32, **kwargs)
        except (TypeError, ValueError) as e:
            raise ZooUnavailable(f"zoo model '{name}': {z.model} cannot be built with {kwargs}: {e}") from e
    _randomize(model, seed)
    model.eval()
    inner = getattr(model, z.submodule) if z.submodule else model
    wrapped = _Forward(inner, z.input_names, z.output, z.forward_kwargs).eval()
    torch.manual_seed(seed + 1)
    return wrapped, z.inputs(cfg)


@dataclass
class ZooExport:
    name: str
    ir: dict[str, Any]  # the IR as JSON-ready data (torch objects in attrs stringified)
    weights: dict[str, np.ndarray]  # by state-dict key (every tensor the IR may read)
    inputs: dict[str, np.ndarray]  # by graph input name
    eager: list[np.ndarray]  # PyTorch eager's outputs for `inputs`, in graph output order


@functools.cache
def export_zoo_model(name: str, dtype: str = "float32", seed: int | None = None) -> ZooExport:
    """Build, cast to `dtype` (like `model.to(dtype)`: weights and float inputs), export (meta device,
    `torch.no_grad()`) and run eager PyTorch once; cached for the process."""
    from torch_ir import extract_ir

    from .model_export import model_tensors
    from .reference import aten_kernels_for, to_numpy

    model, inputs = build_zoo_model(name, seed)
    cast = getattr(torch, dtype)
    if cast != torch.float32:
        model = model.to(cast)
        inputs = tuple(t.to(cast) if t.is_floating_point() else t for t in inputs)
    meta = meta_clone(model).eval()
    with torch.no_grad(), quiet_transformers():
        ir = extract_ir(meta, tuple(t.to("meta") for t in inputs), model_name=name)
        with aten_kernels_for([cast]):  # the kernels the reference runs: eager must not depend on the host either
            eager = model(*inputs)
    data = ir_to_dict(ir)
    names = [t["name"] for t in data["graph_inputs"]]
    tensors = model_tensors(model)
    tensors.update(lifted_constants(model, inputs, {w["name"] for w in data["weights"]} - set(tensors)))
    weights = {k: to_numpy(v) for k, v in tensors.items()}
    eager_list = list(eager) if isinstance(eager, tuple | list) else [eager]
    return ZooExport(name, data, weights, {n: to_numpy(t) for n, t in zip(names, inputs)},
                     [to_numpy(t) for t in eager_list])


# ---- verification ----------------------------------------------------------------------------------------------------


def half_dtype(family: str) -> str:
    """The half dtype a family ships in: float16 for CNNs, bfloat16 for the transformer families."""
    return "float16" if family == "cnn" else "bfloat16"


@dataclass(frozen=True)
class ZooTolerance:
    """What a zoo model's output must meet against the reference in the same dtype (`npu_runtime.metrics.compare`):
    Pearson r >= min_pearson and max |err| / max |ref| <= max_rel."""

    min_pearson: float
    max_rel: float
    why: str


# (family, dtype) -> tolerance; docs/tolerances.md explains the rows. Measured on the CPU backend (2 layers, random
# weights): float32 within 1.5e-6 of the reference everywhere; bfloat16 within 1.4e-2, float16 within 1.4e-3.
_F32 = ZooTolerance(0.99999, 1e-4, "summation order only (GEMM blocking, pairwise sums): about 1e-6 measured")
_BF16 = ZooTolerance(0.999, 5e-2, "a few bf16 ulps (2^-8 relative) of the largest output, where a sum in another "
                                  "order rounds the other way; about 1e-2 measured")
ZOO_TOLERANCE: dict[tuple[str, str], ZooTolerance] = {
    **{(f, "float32"): _F32 for f in FAMILIES},
    **{(f, "bfloat16"): _BF16 for f in FAMILIES if f != "cnn"},
    ("moe", "bfloat16"): ZooTolerance(0.999, 5e-2, "as the decoders, given the same routing: an input whose router "
                                                   "probabilities tie at the top-k boundary has no single answer "
                                                   "(tests/test_zoo.py checks that the reference has no tie)"),
    ("ssm", "bfloat16"): ZooTolerance(0.999, 5e-2, "as the decoders; the scan's state is kept in fp32 by the model"),
    ("cnn", "float16"): ZooTolerance(0.9999, 1e-2, "a few fp16 ulps (2^-11 relative) of the largest output; about "
                                                   "1.5e-3 measured"),
    ("recurrent", "bfloat16"): ZooTolerance(0.999, 5e-2, "as the decoders: a step's bf16 rounding is carried by the "
                                                         "hidden state into the next steps"),
}


@dataclass
class ZooResult:
    name: str
    family: str
    dtype: str  # the model's (exported) dtype
    backend: str
    compute_dtype: str
    ir_nodes: int  # the IR's nodes that compute something read (dead ones are removed, run nowhere)
    npu_nodes: int  # nodes the target runs (the rest would run on the CPU through the partition path)
    kernels: int
    export_max_abs: float  # the IR (torch_ir.IRExecutor) against eager PyTorch
    max_abs: float
    max_rel: float
    pearson: float
    tolerance: ZooTolerance
    passed: bool
    fallback_ops: list[str] = field(default_factory=list)


def verify_zoo_model(name: str, dtype: str = "float32", backend: Any = "cpu") -> ZooResult:
    """Export `name` in `dtype`, compile it for `backend` with the default compute dtype (the model's own), run it and
    compare with torch_ir.IRExecutor under ZOO_TOLERANCE; also how far the IR itself is from eager PyTorch."""
    import npu_compiler
    import npu_runtime
    from npu_compiler.op_support import support_predicate
    from npu_compiler.partition import partition
    from npu_runtime.metrics import Tolerance, compare

    from .reference import run_reference

    be = npu_runtime.get_backend(backend) if isinstance(backend, str) else backend
    z = ZOO[name]
    ex = export_zoo_model(name, dtype)
    ref = run_reference(ex.ir, ex.weights, ex.inputs)
    names = [t["name"] for t in ex.ir["graph_outputs"]]
    export_err = max(float(np.abs(ref[n].astype(np.float64) - e.astype(np.float64)).max())
                     for n, e in zip(names, ex.eager))
    target = be.compile_target()
    plan = partition(ex.ir, support_predicate(target))
    fallback = sorted({f.op for f in plan.fallback})
    tol = ZOO_TOLERANCE[(z.family, dtype)]
    row = dict(name=name, family=z.family, dtype=dtype, backend=be.name, ir_nodes=len(ex.ir["nodes"]) - len(plan.dead),
               npu_nodes=plan.stats.nodes_npu, export_max_abs=export_err, tolerance=tol, fallback_ops=fallback)
    if fallback:
        return ZooResult(**row, compute_dtype="-", kernels=0, max_abs=float("nan"), max_rel=float("nan"),
                         pearson=float("nan"), passed=False)
    prog = npu_compiler.compile(ex.ir, target)
    ws = npu_runtime.load_weights(prog, ex.weights, be)
    outs = be.create_executor(prog).run_numpy(ex.inputs, ws)
    rows = [compare(n, outs[n], ref[n], prog.compute_dtype, Tolerance(tol.min_pearson, tol.max_rel)) for n in names]
    return ZooResult(**row, compute_dtype=prog.compute_dtype, kernels=len(prog.kernels),
                     max_abs=max(r.max_abs for r in rows), max_rel=max(r.max_rel for r in rows),
                     pearson=min((r.pearson for r in rows if r.pearson is not None), default=1.0),
                     passed=all(r.passed for r in rows))
