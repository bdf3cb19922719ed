"""What linear biases and hidden dropout cost in a GPT-style dense layer (Megatron-Core).

GPT-3-style models (ModelSpec.linear_bias: Megatron-Core's add_bias_linear; ModelSpec.
hidden_dropout: its hidden_dropout > 0) run two pieces that a bias-free, dropout-free
(Llama-style) layer does not, read at NVIDIA/Megatron-LM core_r0.8.0 (the same code from
core_r0.5 to core_r0.10, the releases of the NeMo 24.05-24.12 containers):

* **The fused bias-GeLU's bias gradient** (megatron/core/fusions/fused_bias_gelu.py,
  GeLUFunction.backward): the jit-fused backward kernel `bias_gelu_back` returns the input
  gradient, and the same tensor again as the bias's gradient (`return tmp, tmp`); the
  autograd engine reduces it to the bias's shape (torch/csrc/autograd/engine.cpp
  validate_outputs: a gradient expandable to the input's shape is `sum_to` it), a
  reduction kernel that reads the whole [tokens, ffn / tp] tensor once more. mlp.py builds
  linear_fc1 with skip_bias_add=True, so fc1's bias always takes this path when
  bias_activation_fusion is on (GPT-3's recipes: NeMo-Framework-Launcher 24.07 conf/
  training/gpt3/5b.yaml and 20b.yaml, dgxc-benchmarking gpt3_175b_hydra.yaml).
* **Bias-dropout-add** (megatron/core/fusions/fused_bias_dropout.py,
  bias_dropout_add_fused_train under `jit_fuser`, torch.compile from torch 2.2,
  megatron/core/jit.py): after attention's output projection and after fc2 (both built
  with skip_bias_add=True) it adds the bias, drops out and adds the residual in one
  kernel, which also writes the dropout mask (one byte per element: a random op is not
  recomputed in the backward, so the mask is saved). Its backward is not free as a plain
  residual add's is: the branch's gradient is the output gradient times the mask and the
  scale (read the gradient and the mask, write the branch gradient), and with a bias the
  bias's gradient sums that over the tokens (a reduction reading it once more).

The recipes that set these: GPT-3 (launcher gpt3/5b.yaml, 20b.yaml: hidden_dropout 0.1,
attention_dropout 0.1, bias_activation_fusion and bias_dropout_add_fusion True; NeMo's
megatron_base_model.py add_bias_linear = cfg.get('bias', True); dgxc gpt3_175b_hydra.yaml:
hidden_dropout 0.1, attention_dropout 0.1). Nemotron-3/4 set bias false and dropout 0.0
(launcher nemotron_8b.yaml, nemotron_22b.yaml; dgxc nemotron4-15b-synth.yaml).

Under eager kernels (plan `"kernels": "eager"`: PyTorch runs each op alone) the same pieces
are PyTorch's own (`eager_residual_extras`, `Node.eager_extra`), read at torch 2.x:
nn.Linear adds its bias in the GEMM (at::linear folds a contiguous input into addmm, whose
bias is the GEMM's epilogue: no kernel of its own) and reduces its gradient in addmm's
backward (the output gradient summed over the tokens: a kernel reading it once);
nn.Dropout runs aten native_dropout (reads the branch, writes it and a one-byte mask) and
native_dropout_backward (reads the gradient and the mask, writes the gradient). Unlike
Megatron-Core's Transformer Engine projections, whose GEMMs return the bias gradient, an
eager attention's query, key and value biases each take that reduction too.

Not priced: attention dropout inside the fused attention kernel. Transformer Engine issue
3312 (2026-08-04) measures cuDNN fused attention on an H200 in the sbhd layout Megatron-
Core uses at 0.594 ms without and 0.614 ms with dropout 0.1 (+3 %), under 0.5 % of a GPT-3
layer here; the TE release is later than the rows'.
"""
from __future__ import annotations

from .model_spec import ModelSpec

# One byte per element: the saved dropout mask (torch.bool), in passes of the activation.
DROPOUT_MASK_BYTES = 1
# Bias-dropout-add's backward on the branch: read the output gradient (1) and the mask,
# write the branch gradient (1); one kernel.
DROPOUT_BACKWARD_PASSES = 2.0
# A bias gradient's reduction over the tokens reads its gradient once; one kernel.
BIAS_GRAD_PASSES = 1.0
# SwiGLU's fc1 (with w3 fused into it, Megatron-Core's gated linear_fc1) is twice as wide
# as the activation's output.
SWIGLU_FC1_WIDTH = 2.0


def residual_add_costs(model: ModelSpec, act_bytes: int
                       ) -> tuple[tuple[float, float], tuple[float, int] | None]:
    """(forward reads and writes, backward (passes, kernels) or None for the plain add's)
    of a dense layer's residual add after a projection (Megatron-Core's bias-dropout-add),
    in passes over the residual stream's local tensor."""
    mask = DROPOUT_MASK_BYTES / act_bytes if model.hidden_dropout else 0.0
    passes, kernels = (DROPOUT_BACKWARD_PASSES + mask, 1) if model.hidden_dropout else (0.0, 0)
    if model.linear_bias:     # without dropout the gradient passes through unchanged
        passes, kernels = passes + BIAS_GRAD_PASSES, kernels + 1
    return (2.0, 1.0 + mask), ((passes, kernels) if kernels else None)


def eager_residual_extras(model: ModelSpec, act_bytes: int, bias_widths: tuple[float, ...]
                          ) -> tuple[tuple[float, int], tuple[float, int]] | None:
    """Under eager kernels, the (forward, backward) (passes, kernels) that a branch's dropout
    and its projections' bias gradients add to the plain residual add (module docstring),
    in passes over the residual stream's local tensor; `bias_widths`: the widths, in
    units of the residual stream, of the projections whose bias gradients are counted
    here, one reduction kernel each. None when the model has neither."""
    mask = DROPOUT_MASK_BYTES / act_bytes
    dropout = (2.0 + mask, 1) if model.hidden_dropout else (0.0, 0)
    biases = (BIAS_GRAD_PASSES * sum(bias_widths), len(bias_widths)) if model.linear_bias \
        else (0.0, 0)
    backward = (dropout[0] + biases[0], dropout[1] + biases[1])
    return (dropout, backward) if dropout[1] or backward[1] else None


def activation_bias_grad(model: ModelSpec) -> tuple[float, int] | None:
    """(passes, kernels) that fc1's bias gradient adds to the activation's backward, fused
    or eager, where the model has linear biases (None: nothing), in passes of the activation's
    output. GeLU: fc1's output is as wide as it (one pass). SwiGLU: Megatron-
    Core's BiasSwiGLUFunction.backward (megatron/core/fusions/fused_bias_swiglu.py,
    core_r0.8.0 to core_v0.15.0) returns the same gradient of the fused fc1 output (both
    halves, twice the activation's width) as its bias's, which autograd reduces: two
    passes, one kernel."""
    if not model.linear_bias:
        return None
    width = SWIGLU_FC1_WIDTH if model.mlp == "swiglu" else 1.0
    return BIAS_GRAD_PASSES * width, 1
