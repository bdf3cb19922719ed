"""The cross-entropy's working set (workloads/loss_memory.py), measured with torch.

The memory model says ATen's eager cross-entropy holds three fp32 copies of the logits at
its backward's peak and a compiled one (torchtitan's `torch.compile(loss_fn)`) holds one
copy's worth: the saved bf16 logits and the bf16 gradient. These tests run both forms with
the pinned torch on the CPU and measure what they save and their peak, so that a torch
change or a wrong count breaks here; the plan-level tests check the counts reach the plan.
"""
from __future__ import annotations

import json
import shutil
import warnings

import pytest
import torch

from workloads import WorkloadError, plan_from_dict
from workloads.jobs.torchtitan import read_torchtitan
from workloads.loss_memory import (FUSED_CE_FP32_COPIES, TORCH_CE_FP32_COPIES,
                                   fp32_logits_copies)
from workloads.lowering import lower
from workloads.memory import memory_breakdown
from workloads.plan import resolve

F = torch.nn.functional

TOKENS, VOCAB, HIDDEN = 1024, 8192, 256


def _cross_entropy(pred, labels):
    # torchtitan's cross_entropy_loss (torchtitan/components/loss.py)
    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))


def _compiled():
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("Inductor's CPU backend needs a C++ compiler")
    return torch.compile(_cross_entropy)


def _loss_peak_bytes(loss_fn, tmp_path) -> float:
    """Peak CPU bytes of an output projection, the loss and their backward, less the
    projection's weight and input (alive throughout)."""
    from torch.profiler import ProfilerActivity, profile

    weight = torch.randn(HIDDEN, VOCAB, dtype=torch.bfloat16, requires_grad=True)
    hidden = torch.randn(2, TOKENS // 2, HIDDEN, dtype=torch.bfloat16)
    labels = torch.randint(0, VOCAB, (2, TOKENS // 2))
    loss_fn(hidden @ weight, labels).backward()      # compile and warm up outside
    weight.grad = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                     record_shapes=True, with_stack=True) as prof:
            pred = hidden @ weight
            loss = loss_fn(pred, labels)
            del pred                                  # torchtitan's train step does too
            loss.backward()
        path = tmp_path / "timeline.json"
        prof.export_memory_timeline(str(path), device="cpu")
    _, sizes = json.loads(path.read_text())
    peak = max(sum(row) for row in sizes)
    return peak - weight.numel() * 2 - hidden.numel() * 2


@pytest.mark.parametrize("compiled, copies", [(False, TORCH_CE_FP32_COPIES),
                                              (True, FUSED_CE_FP32_COPIES)])
def test_cross_entropy_peak_is_the_modelled_fp32_copies(compiled, copies, tmp_path):
    fp32_logits = 4 * TOKENS * VOCAB
    peak = _loss_peak_bytes(_compiled() if compiled else _cross_entropy, tmp_path)
    # the weight's gradient (bf16, HIDDEN x VOCAB) is the only other tensor, 1/4 of a copy
    assert peak == pytest.approx(copies * fp32_logits, rel=0.15)


def test_compiled_loss_saves_the_bf16_logits_and_two_row_statistics():
    pred = torch.randn(2, TOKENS // 2, VOCAB, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, VOCAB, (2, TOKENS // 2))
    for fn, expected_logit_tensors in ((_cross_entropy, 2), (_compiled(), 1)):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(
                lambda t: saved.append(t) or t, lambda t: t):
            fn(pred, labels).backward()
        vocab_wide = [t for t in saved if t.numel() == TOKENS * VOCAB]
        assert len(vocab_wide) == expected_logit_tensors
        if expected_logit_tensors == 1:       # the input itself, not a copy
            assert vocab_wide[0].dtype == torch.bfloat16
            assert vocab_wide[0].data_ptr() == pred.data_ptr()
        else:                                  # eager: the fp32 copy and log_softmax's output
            assert all(t.dtype == torch.float32 for t in vocab_wide)
        assert pred.grad.dtype == torch.bfloat16
        pred.grad = None


# ------------------------------------------------------------------ the plan's side
def _plan(**over):
    raw = {"model": "llama3-8b", "framework": "torchtitan",
           "training": {"global_batch": 64, "micro_batch": 1, "seq_len": 4096},
           "mesh": {"dp": "auto", "tp": 1}}
    raw.update(over)
    return resolve(plan_from_dict(raw), 8)


def _loss_bytes(plan):
    return memory_breakdown(plan).activations_bytes


def test_the_loss_follows_the_kernels_unless_the_plan_says():
    assert _plan(kernels="fused").loss_kernels == "fused"
    assert _plan(kernels="eager").loss_kernels == "eager"
    assert _plan(kernels="fused", loss={"kernels": "eager"}).loss_kernels == "eager"
    fp32_logits = 4 * 4096 * 128256
    compiled = _loss_bytes(_plan(kernels="fused"))
    model_only = _loss_bytes(_plan(kernels="fused", loss={"kernels": "eager"}))
    assert model_only - compiled == pytest.approx(2 * fp32_logits)


def test_counts_by_framework_and_tensor_parallelism():
    assert fp32_logits_copies("torchtitan", 1, "eager") == 3
    assert fp32_logits_copies("torchtitan", 1, "fused") == 1
    assert fp32_logits_copies("torchtitan", 2, "fused") == 4    # loss_parallel: assumption
    assert fp32_logits_copies("generic", 1, "eager") == 3
    assert fp32_logits_copies("generic", 2, "eager") == 1
    assert fp32_logits_copies("megatron-core", 1, "eager") == 1


def test_an_eager_loss_costs_the_eager_kernels():
    def launches(plan):
        program = lower(plan)
        return sum(t.kernels for t in program.tasks() if t.op == "cross_entropy")
    fused = _plan(kernels="fused", attention="flash")
    eager = _plan(kernels="fused", attention="flash", loss={"kernels": "eager"})
    assert launches(eager) == 3 * launches(fused)     # kernels.EAGER: 3 + 3 against 1 + 1


@pytest.mark.parametrize("framework", ["megatron-core", "megatron-lm"])
def test_megatron_refuses_the_loss_key(framework):
    with pytest.raises(WorkloadError, match="loss.kernels"):
        plan_from_dict({"model": "llama3-8b", "framework": framework,
                        "training": {"global_batch": 8, "micro_batch": 1, "seq_len": 1024},
                        "mesh": {"dp": 8}, "loss": {"kernels": "eager"}})


@pytest.mark.parametrize("components, kernels, loss", [
    ('["model", "loss"]', "fused", "fused"), ('["model"]', "fused", "eager"),
    ('["loss"]', "eager", "fused")])
def test_torchtitan_compile_components(components, kernels, loss):
    job = read_torchtitan(
        '[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 1\n'
        'seq_len = 4096\n[parallelism]\ndata_parallel_shard_degree = 8\n'
        f'[compile]\nenable = true\ncomponents = {components}\n', lenient=True)
    assert job.plan["kernels"] == kernels and job.plan["loss"] == {"kernels": loss}
