"""Training metrics a trainer computes on each micro-batch's logits, beside the loss.

Some trainers evaluate metrics on the training batch every step, and for a language model
those metrics are cross-entropies over the logits again, outside the loss's autograd graph
and outside its fused kernel. A plan says how many with `"loss": {"metrics": N}` (framework
"generic" only; default 0: Megatron-Core and torchtitan compute the loss alone).

Composer with llm-foundry's MPT computes 2. llm-foundry's ComposerMPTCausalLM trains with
`train_metrics = [LanguageCrossEntropy(), LanguagePerplexity()]` unless the model config
sets `use_train_metrics: false` (mosaicml/llm-foundry 5e85bd62d, llmfoundry/models/mpt/
modeling_mpt.py). Composer's trainer runs `_eval_train_metrics` after each micro-batch's
backward whenever the model has train metrics: under the run's precision context (the
autocast of amp_bf16) and without gradients, it takes the forward's cached logits
(`eval_forward(batch, outputs)` does not run the model again) and calls each metric's
update (mosaicml/composer v0.17.2, composer/trainer/trainer.py `_train_microbatch` and
`_eval_train_metrics`; composer/models/huggingface.py `eval_forward`). Each update is
`torch.nn.CrossEntropyLoss(reduction="sum")` over the flattened logits
(composer/metrics/nlp.py LanguageCrossEntropy.update; LanguagePerplexity subclasses it and
updates alike), and autocast runs cross_entropy in fp32: ATen's up-cast, log_softmax and
nll_loss over every logit, the eager cross-entropy forward that workloads/kernels.py
counts (EAGER "cross_entropy", measured under a TorchDispatchMode).

Priced as one memory-bound task per micro-batch on the compute stream, after the logits in
the forward (the device runs the same kernels whether they follow the loss's forward or the
backward; with FSDP1 the backward's last reduce-scatters would overlap them, which this
placement does not credit: they are under 1 % of a scored step). Assumption: their fp32
copies of the logits are freed before the next micro-batch and are not a step's peak
(after the backward the activations are gone), so memory is not charged.
"""
from __future__ import annotations

from .kernels import eager_cost

# Metrics a plan may ask for: Composer's language-model metrics are two; a larger count is
# a typo that would multiply the output layer's traffic.
MAX_LOSS_METRICS = 8
TRAIN_METRICS_OP = "train_metrics"


def add_train_metrics(graph, logits, metrics: int) -> None:
    """`metrics` no-grad eager cross-entropy forwards over `logits` (a LayerGraph node) as
    one node that nothing consumes: the backward, which starts from the loss, skips it."""
    if not metrics:
        return
    passes, kernels = eager_cost("cross_entropy", graph.shape.act_bytes, "forward")
    graph.elementwise(TRAIN_METRICS_OP, [logits], rw=(metrics * passes, 0.0),
                      launches=metrics * kernels, backward=(0.0, 0))
