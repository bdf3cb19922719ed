"""FlashAttention's variable-length kernel behind flash-attn's unpad and pad (`"attention":
"flash_varlen"`): the copies around the attention core, and the host waits they cause.

Code that calls `flash_attn_varlen_func` with a padding mask first gathers the unmasked
tokens of q, k and v into token-major tensors and afterwards scatters the output back to
the padded (batch, sequence) layout, with flash-attn's bert_padding helpers, on every
layer, whether or not the batch holds any padding. llm-foundry's MPT flash path does this
(mosaicml/llm-foundry 5e85bd62d, llmfoundry/models/layers/attention.py flash_attn_fn:
`unpad_input` on query, key and value, each with its padding mask, then `pad_input` on the
output; the attention mask is all ones for packed pre-training data), as does Hugging Face
transformers' flash_attention_2 path when given an attention mask (`_upad_input`).

What flash-attn v2.4.2 runs (flash_attn/bert_padding.py), per layer and micro-batch:
- `unpad_input(x, mask)`, three times: the mask's row sums, `torch.nonzero` of the
  flattened mask (the indices), their maximum with `.item()`, a cumulative sum and its
  pad, then `index_first_axis`, a torch.gather of the kept rows (reads and writes the
  tensor once each). `nonzero` and `.item()` copy to the host and wait for the device:
  the host blocks until the GPU has run everything issued before.
- `pad_input(out, indices)`: `torch.zeros` of the padded output and an index_put of the
  rows (the zeros written, the rows read and written).
- Backward: index_put's gradient is a gather of the output gradient (read, write); each
  gather's gradient is `torch.zeros` and a scatter_ into it (zeros written, rows read and
  written).
So in passes over one rank's tensor (bytes of q, k, v and the output): the forward 2 per
input and 3 for the output, the backward 3 per input and 2 for the output; launches, 7 per
unpad and 2 for the pad forward, 2 per input and 1 for the output backward. The mask work
(tokens, not features) is launches only.

Host: each unpad's waits are priced as one host synchronisation after the forward copies
(simulator/host_timeline.py: the host resumes when the device has run them), where the
plan has host costs at all (host_overhead.per_kernel_s); the backward's gathers and
scatters reuse the saved indices and do not wait. Memory: the unpadded copies live for one
layer's attention (assumption: not a step's peak, nothing charged).
"""
from __future__ import annotations

from .layer_builder import TaskSink
from .program import COMPUTE, MEMORY

UNPAD_OP = "attention_unpad"
UNPAD_FWD_LABEL = "attention.unpad.fwd"   # host_cost.py: the host waits after it
UNPAD_BWD_LABEL = "attention.unpad.bwd"
# (passes over each input, passes over the output, launches per input, launches for the
# output) by phase, from flash-attn v2.4.2's bert_padding (module docstring)
FORWARD = (2.0, 3.0, 7, 2)
BACKWARD = (3.0, 2.0, 2, 1)


def padding_copies_task(sink: TaskSink, ctx: dict, cost, phase: str, deps) -> int:
    """The unpad (forward or recompute) or its gradient's scatter (backward) of one
    attention core, `cost` its AttentionCost, as one memory-bound task."""
    per_input, output, input_launches, output_launches = (
        BACKWARD if phase == "backward" else FORWARD)
    inputs = cost.q_bytes + cost.kv_bytes + cost.v_bytes
    return sink.add(kind=COMPUTE, stream="compute", op=UNPAD_OP, phase=phase,
                    deps=tuple(d for d in deps if d >= 0),
                    bytes=per_input * inputs + output * cost.o_bytes, op_class=MEMORY,
                    kernels=3 * input_launches + output_launches,
                    label=UNPAD_BWD_LABEL if phase == "backward" else UNPAD_FWD_LABEL, **ctx)
