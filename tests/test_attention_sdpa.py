"""`"attention": "sdpa"` under torchtitan: the plan leaves SDPA's backend open and the
simulator names the one torchtitan's SDPA runs on the topology's GPU (simulator/api.py
resolve_on; the rule: workloads/attention_impls.py torchtitan_sdpa_backend, cuDNN first
from compute capability 10.0, torchtitan@6fc499f6f5 torchtitan/models/attention.py)."""
from __future__ import annotations

import pytest

from simulator import simulate
from simulator.api import resolve_on
from topologies import build
from workloads import WorkloadError, plan_from_dict, resolve
from workloads.lowering import lower
from workloads.memory import memory_breakdown

from conftest import small_plan


def _plan(attention: str, framework: str = "torchtitan"):
    # selective_op: the backend decides what torchtitan's op-level checkpoint keeps
    # (cuDNN's operator is not in its save list: workloads/checkpointing.py)
    return plan_from_dict(small_plan(framework=framework, attention=attention,
                                     recompute="selective_op", training={"seq_len": 8192}))


@pytest.mark.parametrize("topo_name, backend", [("dgx-h100", "flash"), ("dgx-b200", "cudnn"),
                                                ("dgx-a100", "flash")])
def test_sdpa_is_the_backend_of_the_topologys_gpu(topo_name, backend):
    topo = build(topo_name)
    assert resolve_on(_plan("sdpa"), topo).attention == backend
    sdpa = simulate(_plan("sdpa"), topo).summary
    explicit = simulate(_plan(backend), topo).summary
    assert sdpa["step_time_s"] == explicit["step_time_s"]
    assert sdpa["peak_memory_bytes"] == explicit["peak_memory_bytes"]


def test_the_same_sdpa_plan_runs_different_backends_on_hopper_and_blackwell():
    b200 = build("dgx-b200")
    sdpa_s = simulate(_plan("sdpa"), b200).summary["step_time_s"]
    flash_s = simulate(_plan("flash"), b200).summary["step_time_s"]
    # cuDNN's forward is recomputed under the op-level checkpoint: a longer step
    assert sdpa_s > flash_s
    h100 = build("dgx-h100")
    assert simulate(_plan("sdpa"), h100).summary["step_time_s"] == \
        simulate(_plan("flash"), h100).summary["step_time_s"]


def test_explicit_backends_are_kept_whatever_the_gpu():
    for backend in ("flash", "cudnn", "eager"):
        assert resolve_on(_plan(backend), build("dgx-b200")).attention == backend
        assert resolve_on(_plan(backend), build("dgx-h100")).attention == backend


@pytest.mark.parametrize("framework", ["generic", "megatron-core", "megatron-lm"])
def test_sdpa_is_refused_where_its_backend_order_is_not_modelled(framework):
    with pytest.raises(WorkloadError) as err:
        _plan("sdpa", framework)
    assert err.value.field == "attention" and "torchtitan" in str(err.value)


def test_an_unresolved_sdpa_is_never_priced_but_its_memory_is_known():
    plan = resolve(_plan("sdpa"), 8)
    with pytest.raises(WorkloadError, match="attention"):
        lower(plan)
    # both backends keep the scores on chip: a memory estimate needs no GPU
    flash = memory_breakdown(resolve(_plan("flash"), 8))
    assert memory_breakdown(plan).activations_bytes == flash.activations_bytes


def test_a_torchtitan_config_expresses_sdpa_but_not_a_forced_backend():
    from workloads.jobs import read_torchtitan, write_torchtitan

    plan = plan_from_dict(small_plan(framework="torchtitan", attention="sdpa",
                                     mesh={"dp": 8}, fsdp={"enabled": True}))
    exported = write_torchtitan(plan)
    assert not any("attention" in n for n in exported.notes)
    # no job-config key picks the backend: the importer leaves it to the GPU
    back = read_torchtitan(exported.text, model=plan.model.to_dict()).plan
    assert back["attention"] == "sdpa"
    for backend in ("cudnn", "flash"):
        forced = plan_from_dict(small_plan(framework="torchtitan", attention=backend,
                                           mesh={"dp": 8}, fsdp={"enabled": True}))
        assert any(n.startswith(f"not expressible in torchtitan: attention = '{backend}'")
                   for n in write_torchtitan(forced).notes)


def _tasks(program) -> list:
    return [(t.kind, t.op, t.phase, t.label, t.flops, t.bytes) for t in program.stages[0]]


@pytest.mark.parametrize("gpu, backend", [("h100", "flash"), ("b200", "cudnn")])
def test_lowering_on_a_gpu_names_sdpa_as_its_backend(gpu, backend):
    # lower(plan, gpu) applies the rule resolve_on applies (attention_impls.sdpa_backend)
    program = lower(resolve(_plan("sdpa"), 8), gpu)
    assert program.plan.attention == backend
    assert _tasks(program) == _tasks(lower(resolve(_plan(backend), 8), gpu))


def test_the_torchtitan_default_is_the_backend_of_the_topologys_gpu():
    # a torchtitan plan that names no attention runs cuDNN on a B200 (recomputed under the
    # op-level checkpoint) and flash on an H100, as torchtitan's SDPA does
    raw = small_plan(framework="torchtitan", recompute="selective_op",
                     training={"seq_len": 8192})
    assert "attention" not in raw and plan_from_dict(raw).attention == "sdpa"
    for topo_name, backend in (("dgx-b200", "cudnn"), ("dgx-h100", "flash")):
        topo = build(topo_name)
        default = simulate(plan_from_dict(raw), topo).summary["step_time_s"]
        assert default == simulate(_plan(backend), topo).summary["step_time_s"], topo_name


def test_gpus_that_pick_different_backends_are_refused():
    from types import SimpleNamespace

    from topologies import TopologyError
    from topologies.specs import DEVICES

    mixed = SimpleNamespace(world_size=8, devices=[DEVICES["h100"]] * 4 + [DEVICES["b200"]] * 4)
    with pytest.raises(TopologyError, match="b200, h100"):
        resolve_on(_plan("sdpa"), mixed)
    same = SimpleNamespace(world_size=8, devices=[DEVICES["h100"]] * 4 + [DEVICES["h200"]] * 4)
    assert resolve_on(_plan("sdpa"), same).attention == "flash"
