"""Engine._compute's piecewise slowdown at its edges: a speed change on the instant a
kernel ends (in either event order), changes from two streams at one instant, a change
that leaves the speed as it was, a collective that began strictly before the kernel, a
pipeline send beside a kernel, and a serial (CPU-like) device whose collectives run on
the compute stream.

The speed changes are driven the way Engine._track drives them (Engine._hold: count,
then _note_speed_change), so the expected ends follow from the SMs each kernel holds:
compute keeps (SMs - held) / SMs (simulator/sm_share.py).
"""
from __future__ import annotations

import json

import pytest

import topologies
from simulator.engine import Engine, SimOptions
from simulator.sm_share import NCCL, NVLS
from workloads.program import COMM, Program, Task

from test_engine import MB, Tasks, kernel_s, plan_on


@pytest.fixture(scope="module")
def node():
    return topologies.build("dgx-h100")


def bare_engine(node, full: bool = False) -> Engine:
    stage = Tasks()
    stage.kernel("unused", 1 * MB)
    return Engine(Program(plan_on(8), [stage.tasks], model_flops=0.0), node,
                  SimOptions(full=full))


# The SMs an NCCL ring on one H100 node and an NVLS collective hold in these tests (one
# per channel: 32 and 16, as the network model plans them on dgx-h100).
RING_SMS, NVLS_SMS = 32, 16


def changes(engine: Engine, rank: int, steps, late: bool = False):
    """Each (at_s, busy, delta): at absolute time at_s, a collective on the rank's SMs
    ("sm": RING_SMS of them) or NVLS ("nvls": NVLS_SMS) begins (+1) or ends (-1). `late`:
    each wait is created after the kernel's own timeout of that instant (a timeout(0)
    first)."""
    env = engine.env
    for at_s, busy, delta in steps:
        if late:
            yield env.timeout(0)
        yield env.timeout(at_s - env.now)
        sms, kind = (RING_SMS, NCCL) if busy == "sm" else (NVLS_SMS, NVLS)
        engine._hold(rank, sms, kind, delta > 0)


def kernel(engine: Engine, rank: int, work_s: float, ends: list):
    yield from engine._compute(rank, work_s)
    ends.append(engine.env.now)


def factors(node) -> tuple[float, float]:
    """Compute's speed beside the "sm" and the "nvls" collective of `changes`."""
    sms = node.device(0).sm_count
    return (sms - RING_SMS) / sms, (sms - NVLS_SMS) / sms


def planned_speed(engine: Engine, op: str, ranks, size: float) -> float:
    """Compute's speed beside this collective: one SM per channel of its plan."""
    sms = engine.topology.device(ranks[0]).sm_count
    return (sms - engine.comm.plan(op, tuple(ranks), size).channels) / sms


@pytest.mark.parametrize("late", [False, True])
def test_a_collective_ending_on_the_instant_the_kernel_ends(node, late):
    # 0.5 s at full speed, then 0.5 s of work at factor f; the collective's end lands
    # on the kernel's end (an ulp either side), its event before or after the kernel's
    engine, ends = bare_engine(node), []
    f, _ = factors(node)
    end_s = 0.5 + 0.5 / f
    engine.env.process(kernel(engine, 0, 1.0, ends))
    engine.env.process(changes(engine, 0, [(0.5, "sm", 1), (end_s, "sm", -1)], late))
    engine.env.run()
    assert ends == [pytest.approx(end_s, rel=1e-12)]
    assert engine._computing[0] == {} and engine.sms.running(0) == 0


@pytest.mark.parametrize("nvls_first", [False, True])
def test_two_streams_changing_the_speed_at_one_instant(node, nvls_first):
    # an SM collective and an NVLS one both begin at 0.25; the SM one ends at 0.5, the
    # NVLS one at 0.75: speeds 1, f, f_nvls, 1. NVLS first: the kernel is interrupted
    # twice at 0.25 (1 -> f_nvls -> f), the second time with nothing done in between
    engine, ends = bare_engine(node), []
    f, fn = factors(node)
    assert f < fn < 1.0
    engine.env.process(kernel(engine, 0, 1.0, ends))
    sm = changes(engine, 0, [(0.25, "sm", 1), (0.5, "sm", -1)])
    nvls = changes(engine, 0, [(0.25, "nvls", 1), (0.75, "nvls", -1)])
    for process in ((nvls, sm) if nvls_first else (sm, nvls)):
        engine.env.process(process)
    engine.env.run()
    done_s = 0.25 + 0.25 * f + 0.25 * fn
    assert ends == [pytest.approx(0.75 + (1.0 - done_s), rel=1e-12)]


def test_a_change_that_keeps_the_speed_and_other_ranks_are_untouched(node):
    # a second SM collective beside a first keeps the speed; rank 1's collective does
    # not slow rank 0 (full mode: every rank simulated), and every kernel of rank 1 is
    # slowed alike
    engine, ends0, ends1 = bare_engine(node, full=True), [], []
    f, _ = factors(node)
    engine.env.process(kernel(engine, 0, 1.0, ends0))
    engine.env.process(kernel(engine, 1, 1.0, ends1))
    engine.env.process(kernel(engine, 1, 2.0, ends1))
    engine.env.process(changes(engine, 1, [(0.0, "sm", 1), (0.5, "sm", 1),
                                           (0.5, "sm", -1), (1.0, "sm", -1)]))
    engine.env.run()
    assert ends0 == [1.0]
    # 1 s at f, then full speed
    assert ends1 == [pytest.approx(1.0 + (1.0 - f), rel=1e-12),
                     pytest.approx(1.0 + (2.0 - f), rel=1e-12)]


def test_a_collective_begun_before_the_kernel_slows_only_the_overlap(node):
    # the reduce-scatter starts at 0 beside "pre"; "long" starts when "pre" ends, with
    # the collective still running: only its overlapped part is slowed (the old engine
    # stretched all of "long")
    stage = Tasks()
    stage.collective("dp_rs", "reduce_scatter", ("dp",), 64 * MB, stream="dp_rs")
    stage.kernel("pre", 10 * MB)
    stage.kernel("long", 3000 * MB)
    engine = Engine(Program(plan_on(8), [stage.tasks], model_flops=0.0), node, SimOptions())
    engine.run()
    cols = engine.trace.table().to_pydict()
    t = {label: (s, e) for label, s, e in zip(cols["label"], cols["start_s"], cols["end_s"])}
    ranks = engine.groups.group(0, ("dp",))
    f = planned_speed(engine, "reduce_scatter", ranks, 64 * MB)
    began, ended = t["dp_rs"]
    pre_end = t["pre"][1]
    assert began == 0.0 and pre_end == pytest.approx(kernel_s(node, 10 * MB) / f, rel=1e-9)
    long_s = kernel_s(node, 3000 * MB)
    assert t["long"][0] == pre_end < ended < pre_end + long_s
    assert t["long"][1] == pytest.approx(pre_end + long_s + (ended - pre_end) * (1 - f),
                                         rel=1e-9)


def send_beside_kernel() -> Program:
    """Stage 0 sends 256 MB to stage 1 beside a long kernel; stage 1 receives it."""
    first, second = Tasks(), Tasks()
    first.kernel("long", 3000 * MB)
    tag = ("act", 0)
    first.tasks.append(Task(id=1, kind=COMM, stream="pp_send", op="send_recv",
                            phase="forward", layer=0, microbatch=0, bytes=256 * MB,
                            group=("pp",), peer=1, tag=tag, label="send"))
    second.tasks.append(Task(id=0, kind=COMM, stream="pp_recv", op="send_recv",
                             phase="forward", layer=0, microbatch=0, bytes=256 * MB,
                             group=("pp",), peer=-1, tag=tag, label="recv"))
    return Program(plan_on(8, pp=2), [first.tasks, second.tasks], model_flops=0.0)


@pytest.mark.parametrize("full", [False, True])
def test_a_pipeline_send_slows_the_kernel_beside_it(node, full):
    engine = Engine(send_beside_kernel(), node, SimOptions(full=full))
    engine.run()
    cols = engine.trace.table().to_pydict()
    t = {label: (s, e) for r, label, s, e in
         zip(cols["rank"], cols["label"], cols["start_s"], cols["end_s"]) if r == 0}
    f = planned_speed(engine, "send_recv", (0, 4), 256 * MB)
    assert f < 1.0
    began, ended = t["send"]
    long_s = kernel_s(node, 3000 * MB)
    assert began == 0.0 and 0.0 < ended < long_s
    assert t["long"][1] == pytest.approx(long_s + ended * (1 - f), rel=1e-9)


def test_a_serial_device_never_slows_compute_by_its_own_collectives(tmp_path, node):
    # concurrent_collectives false: the collective joins the compute stream, so the kernel
    # after it runs alone at full speed
    path = tmp_path / "serial.json"
    path.write_text(json.dumps({"name": "h", "domains": 1, "gpus_per_domain": 8,
                                "gpu": {"base": "h100",
                                        "profile": {"concurrent_collectives": False}}}))
    serial = topologies.build(str(path))
    stage = Tasks()
    stage.collective("dp_rs", "reduce_scatter", ("dp",), 64 * MB, stream="dp_rs")
    stage.kernel("long", 3000 * MB)
    engine = Engine(Program(plan_on(8), [stage.tasks], model_flops=0.0), serial,
                    SimOptions())
    engine.run()
    cols = engine.trace.table().to_pydict()
    t = {label: (s, e) for label, s, e in zip(cols["label"], cols["start_s"], cols["end_s"])}
    ended = t["dp_rs"][1]
    assert t["long"] == pytest.approx((ended, ended + kernel_s(serial, 3000 * MB)),
                                      rel=1e-12)
