"""PyTorch's context parallelism, as torchtitan runs it: torch's ring attention.

torchtitan (torchtitan@9dec370, torchtitan/utils.py create_context_parallel_ctx) wraps each
step in torch.distributed.tensor.experimental.context_parallel, whose SDPA handler runs
`_templated_ring_attention` and its backward (torch/distributed/tensor/experimental/
_attention.py, PyTorch 2.6). What differs from Transformer Engine's ring
(workloads/context_parallel.py), each from that code:

- The K and V it exchanges are the ones SDPA receives. torchtitan's Llama expands the KV
  heads to the query heads before SDPA (torchtitan/models/llama/model.py, Attention.forward:
  `repeat_kv`), so every exchange carries `heads`, not `kv_heads`, per token: 4 x the KV
  bytes of Llama 3 8B, 16 x those of 405B.
- How K and V travel (`context_parallel_rotate_method`, torchtitan's default "allgather",
  plan mode "all_gather"): `_AllGatherRotater` all-gathers every rank's K and V once, issued
  before step 0, so only step 0 (the rank's own causal call) overlaps it and the later steps
  wait for it (eager; compiled, below). "alltoall" (plan mode "ring": `_AllToAllRotater`)
  passes the block to the next rank at every step (`permute_tensor`), overlapping the
  step's call. The backward
  rotates K and V again the same way (it keeps nothing from the forward).
- The calls: load balancing is on (`_cp_options.enable_load_balance = True`): step 0 is
  the causal call of the rank's two chunks, every later step an unmasked call of half the
  queries or half the keys (the same calls as TE's, workloads/context_parallel.py).
- Merging in float32 (`_cp_options.convert_to_f32 = True`): after every later step
  `_SDPAMerger` folds the step's output into a float32 output and log-sum-exp (a pass that
  reads the step's bf16 output and reads and writes the float32 one: MERGE_BYTES per
  element, the passes fused into one by torch.compile; eager, EAGER_MERGE_BYTES, the
  code's kernels counted). The backward accumulates dQ, dK
  and dV in float32 (`accum_dtype`), and the dK/dV partial travels the ring in float32:
  after each step's call the rank waits for the partial of the previous step, adds its own
  and sends it on (`_RotateMethod.ALL_TO_ALL`), the last one back to the block's owner.
- Packing: every rotation first copies K and V into one flat send buffer
  (`torch.cat([key.flatten(), value.flatten()])`, read and write K+V): once per pass for
  the all-gather, once per step for the all-to-all. The all-gather's loop still copies K
  and V at every later step but the last; nothing reads those copies, so torch.compile
  drops them and eager pays them. The casts of the step-0 output to float32 and of the
  merged output, dQ and dK/dV back to bf16 (once per pass) are not counted: a few passes
  over the local tensors against cp merges or accumulations.

When the waits come (plan `"kernels"`): torchtitan compiles each TransformerBlock with
torch.compile (torchtitan@9dec370 parallelize_llama.py apply_compile, fullgraph=True), so
the ring is traced into the block's graph. Traced, a functional collective is followed at
once by its wait (torch/distributed/_functional_collectives.py `_maybe_wrap_tensor`: "if
_are_we_tracing(): return wait_tensor(self)"), and Inductor leaves collectives where the
trace put them unless `reorder_for_compute_comm_overlap` is set (torch/_inductor/
config.py, False by default; torchtitan does not set it). So compiled ("fused"): the
all-gather ends before step 0's call, an all-to-all K/V transfer ends before the call of
the step that issued it, and each step's dK/dV send ends before the next step's call:
nothing of the rotation overlaps. Eager ("eager"): the collective returns an
AsyncCollectiveTensor that waits at its first use, so the rotation overlaps the calls as
described above.
"""
from __future__ import annotations

from .attention import attention_task
from .context_parallel import (CP_STREAM, GRAD_RECV, GRAD_SEND, ContextParallelAttention,
                               _join, _send_recv)
from .precision import FP32_BYTES
from .program import COMM, COMPUTE, MEMORY

# Bytes per output element of one merge (_SDPAMerger._merge_one fused): read the step's
# bf16 output (2), read and write the float32 running output (4 + 4).
MERGE_BYTES = 2 + 4 + 4
# Bytes per gradient element of one backward step's float32 accumulation: read the call's
# bf16 gradient (2), read and write the float32 accumulator (4 + 4); the dK/dV partial is
# also copied into the send buffer (torch.cat: read 4, write 4).
ACCUMULATE_BYTES = 2 + 4 + 4
SEND_COPY_BYTES = 4 + 4
# Eager, the same code runs as separate kernels (_SDPAMerger.step and _merge_one, counted
# per element of the rank's output). A later step with all the queries (source rank at or
# below this one): cast the bf16 step output to float32 (2 + 4), then `out - block_out`
# (4 + 4 + 4), the product with sigmoid(lse difference) (4 + 4) and the subtraction from
# `out` (4 + 4 + 4): 38. A step with the second half of the queries does the same on half
# the elements (3 + 16 per element of the whole output) and puts that half back with
# `_partial_update`'s torch.cat of the float32 whole (read 4, write 4): 27. Over the CP group the two kinds
# are equally many (cp - 1 - r and r for rank r), so a step costs their mean.
EAGER_MERGE_BYTES = (38 + 27) / 2
# Backward, eager, per gradient element of a later step: a full `grad += grad_` (2 + 4 +
# 4 = 10) or, for the half-sized gradient, the add into one half (5) and
# `_partial_update`'s torch.cat of the float32 whole (8): 13. dK/dV take the half form when
# the source rank is at or below this one, dQ otherwise: each is 10 or 13, mean 11.5.
EAGER_ACCUMULATE_BYTES = (10 + 13) / 2


class TorchRingAttention(ContextParallelAttention):
    """torch's `_templated_ring_attention` over a CP group of `cp` ranks (torchtitan's
    context parallelism; a layer builder: workloads/layer_builder.py)."""

    # ---- sizes -----------------------------------------------------------------------
    @property
    def kv_bytes(self) -> float:
        """Bytes of this rank's K and V as SDPA receives them: the query heads' (repeat_kv)."""
        c = self.cost
        return c.queries * c.heads * (c.head_dim + c.v_dim) * c.act_bytes

    @property
    def dkv_bytes(self) -> float:
        """Bytes of the float32 dK/dV partial that travels the ring."""
        return self.kv_bytes * FP32_BYTES / self.cost.act_bytes

    def _elements(self, nbytes: float) -> float:
        return nbytes / self.cost.act_bytes

    # ---- forward ---------------------------------------------------------------------
    def emit_forward(self, sink, ctx: dict, input_dep: tuple[int, ...],
                     phase: str = "forward", saved: frozenset[int] = frozenset()) -> int:
        """The forward (or recomputed forward): the rotation, cp calls, the merges."""
        start = _join(sink, ctx, tuple(input_dep), phase, "cp.torch.start")
        blocks = self._blocks(sink, ctx, start, phase)
        out = attention_task(sink, ctx, self.cost, phase, (self._wait(blocks, 0),),
                             "attention.fwd.0", parts=self.cp, **self._step_call(0))
        per_element = MERGE_BYTES if self.compiled else EAGER_MERGE_BYTES
        merge_bytes = self._elements(self.cost.o_bytes) * per_element
        for step in range(1, self.cp):
            call = attention_task(sink, ctx, self.cost, phase,
                                  (self._wait(blocks, step), out),
                                  f"attention.fwd.{step}", parts=self.cp,
                                  **self._step_call(step))
            out = _memory(sink, ctx, (call,), phase, merge_bytes + self._dead_copy(step),
                          "cp.torch.merge")
        self._output = out
        return out

    @property
    def compiled(self) -> bool:
        """Whether the ring runs inside torch.compile's graph (plan kernels "fused"), where
        every collective is waited for where it is issued (module docstring)."""
        # the model's compile is its default kernel mode, not any one family's
        return self.options.kernels == "fused"

    def _dead_copy(self, step: int) -> float:
        """Bytes of the K/V copy the all-gather's loop makes at a later step but the last
        and nothing reads: eager runs it, torch.compile drops it."""
        if self.compiled or self.mode != "all_gather" or not 0 < step < self.cp - 1:
            return 0.0
        return 2 * self.kv_bytes

    def _wait(self, blocks: list[int], step: int) -> int:
        """The rotation task step `step`'s call waits for: eager, the block it uses
        (step 0: its own, ready at the start); compiled, the transfer issued in its own
        iteration, which is waited for at once: the gathered blocks (all-gather) or the
        block for the next step (all-to-all; the last step issues none)."""
        if not self.compiled or self.cp == 1:
            return blocks[step]
        return blocks[min(step + 1, self.cp - 1)]

    def _blocks(self, sink, ctx: dict, start: int, phase: str) -> list[int]:
        """The task after which step j's K and V are here, for j = 1 .. cp - 1 (index 0
        unused): one all-gather for all, or one transfer per step along the ring."""
        pack_bytes = 2 * self.kv_bytes     # torch.cat into the send buffer: read, write
        if self.mode == "all_gather":
            packed = _memory(sink, ctx, (start,), phase, pack_bytes, "cp.torch.pack",
                             "cp_pack")
            gathered = sink.add(kind=COMM, stream=CP_STREAM, op="all_gather", phase=phase,
                                deps=(packed,), bytes=self.cp * self.kv_bytes,
                                group=("cp",), label="cp.torch.all_gather.kv", **ctx)
            return [start] + [gathered] * (self.cp - 1)
        key = (ctx["layer"], ctx["microbatch"], phase)
        blocks, block = [start], start
        for step in range(1, self.cp):
            packed = _memory(sink, ctx, (block,), phase, pack_bytes, "cp.torch.pack",
                             "cp_pack")
            block = _send_recv(sink, ctx, ("cp.torch.kv",) + key + (step,), self.kv_bytes,
                               (packed,), phase, "cp.torch.kv")
            blocks.append(block)
        return blocks

    # ---- backward --------------------------------------------------------------------
    def emit_backward(self, sink, ctx: dict, grad_dep: int) -> int:
        """The backward: K and V rotated again, cp calls, float32 accumulation, and the
        float32 dK/dV partials along the ring (the last back to their owner)."""
        ready = grad_dep
        if self.options.recompute_attention:
            ready = self.emit_forward(sink, ctx, (ready,), "recompute")
        blocks = self._blocks(sink, ctx, ready, "backward")
        key = (ctx["layer"], ctx["microbatch"], "backward")
        grad_elements = self._elements(self.cost.q_bytes + self.kv_bytes)
        send_copy = self._elements(self.kv_bytes) * SEND_COPY_BYTES
        call, dkv = -1, -1
        for step in range(self.cp):
            # compiled, the previous step's dK/dV send was waited for where it was issued
            sent = dkv if self.compiled else -1
            call = attention_task(sink, ctx, self.cost, "backward",
                                  (self._wait(blocks, step), call, sent),
                                  f"attention.bwd.{step}", parts=self.cp,
                                  **self._step_call(step))
            per_element = (ACCUMULATE_BYTES if self.compiled or step == 0
                           else EAGER_ACCUMULATE_BYTES)
            accumulate = grad_elements * per_element + send_copy + self._dead_copy(step)
            added = _memory(sink, ctx, (call, dkv), "backward", accumulate,
                            "cp.torch.accumulate")
            dkv = _send_recv(sink, ctx, ("cp.torch.dkv",) + key + (step,), self.dkv_bytes,
                             (added,), "backward", "cp.torch.dkv", (GRAD_SEND, GRAD_RECV))
            call = added
        return _join(sink, ctx, (call, dkv), "backward", "cp.torch.grads")


def torch_cp_buffer_bytes(mode: str, cp: int, tokens: float, q_size: int, v_size: int,
                          act_bytes: int) -> float:
    """Peak transient bytes of torch's ring attention on one rank for `tokens` local
    tokens: the rotated K and V with the query heads (the all-gather's cp blocks, or the
    block held and the one arriving), and in the backward the float32 dQ, dK and dV
    accumulators and the float32 dK/dV partial sent and the one received."""
    kv = tokens * (q_size + v_size) * act_bytes
    q = tokens * q_size * act_bytes
    rotated = cp * kv if mode == "all_gather" else 2 * kv
    fp32 = FP32_BYTES / act_bytes
    return rotated + fp32 * (q + kv) + 2 * fp32 * kv


def _memory(sink, ctx: dict, deps, phase: str, nbytes: float, label: str,
            op: str = "cp_merge") -> int:
    """One fused elementwise pass of `nbytes` HBM traffic on the compute stream."""
    return sink.add(kind=COMPUTE, stream="compute", op=op, phase=phase,
                    deps=tuple(d for d in deps if d >= 0), bytes=nbytes, op_class=MEMORY,
                    label=label, **ctx)
