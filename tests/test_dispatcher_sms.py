"""SMs held by the fused MoE dispatcher's kernels (moe.flex_num_sms, Task.sm_count): compute
beside them keeps the other SMs, as beside NCCL's one SM per channel; the plan key's
defaults, checks and Megatron flags."""
from __future__ import annotations

from dataclasses import replace

import pytest

import topologies
from simulator.engine import Engine, SimOptions
from workloads import WorkloadError, plan_from_dict
from workloads.moe_options import FLEX_DEFAULT_SMS, MoEOptions, parse_moe
from workloads.program import COMM, Program

from moe_small import layer_tasks, moe_plan
from test_engine import MB, Tasks, kernel_s, plan_on
from test_moe_routing_options import MIXTRAL


@pytest.fixture(scope="module")
def node():
    """One DGX H100 node (132 SMs per GPU)."""
    return topologies.build("dgx-h100")


def beside_dispatch(sm_count: int) -> Program:
    """A long kernel beside an EP all-to-all that holds `sm_count` SMs (0: NCCL's)."""
    stage = Tasks()
    stage.collective("a2a", "all_to_all", ("dp",), 64 * MB, stream="ep")
    stage.tasks[-1] = replace(stage.tasks[-1], sm_count=sm_count)
    stage.kernel("long", 3000 * MB)
    return Program(plan_on(8), [stage.tasks], model_flops=0.0)


def long_kernel_end(node, sm_count: int) -> tuple[float, float]:
    """(the kernel's end, the all-to-all's duration) on rank 0."""
    engine = Engine(beside_dispatch(sm_count), node, SimOptions())
    engine.run()
    cols = engine.trace.table().to_pydict()
    times = {label: (s, e) for r, label, s, e in
             zip(cols["rank"], cols["label"], cols["start_s"], cols["end_s"]) if r == 0}
    a2a_start, a2a_end = times["a2a"]
    return times["long"][1], a2a_end - a2a_start


@pytest.mark.parametrize("sms", [20, 32, 64])
def test_compute_keeps_the_sms_the_dispatcher_leaves(node, sms):
    # 132 SMs: beside a kernel on `sms` of them, compute runs at (132 - sms) / 132 for
    # the all-to-all's duration, which must end inside the long kernel
    end, overlap_s = long_kernel_end(node, sms)
    long_s = kernel_s(node, 3000 * MB)
    assert overlap_s < long_s
    speed = (node.device(0).sm_count - sms) / node.device(0).sm_count
    assert end == pytest.approx(long_s + overlap_s * (1 - speed), rel=1e-9)


def test_more_dispatcher_sms_slow_compute_more(node):
    ends = [long_kernel_end(node, sms)[0] for sms in (20, 32, 64)]
    assert ends[0] < ends[1] < ends[2]


def test_nccls_all_to_all_holds_one_sm_per_channel(node):
    # NCCL's kernel (sm_count 0) slows compute as a kernel stating its channels does
    engine = Engine(beside_dispatch(0), node, SimOptions())
    channels = engine.comm.plan("all_to_all", tuple(range(8)), 64 * MB).channels
    assert 0 < channels < node.device(0).sm_count
    nccl_end, _ = long_kernel_end(node, 0)
    assert nccl_end == pytest.approx(long_kernel_end(node, channels)[0], rel=1e-12)
    assert nccl_end > kernel_s(node, 3000 * MB)


def test_a_kernel_on_every_sm_leaves_compute_one_sm_and_no_stall(node):
    end, overlap_s = long_kernel_end(node, 10_000)
    sms = node.device(0).sm_count
    long_s = kernel_s(node, 3000 * MB)
    assert end == pytest.approx(long_s + overlap_s * (1 - 1 / sms), rel=1e-9)


def test_defaults_follow_the_backend():
    assert MoEOptions(dispatcher="deepep").dispatcher_sms == FLEX_DEFAULT_SMS["deepep"] == 20
    assert MoEOptions(dispatcher="deepep", flex_backend="hybridep").dispatcher_sms == 32
    assert MoEOptions(dispatcher="deepep", flex_num_sms=64).dispatcher_sms == 64
    assert MoEOptions().dispatcher_sms == 0         # NCCL's all-to-all


@pytest.mark.parametrize("raw,why", [
    ({"dispatcher": "deepep", "flex_num_sms": 0}, "1..1024"),
    ({"dispatcher": "deepep", "flex_num_sms": 2.5}, "1..1024"),
    ({"dispatcher": "deepep", "flex_num_sms": True}, "1..1024"),
    ({"dispatcher": "alltoall", "flex_num_sms": 32}, "deepep"),
])
def test_bad_sm_counts_are_refused_by_name(raw, why):
    with pytest.raises(WorkloadError) as err:
        parse_moe(raw)
    assert "moe.flex_num_sms" in str(err.value) and why in str(err.value)


def test_the_dispatch_tasks_carry_the_sm_count():
    plan = moe_plan(world=8, mesh={"dp": "auto", "tp": 1, "ep": 8},
                    moe={"dispatcher": "deepep", "flex_backend": "hybridep",
                         "flex_num_sms": 48})
    comm = [t for t in layer_tasks(plan) if t.kind == COMM]
    a2a = [t for t in comm if t.op == "all_to_all"]
    assert a2a and {t.sm_count for t in a2a} == {48}
    nccl = moe_plan(world=8, mesh={"dp": "auto", "tp": 1, "ep": 8})   # alltoall: NCCL's
    assert {t.sm_count for t in layer_tasks(nccl) if t.kind == COMM} == {0}


def test_megatron_flags_round_trip():
    from workloads.jobs import read_megatron, write_megatron
    deepep = {**MIXTRAL, "name": "x", "moe": {"dispatcher": "deepep", "flex_num_sms": 24}}
    flags = write_megatron(plan_from_dict(deepep)).text
    assert "--moe-deepep-num-sms 24" in flags
    assert plan_from_dict(read_megatron(flags).plan).moe.flex_num_sms == 24
    # the backend's default is left out both ways
    plain = write_megatron(plan_from_dict({**deepep, "moe": {"dispatcher": "deepep"}})).text
    assert "num-sms" not in plain
    default = flags.replace("--moe-deepep-num-sms 24", "--moe-deepep-num-sms 20")
    assert plan_from_dict(read_megatron(default).plan).moe.flex_num_sms is None
    # HybridEP's knob, as a Bridge YAML's model.moe_hybridep_num_sms spells it
    hybrid = flags.replace("--moe-enable-deepep", "--moe-flex-dispatcher-backend hybridep"
                           ).replace("--moe-deepep-num-sms 24", "--moe-hybridep-num-sms 64")
    moe = plan_from_dict(read_megatron(hybrid).plan).moe
    assert (moe.flex_backend, moe.dispatcher_sms) == ("hybridep", 64)
    # a config written out with every field carries DeepEP's default beside it: ignored
    both = hybrid.replace("--moe-hybridep-num-sms 64",
                          "--moe-hybridep-num-sms 64 --moe-deepep-num-sms 20")
    assert plan_from_dict(read_megatron(both).plan).moe.dispatcher_sms == 64
    unified = both.replace("--moe-deepep-num-sms 20", "--moe-flex-dispatcher-num-sms 40")
    assert plan_from_dict(read_megatron(unified).plan).moe.dispatcher_sms == 40
    # HybridEP's count has no core_v0.15.0 flag: exported as a note naming the fields
    exported = write_megatron(plan_from_dict({**deepep, "moe": {
        "dispatcher": "deepep", "flex_backend": "hybridep", "flex_num_sms": 48}}))
    assert "num-sms" not in exported.text
    assert exported.notes == [
        "moe.flex_num_sms = 48 has no core_v0.15.0 flag for HybridEP: set "
        "model.moe_hybridep_num_sms (Megatron-Bridge) or moe_flex_dispatcher_num_sms "
        "(Megatron-Core after core_v0.15.0)"]
