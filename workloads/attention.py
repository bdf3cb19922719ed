"""The cost of a layer's causal attention core, and the one place that emits it as a task.

FLOPs: QK^T and PV, 2 s_q s_k d each per head, halved by the causal mask (the convention
of Megatron-LM's and FlashAttention's causal FLOP counts). The backward runs dV, dP, dQ
and dK, twice the forward's FLOPs; FlashAttention also recomputes S = QK^T in its
backward, five GEMMs or 2.5x the forward (Dao 2023, FlashAttention-2, arXiv:2307.08691,
Algorithm 2).

HBM bytes: a FlashAttention forward reads q, k and v and writes o (and the per-row
logsumexp, negligible); its backward reads q, k, v, o and dO and writes dq, dk and dv,
about twice the forward's traffic (FlashAttention-2, Algorithm 2). Attention that is not
flash ("eager": PyTorch's math path, ATen's _scaled_dot_product_attention_math) also
materialises the s_q x s_k scores of every head and passes over them between its kernels
(workloads/attention_impls.py, which also has Megatron-LM's fused-softmax path).

Head dims: q and k share head_dim, v has v_head_dim (multi-head latent attention,
DeepSeek-V3 arXiv:2412.19437 section 2.1.1: 128 + 64 for q and k, 128 for v), so QK^T
costs 2 s_q s_k d_qk and PV 2 s_q s_k d_v per head.

Sliding window (Mistral 7B, arXiv:2310.06825 section 2; GPT-OSS, arXiv:2508.10925): a
query attends to at most w keys, itself included. Over a sequence of s tokens the causal
(query, key) pairs are s^2/2 in the convention above, and with the window s w - w^2/2
(the first w queries see a triangle, the rest w keys each), so the FLOPs are bounded by
the window. FlashAttention skips the key blocks outside the window (its window_size
argument); the tiles that straddle the window's edge are computed and masked, which is
not counted (an assumption: at most one tile of keys per query tile more). Eager
attention computes every score and masks them, so it gets no saving. A window of one key
tile (GPT-OSS's 128) leaves each query tile a loop of one or two key tiles, and the
kernel runs at a fraction of its full-sequence speed that cuDNN's GPT-OSS benchmark
measures per GPU (workloads/windowed_attention.py: 0.16-0.33).

Attention sinks (GPT-OSS): one learned logit per head joins every softmax denominator:
per query and head one exponential and one addition, against 2 w (d_qk + d_v) FLOPs of
the windowed core (under 0.01 % at w = 128, d = 64), so not priced; their parameters are
counted (workloads/model_spec.py). Megatron-Core with Transformer Engine >= 2.8 and cuDNN
>= 9.13.1 runs sink and window inside cuDNN's fused kernel (TE's get_attention_backend
keeps FusedAttention for softmax_type "learnable"; fused_attn_f16_arbitrary_seqlen.cu
passes the sink as set_sink_token and the window as a diagonal band), so GPT-OSS keeps
the flash pricing (the trail: tests/test_gptoss_attention.py).

Kernel speed (Shah et al. 2024, FlashAttention-3, arXiv:2407.08608, Figures 5 and 6:
FlashAttention-2 in BF16 on H100 SXM5, head dim 128, batch x sequence = 16k tokens, 2048
features). The device profile's attention_efficiency is its kernel's rate at 16k causal
tokens (FlashAttention-2's on Hopper and Ampere; cuDNN's measured fused attention on
Blackwell, topologies/attention_kernels.py); a flash task's `efficiency` scales it by the
kernel's TFLOP/s at the length of its call (the keys one kernel call sees) over its 16k
causal TFLOP/s, per pass: FlashAttention-2's below on Hopper and Ampere, cuDNN's measured
curve on Blackwell (workloads/cudnn_attention.py, kernel_speed):
  sequence          512   1k   2k   4k   8k  16k
  forward, causal   191  260  298  319  333  335
  forward           309  350  362  368  370  370
  backward          214  260  291  310  318  322
  backward, causal  154  208  254  285  299  325   (derived: KERNEL_TFLOPS)
Short calls fill fewer tiles per (batch, head); a causal call skips the masked tiles but
pays for the diagonal ones. Context parallelism's ring steps are shorter calls, the later
ones without the mask (workloads/context_parallel.py).
FlashAttention-2 is PyTorch SDPA's flash backend (the one torchtitan runs on H100: cuDNN
attention was opt-in in the December 2024 nightlies, pytorch/pytorch#142132, and
torchtitan's context parallelism allows only the flash and memory-efficient backends,
torchtitan@9dec370 torchtitan/utils.py get_train_context). Transformer Engine prefers
cuDNN's fused attention on Hopper whenever both can run ("Select FusedAttention on sm90
... for performance": transformer_engine/pytorch/attention.py from v1.2-v1.4, early
2024; attention/dot_product_attention/utils.py get_attention_backend through v2.18), so
Megatron-Core's H100 runs ran cuDNN, about 1.6 x FlashAttention-2 at every length in the
same figures (causal forward 315 410 484 518 529 539, backward without the mask 305 408
465 499 518 516 TFLOP/s at 512-16k). It is not modelled, a known compensating error:
priced at that curve, the 115 Megatron-Core H100 rows of the references go from 6.1 % /
-1.0 % to 9.0 % / -7.8 % (MAPE / bias; NeMo DGX Cloud 3.7 / +1.8 -> 4.7 / -3.5, the NeMo
performance summary 9.3 / -4.1 -> 15.0 / -13.6, MoE 19.6 / -19.6 -> 24.4 / -24.4), while
Megatron-Bridge's one published H100 profile (Qwen3-30B-A3B, validation/README.md) has a
compute union of about 14.3 s that cuDNN's speed matches (15.1 s simulated; 17.2 s at
FlashAttention-2's). So FlashAttention-2's speed stands in for a cost of about that size
that these rows pay and the simulator does not price; it is kept until that cost is found.

Packed sequences (training.packed_segment): fine-tuning packs several examples into one
sequence and passes their boundaries as cu_seqlens with qkv_format "thd" (NeMo 2.1
nemo/collections/llm/gpt/model/base.py get_packed_seq_params, the collate_fn of
GPTSFTPackedDataset in nemo/collections/nlp/data/language_modeling/megatron/
gpt_sft_dataset.py), so Transformer Engine's fused attention runs each example's causal
attention on its own: n examples of L tokens cost n L^2 / 2 (query, key) pairs, not
(n L)^2 / 2 (two examples of 2048 tokens: half of one causal 4096 sequence). One kernel
call covers the whole packed batch, the FlashAttention benchmark's shape (batch x
sequence = 16k tokens) at sequence L, so the call runs at the kernel's speed at length L
(below 512 tokens at the table's 512: an optimistic bound).
Examples are priced at one mean length (Assumption: a spread of lengths adds the factor
1 + cv^2 to the pairs, which stays a few % of the unpacked attention for short examples),
and the pack's trailing pad (its own cu_seqlens entry) is not priced.

Context parallelism splits the queries over the CP group (workloads/context_parallel.py
emits ring, all-gather and all-to-all attention from the sizes here). Selective recompute
(Korthikanti et al. 2022, arXiv:2205.05198 section 5) runs the forward again just before
the backward (LocalAttention).
"""
from __future__ import annotations

from dataclasses import dataclass

from .attention_impls import FULL_SQUARE_GEMMS, VARLEN_IMPL, score_passes
from .varlen_padding import padding_copies_task
from .cudnn_attention import cudnn_causal_speed, curve_gpu
from .fp8_attention import attention_shape, fp8_attention_speedup
from .head_dim_attention import head_dim_speed
from .interpolate import log_linear
from .layer_builder import BuildOptions, TaskSink
from .program import ATTENTION, COMPUTE
from .windowed_attention import keys_per_query, windowed_speed_ratio

# Backward FLOPs over forward FLOPs (FlashAttention-2, arXiv:2307.08691, Algorithm 2):
# dV, dP, dQ, dK are two forwards' worth; flash attention also recomputes S = QK^T.
FLASH_BACKWARD_FLOPS_FACTOR = 2.5
EAGER_BACKWARD_FLOPS_FACTOR = 2.0
# Backward HBM bytes of q, k, v, o and their gradients over the forward's (Algorithm 2:
# reads q, k, v, o, dO, writes dq, dk, dv).
BACKWARD_IO_BYTES_FACTOR = 2.0
# Passes over the s_q x s_k scores of each head in materialised attention (eager, and
# Megatron-LM's fused softmax): workloads/attention_impls.py SCORE_PASSES.

# Kernel TFLOP/s by the sequence length of the call (FlashAttention-3 paper, Figures 5 and
# 6; the table in the module docstring): lengths, then each series.
KERNEL_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
KERNEL_TFLOPS = {
    ("flash2", "forward", True): (191, 260, 298, 319, 333, 335),
    ("flash2", "forward", False): (309, 350, 362, 368, 370, 370),
    ("flash2", "backward", False): (214, 260, 291, 310, 318, 322),
    # Causal backward, derived: FlashAttention-2's causal forward + backward TFLOP/s on H100
    # (Dao-AILab/flash-attention README, assets/flash2_h100_fwd_bwd_benchmark.png, head dim
    # 128: 163 221 265 294 308 328, counting the backward as 2.5 forwards) less the
    # forward's time above: 2.5 / (3.5 / fwd_bwd - 1 / fwd).
    ("flash2", "backward", True): (154, 208, 254, 285, 299, 325),
}
# The reference the device profile's attention_efficiency stands for: FlashAttention-2 at
# 16k tokens, causal forward and backward.
_REFERENCE = {"forward": KERNEL_TFLOPS[("flash2", "forward", True)][-1],
              "backward": KERNEL_TFLOPS[("flash2", "backward", True)][-1]}


def flash_tflops(phase: str, length: float, causal: bool) -> float:
    """H100 TFLOP/s of FlashAttention-2 in `phase` (a recompute is a forward) for calls of
    `length` keys, with or without the causal mask."""
    step = "backward" if phase == "backward" else "forward"
    return log_linear(KERNEL_LENGTHS, KERNEL_TFLOPS[("flash2", step, causal)], length)


def kernel_speed(phase: str, length: float, causal: bool = True, gpu: str = "") -> float:
    """The attention kernel's speed at this call's length and mask relative to its 16k
    causal speed, the device profile's attention_efficiency: cuDNN's measured curve on
    Blackwell (workloads/cudnn_attention.py, non-causal calls at FlashAttention-2's
    non-causal over causal ratio), FlashAttention-2's elsewhere. Assumption: FlashAttention-
    2's curve (tiles per head and the mask's diagonal) carries over to Hopper's and
    Ampere's other GPUs."""
    measured = curve_gpu(gpu)
    if not measured:
        ref = _REFERENCE["backward" if phase == "backward" else "forward"]
        return flash_tflops(phase, length, causal) / ref
    mask = 1.0 if causal else flash_tflops(phase, length, False) / flash_tflops(
        phase, length, True)
    return cudnn_causal_speed(measured, phase, length) * mask


def causal_attention_flops(queries: float, keys: float, head_dim: int, heads: float,
                           v_head_dim: int = 0, window: int = 0) -> float:
    """Forward FLOPs of causal attention: QK^T and PV, 2 * s_q * s_k * d each per head
    (d_qk for QK^T, d_v = v_head_dim for PV; 0: head_dim), halved by the causal mask.
    `queries` counts query tokens over the batch, `keys` is the sequence. With a sliding
    `window` shorter than the sequence a query sees on average w - w^2 / (2 s) keys
    instead of s / 2."""
    v = v_head_dim or head_dim
    if 0 < window < keys:
        return 2.0 * queries * keys_per_query(window, keys) * (head_dim + v) * heads
    if v == head_dim:
        return 4.0 * queries * keys * head_dim * heads * 0.5
    return 2.0 * queries * keys * (head_dim + v) * heads * 0.5


@dataclass(frozen=True)
class AttentionCost:
    """One rank's attention core for one micro-batch: its queries, heads and sizes."""

    queries: float      # query tokens on this rank (over the micro-batch)
    keys: int           # keys each query sees: the full sequence
    heads: float        # this rank's query heads
    kv_heads: float     # this rank's key/value heads
    head_dim: int       # of q and k
    act_bytes: int      # bytes per activation element
    flash: bool = True
    v_head_dim: int = 0  # of v and the output (0: head_dim)
    window: int = 0      # sliding window: keys a query sees at most (0: all earlier)
    # the materialised implementation when not flash (workloads/attention_impls.py)
    impl: str = "eager"
    gpu: str = ""        # the device lowered for (its kernel's length curve and a short
                         # window's speed depend on it)
    segment: int = 0     # tokens of each packed example (0: the sequence is one example)
    quantized: str = ""  # the training dtype of a quantized attention core ("": BF16)

    @classmethod
    def of_layer(cls, shape, flash: bool, queries: float | None = None,
                 head_split: float | None = None, window: int = 0,
                 impl: str = "") -> "AttentionCost":
        """The attention core of a LayerShape, its heads split `head_split` ways (default
        over TP), `queries` query tokens (default the shape's tokens) and the layer's
        sliding `window` (0: none); `impl` names the materialised implementation (a plan's
        `attention`; "", "flash" or "cudnn": PyTorch's eager math path when not flash)."""
        split = shape.tp if head_split is None else head_split
        return cls(queries=shape.tokens if queries is None else queries, keys=shape.seq_len,
                   heads=shape.heads / split, kv_heads=shape.kv_heads / split,
                   head_dim=shape.head_dim, act_bytes=shape.act_bytes, flash=flash,
                   v_head_dim=shape.v_head_dim or shape.head_dim, window=window,
                   impl=impl if impl not in ("", "flash", "cudnn") else "eager",
                   gpu=getattr(shape, "gpu", ""), segment=getattr(shape, "packed_segment", 0),
                   quantized=getattr(shape, "attention_dtype", ""))

    # ---- sizes ---------------------------------------------------------------------
    @property
    def v_dim(self) -> int:
        """Features of one value (and output) head."""
        return self.v_head_dim or self.head_dim

    @property
    def q_bytes(self) -> float:
        """Bytes of this rank's q (and of dq)."""
        return self.queries * self.heads * self.head_dim * self.act_bytes

    @property
    def o_bytes(self) -> float:
        """Bytes of this rank's attention output (and of dO)."""
        return self.queries * self.heads * self.v_dim * self.act_bytes

    @property
    def kv_bytes(self) -> float:
        """Bytes of this rank's K for its queries' tokens."""
        return self.queries * self.kv_heads * self.head_dim * self.act_bytes

    @property
    def v_bytes(self) -> float:
        """Bytes of this rank's V for its queries' tokens."""
        return self.queries * self.kv_heads * self.v_dim * self.act_bytes

    @property
    def kv_block_bytes(self) -> float:
        """Bytes of this rank's K and V block (context parallelism moves it)."""
        return self.kv_bytes + self.v_bytes

    @property
    def score_elements(self) -> float:
        """Elements of the s_q x s_k scores of every head (eager attention writes them)."""
        return self.queries * self.keys * self.heads

    @property
    def span(self) -> int:
        """Keys of the causal sequence each query belongs to: its packed example's tokens
        (flash attention with cu_seqlens), else the whole sequence."""
        return self.segment if self.flash and 0 < self.segment < self.keys else self.keys

    # ---- costs ---------------------------------------------------------------------
    @property
    def forward_flops(self) -> float:
        """Forward FLOPs of this rank's causal attention (flash skips the keys outside a
        sliding window; eager attention computes and masks them; Megatron-LM's
        fused-softmax path computes the whole s x s square, workloads/attention_impls.py)."""
        if not self.flash and FULL_SQUARE_GEMMS[self.impl]:
            return 2.0 * self.queries * self.keys * (self.head_dim + self.v_dim) * self.heads
        return causal_attention_flops(self.queries, self.span, self.head_dim, self.heads,
                                      self.v_dim, self.window if self.flash else 0)

    @property
    def backward_flops(self) -> float:
        """Backward FLOPs (flash: 2.5x the forward, else 2x)."""
        factor = FLASH_BACKWARD_FLOPS_FACTOR if self.flash else EAGER_BACKWARD_FLOPS_FACTOR
        return factor * self.forward_flops

    @property
    def io_bytes(self) -> float:
        """Forward HBM traffic of q, k, v and o: read q, k, v, write o."""
        return self.q_bytes + self.o_bytes + self.kv_block_bytes

    def flops(self, phase: str, parts: int = 1) -> float:
        """FLOPs in `phase` (forward and recompute alike), of one of `parts` equal
        shares (ring attention's steps)."""
        whole = self.backward_flops if phase == "backward" else self.forward_flops
        return whole / parts if parts > 1 else whole

    def bytes(self, phase: str, parts: int = 1) -> float:
        """HBM bytes in `phase` of one of `parts` shares of the work: every share reads
        the local q, k, v block again; eager scores split with the work."""
        backward = phase == "backward"
        io = BACKWARD_IO_BYTES_FACTOR * self.io_bytes if backward else self.io_bytes
        if self.flash:
            return io
        passes = score_passes(self.impl, phase)
        return io + passes * self.score_elements * self.act_bytes / parts

    def speed(self, phase: str, length: float = 0.0, causal: bool = True) -> float:
        """The flash kernel's speed relative to the profile's (kernel_speed) for calls of
        `length` keys (0: the layer's sequence, or its window); eager attention: 1. A
        whole-sequence call with a window of at most 128 keys runs at cuDNN's measured
        fraction of the full causal call's speed (workloads/windowed_attention.py); heads
        of fewer than 128 features at cuDNN's measured fraction of its head-dim-128 speed
        on Blackwell (workloads/head_dim_attention.py)."""
        if not self.flash:
            return 1.0
        span = self.span
        quantized = (fp8_attention_speedup(
            self.gpu, self.quantized, phase, length or span,
            attention_shape(self.window, span, self.v_dim != self.head_dim))
            if self.quantized else 1.0)
        # heads narrower than the curves' 128 features (workloads/head_dim_attention.py)
        narrow = head_dim_speed(self.gpu, self.head_dim, length or span)
        if not length:
            ratio = windowed_speed_ratio(self.gpu, self.window, span)
            if ratio is not None:
                return kernel_speed(phase, span, causal, self.gpu) * ratio * quantized * narrow
        keys = length or (self.window if 0 < self.window < span else span)
        return kernel_speed(phase, keys, causal, self.gpu) * quantized * narrow


def attention_task(sink: TaskSink, ctx: dict, cost: AttentionCost, phase: str, deps,
                   label: str = "", parts: int = 1, length: float = 0.0,
                   causal: bool = True, flops: float | None = None) -> int:
    """The compute task of an attention core (or of one of `parts` ring steps, or of a
    call of `flops` given), its kernel's speed at calls of `length` keys (0: the
    sequence) with or without the causal mask."""
    label = label or ("attention.bwd" if phase == "backward" else "attention.fwd")
    work = cost.flops(phase, parts) if flops is None else flops
    return sink.add(kind=COMPUTE, stream="compute", op="attention", phase=phase,
                    deps=tuple(d for d in deps if d >= 0), flops=work,
                    bytes=cost.bytes(phase, parts), op_class=ATTENTION, label=label,
                    efficiency=cost.speed(phase, length, causal), **ctx)


class AttentionCore:
    """What every attention-core builder shares: its cost, the build options, no weights,
    and the task that ends its forward (a layer builder: workloads/layer_builder.py)."""

    def __init__(self, cost: AttentionCost, options: BuildOptions):
        self.cost, self.options = cost, options
        self.wgrad_tasks: dict[str, int] = {}     # no weights
        self._output = -1

    @property
    def output_task(self) -> int:
        """The forward's last task (after emit_forward)."""
        return self._output


class LocalAttention(AttentionCore):
    """The attention core on one rank: all its queries' keys are local (no CP)."""

    def emit_forward(self, sink: TaskSink, ctx: dict, input_dep: tuple[int, ...],
                     phase: str = "forward", saved: frozenset[int] = frozenset()) -> int:
        """The forward (or recomputed forward) attention task, after the unpad copies of
        flash_varlen (workloads/varlen_padding.py)."""
        label = "attention.recompute" if phase == "recompute" else ""
        if self.options.attention_impl == VARLEN_IMPL:
            input_dep = (padding_copies_task(sink, ctx, self.cost, phase, input_dep),)
        self._output = attention_task(sink, ctx, self.cost, phase, input_dep, label=label)
        return self._output

    def emit_backward(self, sink: TaskSink, ctx: dict, grad_dep: int) -> int:
        """Selective recompute's forward if asked, then the backward task (dq, dk, dv) and
        flash_varlen's scatter of their gradients."""
        ready = grad_dep
        if self.options.recompute_attention:
            ready = attention_task(sink, ctx, self.cost, "recompute", (ready,),
                                   label="attention.recompute")
        grads = attention_task(sink, ctx, self.cost, "backward", (ready,))
        if self.options.attention_impl == VARLEN_IMPL:
            grads = padding_copies_task(sink, ctx, self.cost, "backward", (grads,))
        return grads
