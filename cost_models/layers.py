"""The model as the cost model sees it: a chain of layers, each described by numbers.

A `Layer` is the *application* description (Calculon's term): sizes only, no device, no
strategy. The functions below derive what the cost terms need from it, per sample (one
sequence) and for a tensor-parallel degree `tmp`:

- `forward_flops`      GEMM FLOPs of one forward pass (backward is 2x, Narayanan et al. 2021);
- `elementwise_bytes`  bytes moved by the memory-bound ops (norms, softmax, GELU, residuals);
- `param_count`        parameters held by one tensor rank;
- `output_elements`    elements of the activation sent to the next layer (the P2P volume);
- `tp_allreduce_elements`  elements all-reduced inside the layer per forward+backward
  (`tp_allreduce_elements_by_pass`: the same, per pass).

The layer code the trials run (`amp_search/trial/`) implements exactly these layers:
- embedding: vocab-parallel token embedding (V*h / tmp) + replicated learned positions (s*h);
- transformer: pre-LayerNorm GPT block, fused QKV (column parallel), output projection (row
  parallel), GELU MLP h -> f -> h (column then row parallel), biases everywhere;
- mlp: pre-LayerNorm GELU MLP h -> f -> h with a residual (column then row parallel);
- head: final LayerNorm + untied LM projection h -> V (column parallel) + vocab-parallel
  cross-entropy;
- custom: a layer given by its forward FLOPs, parameters and output size; replicated, never
  split by tensor parallelism.

Llama-family layers (`Layer.is_gpt_block` false: grouped-query attention with g = query_groups
K/V heads, a head width d = kv_channels, SwiGLU, RMSNorm, no biases, RoPE) are costed as
Megatron-LM's megatron-core GPT model runs them (--group-query-attention, --kv-channels,
--swiglu, --normalization RMSNorm, --disable-bias-linear, --position-embedding-type rope):
each function documents its Llama terms; GPT layers take the GPT formulas unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

LAYER_KINDS = ("embedding", "transformer", "mlp", "head", "custom")
MLP_KINDS = ("gelu", "swiglu", "quick_geglu")
GATED_MLP_KINDS = ("swiglu", "quick_geglu")
"""The gated MLPs: fc1 writes a gate and a linear half (h -> 2f), fc2 reads f. swiglu:
silu(gate) * linear (Megatron-LM's --swiglu); quick_geglu: GPT-OSS's clamped quick-GELU GLU,
quick_gelu(min(gate, c)) * (clamp(linear, -c, c) + 1) with c = QUICK_GEGLU_CLAMP and
quick_gelu(x) = x sigmoid(1.702 x) (--quick-geglu --glu-linear-offset 1.0
--activation-func-clamp-value 7.0). Both cost the same FLOPs and parameters."""
QUICK_GEGLU_CLAMP = 7.0
"""GPT-OSS's activation clamp (its config's swiglu_limit; Megatron-Bridge's
activation_func_clamp_value)."""
QUICK_GEGLU_OFFSET = 1.0
"""GPT-OSS's GLU linear offset (Megatron-Bridge's glu_linear_offset)."""
NORM_KINDS = ("layernorm", "rmsnorm")
POSITION_EMBEDDINGS = ("learned", "rope")
ROPE_SCALINGS = ("none", "yarn")
"""Layer.rope_scaling: how the rotary frequencies are scaled. yarn: YaRN (GPT-OSS, DeepSeek
V3), whose attention scale (mscale) is not 1, which megatron-core's fused RoPE kernel does not
take: it runs the rotation as separate PyTorch ops (`UNFUSED_ROPE_BYTES_PER_ELEMENT`)."""
UNFUSED_ROPE_BYTES_PER_ELEMENT = (12, 10)
"""(forward, backward) bytes per element of q and k, in units of g, that megatron-core's
unfused RoPE (rope_utils._apply_rotary_pos_emb_bshd: t cos + rotate_half(t) sin, then the
concatenation with the unrotated part) moves: forward rotate_half's negation of one half
(read and write 1/2 each) and concatenation (1, 1), the two products (1, 1 each), their sum
(2, 1) and the final concatenation (1, 1): 12; backward the two products' gradients (1, 1
each), the negation's (1/2, 1/2), the halves' concatenation (1, 1) and the sum of the two
paths' gradients (2, 1): 10. The fused kernel reads and writes each element once: 2 and 2."""
CROSS_ENTROPY_KINDS = ("native", "te")
"""Layer.cross_entropy: the loss kernel after the head."""
MOE_DISPATCHERS = ("alltoall", "deepep", "hybridep")
"""Megatron-core's token dispatchers for expert parallelism (training.moe_dispatcher):
'alltoall' (--moe-token-dispatcher-type alltoall, its default) sends each of a token's k
copies straight to its expert's rank, an NCCL all-to-all; 'deepep' and 'hybridep'
(--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep | hybridep, DeepSeek's
DeepEP and NVIDIA's Hybrid-EP, "an optimized branch of DeepEP-V1") send it hierarchically:
once over the network to each other node that holds one of its experts, whence NVLink
forwards it to those experts' ranks (cost_models.comm.hierarchical_shares); the combine
reduces a node's copies over NVLink first and returns one vector per node."""
VOCAB_PAD_MULTIPLE = 128
"""Megatron-LM pads the vocabulary to a multiple of 128 x tmp (--make-vocab-size-divisible-by),
so that every tensor rank holds an equal, aligned shard; the trials do the same."""


def padded_vocab_size(vocab_size: int, tmp: int = 1) -> int:
    """The vocabulary the embedding and head really hold at tensor-parallel degree `tmp`."""
    multiple = VOCAB_PAD_MULTIPLE * tmp
    return -(-vocab_size // multiple) * multiple


@dataclass(frozen=True, kw_only=True)
class Layer:
    """One layer of the chain. Sizes are element counts; all per sample (one sequence)."""

    kind: str
    """One of LAYER_KINDS."""
    seq_length: int
    """Tokens per sample."""
    hidden_size: int = 0
    """Width of the layer's input and output (embedding: output; head: input)."""
    num_attention_heads: int = 0
    """Attention heads (transformer only)."""
    ffn_hidden_size: int = 0
    """Inner MLP width (transformer and mlp)."""
    vocab_size: int = 0
    """Vocabulary (embedding and head)."""
    input_hidden_size: int = 0
    """Width of the incoming activation when it differs from hidden_size (a projection is
    then part of the layer: h_in -> h). 0 means the same as hidden_size."""
    num_query_groups: int = 0
    """Key/value heads (transformer): grouped-query attention shares one K/V head among
    num_attention_heads / num_query_groups query heads (1: multi-query); 0: one per query
    head (multi-head attention). Megatron-LM: --group-query-attention --num-query-groups."""
    head_dim: int = 0
    """Width of one attention head (Megatron-LM's --kv-channels); 0: hidden_size /
    num_attention_heads."""
    mlp: str = "gelu"
    """The MLP (transformer and mlp): 'gelu', h -> f -> h; 'swiglu', gate and up h -> f each,
    SiLU(gate) * up, down f -> h (three matrices, Megatron-LM's --swiglu); 'quick_geglu',
    the same matrices with GPT-OSS's clamped quick-GELU GLU (GATED_MLP_KINDS)."""
    norm: str = "layernorm"
    """'layernorm' (weight and bias) | 'rmsnorm' (weight only; --normalization RMSNorm)."""
    bias: bool = True
    """Biases on the linear layers (False: Megatron-LM's --disable-bias-linear)."""
    position_embedding: str = "learned"
    """embedding: 'learned' (s*h position parameters) | 'rope' (rotary, applied to q and k
    inside each block, no parameters; --position-embedding-type rope)."""
    rope_scaling: str = "none"
    """transformer with RoPE: one of ROPE_SCALINGS (yarn: megatron-core rotates q and k
    unfused)."""
    qk_norm: bool = False
    """transformer: a norm (the layer's `norm`, over one head's d) on each query and key head
    after the QKV projection, before RoPE (Megatron-LM's --qk-layernorm; Qwen3's q_norm and
    k_norm): 2d parameters, and its inputs kept for the backward."""
    tie_embeddings: bool = False
    """embedding and head: the head's projection is the embedding's matrix. The model holds it
    once; a pipeline keeps a copy on the last stage too, as Megatron-LM does (its default;
    --untie-embeddings-and-output-weights unties)."""
    num_experts: int = 0
    """transformer: routed experts E of a mixture-of-experts MLP (0: a dense MLP). Each token
    goes to moe_router_topk of them; Megatron-LM's --num-experts."""
    moe_router_topk: int = 0
    """k: experts per token (--moe-router-topk)."""
    moe_ffn_hidden_size: int = 0
    """f_e: one expert's inner width (--moe-ffn-hidden-size); 0: ffn_hidden_size. The
    expert's MLP is `mlp` (SwiGLU: gate and up h -> f_e each, down f_e -> h)."""
    moe_shared_expert_size: int = 0
    """f_s: the inner width of the shared experts every token also passes through (their
    widths summed, --moe-shared-expert-intermediate-size); 0: none."""
    kv_lora_rank: int = 0
    """transformer: multi-latent attention (MLA, DeepSeek-V2/V3, Kimi-K2) where > 0: the
    key/value latent width c (Megatron-LM's --multi-latent-attention --kv-lora-rank). Keys
    and values are made from a per-token latent: a down-projection h -> c + d_r (the latent
    and the one rotary key head every query head shares), a norm on the latent, and an
    up-projection c -> a (d + d_v) (each head's non-rotary key part and its value). head_dim
    is d, the non-rotary width of each query and key head (--qk-head-dim)."""
    q_lora_rank: int = 0
    """MLA: the query's latent width q_r (--q-lora-rank): a down-projection h -> q_r, a norm,
    an up-projection q_r -> a (d + d_r); 0: one projection h -> a (d + d_r)."""
    qk_rope_head_dim: int = 0
    """MLA: d_r, the rotary part of each query and key head (--qk-pos-emb-head-dim); RoPE
    rotates only these, and one rotary key head serves every query head."""
    v_head_dim: int = 0
    """MLA: d_v, the width of each value head and of each head's attention output
    (--v-head-dim)."""
    mtp: bool = False
    """A layer of Megatron-LM's multi-token-prediction module (--mtp-num-layers; DeepSeek-V3),
    which follows the last block on the last pipeline stage: its transformer block, whose
    input projection (input_hidden_size 2h: the eh_proj) reads the normed embedding of the
    next tokens beside the normed hidden state, or its loss, a head computing the logits of
    the next-but-one tokens with the main head's output layer (the stage's copy of the
    embedding matrix for the MTP's token lookup has as many parameters as that head's
    matrix, counted in its place); the loss hands the main model's hidden state on to the
    main head after it."""
    attention_window: int = 0
    """transformer: sliding-window attention, each query attends to the w keys before it
    (Megatron-LM's --window-size w,0); 0: full causal attention."""
    hidden_dropout: float = 0.0
    """embedding, transformer and mlp: the dropout probability on the embedding's output and
    on the attention's and the MLP's outputs before their residual adds (Megatron-LM's
    --hidden-dropout, 0.1 by default there); each keeps a 1-byte mask per element for the
    backward. 0: none (the Llama recipes)."""
    custom_forward_flops: float = 0.0
    """custom only: forward FLOPs per sample."""
    custom_params: int = 0
    """custom only: parameter count."""
    custom_output_elements: int = 0
    """custom only: output activation elements per sample."""
    fused_experts: bool = False
    """transformer with experts: the experts' fc1, activation and fc2 run as one fused kernel
    (megatron-core's fused grouped MLP, which the sync-free MoE recipes run:
    training.moe_sync_free). False: megatron-core's TEGroupedMLP, which runs some of the
    experts' elementwise work as separate PyTorch ops (`unfused_expert_bytes_by_pass`)."""
    cross_entropy: str = "native"
    """head: the loss kernel. 'native': Megatron-LM's vocab-parallel cross-entropy, which
    computes in an fp32 copy of the logits and keeps the fp32 softmax for the backward;
    'te': Transformer Engine's fused one (--cross-entropy-loss-fusion
    --cross-entropy-fusion-impl te, transformer_engine.pytorch.cross_entropy), which writes
    the logits' gradient into a tensor of the logits' own dtype in the forward and keeps that
    (with two fp32 softmax statistics and the target per token)."""
    name: str = field(default="")
    """A label for tables, e.g. 'block3'."""

    def __hash__(self) -> int:
        """The fields' hash, computed once per layer: the search keys its caches by layers
        and by tuples of a hundred of them."""
        h = self.__dict__.get("_cached_hash")
        if h is None:
            h = self.__dict__["_cached_hash"] = hash(
                tuple(getattr(self, f.name) for f in fields(self)))
        return h

    def __getstate__(self) -> dict:
        """Pickled without the cached hash and signature (string hashes differ between
        processes)."""
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_cached")}

    @property
    def signature(self) -> str:
        """A key naming the layer's shape; layers with equal signatures cost the same
        (computed once per layer)."""
        sig = self.__dict__.get("_cached_signature")
        if sig is None:
            sig = self.__dict__["_cached_signature"] = self._signature()
        return sig

    def _signature(self) -> str:
        if self.kind == "custom":
            return (f"custom:f{self.custom_forward_flops:g}:p{self.custom_params}"
                    f":o{self.custom_output_elements}")
        parts = [self.kind, f"s{self.seq_length}", f"h{self.hidden_size}"]
        if self.kind == "transformer":
            parts += [f"a{self.num_attention_heads}", f"f{self.ffn_hidden_size}"]
        if self.kind == "mlp":
            parts += [f"f{self.ffn_hidden_size}"]
        if self.kind in ("embedding", "head"):
            parts += [f"v{self.vocab_size}"]
        if self.input_hidden_size and self.input_hidden_size != self.hidden_size:
            parts += [f"in{self.input_hidden_size}"]
        # the Llama-family options, only where they differ from the GPT block (so that the
        # signatures of GPT layers, which measured profiles are keyed by, stay as they were)
        if self.num_query_groups and self.num_query_groups != self.num_attention_heads:
            parts += [f"g{self.num_query_groups}"]
        if self.head_dim and self.num_attention_heads and \
                self.head_dim * self.num_attention_heads != self.hidden_size:
            parts += [f"d{self.head_dim}"]
        parts += [x for x, default in ((self.mlp, "gelu"), (self.norm, "layernorm"),
                                       (self.position_embedding, "learned"),
                                       (self.rope_scaling, "none")) if x != default]
        if not self.bias:
            parts += ["nobias"]
        if self.qk_norm and self.kind == "transformer":
            parts += ["qknorm"]
        if self.is_mla:
            parts += [f"mla{self.q_lora_rank}-{self.kv_lora_rank}-{self.qk_rope_head_dim}"
                      f"-{self.v_head_dim}"]
        if self.tie_embeddings:
            parts += ["tied"]
        if self.is_moe:
            parts += [f"e{self.num_experts}", f"k{self.moe_router_topk}",
                      f"fe{self.expert_ffn}"]
            if self.moe_shared_expert_size:
                parts += [f"fs{self.moe_shared_expert_size}"]
            if self.fused_experts:
                parts += ["fusedmlp"]
        if self.kind == "transformer" and 0 < self.attention_window < self.seq_length:
            parts += [f"w{self.attention_window}"]
        if self.dropout_masks:
            parts += ["dropout"]
        if self.kind == "head" and self.cross_entropy != "native":
            parts += [f"ce-{self.cross_entropy}"]
        if self.mtp:
            parts += ["mtp"]
        return ":".join(parts)

    @property
    def dropout_masks(self) -> int:
        """Dropout masks of one element per token and hidden unit the layer keeps for the
        backward: 2 in a transformer block (after the attention and after the MLP), 1 in an
        mlp layer and in the embedding; 0 without hidden dropout."""
        if self.hidden_dropout <= 0.0:
            return 0
        return {"transformer": 2, "mlp": 1, "embedding": 1}.get(self.kind, 0)

    @property
    def is_mla(self) -> bool:
        """A transformer block with multi-latent attention (`kv_lora_rank` > 0)."""
        return self.kind == "transformer" and self.kv_lora_rank > 0

    @property
    def qk_head_width(self) -> int:
        """The width of one query (and key) head as the attention core sees it: d + d_r
        under MLA, else d (`kv_channels`)."""
        return self.kv_channels + (self.qk_rope_head_dim if self.is_mla else 0)

    @property
    def mla_latent_width(self) -> int:
        """MLA: q_r + c + d_r, the per-token width of what the down-projections write (the
        query latent, the key/value latent, the shared rotary key); 0 otherwise."""
        if not self.is_mla:
            return 0
        return self.q_lora_rank + self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def is_moe(self) -> bool:
        """A transformer block whose MLP is a mixture of experts."""
        return self.kind == "transformer" and self.num_experts > 0

    @property
    def expert_ffn(self) -> int:
        """f_e: one expert's inner width."""
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    @property
    def gated_mlp(self) -> bool:
        """A gated MLP (GATED_MLP_KINDS): fc1 h -> 2f (gate and linear half fused)."""
        return self.mlp in GATED_MLP_KINDS

    @property
    def unfused_clamps(self) -> bool:
        """Experts whose quick-GEGLU clamps and concatenates fc1's halves in separate ops
        before its fused kernel (megatron-core's unfused grouped experts): the time
        (`clamp_bytes_per_element`) and the clamped copy they keep
        (cost_models.activations) follow from it."""
        return self.mlp == "quick_geglu" and self.is_moe and not self.fused_experts

    @property
    def expert_fc1_width(self) -> int:
        """One expert's fc1 output width: f_e (GELU) or 2 f_e (gated, gate and up fused)."""
        return (2 if self.gated_mlp else 1) * self.expert_ffn

    @property
    def shared_fc1_width(self) -> int:
        """The shared experts' fc1 output width (0 without them)."""
        return (2 if self.gated_mlp else 1) * self.moe_shared_expert_size

    @property
    def in_hidden(self) -> int:
        return self.input_hidden_size or self.hidden_size

    @property
    def query_groups(self) -> int:
        """g: key/value heads (num_query_groups, or one per query head)."""
        return self.num_query_groups or self.num_attention_heads

    @property
    def kv_channels(self) -> int:
        """d: width of one attention head (head_dim, or hidden_size / num_attention_heads)."""
        if self.head_dim:
            return self.head_dim
        return self.hidden_size // self.num_attention_heads if self.num_attention_heads else 0

    @property
    def is_gpt_block(self) -> bool:
        """Whether every Llama-family option has its GPT value for the costs of this layer
        (multi-head attention of width h, GELU MLP, LayerNorm, biases, learned positions):
        then the GPT formulas apply as they always did, byte for byte. A layer with
        num_query_groups = num_attention_heads or head_dim = h / a explicitly is one too
        (the Llama formulas give the same numbers). tie_embeddings changes no layer's cost
        (see `model_param_count`)."""
        a = self.num_attention_heads
        return (not self.num_experts and not self.kv_lora_rank
                and (self.num_query_groups in (0, a))
                and (not self.head_dim or self.head_dim * a == self.hidden_size)
                and self.mlp == "gelu" and self.norm == "layernorm" and self.bias
                and self.position_embedding == "learned" and not self.qk_norm)

    @property
    def attention_width(self) -> int:
        """a d: the width of the attention output, the output projection's input (h in the
        GPT block); under MLA a d_v."""
        if self.is_mla:
            return self.num_attention_heads * self.v_head_dim
        return self.num_attention_heads * self.kv_channels

    @property
    def qkv_width(self) -> int:
        """(a + 2g) d: the fused QKV projection's output width (3h in the GPT block); under
        MLA the queries, keys and values the core reads, a (2 (d + d_r) + d_v)."""
        if self.is_mla:
            return self.num_attention_heads * (2 * self.qk_head_width + self.v_head_dim)
        return (self.num_attention_heads + 2 * self.query_groups) * self.kv_channels

    @property
    def core_width(self) -> int:
        """The width w whose 4 s^2 w / t are the attention core's FLOPs (QK^T and attention
        x V): a d; under MLA a (d + d_r + d_v) / 2, its QK^T over d + d_r and its
        attention x V over d_v."""
        if self.is_mla:
            return self.num_attention_heads * (self.qk_head_width + self.v_head_dim) // 2
        return self.attention_width

    @property
    def norm_params(self) -> int:
        """Parameters of one norm of width h: LayerNorm 2h (weight, bias), RMSNorm h."""
        return (2 if self.norm == "layernorm" else 1) * self.hidden_size

    @property
    def qk_norm_params(self) -> int:
        """Parameters of the query and key norms (`qk_norm`): one norm of width d each
        (LayerNorm 2d, RMSNorm d), replicated on every tensor rank; 0 without them."""
        if not self.qk_norm or self.kind != "transformer":
            return 0
        return 2 * (2 if self.norm == "layernorm" else 1) * self.kv_channels

    @property
    def norm_stats(self) -> int:
        """Per-token statistics one norm saves for backward: LayerNorm mean and rstd (2),
        RMSNorm rstd (1)."""
        return 2 if self.norm == "layernorm" else 1

    @property
    def fc1_width(self) -> int:
        """Output width of the MLP's first (column-parallel) linear, whole: f for GELU, 2f
        for a gated MLP (megatron-core fuses gate and up into one linear_fc1 of h x 2f)."""
        return (2 if self.gated_mlp else 1) * self.ffn_hidden_size


def _projection_params(layer: Layer) -> int:
    """An input projection h_in -> h (weight + bias, no bias with bias False) when the width
    changes; replicated."""
    if layer.input_hidden_size and layer.input_hidden_size != layer.hidden_size:
        return (layer.input_hidden_size * layer.hidden_size
                + (layer.hidden_size if layer.bias else 0))
    return 0


def _check_options(layer: Layer) -> None:
    for value, known, what in ((layer.mlp, MLP_KINDS, "mlp"), (layer.norm, NORM_KINDS, "norm"),
                               (layer.position_embedding, POSITION_EMBEDDINGS,
                                "position_embedding"),
                               (layer.rope_scaling, ROPE_SCALINGS, "rope_scaling"),
                               (layer.cross_entropy, CROSS_ENTROPY_KINDS, "cross_entropy")):
        if value not in known:
            raise ValueError(f"{what} {value!r}; known: {', '.join(known)}")


def block_tensor_numels(layer: Layer, tmp: int = 1, vocab: int | None = None, ep: int = 1
                        ) -> tuple[int, ...]:
    """Elements of each parameter tensor of a layer with the Llama-family options on one
    tensor rank, in megatron-core's registration order (the order a flat buffer holds them);
    `vocab` the vocabulary held (default: padded for tmp). For every layer, GPT ones included,
    these are what megatron-core's GPT model registers (the trial layers register the same
    for the GPT block):

    embedding:   word V h/t, positions s h (learned only)
    transformer: [input projection h_in h, h], input norm (LayerNorm h, h | RMSNorm h),
                 linear_qkv h (a + 2g) d / t [+ bias (a + 2g) d / t], [q and k norms of
                 width d each, replicated, with qk_norm], linear_proj a d h / t
                 [+ bias h], pre-MLP norm, linear_fc1 h F / t [+ F / t] with F = f (GELU) or
                 2f (SwiGLU: gate and up fused), linear_fc2 f h / t [+ h]
    mlp:         [input projection], norm, fc1, fc2 as above
    head:        final norm, output_layer V h / t [+ V / t]
    Column-parallel weights and biases are divided by t, row-parallel biases and norms
    replicated; Megatron-LM requires t | g (each rank holds whole K/V groups) and t | a.

    A mixture-of-experts block (`Layer.is_moe`) has, after the pre-MLP norm, the router
    (E x h, replicated, no bias), the shared experts (an MLP of width f_s, tensor-parallel
    as above) and E/ep routed experts of this expert-parallel rank, each fc1 h F_e [+ F_e]
    and fc2 f_e h [+ h] (F_e = f_e or 2 f_e), whole: the experts are not split by tensor
    parallelism (expert tensor parallelism 1, as Megatron-Bridge's MoE recipes set
    --expert-tensor-parallel-size 1)."""
    _check_options(layer)
    h, f, s, t = layer.hidden_size, layer.ffn_hidden_size, layer.seq_length, tmp
    v = padded_vocab_size(layer.vocab_size, tmp) if vocab is None else vocab
    b = layer.bias
    norm = (h, h) if layer.norm == "layernorm" else (h,)
    proj = ()
    if layer.input_hidden_size and layer.input_hidden_size != h:
        proj = (layer.input_hidden_size * h,) + ((h,) if b else ())
    fc1 = layer.fc1_width
    mlp = ((h * fc1 // t,) + ((fc1 // t,) if b else ())
           + (f * h // t,) + ((h,) if b else ()))
    k = layer.kind
    if k == "embedding":
        return (v * h // t,) + ((s * h,) if layer.position_embedding == "learned" else ())
    if k == "transformer":
        qkv, ad = layer.qkv_width, layer.attention_width
        qk = layer.qk_norm_params // 2
        if layer.is_mla:
            attention = proj + norm + _mla_tensor_numels(layer, t) \
                + (ad * h // t,) + ((h,) if b else ()) + norm
        else:
            attention = (proj + norm + (h * qkv // t,) + ((qkv // t,) if b else ())
                         + ((qk, qk) if qk else ())
                         + (ad * h // t,) + ((h,) if b else ()) + norm)
        if not layer.is_moe:
            return attention + mlp
        fs, fs1 = layer.moe_shared_expert_size, layer.shared_fc1_width
        shared = ((h * fs1 // t,) + ((fs1 // t,) if b else ())
                  + (fs * h // t,) + ((h,) if b else ())) if fs else ()
        fe, fe1 = layer.expert_ffn, layer.expert_fc1_width
        expert = (h * fe1,) + ((fe1,) if b else ()) + (fe * h,) + ((h,) if b else ())
        return attention + (layer.num_experts * h,) + shared \
            + expert * (layer.num_experts // ep)
    if k == "mlp":
        return proj + norm + mlp
    if k == "head":
        return norm + (v * h // t,) + ((v // t,) if b else ())
    if k == "custom":
        return (layer.custom_params,)
    raise ValueError(f"unknown layer kind {k!r}")


def _mla_tensor_numels(layer: Layer, tmp: int) -> tuple[int, ...]:
    """The projections of multi-latent attention on one tensor rank, as megatron-core's
    MLASelfAttention registers them (megatron/core/transformer/multi_latent_attention.py):
    the query's down-projection h q_r and its latent norm q_r (replicated on every tensor
    rank), its up-projection q_r a (d + d_r) / t (column-parallel; without a query latent one
    projection h a (d + d_r) / t), the key/value down-projection h (c + d_r) and its latent
    norm c (replicated), the up-projection c a (d + d_v) / t (column-parallel); the output
    projection a d_v h / t is the caller's. Norms: RMSNorm (weight) or LayerNorm (weight,
    bias) of the latent's width."""
    h, a, t = layer.hidden_size, layer.num_attention_heads, tmp
    d, dr, dv = layer.kv_channels, layer.qk_rope_head_dim, layer.v_head_dim
    qr, c = layer.q_lora_rank, layer.kv_lora_rank
    per_norm = 2 if layer.norm == "layernorm" else 1
    q = ((h * qr,) + (qr,) * per_norm + (qr * a * (d + dr) // t,) if qr
         else (h * a * (d + dr) // t,))
    return q + (h * (c + dr),) + (c,) * per_norm + (c * a * (d + dv) // t,)


def param_count(layer: Layer, tmp: int = 1, ep: int = 1) -> int:
    """Parameters held by one tensor-parallel rank (of a mixture-of-experts block: with its
    expert-parallel rank's E/ep experts, `block_tensor_numels`).

    transformer: LN 2h + QKV (3h*h + 3h)/t + proj h*h/t + h + LN 2h + fc1 (h*f + f)/t + fc2 f*h/t + h
    (row-parallel biases and LayerNorms are replicated, as in Megatron).

    A layer with Llama-family options (not `Layer.is_gpt_block`): the sum of
    `block_tensor_numels`, i.e. per transformer block
    norm + h (a + 2g) d / t [+ (a + 2g) d / t] + a d h / t [+ h] + norm + h F / t [+ F / t]
    + f h / t [+ h], norm = 2h (LayerNorm) or h (RMSNorm), F = f (GELU) or 2f (gated),
    [...] only with biases; embedding V h / t (+ s h with learned positions); head norm +
    V h / t (+ V / t with biases). Tied embeddings change nothing here: every stage holding
    the embedding or the head holds the matrix (Megatron-LM keeps a copy on the last
    stage); `model_param_count` counts it once.
    """
    if not layer.is_gpt_block and layer.kind != "custom":
        return sum(block_tensor_numels(layer, tmp, ep=ep))
    h, f, s = layer.hidden_size, layer.ffn_hidden_size, layer.seq_length
    v = padded_vocab_size(layer.vocab_size, tmp)
    k = layer.kind
    if k == "embedding":
        return v * h // tmp + s * h
    if k == "transformer":
        return (2 * h + (3 * h * h + 3 * h) // tmp + h * h // tmp + h
                + 2 * h + (h * f + f) // tmp + f * h // tmp + h + _projection_params(layer))
    if k == "mlp":
        return 2 * h + (h * f + f) // tmp + f * h // tmp + h + _projection_params(layer)
    if k == "head":
        return 2 * h + (h * v + v) // tmp
    if k == "custom":
        return layer.custom_params
    raise ValueError(f"unknown layer kind {k!r}")


def expert_param_count(layer: Layer, ep: int = 1) -> int:
    """Parameters of the routed experts one expert-parallel rank holds (E/ep of them, whole);
    0 for a layer without experts. Their gradients are reduced, and their optimizer state
    sharded, over the expert-data-parallel ranks (dp x cp x tmp / ep), not over dp x cp."""
    if not layer.is_moe:
        return 0
    h, fe, fe1 = layer.hidden_size, layer.expert_ffn, layer.expert_fc1_width
    per_expert = h * fe1 + fe * h + ((fe1 + h) if layer.bias else 0)
    return per_expert * (layer.num_experts // ep)


def model_flops_per_sample(layers, frozen: bool = False) -> float:
    """Model FLOPs of one training sample (one sequence): three times the forward pass's GEMMs
    and attention core (forward, and the input and weight gradients), full attention as
    Narayanan et al. 2021 count it, no recomputation, the vocabulary padded as at tmp 1; what
    "model TFLOP/s per GPU" divides by the time (recomputed work is not model work). `frozen`
    weights (LoRA) have no weight gradients: twice the GEMMs, three times the attention core."""
    gemm = sum(sum(gemm_flops(x, 1)) for x in layers)
    return (2.0 if frozen else 3.0) * gemm \
        + 3.0 * sum(attention_core_flops(x, 1) for x in layers)


def model_param_count(layers) -> int:
    """The model's parameters as model cards publish them: every layer at tmp 1 with the
    unpadded vocabulary, and a tied embedding matrix (`Layer.tie_embeddings` on the
    embedding or the head, with both in the chain) counted once, not once per holder."""
    layers = list(layers)
    total = sum(sum(block_tensor_numels(x, 1, vocab=x.vocab_size)) for x in layers)
    embeddings = [x for x in layers if x.kind == "embedding"]
    for head in (x for x in layers if x.kind == "head"):
        if embeddings and (head.tie_embeddings or any(e.tie_embeddings for e in embeddings)):
            total -= head.vocab_size * head.hidden_size
    return total


def forward_flops(layer: Layer, tmp: int = 1) -> float:
    """Matrix-multiply FLOPs of one forward pass per sample on one tensor rank: the GEMMs plus
    the attention core (transformer, Narayanan et al. 2021, eq. 2 per layer:
    2s(4h^2 + 2hf)/t + 4 s^2 h/t)."""
    if layer.kind not in LAYER_KINDS:
        raise ValueError(f"unknown layer kind {layer.kind!r}")
    return sum(gemm_flops(layer, tmp)) + attention_core_flops(layer, tmp)


def gemm_flops(layer: Layer, tmp: int = 1, ep: int = 1) -> tuple[float, ...]:
    """FLOPs of each dense GEMM call of one forward pass per sample on one tensor rank (the
    attention core, QK^T and attention x V, is `attention_core_flops`). What sets a GEMM's
    efficiency is its size (`cost_models.compute.gemm_efficiency`).

    transformer: QKV 2s h 3h/t, projection 2s (h/t) h, fc1 2s h f/t, fc2 2s (f/t) h;
    mlp: fc1 and fc2; head: 2s h V/t (V padded); an input projection 2s h_in h; custom: its
    FLOPs.

    With the Llama-family options (g query groups, head width d, F = fc1 width: f for GELU,
    2f for SwiGLU): QKV 2s h (a + 2g) d / t, projection 2s a d h / t, fc1 2s h F / t (one GEMM:
    megatron-core runs SwiGLU's gate and up as one fused linear_fc1 of h x 2f), fc2
    2s f h / t. Biases, norms, RoPE and the SiLU are memory-bound (`elementwise_bytes`).

    A mixture-of-experts block (expert tensor parallelism 1, sequence parallelism with
    tmp > 1, so a rank routes s/t tokens): the router 2s h E / t, the routed experts'
    fc1 2s k h F_e / t and fc2 2s k f_e h / t (each rank's tokens go to k experts; with the
    tokens balanced over the experts every expert-parallel rank gets as many as it sends),
    as E/ep calls each, one per local expert of its ep s k / (E t) tokens (--moe-grouped-gemm
    runs them in one kernel, but each expert's GEMM is as small as its tokens make it: ep
    sets how efficient they are), and the shared experts' fc1 and fc2 as a dense MLP of
    width f_s."""
    h, f, s = layer.hidden_size, layer.ffn_hidden_size, layer.seq_length
    v = padded_vocab_size(layer.vocab_size, tmp)
    proj = (2.0 * s * layer.input_hidden_size * h,) if _projection_params(layer) else ()
    k = layer.kind
    if k in ("transformer", "mlp") and not layer.is_gpt_block:
        mlp = (2.0 * s * h * layer.fc1_width / tmp, 2.0 * s * f * h / tmp)
        if layer.is_moe:
            local = layer.num_experts // ep
            tk, fs = s * layer.moe_router_topk / local, layer.moe_shared_expert_size
            mlp = (2.0 * s * h * layer.num_experts / tmp,) \
                + (2.0 * tk * h * layer.expert_fc1_width / tmp,) * local \
                + (2.0 * tk * layer.expert_ffn * h / tmp,) * local \
                + ((2.0 * s * h * layer.shared_fc1_width / tmp, 2.0 * s * fs * h / tmp)
                   if fs else ())
        if k == "mlp":
            return proj + mlp
        if layer.is_mla:
            return proj + mla_gemm_flops(layer, tmp) \
                + (2.0 * s * layer.attention_width * h / tmp,) + mlp
        return proj + (2.0 * s * h * layer.qkv_width / tmp,
                       2.0 * s * layer.attention_width * h / tmp) + mlp
    if k == "transformer":
        return proj + (2.0 * s * h * 3 * h / tmp, 2.0 * s * h * h / tmp,
                       2.0 * s * h * f / tmp, 2.0 * s * f * h / tmp)
    if k == "mlp":
        return proj + (2.0 * s * h * f / tmp, 2.0 * s * f * h / tmp)
    if k == "head":
        return (2.0 * s * h * v / tmp,)
    if k == "custom":
        return (float(layer.custom_forward_flops),) if layer.custom_forward_flops else ()
    return ()


def mla_gemm_flops(layer: Layer, tmp: int = 1) -> tuple[float, ...]:
    """The projection GEMMs of multi-latent attention, one forward per sample on one tensor
    rank: the down-projections 2s h q_r and 2s h (c + d_r), whose weights every tensor rank
    holds whole, each on the rank's s/t tokens (megatron-core runs them on the sequence
    shard and gathers the latents; `Layer.mla_latent_width`), and the column-parallel
    up-projections 2s q_r a (d + d_r) / t and 2s c a (d + d_v) / t (without a query latent
    one query projection 2s h a (d + d_r) / t). The output projection is the caller's."""
    s, h, t = layer.seq_length, layer.hidden_size, tmp
    qr, c, dr = layer.q_lora_rank, layer.kv_lora_rank, layer.qk_rope_head_dim
    q_up, kv_up = mla_up_projection_flops(layer, tmp)
    return ((2.0 * s * h * qr / t, q_up) if qr else (q_up,)) \
        + (2.0 * s * h * (c + dr) / t, kv_up)


def mla_up_projection_flops(layer: Layer, tmp: int = 1) -> tuple[float, float]:
    """(queries, keys and values): the column-parallel GEMMs of multi-latent attention that
    make each head's q, k and v, one forward per sample on one tensor rank: 2s q_r a (d + d_r)
    / t (without a query latent the query projection 2s h a (d + d_r) / t) and
    2s c a (d + d_v) / t; what recompute_modules mla_up_proj runs again."""
    s, h, a, t = layer.seq_length, layer.hidden_size, layer.num_attention_heads, tmp
    d, dr, dv = layer.kv_channels, layer.qk_rope_head_dim, layer.v_head_dim
    q_in = layer.q_lora_rank or h
    return 2.0 * s * q_in * a * (d + dr) / t, 2.0 * s * layer.kv_lora_rank * a * (d + dv) / t


def kv_elements_per_token(layer: Layer, tmp: int = 1) -> int:
    """Elements of one token's keys and values on one tensor rank (2 g d / t; a key/value group
    that tmp splits below one is replicated on each rank): what context parallelism's ring
    passes from rank to rank. 0 for the other layers."""
    if layer.kind != "transformer":
        return 0
    if layer.is_mla:        # every head's key (d + d_r) and value (d_v), a / t heads
        return layer.num_attention_heads // tmp * (layer.qk_head_width + layer.v_head_dim)
    per_rank = max(layer.query_groups // tmp, 1)
    return 2 * per_rank * layer.kv_channels


def attention_core_flops(layer: Layer, tmp: int = 1) -> float:
    """QK^T and attention x V of one forward pass per sample: 4 s^2 h / t (Narayanan et al.
    2021); transformer layers only. With a head width d: 4 s^2 a d / t (grouped-query
    attention shares K and V but every query head still runs its own s x s products).
    Sliding-window attention (w < s keys per query) computes the band of the causal
    triangle: `window_fraction` of it."""
    if layer.kind != "transformer":
        return 0.0
    width = layer.hidden_size if layer.is_gpt_block else layer.core_width
    return 4.0 * layer.seq_length ** 2 * width / tmp * window_fraction(layer)


def window_fraction(layer: Layer) -> float:
    """The share of the causal triangle's (query, key) pairs a sliding window of w keys
    keeps: (s w - w^2 / 2) / (s^2 / 2) = 2 w/s - (w/s)^2; 1 for full attention. A fused
    kernel skips the blocks outside the band, so its time scales with this share."""
    s, w = layer.seq_length, layer.attention_window
    if not 0 < w < s:
        return 1.0
    return 2.0 * w / s - (w / s) ** 2


def attention_score_elements(layer: Layer, tmp: int = 1) -> float:
    """Elements of the attention score matrix per sample on one tensor rank: a s^2 / t."""
    if layer.kind != "transformer":
        return 0.0
    return layer.num_attention_heads * layer.seq_length ** 2 / tmp


def per_distinct_layer(layers, fn) -> list:
    """[fn(layer) for layer in layers], calling fn once per distinct `Layer.signature` (a
    model's many equal blocks cost the same)."""
    seen: dict = {}
    out = []
    for x in layers:
        if x.signature not in seen:
            seen[x.signature] = fn(x)
        out.append(seen[x.signature])
    return out


def dropout_bytes(layer: Layer, bytes_per_element: int) -> float:
    """Bytes per sample the layer's hidden dropouts move in one forward, eager as a trial
    layer runs them: each reads its input and writes its output and the 1-byte mask,
    (2g + 1) h per token."""
    return layer.dropout_masks * (2.0 * bytes_per_element + 1.0) * layer.seq_length \
        * layer.hidden_size


def elementwise_bytes(layer: Layer, tmp: int, bytes_per_element: int) -> float:
    """Bytes read+written per sample by the memory-bound ops of one forward pass
    (`_elementwise_bytes`), and each hidden dropout's (`dropout_bytes`)."""
    return _elementwise_bytes(layer, tmp, bytes_per_element) + \
        dropout_bytes(layer, bytes_per_element)


def _elementwise_bytes(layer: Layer, tmp: int, bytes_per_element: int) -> float:
    """Bytes read+written per sample by the memory-bound ops of one forward pass, without
    hidden dropout.

    Counted as (reads + writes) of each elementwise op's tensors:
    transformer: 2 LayerNorms and 2 residual adds on s*h (~4 tensors each), bias+GELU on s*f/t
    (the attention scores are `attention_score_elements`, costed by the attention kernel);
    head: LayerNorm on s*h, and the cross-entropy over s*V/t logits at a third of
    CROSS_ENTROPY_BYTES_PER_LOGIT (the backward pass, 2x the forward, takes the rest), or of
    TE_CROSS_ENTROPY_ELEMENTS_PER_LOGIT elements with Transformer Engine's fused one;
    embedding: the gathered rows s*h plus the positions.

    With the Llama-family options (not `Layer.is_gpt_block`), counted the same way:
    the norms: RMSNorm moves the same s*h tensors as LayerNorm (read x, write y; its one
    statistic, like LayerNorm's two, is per token and not counted): unchanged;
    the MLP activation on the fc1 output: GELU 2 s f/t (read, write) + its bias add 2 s f/t
    with biases (4 s f/t as before); SwiGLU (eager, as a trial layer would run it) SiLU of
    the gate (read f/t, write f/t) and the product with up (read 2f/t, write f/t): 5 s f/t,
    + the bias add on the 2f/t output 4 s f/t with biases;
    RoPE (a transformer with position_embedding 'rope'), applied to q and k: read and write
    s (a + g) d / t elements, 2 s (a + g) d / t (the cos/sin table, s d, is not counted);
    the query and key norms (qk_norm) as much again;
    embedding with RoPE: no positions to add, 2 s h (the gathered rows read and written).
    """
    h, f, s = layer.hidden_size, layer.ffn_hidden_size, layer.seq_length
    v = padded_vocab_size(layer.vocab_size, tmp)
    k = layer.kind
    if k in ("embedding", "transformer", "mlp") and not layer.is_gpt_block:
        if k == "embedding":
            n = (3.0 if layer.position_embedding == "learned" else 2.0) * s * h
        else:
            n = (16.0 if k == "transformer" else 8.0) * s * h \
                + _activation_elements(layer) * s * _mlp_inner(layer) / tmp \
                + (_q_k_elements(layer) / tmp if k == "transformer" else 0.0)
            return n * bytes_per_element + _moe_routing_bytes(layer, tmp, bytes_per_element)
        return n * bytes_per_element
    if k == "embedding":
        n = 3.0 * s * h
    elif k == "transformer":
        n = 16.0 * s * h + 4.0 * s * f / tmp
    elif k == "mlp":
        n = 8.0 * s * h + 4.0 * s * f / tmp
    elif k == "head":
        per_logit = TE_CROSS_ENTROPY_ELEMENTS_PER_LOGIT * bytes_per_element \
            if layer.cross_entropy == "te" else CROSS_ENTROPY_BYTES_PER_LOGIT
        return 4.0 * s * h * bytes_per_element + per_logit / 3 * s * v / tmp
    else:
        n = 2.0 * output_elements(layer)
    return n * bytes_per_element


def elementwise_bytes_by_pass(layer: Layer, tmp: int, bytes_per_element: int,
                              framework: str = "deepspeed") -> tuple[float, float]:
    """(forward, backward) bytes per sample moved by the memory-bound ops of one pass, as the
    framework runs them.

    deepspeed (the trial layers, amp_search.trial.model): `elementwise_bytes` forward, twice
    that backward.

    megatron (Megatron-LM's GPT block with its default fusions, --bias-gelu-fusion and
    --bias-dropout-fusion; g bytes per element, masks 1 byte), counted per token:
    forward: 2 LayerNorms (read x, write y: 2g h each), the attention context's permute to
    [s, b, h] (.contiguous(): 2g h), 2 fused bias-dropout-adds (read the GEMM output and the
    residual, write the sum and the 1-byte mask: (3g + 1) h each), the fused bias-GeLU on
    the f/t shard (2g f/t): (12g + 2) h + 2g f/t;
    backward: 2 LayerNorm backwards (read x and dy, write dx: 3g h each), 2 bias-dropout-add
    backwards (read dy and the mask, write dx, read dy again for the bias gradient:
    (3g + 1) h each), the 2 residual gradient sums (3g h each), the permute's (2g h), the
    bias-GeLU backward and its bias gradient (4g f/t): (20g + 2) h + 4g f/t, 1.6-1.8x the
    forward rather than 2x. The mlp layer has one LayerNorm, one bias-dropout-add, one
    residual sum and the GeLU; the other layers are counted as for deepspeed."""
    if framework not in TP_FRAMEWORKS:
        raise ValueError(f"framework {framework!r}; known: {', '.join(TP_FRAMEWORKS)}")
    if framework == "megatron" and layer.kind in ("transformer", "mlp") \
            and not layer.is_gpt_block:
        return _megatron_llama_elementwise_bytes(layer, tmp, bytes_per_element)
    if framework == "megatron" and layer.kind in ("transformer", "mlp"):
        g = float(bytes_per_element)
        sh = float(layer.seq_length * layer.hidden_size)
        sf = float(layer.seq_length * layer.ffn_hidden_size) / tmp
        if layer.kind == "transformer":
            return (12 * g + 2) * sh + 2 * g * sf, (20 * g + 2) * sh + 4 * g * sf
        return (5 * g + 1) * sh + 2 * g * sf, (9 * g + 1) * sh + 4 * g * sf
    forward = elementwise_bytes(layer, tmp, bytes_per_element)
    return forward, 2.0 * forward


def _activation_elements(layer: Layer) -> float:
    """Elements per token, in units of f/t, moved by the MLP activation in the trial-style
    (eager) count of one forward: GELU 2 (+2 bias add), SwiGLU 5 (+4 bias add on 2f/t);
    quick-GEGLU 16 (+4): its two clamps (4), the gate's 1.702 x and sigmoid (4), their product
    with the gate (3), the linear half's + 1 (2) and the product of the two (3)."""
    if layer.mlp == "swiglu":
        return 5.0 + (4.0 if layer.bias else 0.0)
    if layer.mlp == "quick_geglu":
        return 16.0 + (4.0 if layer.bias else 0.0)
    return 2.0 + (2.0 if layer.bias else 0.0)


def _mlp_inner(layer: Layer) -> int:
    """Per token, the inner width the MLP's activation runs on: f, or for a mixture of
    experts k f_e (the token's k routed experts) + f_s (the shared experts)."""
    if layer.is_moe:
        return layer.moe_router_topk * layer.expert_ffn + layer.moe_shared_expert_size
    return layer.ffn_hidden_size


def _moe_routing_bytes(layer: Layer, tmp: int, bytes_per_element: int) -> float:
    """Bytes per sample that one pass of a mixture-of-experts block's routing moves on one
    rank (its s/t tokens): the router's softmax and top-k over E fp32 logits (read and
    write, 8E), the permutation of each token into its k experts' order (read h, write k h)
    and the weighted combination back (read k h and the k weights, write h):
    s (g (2h + 2k h) + 8E) / t; 0 for other layers."""
    if not layer.is_moe:
        return 0.0
    h, k = layer.hidden_size, layer.moe_router_topk
    return layer.seq_length * (bytes_per_element * (2.0 * h + 2.0 * k * h)
                               + 2 * FP32_ROUTER_BYTES * layer.num_experts) / tmp


FP32_ROUTER_BYTES = 4
"""Megatron-LM's router computes its logits and probabilities in fp32."""


def _q_k_elements(layer: Layer) -> float:
    """Elements per sample times t that RoPE and the query and key norms (`Layer.qk_norm`)
    read and write on q and k in one pass: 2 s (a + g) d each (0 without either)."""
    if layer.kind != "transformer":
        return 0.0
    ops = (layer.position_embedding == "rope") + bool(layer.qk_norm)
    return 2.0 * ops * _q_k_per_sample(layer)


def q_k_bytes(layer: Layer, tmp: int, bytes_per_element: int) -> float:
    """Bytes per sample one rotation of q and k (RoPE, fused: one read and write of each
    element) moves on one tensor rank: 2 g s (a + g) d / t (MLA: 4 g s a (d + d_r) / t)."""
    return 2.0 * bytes_per_element * _q_k_per_sample(layer) / tmp


def _q_k_per_sample(layer: Layer) -> float:
    """Elements of q and k per sample, all heads: s (a + g) d; under MLA the queries and
    keys the core reads, 2 s a (d + d_r) (megatron-core's MLA RoPE kernel rotates their
    d_r parts and writes them whole, with the non-rotary parts: one read and write of
    each)."""
    if layer.is_mla:
        return 2.0 * layer.seq_length * layer.num_attention_heads * layer.qk_head_width
    return layer.seq_length * (layer.num_attention_heads + layer.query_groups) \
        * layer.kv_channels


def _megatron_llama_elementwise_bytes(layer: Layer, tmp: int, bytes_per_element: int
                                      ) -> tuple[float, float]:
    """`elementwise_bytes_by_pass` for megatron of a transformer or mlp layer with the
    Llama-family options: the GPT count with each term re-derived (g bytes per element, the
    dropout masks 1 byte as Megatron-LM's default dropout has them; a layer carries no
    dropout setting), per token:

    forward: 2 norms (LayerNorm or RMSNorm alike: read x, write y, 2g h each), the attention
    context's permute (2g a d), 2 bias-dropout-adds ((3g + 1) h each; without biases the same,
    the bias is h wide), the MLP activation (fused bias-GeLU or plain GeLU 2g f/t; fused
    bias-SwiGLU, megatron-core's bias_swiglu_impl, reads the 2f/t fc1 output and writes
    f/t: 3g f/t), fused RoPE on q and k (read and write (a + g) d / t: 2g (a + g) d / t),
    and as much for the query and key norms (qk_norm):
    (10g + 2) h + 2g a d + act + rope;
    backward: 2 norm backwards (3g h each), 2 bias-dropout-add backwards (read dy and the
    mask, write dx: (2g + 1) h each, + g h each for the bias gradient with biases), the 2
    residual sums (3g h each), the permute's (2g a d), the activation backward (GeLU: read
    dy and x, write dx, 3g f/t, + g f/t for the bias gradient; SwiGLU: read dy f/t and the
    saved 2f/t input, write the 2f/t gradient, 5g f/t, + 2g f/t for the bias gradient) and
    RoPE's (the inverse rotation of dq', dk': 2g (a + g) d / t; the query and key norms'
    backward counted the same):
    (16g + 2) h [+ 2g h] + 2g a d + act + rope.
    The mlp layer: one norm, one bias-dropout-add, one residual sum and the activation. With
    the GPT values these are the GPT formulas ((12g + 2) h + 2g f/t, (20g + 2) h + 4g f/t).
    A mixture-of-experts block: the activation on k f_e + f_s per token (`_mlp_inner`) and
    the routing's permutations in each pass (`_moe_routing_bytes`)."""
    g = float(bytes_per_element)
    s, f = layer.seq_length, float(_mlp_inner(layer))
    bias = 1.0 if layer.bias else 0.0
    act_f = megatron_activation_bytes(layer, bytes_per_element) * f / tmp
    act_b = (5 + 2 * bias if layer.gated_mlp else 3 + bias) * g * f / tmp
    norms_f, norms_b = megatron_norm_residual_bytes(layer, bytes_per_element)
    if layer.kind == "mlp":
        return s * (norms_f + act_f), s * (norms_b + act_b)
    ad = float(layer.attention_width)
    q_k_routing = g * _q_k_elements(layer) / tmp \
        + _moe_routing_bytes(layer, tmp, bytes_per_element)
    experts_f, experts_b = unfused_expert_bytes_by_pass(layer, tmp, bytes_per_element)
    rope_f, rope_b = unfused_rope_bytes_by_pass(layer, tmp, bytes_per_element)
    return (s * (norms_f + 2 * g * ad + act_f) + q_k_routing + experts_f + rope_f,
            s * (norms_b + 2 * g * ad + act_b) + q_k_routing + experts_b + rope_b)


CP_MERGE_ELEMENT_PASSES = (2.0, 2.25)
"""(first step, each later step): passes of g bytes over each element of a context-parallel
rank's attention output (and in the backward of its gradients) that ring attention's merges
move, averaged over the ring's ranks (`cp_merge_bytes_by_pass`)."""


def cp_merge_bytes_by_pass(layer: Layer, tmp: int, cp: int, bytes_per_element: int
                           ) -> tuple[float, float]:
    """(forward, backward) bytes per sample that one context-parallel rank moves merging the
    per-step results of Megatron-LM's ring attention (cp_comm_type p2p, its default), as
    Transformer Engine's AttnFuncWithCPAndKVP2P runs them in 16 bits (transformer_engine/
    pytorch/attention/dot_product_attention/context_parallel.py, read through the search
    tool); (0, 0) for cp 1 and for other layers. The attention kernels of the cp steps are
    `cost_models.compute.attention_time_s`'s; these are the memory-bound ops between them, on
    the rank's s/cp tokens, its a d / t query width and `kv_elements_per_token` key/value
    elements:

    - forward: each step's partial output is kept, and after the ring they are merged into
      one: the first step's scaled into the output (read and write: 2g per element), each
      later step's added to it (read it, read and write the output: 3g) over the whole local
      sequence on the steps with K/V from earlier ranks and its second half on the others,
      3/4 of it averaged over the ranks: g (2 + 2.25 (cp - 1)) per element of the output;
    - backward: each step's dq added to the running dq, and its dK and dV to the K/V gradient
      that goes on round the ring, the same way (the first copied, the later added over the
      whole or half): g (2 + 2.25 (cp - 1)) per element of q and of K/V; and the K/V copied
      into the ring's send buffer first (2g per element of K/V).

    The softmax statistics' merges (one value per head and token) are left out."""
    if cp <= 1 or layer.kind != "transformer":
        return 0.0, 0.0
    g = float(bytes_per_element)
    tokens = layer.seq_length / cp
    q = layer.attention_width / tmp
    kv = float(kv_elements_per_token(layer, tmp))
    first, later = CP_MERGE_ELEMENT_PASSES
    passes = first + later * (cp - 1)
    return g * tokens * q * passes, g * tokens * ((q + kv) * passes + 2.0 * kv)


def unfused_rope_bytes_by_pass(layer: Layer, tmp: int, bytes_per_element: int
                               ) -> tuple[float, float]:
    """(forward, backward) bytes per sample that megatron-core's unfused RoPE (YaRN,
    `Layer.rope_scaling`) moves beyond the fused kernel's read and write of each element of q
    and k on the rank (s (a + g) d / t of them): (12 - 2) g and (10 - 2) g each
    (UNFUSED_ROPE_BYTES_PER_ELEMENT); (0, 0) for other layers."""
    if layer.kind != "transformer" or layer.position_embedding != "rope" \
            or layer.rope_scaling != "yarn":
        return 0.0, 0.0
    elements = _q_k_per_sample(layer) / tmp
    g = float(bytes_per_element)
    forward, backward = UNFUSED_ROPE_BYTES_PER_ELEMENT
    return (forward - 2) * g * elements, (backward - 2) * g * elements


def unfused_expert_bytes_by_pass(layer: Layer, tmp: int, bytes_per_element: int
                                 ) -> tuple[float, float]:
    """(forward, backward) bytes per sample that megatron-core's grouped experts
    (TEGroupedMLP, megatron/core/transformer/moe/experts.py) move in separate PyTorch ops
    beside their GEMMs and fused activation, on the rank's s/t tokens (k routed copies each);
    (0, 0) for other layers and with `Layer.fused_experts`. Counted as each op's reads and
    writes (g bytes per element; the router's probabilities are fp32, FP32_ROUTER_BYTES = P):

    quick-GEGLU (weighted_bias_quick_geglu_impl, megatron/core/fusions/fused_bias_geglu.py)
    clamps the gate and the linear half of fc1's 2 f_e output and concatenates them again
    before its fused kernel: two clamps (read and write f_e each) and the cat (read and write
    2 f_e), 8g per element of f_e forward; backward the clamps' (read the gradient and the
    input, write: 6g f_e for both) and the chunk's, a cat of the two gradients (4g f_e): 10g
    (`clamp_bytes_per_element`);

    biases: fc2's bias is not added in the grouped GEMM but expert by expert afterwards,
    t + b p with each row's router probability p (TEGroupedMLP._apply_bias), in fp32 as p is:
    b p (write P h), the add (read g h and P h, write P h), the cat of the experts' pieces
    (2P h) and the cast back (read P h, write g h): (6P + 2g) h per routed token forward;
    backward the casts of the gradient to fp32 and of t's gradient back (2 (P + g) h), b's
    gradient sum(grad x p) and p's sum(grad x b) (read, write, read: 3P h each):
    (8P + 2g) h."""
    if not layer.is_moe or layer.fused_experts:
        return 0.0, 0.0
    g = float(bytes_per_element)
    k, h = layer.moe_router_topk, float(layer.hidden_size)
    clamp_f, clamp_b = clamp_bytes_per_element(layer, bytes_per_element)
    fe = float(layer.expert_ffn)
    p = float(FP32_ROUTER_BYTES)
    bias_f, bias_b = ((6 * p + 2 * g) * h, (8 * p + 2 * g) * h) if layer.bias else (0.0, 0.0)
    per_sample = layer.seq_length * k / tmp
    return (per_sample * (clamp_f * fe + bias_f), per_sample * (clamp_b * fe + bias_b))


def clamp_bytes_per_element(layer: Layer, bytes_per_element: int) -> tuple[float, float]:
    """(forward, backward) bytes per element of an expert's inner width f_e that the
    quick-GEGLU's separate clamps and concatenation move under megatron-core's unfused
    grouped experts (`unfused_expert_bytes_by_pass`): 8g and 10g; (0, 0) for another
    activation, a layer without experts, or fused experts. A recomputed activation
    (recompute_modules moe_act) runs the forward ones again."""
    if not layer.unfused_clamps:
        return 0.0, 0.0
    g = float(bytes_per_element)
    return 8.0 * g, 10.0 * g


def megatron_activation_bytes(layer: Layer, bytes_per_element: int) -> float:
    """Bytes per element of the MLP's inner width that megatron-core's fused activation moves
    in one forward: bias-SwiGLU and the quick-GEGLU read the 2 halves of the fc1 output and
    write one (3g), bias-GeLU reads and writes (2g)."""
    return (3.0 if layer.gated_mlp else 2.0) * bytes_per_element


def megatron_norm_residual_bytes(layer: Layer, bytes_per_element: int) -> tuple[float, float]:
    """(forward, backward) bytes per token of a transformer or mlp layer's norms, fused
    bias-dropout-adds and residual sums under megatron, the s x h part of
    `_megatron_llama_elementwise_bytes` (the region tensor parallelism leaves replicated and
    sequence parallelism splits): transformer (10g + 2) h and (16g + 2) h [+ 2g h with
    biases], mlp (5g + 1) h and (8g + 1) h [+ g h]; (0, 0) for the other layers."""
    g = float(bytes_per_element)
    h = float(layer.hidden_size)
    bias = 1.0 if layer.bias else 0.0
    if layer.kind == "transformer":
        # multi-latent attention's latent norms (read x, write y: 2g each of q_r and c;
        # backward 3g), per token and whole on every rank like the block's own norms
        latents = float(layer.q_lora_rank + layer.kv_lora_rank) if layer.is_mla else 0.0
        return (10 * g + 2) * h + 2 * g * latents, \
            (16 * g + 2) * h + 2 * bias * g * h + 3 * g * latents
    if layer.kind == "mlp":
        return (5 * g + 1) * h, (8 * g + 1) * h + bias * g * h
    return 0.0, 0.0


CROSS_ENTROPY_BYTES_PER_LOGIT = 60.0
"""Memory traffic per logit of Megatron's vocab-parallel cross-entropy, forward and backward,
with fp16/bf16 logits: the fp32 copy (read 2, write 4), max, subtract, exp and sum (read 4 x 4,
write 4 x 2), the softmax kept for backward, and the gradient (read 4 x 2, write 4, cast to the
training precision 4 + 2) ~ 60 B. Counted, not fitted; it matches the head's share of the
vTrain A100 measurements at tp >= 2 (benchmarks/gpu_accuracy.py)."""

TE_CROSS_ENTROPY_ELEMENTS_PER_LOGIT = 5.0
"""Memory traffic per logit, in elements of the logits' dtype, of Transformer Engine's fused
cross-entropy (Layer.cross_entropy 'te'), forward and backward: its Triton kernels read the
logits for the row's max and sum of exponentials, read them again and write the gradient in
place (3), and the backward scales that gradient by the loss's (read, write: 2). Counted."""


def output_elements(layer: Layer) -> int:
    """Elements of the activation this layer hands to the next one, per sample."""
    if layer.kind == "custom":
        return layer.custom_output_elements
    if layer.kind == "head" and not layer.mtp:
        return 1  # the loss
    return layer.seq_length * layer.hidden_size     # (an MTP loss passes the hidden state on)


def tp_allreduce_elements_by_pass(layer: Layer, recompute: bool = False
                                  ) -> tuple[tuple[float, ...], ...]:
    """Sizes (elements per sample) of the all-reduces inside the layer under tensor
    parallelism (Megatron's f/g operators, Shoeybi et al. 2019), per pass: (forward,
    backward, recomputed forward).

    transformer: 2 in forward (after attention and MLP row-parallel GEMMs) + 2 in backward
    (input gradients of the column-parallel GEMMs), each s*h;
    mlp: 1 + 1 of s*h; embedding (vocab-parallel): 1 of s*h in forward;
    head: 3 of s in forward (vocab-parallel cross-entropy: max, sum of exp, target logit) and
    1 of s*h in backward (column-parallel input gradient);
    custom: none (replicated).
    With full recomputation a block's forward runs again inside its backward, all-reduces
    included (transformer 2 more, mlp 1 more). A mixture-of-experts block without shared
    experts has the attention's only (the experts' tokens move by all-to-all).
    """
    s, h = layer.seq_length, layer.hidden_size
    k = layer.kind
    if layer.is_mla:
        # the output projection's forward; backward the input gradients of the column-parallel
        # up-projections (the latents, whole on every rank) or of a query projection of h
        mlp = () if layer.is_moe and not layer.moe_shared_expert_size else (s * h,)
        attention_backward = (s * (layer.q_lora_rank or h), s * layer.kv_lora_rank)
        forward = (s * h,) + mlp
        return forward, attention_backward + mlp, (forward if recompute else ())
    if k == "transformer" and layer.is_moe and not layer.moe_shared_expert_size:
        return (s * h,), (s * h,), ((s * h,) if recompute else ())   # the attention's only
    if k == "transformer":
        return (s * h, s * h), (s * h, s * h), ((s * h, s * h) if recompute else ())
    if k == "mlp":
        return (s * h,), (s * h,), ((s * h,) if recompute else ())
    if k == "embedding":
        return (s * h,), (), ()
    if k == "head":
        return (s, s, s), (s * h,), ()
    return (), (), ()


TP_FRAMEWORKS = ("deepspeed", "megatron")
"""Whose sequence-parallel layers `tp_collectives_by_pass` describes: the trial layers
(amp_search.trial.model, run by DeepSpeed) or Megatron-LM's own."""


@dataclass(frozen=True)
class TpCollective:
    """One tensor-parallel collective of one micro-batch sample: its kind
    (cost_models.comm.COLLECTIVES) and its size in elements per sample (all-reduce: the
    buffer; all-gather: the gathered output; reduce-scatter: the unscattered input), the sizes
    `cost_models.comm.collective_time_s` takes."""

    kind: str
    elements: float


def tp_collectives_by_pass(layer: Layer, recompute: bool = False,
                           sequence_parallel: bool = False, framework: str = "deepspeed"
                           ) -> tuple[tuple[TpCollective, ...], ...]:
    """The collectives inside the layer under tensor parallelism, per pass (forward, backward,
    recomputed forward), with or without sequence parallelism.

    Without it: the all-reduces of `tp_allreduce_elements_by_pass`.

    With it (Korthikanti et al. 2022, section 4.2.2, Figure 5: g is an all-gather in forward
    and a reduce-scatter in backward, g-bar the reverse), per transformer block:
    forward 2 all-gathers (the inputs of QKV and fc1, the column-parallel GEMMs) and 2
    reduce-scatters (the outputs of proj and fc2, the row-parallel GEMMs), all of s*h;
    backward the conjugates (2 reduce-scatters of the column GEMMs' input gradients, 2
    all-gathers of the row GEMMs' output gradients) plus one more all-gather of s*h per
    column-parallel GEMM: its input is saved as the s/t shard and gathered again for the
    weight gradient (Megatron's LinearWithGradAccumulationAndAsyncCommunication with
    sequence_parallel, and the trial layers' _SequenceColumnLinear). So the bus volume of
    backward is 1.5x that of tensor parallelism and there are twice as many calls (or more)
    as all-reduces, each with its own per-call cost.
    mlp: one column + one row GEMM (half of the above); head: its column-parallel LM
    projection (all-gather in forward; re-gather + reduce-scatter in backward) beside the
    cross-entropy's 3 all-reduces of s; embedding: Megatron reduce-scatters its output in
    forward and all-gathers the gradient in backward, the trial layers keep the vocab-parallel
    all-reduce and split the result (all-gather of the gradient in backward).
    The trial layers (`framework` "deepspeed") also all-reduce, in every micro-batch's
    backward, the gradients of the weights used on a sequence shard (their
    copy_to_tensor_model_parallel_region): per block 2 LayerNorms (weight and bias) and the
    row-parallel biases of proj and fc2, 6 all-reduces of h; mlp 3; head 2 (its LayerNorm);
    an input projection 2 more (h_in*h and h). (With RMSNorm one per norm, without biases
    none for the biases: a Llama block 2.) Grouped-query attention changes no collective:
    all of them carry the s*h residual stream, never K or V. Megatron-LM all-reduces those once per
    iteration (finalize_model_grads), which is not counted here.
    With full recomputation the block's forward (and its collectives) runs again in backward.
    """
    if framework not in TP_FRAMEWORKS:
        raise ValueError(f"framework {framework!r}; known: {', '.join(TP_FRAMEWORKS)}")
    if not sequence_parallel:
        return tuple(tuple(TpCollective("all_reduce", x) for x in part)
                     for part in tp_allreduce_elements_by_pass(layer, recompute))
    s, h = layer.seq_length, layer.hidden_size
    k = layer.kind
    ag, rs, ar = ("all_gather", "reduce_scatter", "all_reduce")
    trial = framework == "deepspeed"
    proj = ((TpCollective(ar, layer.input_hidden_size * h),)
            + ((TpCollective(ar, h),) if layer.bias else ())
            if trial and layer.input_hidden_size and layer.input_hidden_size != h else ())
    # replicated weights used on a sequence shard, per norm + row-parallel GEMM pair: the
    # norm's tensors (LayerNorm 2, RMSNorm 1) and the row-parallel bias (GPT block: 3)
    norm_tensors = 2 if layer.norm == "layernorm" else 1
    shard_weights = norm_tensors + (1 if layer.bias else 0)
    if layer.is_mla:
        # megatron-core's MLA: the down-projections run on the sequence shard, each
        # up-projection gathers its latent (q_r or, without one, the h-wide input; c), the
        # shared rotary key is gathered (d_r), and the output projection reduce-scatters;
        # backward the conjugates, the latents gathered again for the weight gradients and
        # the projection's output gradient gathered
        latents = (layer.q_lora_rank or h, layer.kv_lora_rank)
        mlp_pairs = 0 if layer.is_moe and not layer.moe_shared_expert_size else 1
        forward = tuple(TpCollective(ag, s * x) for x in latents + (layer.qk_rope_head_dim,)) \
            + (TpCollective(rs, s * h),) \
            + (TpCollective(ag, s * h), TpCollective(rs, s * h)) * mlp_pairs
        backward = tuple(TpCollective(rs, s * x) for x in latents + (layer.qk_rope_head_dim,)) \
            + tuple(TpCollective(ag, s * x) for x in latents) + (TpCollective(ag, s * h),) \
            + (TpCollective(ag, s * h), TpCollective(ag, s * h),
               TpCollective(rs, s * h)) * mlp_pairs
        return forward, backward, (forward if recompute else ())
    if k in ("transformer", "mlp"):
        gemm_pairs = 2 if k == "transformer" else 1
        if layer.is_moe:     # the experts keep their tokens sharded (all-to-all, not TP)
            gemm_pairs = 1 + (1 if layer.moe_shared_expert_size else 0)
        forward = (TpCollective(ag, s * h), TpCollective(rs, s * h)) * gemm_pairs
        backward = (TpCollective(ag, s * h), TpCollective(ag, s * h),
                    TpCollective(rs, s * h)) * gemm_pairs
        if trial:
            backward += (TpCollective(ar, h),) * (shard_weights * gemm_pairs) + proj
        return forward, backward, (forward if recompute else ())
    if k == "embedding":
        return ((TpCollective(ar if trial else rs, s * h),), (TpCollective(ag, s * h),), ())
    if k == "head":
        backward = (TpCollective(ag, s * h), TpCollective(rs, s * h))
        if trial:
            backward += (TpCollective(ar, h),) * norm_tensors   # its norm's weight (+ bias)
        return ((TpCollective(ag, s * h),) + (TpCollective(ar, s),) * 3, backward, ())
    return (), (), ()


def tp_allreduce_elements(layer: Layer, recompute: bool = False) -> tuple[float, ...]:
    """Sizes (elements per sample) of the all-reduces inside the layer for one forward and one
    backward pass (and the recomputed forward), all passes of
    `tp_allreduce_elements_by_pass` together."""
    return tuple(x for part in tp_allreduce_elements_by_pass(layer, recompute) for x in part)


def leading_layers(layers, kind: str) -> int:
    """How many layers of `kind` open the chain (the embedding's layers at the front; on the
    reversed chain, the head's at the back): the pipeline split keeps them with the first or
    last stage."""
    n = 0
    for layer in layers:
        if layer.kind != kind:
            break
        n += 1
    return n
