"""The spec's model section: the chain of layers the pipeline splits (ModelSpec), from a
preset (gpt, bert), a named model (profiles/models.yaml) or a list of layers, with the
Llama-family block options (cost_models.layers.Layer's fields). Every problem is one SpecError
naming the key path and what is accepted."""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from cost_models.layers import (MLP_KINDS, NORM_KINDS, POSITION_EMBEDDINGS, ROPE_SCALINGS, Layer,
                                 leading_layers)

from .errors import SpecError, UsageError
from .resources import models_path
from .spec_reader import MappingReader, read_name, show_value
from .yaml_io import load_yaml_file, show_path

MODEL_PRESETS = ("llama3-8b", "llama3-70b", "llama3.1-405b", "qwen3-8b", "qwen3-32b",
                 "qwen3-30b-a3b", "qwen3-235b-a22b", "mixtral-8x7b", "mixtral-8x22b",
                 "gpt-oss-120b", "gpt-oss-20b", "deepseek-v3", "kimi-k2")
"""Named models (profiles/models.yaml): `model: {preset: NAME, seq_length: ...}` takes every
size from there; any size key the spec gives overrides it."""
PRESETS = ("gpt", "bert", "layers") + MODEL_PRESETS
MAX_LAYERS = 10_000
MAX_WIDTH = 1_000_000
MAX_SEQ = 10_000_000
MAX_VOCAB = 10_000_000
MAX_MTP_LAYERS = 8
"""model.mtp_num_layers at most (DeepSeek-V3 trains with 1)."""


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    preset: str
    """gpt | bert | layers | a named model (MODEL_PRESETS: a GPT chain of its sizes)"""
    layers: tuple[Layer, ...]
    """The full chain the pipeline splits: embedding, blocks, head (for the presets)."""
    num_attention_heads: int
    """Heads of every attention layer (tmp must divide it); 0 if there is no attention."""

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def tp_divisors(self) -> tuple[int, ...]:
        """Sizes every tensor-parallel degree must divide (heads, key/value groups, widths).
        The vocabulary is padded to a multiple of 128 x tmp instead, as Megatron-LM does
        (cost_models.layers.padded_vocab_size)."""
        sizes = set()
        for layer in self.layers:
            if layer.kind == "transformer":
                sizes |= {layer.num_attention_heads, layer.hidden_size}
                if not layer.is_moe:      # the experts are whole on a rank (ETP 1)
                    sizes.add(layer.ffn_hidden_size)
                elif layer.moe_shared_expert_size:
                    sizes.add(layer.moe_shared_expert_size)
                if layer.num_query_groups:      # Megatron-LM: tp | num_query_groups
                    sizes.add(layer.num_query_groups)
            elif layer.kind == "mlp":
                sizes |= {layer.ffn_hidden_size}
        return tuple(sorted(sizes))

    @property
    def num_experts(self) -> int:
        """Routed experts of the model's mixture-of-experts blocks (0: a dense model)."""
        return max((l.num_experts for l in self.layers), default=0)

    @property
    def vocab_size(self) -> int:
        """The vocabulary of the embedding or head (0 if the model has neither)."""
        return next((l.vocab_size for l in self.layers if l.kind in ("embedding", "head")), 0)

    @property
    def ends(self) -> tuple[int, int]:
        """(leading embedding layers, trailing head layers) around the blocks
        (cost_models.layers.leading_layers; the multi-token-prediction module's layers before
        the head count with it): what the pipeline split keeps with the first and last stage,
        and the interleaved schedule's chunks leave out of their even split."""
        mtp = self.mtp_layers       # the main head, and the MTP's blocks and losses before it
        tail = 1 + mtp if mtp else leading_layers(self.layers[::-1], "head")
        return leading_layers(self.layers, "embedding"), tail

    @property
    def mtp_layers(self) -> int:
        """Layers of the multi-token-prediction module (Layer.mtp: a block and a loss per
        --mtp-num-layers), which follow the last block."""
        return sum(x.mtp for x in self.layers)


ARCH_KEYS = ("num_query_groups", "head_dim", "mlp", "norm", "bias", "position_embedding",
              "rope_scaling", "qk_norm", "tie_embeddings")
"""The Llama-family keys (cost_models.layers.Layer's fields of the same names); absent, a
model is the GPT block of before: MHA, head_dim h/a, GELU, LayerNorm, biases, learned
positions, no query and key norms, untied head."""
MLA_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim")
"""Multi-latent attention (DeepSeek-V2/V3, Kimi-K2), Megatron-LM's --multi-latent-attention
with --kv-lora-rank, --q-lora-rank, --qk-pos-emb-head-dim and --v-head-dim (head_dim is
--qk-head-dim, each query and key head's non-rotary part): the cost_models.layers.Layer
fields of the same names. kv_lora_rank > 0 turns it on; it needs position_embedding: rope
and no biases."""
MOE_KEYS = ("num_experts", "moe_router_topk", "moe_ffn_hidden_size",
            "moe_shared_expert_intermediate_size", "moe_first_dense_layers")
"""The mixture-of-experts keys, Megatron-LM's argument names (--num-experts, ...): every
transformer block's MLP becomes E routed experts (k per token, each of width
moe_ffn_hidden_size) beside optional shared experts."""
MOE_LAYER_FIELDS = ("num_experts", "moe_router_topk", "moe_ffn_hidden_size",
                    "moe_shared_expert_size")
"""The cost_models.layers.Layer fields MOE_KEYS fill, in the same order (the last key,
moe_first_dense_layers k, makes the first k blocks dense MLPs of ffn_hidden_size: DeepSeek-V3's
first_k_dense_replace, Megatron-LM's --moe-layer-freq [0]*k+[1]*(L-k))."""
WINDOW_KEYS = ("window_size", "window_attn_skip_freq")
"""Sliding-window attention, Megatron-LM's argument names: window_size w (each query attends
to the w keys before it) in every block but each window_attn_skip_freq-th (N: N - 1 windowed
blocks, then one of full attention; absent: every block windowed), as GPT-OSS alternates
them."""
WINDOW_LAYER_FIELDS = ("attention_window",)
"""The cost_models.layers.Layer field WINDOW_KEYS fill."""
MODEL_KEYS = ("preset", "num_layers", "hidden_size", "num_attention_heads", "seq_length",
               "vocab_size", "ffn_hidden_size", "layers", "name", "hidden_dropout",
               "mtp_num_layers") \
    + ARCH_KEYS + MLA_KEYS + MOE_KEYS + WINDOW_KEYS
DROPOUT_KINDS = ("embedding", "transformer", "mlp")
"""The layers `hidden_dropout` applies to (cost_models.layers.Layer.dropout_masks)."""
DROPOUT_LAYER_FIELDS = ("hidden_dropout",)
"""The cost_models.layers.Layer field model.hidden_dropout fills."""
TRAINING_LAYER_FIELDS = ("cross_entropy", "fused_experts")
"""The cost_models.layers.Layer fields the training section fills: the head's cross_entropy
(training.cross_entropy) and the mixture-of-experts blocks' fused_experts
(training.moe_sync_free: the sync-free recipes' fused expert MLP)."""
LAYER_KEYS = ("kind", "count", "hidden_size", "num_attention_heads", "ffn_hidden_size",
               "vocab_size", "forward_flops", "params", "output_elements", "name") + ARCH_KEYS
_LAYER_ARCH = {"embedding": ("position_embedding", "tie_embeddings"),
               "transformer": ("num_query_groups", "head_dim", "mlp", "norm", "bias",
                               "position_embedding", "rope_scaling", "qk_norm"),
               "mlp": ("mlp", "norm", "bias"),
               "head": ("norm", "bias", "tie_embeddings"),
               "custom": ()}
"""The Llama-family keys each kind of layer takes (preset: layers)."""


@lru_cache(maxsize=1)
def _named_models() -> tuple[dict, dict]:
    """profiles/models.yaml: (name -> model-section keys, name -> why it is refused)."""
    path = models_path()
    data = load_yaml_file(path, what="named models")
    models = data.get("models") if isinstance(data, dict) else None
    refused = (data.get("not_modelled") or {}) if isinstance(data, dict) else None
    if not isinstance(models, dict) or not isinstance(refused, dict):
        raise UsageError(f"named models {show_path(path)}: expected 'models: {{NAME: {{model "
                         f"keys}}}}' and 'not_modelled: {{NAME: reason}}'")
    return models, refused


def named_model(name: str) -> dict:
    """The model-section keys of a named model (MODEL_PRESETS) from profiles/models.yaml."""
    entry = _named_models()[0].get(name)
    if name not in MODEL_PRESETS or not isinstance(entry, dict):
        raise UsageError(f"named models {show_path(models_path())}: no model {name!r}; "
                         f"known: {', '.join(MODEL_PRESETS)}")
    return dict(entry)


def _heads_divide(path: str, hidden: int, heads: int, note: str = "") -> None:
    if hidden % heads:
        raise SpecError(path, f"num_attention_heads ({heads}) must divide hidden_size "
                              f"({hidden}); try one of "
                              f"{', '.join(str(d) for d in _divisors(hidden) if d <= 256)}"
                              f", or give head_dim{note}")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0] if n <= 1 << 20 else [1]


def swiglu_ffn_hidden_size(hidden: int) -> int:
    """Megatron-LM's default MLP width with --swiglu (megatron/training/arguments.py):
    int((4h * 2/3) / 64) * 64, about the parameters of a 4h GELU MLP in three matrices."""
    return int((4 * hidden * 2 / 3) / 64) * 64


def _ffn(r: MappingReader, h: int, mlp: str, note: str = "") -> int:
    """ffn_hidden_size: given, else 4h (gelu) or Megatron-LM's swiglu default (for either
    gated MLP: three matrices of about a 4h GELU MLP's parameters)."""
    default = 4 * h if mlp == "gelu" else swiglu_ffn_hidden_size(h)
    if not default and not r.has("ffn_hidden_size"):
        raise SpecError(r.at("ffn_hidden_size"), f"required key is missing: mlp: {mlp} with "
                                                 f"hidden_size {h} has no default (Megatron-"
                                                 f"LM's int(8h/3 / 64) * 64 is 0){note}")
    return r.int("ffn_hidden_size", default, hi=4 * MAX_WIDTH)


def _attention(r: MappingReader, h: int, a: int, note=lambda k: "") -> dict:
    """num_query_groups and head_dim as Layer fields (0: the MHA default, h / a); a must
    divide h unless head_dim is given (as Megatron-LM's --kv-channels)."""
    d = r.int("head_dim", hi=MAX_WIDTH) if r.has("head_dim") else 0
    if not d:
        _heads_divide(r.at("num_attention_heads"), h, a, note("hidden_size"))
    elif h % a == 0 and d == h // a:
        d = 0                                       # the default, written out
    g = 0
    if r.has("num_query_groups"):
        g = r.int("num_query_groups", hi=MAX_WIDTH)
        if a % g:
            raise SpecError(r.at("num_query_groups"),
                            f"{g} must divide num_attention_heads ({a}); accepted: "
                            f"{', '.join(str(x) for x in _divisors(a) if x <= 256)}"
                            f"{note('num_query_groups')}")
        g = 0 if g == a else g                      # one group per head: MHA
    return {"num_query_groups": g, "head_dim": d}


def _experts(r: MappingReader, f: int, num_layers: int) -> tuple[dict, int]:
    """(the MOE_KEYS as Layer fields, {} for a dense model; the dense blocks before the first
    mixture-of-experts one): num_experts E >= 2 with 1 <= moe_router_topk <= E (required with
    experts), moe_ffn_hidden_size (default ffn_hidden_size),
    moe_shared_expert_intermediate_size (default 0, none) and moe_first_dense_layers (default
    0; fewer than num_layers)."""
    if not r.has("num_experts"):
        for k in MOE_KEYS[1:]:
            if r.has(k):
                raise SpecError(r.at(k), "only with num_experts (a mixture-of-experts model)")
        return {}, 0
    e = r.int("num_experts", lo=2, hi=MAX_WIDTH)
    k = r.int("moe_router_topk", required=True, hi=e)
    fe = r.int("moe_ffn_hidden_size", f, hi=4 * MAX_WIDTH)
    fs = r.int("moe_shared_expert_intermediate_size", 0, lo=0, hi=4 * MAX_WIDTH)
    dense = r.int("moe_first_dense_layers", 0, lo=0, hi=num_layers - 1)
    return dict(zip(MOE_LAYER_FIELDS, (e, k, fe, fs))), dense


def _latent_attention(r: MappingReader, a: int, pos: str, bias: bool, attention: dict,
                      note=lambda k: "") -> dict:
    """The MLA_KEYS as Layer fields ({} without kv_lora_rank): the latent widths, the rotary
    and value head widths (v_head_dim default head_dim), with head_dim required (the
    non-rotary query and key width, --qk-head-dim; set in `attention`), RoPE, no biases and
    no key/value groups (every head has its own key and value, made from the shared
    latent)."""
    if not r.has("kv_lora_rank"):
        for k in MLA_KEYS[1:]:
            if r.has(k):
                raise SpecError(r.at(k), "only with kv_lora_rank (multi-latent attention)")
        return {}
    c = r.int("kv_lora_rank", hi=MAX_WIDTH)
    if r.has("head_dim"):           # kept even where it is h / a: MLA's heads are not h wide
        attention["head_dim"] = r.int("head_dim", hi=MAX_WIDTH)
    if not attention["head_dim"]:
        raise SpecError(r.at("head_dim"), f"required key is missing: multi-latent attention "
                                          f"needs head_dim, each query and key head's "
                                          f"non-rotary width (Megatron-LM's --qk-head-dim, "
                                          f"e.g. 128){note('head_dim')}")
    if attention["num_query_groups"]:
        raise SpecError(r.at("num_query_groups"), "not with multi-latent attention: every head "
                                                  "has its own key and value, made from the "
                                                  "shared latent")
    if pos != "rope":
        raise SpecError(r.at("position_embedding"), f"multi-latent attention rotates its "
                                                    f"qk_rope_head_dim part: accepted: rope "
                                                    f"(got {pos}){note('position_embedding')}")
    if bias:
        raise SpecError(r.at("bias"), f"multi-latent attention's projections have no biases "
                                      f"in megatron-core: accepted: false{note('bias')}")
    return {"kv_lora_rank": c, "q_lora_rank": r.int("q_lora_rank", 0, lo=0, hi=MAX_WIDTH),
            "qk_rope_head_dim": r.int("qk_rope_head_dim", required=True, hi=MAX_WIDTH),
            "v_head_dim": r.int("v_head_dim", attention["head_dim"], hi=MAX_WIDTH)}


def _window(r: MappingReader) -> tuple[int, int]:
    """(window_size, window_attn_skip_freq) of WINDOW_KEYS; (0, 0) without a window."""
    if not r.has("window_size"):
        if r.has("window_attn_skip_freq"):
            raise SpecError(r.at("window_attn_skip_freq"), "only with window_size (sliding-"
                                                            "window attention)")
        return 0, 0
    return (r.int("window_size", hi=MAX_SEQ),
            r.int("window_attn_skip_freq", 0, lo=0, hi=MAX_LAYERS))


def _rope_scaling(r: MappingReader, position_embedding: str, note: str = "") -> str:
    """model.rope_scaling (ROPE_SCALINGS, default none): yarn only with RoPE."""
    scaling = r.choice("rope_scaling", ROPE_SCALINGS, "none")
    if scaling != "none" and position_embedding != "rope":
        raise SpecError(r.at("rope_scaling"), f"{scaling} scales rotary embeddings: it needs "
                                              f"position_embedding: rope (got "
                                              f"{position_embedding}); accepted with it: "
                                              f"none{note}")
    return scaling


def _hidden_dropout(r: MappingReader) -> float:
    """model.hidden_dropout: Megatron-LM's --hidden-dropout (0 here, as the Llama recipes
    train; Megatron-LM's own default is 0.1)."""
    return r.number("hidden_dropout", 0.0, lo=0.0, below=1.0)


def _gpt_model(r: MappingReader, preset: str, seq: int, given: frozenset | None) -> ModelSpec:
    """preset gpt, bert or a named model (`given`: the keys the spec itself wrote)."""
    def note(key: str) -> str:
        if given is None or key in given:
            return ""
        return f" ({key} from preset {preset}; any size key given overrides the preset's)"

    if r.has("layers"):
        raise SpecError(r.at("layers"), f"only for preset: layers (this model is {preset})")
    L = r.int("num_layers", required=True, hi=MAX_LAYERS)
    h = r.int("hidden_size", required=True, hi=MAX_WIDTH)
    a = r.int("num_attention_heads", required=True, hi=MAX_WIDTH)
    v = r.int("vocab_size", required=True, hi=MAX_VOCAB)
    mlp = r.choice("mlp", MLP_KINDS, "gelu")
    f = _ffn(r, h, mlp)
    attention = _attention(r, h, a, note)
    norm = r.choice("norm", NORM_KINDS, "layernorm")
    bias = r.flag("bias", True)
    pos = r.choice("position_embedding", POSITION_EMBEDDINGS, "learned")
    scaling = _rope_scaling(r, pos, note("rope_scaling"))
    qk_norm = r.flag("qk_norm", False)
    tied = r.flag("tie_embeddings", False)
    latent = _latent_attention(r, a, pos, bias, attention, note)
    if latent and qk_norm:
        raise SpecError(r.at("qk_norm"), "not with multi-latent attention (its norms are on the "
                                         "latents, counted with kv_lora_rank)")
    experts, dense = _experts(r, f, L)
    window, every = _window(r)
    dropout = _hidden_dropout(r)
    block = Layer(kind="transformer", seq_length=seq, hidden_size=h, num_attention_heads=a,
                  ffn_hidden_size=f, **attention, **latent, mlp=mlp, norm=norm, bias=bias,
                  position_embedding=pos, rope_scaling=scaling, qk_norm=qk_norm, **experts,
                  hidden_dropout=dropout)
    dense_fields = {k: 0 for k in MOE_LAYER_FIELDS}
    mtp = r.int("mtp_num_layers", 0, lo=0, hi=MAX_MTP_LAYERS)
    head = Layer(kind="head", seq_length=seq, hidden_size=h, vocab_size=v, norm=norm,
                 bias=bias, tie_embeddings=tied, name="head")
    blocks = tuple(Layer(**{**block.__dict__, "name": f"block{i}",
                            **(dense_fields if i < dense else {}),
                            **({"attention_window": window}
                               if window and (not every or (i + 1) % every) else {})})
                   for i in range(L))
    # the multi-token-prediction module: per depth a block like the last one, reading 2h
    # (its eh_proj), and a loss through the main head's output layer
    mtp_layers = tuple(x for i in range(mtp) for x in (
        Layer(**{**blocks[-1].__dict__, "input_hidden_size": 2 * h, "mtp": True,
                 "name": f"mtp{i}"}),
        Layer(**{**head.__dict__, "tie_embeddings": False, "mtp": True,
                 "name": f"mtp{i}_loss"})))
    layers = ((Layer(kind="embedding", seq_length=seq, hidden_size=h, vocab_size=v,
                     position_embedding=pos, tie_embeddings=tied, name="embedding",
                     hidden_dropout=dropout),)
              + blocks + mtp_layers + (head,))
    return ModelSpec(preset=preset, layers=layers, num_attention_heads=a)


def parse_model(data) -> ModelSpec:
    r = MappingReader(data, "model", MODEL_KEYS)
    asked = r.raw("preset")
    if isinstance(asked, str) and asked not in PRESETS:
        reason = _named_models()[1].get(asked)
        if isinstance(reason, str):
            raise SpecError(r.at("preset"), f"{asked}: {reason}; accepted: "
                                            f"{', '.join(PRESETS)}")
    preset = r.choice("preset", PRESETS)
    given = None
    if preset in MODEL_PRESETS:
        given = frozenset(k for k in data if data[k] is not None)
        r = MappingReader({**named_model(preset), **{k: data[k] for k in given}}, "model",
                    MODEL_KEYS)
    read_name(r.raw("name"), r.at("name"), "")
    seq = r.int("seq_length", required=True, hi=MAX_SEQ)
    if preset != "layers":
        return _gpt_model(r, preset, seq, given)
    for k in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size",
              "ffn_hidden_size", "mtp_num_layers") + ARCH_KEYS + MLA_KEYS + MOE_KEYS \
            + WINDOW_KEYS:
        if r.has(k):
            raise SpecError(r.at(k), "not used with preset: layers; give sizes per layer "
                                     "in model.layers")
    dropout = _hidden_dropout(r)
    items = r.raw("layers", required=True)
    if not isinstance(items, list) or not items:
        raise SpecError("model.layers", "expected a non-empty list of layers")
    layers: list[Layer] = []
    heads: set[int] = set()
    prev_width = 0
    pos_default = "learned"         # blocks follow the position embedding before them
    tied_at: list[tuple[str, Layer]] = []
    for i, item in enumerate(items):
        lr = MappingReader(item, f"model.layers[{i}]", LAYER_KEYS)
        kind = lr.choice("kind", ("embedding", "transformer", "mlp", "head", "custom"))
        count = lr.int("count", 1, hi=MAX_LAYERS)
        if len(layers) + count > MAX_LAYERS:
            raise SpecError(lr.at("count"), f"more than {MAX_LAYERS} layers in all")
        name = read_name(lr.raw("name"), lr.at("name"), kind)
        needs = {"embedding": ("hidden_size", "vocab_size"),
                 "transformer": ("hidden_size", "num_attention_heads"),
                 "mlp": ("hidden_size",), "head": ("hidden_size", "vocab_size"),
                 "custom": ("forward_flops", "params", "output_elements")}[kind]
        for k in LAYER_KEYS[2:9]:
            if lr.has(k) and k not in needs and k != "ffn_hidden_size":
                raise SpecError(lr.at(k), f"not used by a {kind} layer; it takes: "
                                          f"{', '.join(needs)}")
        for k in ARCH_KEYS:
            if lr.has(k) and k not in _LAYER_ARCH[kind]:
                takes = ", ".join(_LAYER_ARCH[kind]) or "none of the architecture keys"
                raise SpecError(lr.at(k), f"not used by a {kind} layer; it takes: {takes}")
        for k in needs:
            lr.raw(k, required=True)
        if kind == "custom":
            flops = lr.raw("forward_flops")
            if isinstance(flops, bool) or not isinstance(flops, (int, float)) or not \
                    0 <= flops <= 1e18:
                raise SpecError(lr.at("forward_flops"), f"got {show_value(flops)}; expected forward "
                                                        f"FLOPs per sample, a number in "
                                                        f"[0, 1e18]")
            base = Layer(kind="custom", seq_length=seq, custom_forward_flops=float(flops),
                         custom_params=lr.int("params", lo=0, hi=10**13),
                         custom_output_elements=lr.int("output_elements", hi=10**12))
            width = 0
        else:
            h = lr.int("hidden_size", hi=MAX_WIDTH)
            a = lr.int("num_attention_heads", hi=MAX_WIDTH) if kind == "transformer" else 0
            arch: dict = {}
            if kind in ("transformer", "mlp"):
                arch["mlp"] = lr.choice("mlp", MLP_KINDS, "gelu")
            if kind == "transformer":
                arch |= _attention(lr, h, a)
                heads.add(a)
            if kind in ("transformer", "mlp", "head"):
                arch["norm"] = lr.choice("norm", NORM_KINDS, "layernorm")
                arch["bias"] = lr.flag("bias", True)
            if kind in ("embedding", "transformer"):
                arch["position_embedding"] = lr.choice("position_embedding",
                                                       POSITION_EMBEDDINGS, pos_default)
                if kind == "embedding":
                    pos_default = arch["position_embedding"]
            if kind == "transformer":
                arch["rope_scaling"] = _rope_scaling(lr, arch["position_embedding"])
                arch["qk_norm"] = lr.flag("qk_norm", False)
            if kind in ("embedding", "head"):
                arch["tie_embeddings"] = lr.flag("tie_embeddings", False)
            f = _ffn(lr, h, arch["mlp"]) if kind in ("transformer", "mlp") else 0
            if lr.has("ffn_hidden_size") and kind not in ("transformer", "mlp"):
                raise SpecError(lr.at("ffn_hidden_size"), f"not used by a {kind} layer")
            v = lr.int("vocab_size", hi=MAX_VOCAB) if kind in ("embedding", "head") else 0
            in_h = prev_width if kind in ("transformer", "mlp") and prev_width and \
                prev_width != h else 0
            base = Layer(kind=kind, seq_length=seq, hidden_size=h, num_attention_heads=a,
                         ffn_hidden_size=f, vocab_size=v, input_hidden_size=in_h, **arch,
                         hidden_dropout=dropout if kind in DROPOUT_KINDS else 0.0)
            width = h
            if kind in ("embedding", "head"):
                tied_at.append((lr.at("tie_embeddings"), base))
        for c in range(count):
            # only the first of a run of same-width layers carries the input projection
            extra = {"input_hidden_size": 0} if c else {}
            layers.append(Layer(**{**base.__dict__, **extra,
                                   "name": f"{name}{c}" if count > 1 else name}))
        prev_width = width
    _check_tied(tied_at, layers)
    return ModelSpec(preset="layers", layers=tuple(layers),
                     num_attention_heads=math.gcd(*heads) if heads else 0)


def _check_tied(tied_at: list[tuple[str, Layer]], layers: list[Layer]) -> None:
    """tie_embeddings (preset: layers): one embedding and one head, both tied, of one shape."""
    tied = [(path, x) for path, x in tied_at if x.tie_embeddings]
    if not tied:
        return
    kinds = [x.kind for x in layers]
    emb = [x for x in layers if x.kind == "embedding"]
    head = [x for x in layers if x.kind == "head"]
    if kinds.count("embedding") != 1 or kinds.count("head") != 1 or len(tied) != 2 or \
            (emb[0].vocab_size, emb[0].hidden_size) != (head[0].vocab_size,
                                                        head[0].hidden_size):
        raise SpecError(tied[0][0], "tie_embeddings: true needs one embedding and one head "
                                    "layer, both with tie_embeddings: true and the same "
                                    "vocab_size and hidden_size")
