"""cuDNN attention and torchtitan's op-level checkpoint save list (workloads/checkpointing.py,
workloads/attention_impls.py): an attention operator missing from the save list is
recomputed in the backward; the profile's default stays flash (kept)."""
from __future__ import annotations

from collections import Counter

import pytest

from simulator import simulate
from simulator.api import resolve_on
from topologies import build
from workloads import plan_from_dict, resolve
from workloads.attention_impls import torchtitan_sdpa_backend
from workloads.checkpointing import attention_kept
from workloads.lowering import lower
from workloads.memory import memory_breakdown

from conftest import small_plan

LAYERS = 4


def _program(attention: str, recompute: str = "selective_op", **over):
    raw = small_plan(framework="torchtitan", attention=attention, recompute=recompute,
                     **over)
    return lower(resolve(plan_from_dict(raw), 8))


def _attention_tasks(program) -> Counter:
    return Counter((t.phase, t.label) for t in program.stages[0] if t.op == "attention")


def _signature(program) -> list:
    """What the simulator prices, task by task."""
    return [(t.kind, t.op, t.phase, t.flops, t.bytes, t.efficiency)
            for t in program.stages[0]]


def test_save_list_keeps_flash_but_not_cudnn_or_the_math_path():
    # torchtitan@6fc499f6f5 _save_list: the flash and efficient SDPA operators only
    assert attention_kept("flash")
    assert not attention_kept("cudnn")
    assert not attention_kept("eager")           # decomposed into bmm / softmax
    assert not attention_kept("fused_softmax")   # not an SDPA operator


def test_cudnn_attention_is_recomputed_once_per_layer_under_op_level_checkpointing():
    flash = _attention_tasks(_program("flash"))
    cudnn = _attention_tasks(_program("cudnn"))
    assert not any(phase == "recompute" for phase, _ in flash)
    micro_batches = cudnn[("forward", "attention.fwd")]
    assert micro_batches == LAYERS * 1     # one micro-batch per rank (global 8 on 8 GPUs)
    assert cudnn[("recompute", "attention.recompute")] == micro_batches
    assert cudnn[("backward", "attention.bwd")] == micro_batches


def test_the_recompute_is_the_only_difference_from_flash():
    # cuDNN's fused attention is priced as flash: without the op-level policy the two
    # programs are identical, and with it cuDNN's adds exactly the forward again.
    for recompute in ("none", "full"):
        assert _signature(_program("flash", recompute)) == _signature(_program("cudnn", recompute))
    flash, cudnn = _program("flash"), _program("cudnn")
    extra = [t for t in cudnn.stages[0] if t.op == "attention" and t.phase == "recompute"]
    forward = [t for t in cudnn.stages[0] if t.op == "attention" and t.phase == "forward"]
    assert [(t.flops, t.bytes) for t in extra] == [(t.flops, t.bytes) for t in forward]
    assert len(cudnn.stages[0]) == len(flash.stages[0]) + len(extra)


def test_recomputed_attention_waits_for_the_rebuilt_qkv_and_feeds_the_backward():
    tasks = {t.id: t for t in _program("cudnn").stages[0]}
    recomputes = [t for t in tasks.values()
                  if t.op == "attention" and t.phase == "recompute"]
    backward_ids = {t.id for t in tasks.values() if t.op == "attention"
                    and t.phase == "backward"}
    for task in recomputes:
        assert any(tasks[d].phase == "recompute" for d in task.deps if d in tasks)
    # every attention backward depends (through the recomputed wo's input) on it
    assert all(any(r.id in tasks[b].deps or _reaches(tasks, b, r.id) for r in recomputes)
               for b in backward_ids)


def _reaches(tasks, start: int, target: int) -> bool:
    seen, todo = set(), [start]
    while todo:
        tid = todo.pop()
        if tid == target:
            return True
        if tid in seen or tid not in tasks:
            continue
        seen.add(tid)
        todo.extend(tasks[tid].deps)
    return False


def test_the_step_grows_by_about_one_attention_forward_per_layer():
    topo = build("dgx-b200")
    steps = {a: simulate(resolve(plan_from_dict(small_plan(
        framework="torchtitan", attention=a, recompute="selective_op",
        training={"seq_len": 8192})), 8), topo) for a in ("flash", "cudnn")}
    flash_s = steps["flash"].summary["step_time_s"]
    cudnn_s = steps["cudnn"].summary["step_time_s"]
    rows = steps["cudnn"].trace.to_pylist()
    recomputed_s = sum(r["end_s"] - r["start_s"] for r in rows  # visible in the trace
                       if r["rank"] == 0 and r["label"] == "attention.recompute")
    assert recomputed_s > 0
    assert cudnn_s - flash_s == pytest.approx(recomputed_s, rel=0.1)


def test_cudnn_keeps_no_scores_in_memory():
    flash = memory_breakdown(resolve(plan_from_dict(small_plan(attention="flash")), 8))
    cudnn = memory_breakdown(resolve(plan_from_dict(small_plan(attention="cudnn")), 8))
    assert cudnn.activations_bytes == flash.activations_bytes


def test_torchtitan_runs_cudnn_first_on_blackwell_only():
    for gpu in ("b200", "gb200", "gb300"):
        assert torchtitan_sdpa_backend(gpu) == "cudnn"
    for gpu in ("a100", "h100", "h100-hbm2e", "h200", "unknown"):
        assert torchtitan_sdpa_backend(gpu) == "flash"
    # the profile's default leaves the backend to the GPU: flash on Hopper, kept by the
    # save list; cuDNN on Blackwell, recomputed
    plan = plan_from_dict(small_plan(framework="torchtitan"))
    assert plan.attention == "sdpa"
    assert attention_kept(resolve_on(plan, build("dgx-h100")).attention)
    assert not attention_kept(resolve_on(plan, build("dgx-b200")).attention)


def test_torchtitan_reference_rows_run_the_backend_of_their_gpu():
    from validation.reference_rows import DEFAULT_CSV, load_rows, plan_dict, topology_for

    rows = {r["id"]: r for r in load_rows(DEFAULT_CSV)
            if r.get("framework") == "torchtitan"}
    b200 = [i for i in rows if i.startswith("titan-b200-8b-")]
    assert len(b200) == 4
    for row_id, row in rows.items():
        # the rows leave the backend to the simulator, which names the row GPU's
        assert plan_dict(row)["attention"] == "sdpa", row_id
        plan = resolve_on(plan_from_dict(plan_dict(row)), topology_for(row))
        assert plan.attention == ("cudnn" if row_id in b200 else "flash"), row_id
