"""The engine on hand-made Programs: stream order, dependencies, collective rendezvous and
rank-class twins, with expected times worked out from the compute model.

Every compute task here is a memory-bound kernel (no FLOPs), so by simulator/compute.py its
duration is bytes / (HBM bandwidth x memory efficiency) + one launch overhead.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

import topologies
from topologies.builders import NDR_400G
from simulator.engine import Engine, SimOptions
from workloads import plan_from_dict, resolve
from workloads.program import COMM, COMPUTE, MEMORY, Program, Task

from conftest import small_plan

MB = 1e6


@pytest.fixture(scope="module")
def node():
    """One DGX H100 node: 8 identical GPUs."""
    return topologies.build("dgx-h100")


def kernel_s(topology, size_bytes: float) -> float:
    """By hand: a memory-bound kernel of `size_bytes` on the node's GPU."""
    device = topology.device(0)
    return (size_bytes / (device.hbm_Bps * device.profile.memory_efficiency)
            + device.profile.launch_overhead_s)


def plan_on(world: int, **mesh):
    """A resolved small plan with the given mesh degrees (dp fills the world)."""
    return resolve(plan_from_dict(small_plan(mesh={"dp": "auto", "tp": 1, **mesh})), world)


class Tasks:
    """Builds one stage's task list; a task's id is its position, as lowering numbers them."""

    def __init__(self) -> None:
        self.tasks: list[Task] = []

    def kernel(self, label: str, size_bytes: float, stream: str = "compute",
               deps: tuple[int, ...] = ()) -> int:
        return self._add(Task(id=len(self.tasks), kind=COMPUTE, stream=stream, op=label,
                              phase="forward", layer=0, microbatch=0, deps=deps,
                              bytes=size_bytes, op_class=MEMORY, label=label))

    def collective(self, label: str, op: str, group: tuple[str, ...], size_bytes: float,
                   stream: str = "tp", deps: tuple[int, ...] = ()) -> int:
        return self._add(Task(id=len(self.tasks), kind=COMM, stream=stream, op=op,
                              phase="forward", layer=0, microbatch=0, deps=deps,
                              bytes=size_bytes, group=group, label=label))

    def _add(self, task: Task) -> int:
        self.tasks.append(task)
        return task.id


def run(program: Program, topology, full: bool = False) -> dict[tuple[int, str], tuple]:
    """Simulate; (rank, label) -> (start_s, end_s)."""
    engine = Engine(program, topology, SimOptions(full=full))
    engine.run()
    cols = engine.trace.table().to_pydict()
    return {(r, label): (s, e) for r, label, s, e in
            zip(cols["rank"], cols["label"], cols["start_s"], cols["end_s"])}


def test_tasks_on_one_stream_run_in_list_order(node):
    stage = Tasks()
    stage.kernel("a", 300 * MB)
    stage.kernel("b", 100 * MB)
    stage.kernel("c", 200 * MB)
    stage.kernel("side", 50 * MB, stream="aux")   # another stream: starts at once
    times = run(Program(plan_on(8), [stage.tasks], model_flops=0.0), node)
    a, b, c = (kernel_s(node, s * MB) for s in (300, 100, 200))
    assert times[(0, "a")] == pytest.approx((0.0, a), abs=1e-12)
    assert times[(0, "b")] == pytest.approx((a, a + b), abs=1e-12)
    assert times[(0, "c")] == pytest.approx((a + b, a + b + c), abs=1e-12)
    assert times[(0, "side")] == pytest.approx((0.0, kernel_s(node, 50 * MB)), abs=1e-12)


def test_a_task_starts_after_its_dependencies_end(node):
    stage = Tasks()
    long_ = stage.kernel("long", 400 * MB, stream="aux")
    first = stage.kernel("first", 100 * MB)
    stage.kernel("after_long", 100 * MB, deps=(long_,))          # waits for the other stream
    stage.kernel("after_first", 10 * MB, stream="aux2", deps=(first,))
    times = run(Program(plan_on(8), [stage.tasks], model_flops=0.0), node)
    long_s, first_s = kernel_s(node, 400 * MB), kernel_s(node, 100 * MB)
    assert long_s > first_s
    # Its stream is free at first_s, but its dependency ends later.
    assert times[(0, "after_long")] == pytest.approx((long_s, long_s + first_s), abs=1e-12)
    assert times[(0, "after_first")] == pytest.approx(
        (first_s, first_s + kernel_s(node, 10 * MB)), abs=1e-12)


def pipeline_pair(before_bytes: tuple[float, float]) -> Program:
    """Two pipeline stages that each run a kernel and then one all-reduce over pp."""
    stages = []
    for size in before_bytes:
        stage = Tasks()
        work = stage.kernel("work", size)
        stage.collective("sync", "all_reduce", ("pp",), 64 * MB, deps=(work,))
        stages.append(stage.tasks)
    return Program(plan_on(8, pp=2), stages, model_flops=0.0)


def test_a_collective_starts_when_its_last_member_arrives(node):
    # Full mode: rank 0 (stage 0) and rank 4 (stage 1) form a pp group; stage 1 arrives later.
    early_s, late_s = kernel_s(node, 100 * MB), kernel_s(node, 500 * MB)
    times = run(pipeline_pair((100 * MB, 500 * MB)), node, full=True)
    alone = run(pipeline_pair((500 * MB, 500 * MB)), node, full=True)
    collective_s = alone[(0, "sync")][1] - late_s            # both members arrive together
    assert collective_s > 0
    # Each row starts at its rank's arrival; both end one collective after the last arrival.
    assert times[(0, "sync")] == pytest.approx((early_s, late_s + collective_s), rel=1e-9)
    assert times[(4, "sync")] == pytest.approx((late_s, late_s + collective_s), rel=1e-9)
    # Every member of every pp group behaves alike.
    for rank in range(4):
        assert times[(rank, "sync")][1] == pytest.approx(late_s + collective_s, rel=1e-9)


def symmetric_program() -> Program:
    """TP 2 x DP 4 on one node: compute, a TP all-reduce, compute, a DP reduce-scatter
    overlapping a last kernel."""
    stage = Tasks()
    a = stage.kernel("a", 200 * MB)
    tp = stage.collective("tp_ar", "all_reduce", ("tp",), 32 * MB, deps=(a,))
    b = stage.kernel("b", 100 * MB, deps=(tp,))
    stage.collective("dp_rs", "reduce_scatter", ("dp",), 256 * MB, stream="dp_rs", deps=(b,))
    stage.kernel("c", 300 * MB)
    return Program(plan_on(8, tp=2), [stage.tasks], model_flops=0.0)


def test_rank_class_mode_agrees_with_full_mode_on_a_symmetric_job(node):
    classes = run(symmetric_program(), node)
    full = run(symmetric_program(), node, full=True)
    assert {rank for rank, _ in classes} == {0}                # one representative rank
    assert {rank for rank, _ in full} == set(range(8))
    for label in ("a", "tp_ar", "b", "dp_rs", "c"):
        for rank in range(8):
            assert full[(rank, label)] == pytest.approx(classes[(0, label)], rel=1e-9), label
    # The kernels before the collectives are as computed by hand.
    a_s = kernel_s(node, 200 * MB)
    assert classes[(0, "a")] == pytest.approx((0.0, a_s), abs=1e-12)
    assert classes[(0, "tp_ar")][0] == pytest.approx(a_s, abs=1e-12)


def two_nodes_one_nic(gpus_per_node: int):
    """Two nodes joined by one 400 Gb/s NIC each, so every cross-node group shares it."""
    spec = topologies.cluster_spec("dgx-h100")
    return replace(spec, num_domains=2, domain_size=gpus_per_node,
                   fabric=replace(NDR_400G, nics_per_domain=1)).build()


def cross_node_all_reduce(tp: int) -> Program:
    """A kernel, then an all-reduce over dp; with dp = 2 each dp group spans the nodes."""
    stage = Tasks()
    a = stage.kernel("a", 200 * MB)
    stage.collective("dp_ar", "all_reduce", ("dp",), 256 * MB, stream="dp_rs", deps=(a,))
    return Program(plan_on(2 * tp, tp=tp, dp=2), [stage.tasks], model_flops=0.0)


def test_twins_load_the_links_they_share():
    # TP 8 x DP 2 on two nodes: eight DP groups cross the one NIC pair at the same time.
    # Rank-class mode simulates rank 0 and lets the seven twin groups load the link; full
    # mode runs all eight groups. Both must give the same time, about 8 x one group alone.
    crowded = two_nodes_one_nic(8)
    classes = run(cross_node_all_reduce(8), crowded)
    full = run(cross_node_all_reduce(8), crowded, full=True)
    alone = run(cross_node_all_reduce(1), two_nodes_one_nic(1))
    for rank in range(16):
        assert full[(rank, "dp_ar")] == pytest.approx(classes[(0, "dp_ar")], rel=1e-9)
    start, end = classes[(0, "dp_ar")]
    alone_start, alone_end = alone[(0, "dp_ar")]
    assert start == alone_start == pytest.approx(kernel_s(crowded, 200 * MB), abs=1e-12)
    assert 6 * (alone_end - alone_start) < end - start < 8 * (alone_end - alone_start)


def overlapped_kernel(collective_first: bool) -> Program:
    """A long kernel beside a DP reduce-scatter that starts either at the same instant
    (`collective_first`: the compute stream's process runs first, so the collective
    interrupts the kernel at 0) or after a 100 MB kernel on another stream. A collective
    begun strictly before the kernel: tests/test_engine_overlap.py."""
    stage = Tasks()
    deps: tuple[int, ...] = ()
    if not collective_first:
        deps = (stage.kernel("pre", 100 * MB, stream="aux"),)
    stage.collective("dp_rs", "reduce_scatter", ("dp",), 64 * MB, stream="dp_rs", deps=deps)
    stage.kernel("long", 3000 * MB)
    return Program(plan_on(8), [stage.tasks], model_flops=0.0)


@pytest.mark.parametrize("collective_first", [True, False])
def test_only_the_overlapped_part_of_a_kernel_is_slowed(node, collective_first):
    # The kernel runs at the profile's overlap factor while the collective holds SMs (or
    # NVLS) and at full speed otherwise: its end moves by the overlap x (1 - factor),
    # whether the collective began on the kernel's first instant or during it (the old
    # engine slowed neither: it looked only at the kernel's start, before the collective).
    program = overlapped_kernel(collective_first)
    engine = Engine(program, node, SimOptions())
    engine.run()
    cols = engine.trace.table().to_pydict()
    times = {label: (s, e) for r, label, s, e in
             zip(cols["rank"], cols["label"], cols["start_s"], cols["end_s"]) if r == 0}
    ranks = engine.groups.group(0, ("dp",))
    # one SM per channel of the collective's kernel (simulator/sm_share.py)
    sms = node.device(0).sm_count
    factor = (sms - engine.comm.plan("reduce_scatter", tuple(ranks), 64 * MB).channels) / sms
    assert factor < 1.0
    began, ended = times["dp_rs"]
    long_s = kernel_s(node, 3000 * MB)
    assert times["long"][0] == 0.0 and ended < long_s     # the collective ends inside it
    assert began == pytest.approx(0.0 if collective_first else kernel_s(node, 100 * MB))
    assert times["long"][1] == pytest.approx(long_s + (ended - began) * (1 - factor),
                                             rel=1e-9)
    # without interference the kernel keeps its own duration
    quiet = Engine(program, node, SimOptions(overlap_slowdown=False))
    quiet.run()
    quiet_cols = quiet.trace.table().to_pydict()
    assert dict(zip(quiet_cols["label"], quiet_cols["end_s"]))["long"] == pytest.approx(
        long_s, rel=1e-12)
