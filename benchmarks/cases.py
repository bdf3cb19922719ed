"""The benchmark cases (each with its wall-time target), and running one of them in this
process."""
from __future__ import annotations

import resource
import time
from dataclasses import dataclass

import topologies
from simulator import SimOptions, simulate
from topologies.faults import apply_faults
from workloads import load_plan


@dataclass(frozen=True)
class Case:
    """One benchmark: a bundled plan, optionally a topology and full mode, and its target."""

    name: str
    plan: str
    full: bool = False
    target_s: float = 0.0
    target_rss_bytes: float = 0.0
    faults: tuple[str, ...] = ()    # topologies.faults specs, simulated as rank classes


CASES = [
    Case("llama3-8b fsdp on dgx-h100 (8 GPUs)", "fsdp.json", target_s=1.0),
    Case("llama3-70b col on dgx-h100x4 (32 GPUs)", "col.json", target_s=2.0),
    Case("llama3-405b on 2,048 GPUs", "llama3-405b-2k.json"),
    Case("llama3-405b on 16,384 GPUs (Llama 3 layout)", "llama3-405b-16k.json",
         target_s=30.0, target_rss_bytes=4e9),
    Case("llama3-70b --full on 1,024 GPUs", "llama3-70b-1k.json", full=True, target_s=300.0,
         target_rss_bytes=2e9),
    # Faults on the 16,384-GPU job: the ranks a fault touches, and those that wait on
    # them, are their own rank classes (simulator/rank_classes.py).
    Case("405b 16,384 GPUs, straggler gpu 5 x1.2", "llama3-405b-16k.json", target_s=60.0,
         faults=("straggler:gpu=5,slowdown=1.2",)),
    Case("405b 16,384 GPUs, NIC node1/3 down", "llama3-405b-16k.json", target_s=60.0,
         faults=("link-down:nic=node1/3",)),
    Case("405b 16,384 GPUs, NIC nic1.3 at x0.5", "llama3-405b-16k.json", target_s=60.0,
         faults=("degraded:link=nic1.3,factor=0.5",)),
    Case("405b 16,384 GPUs, node 1 of A100s", "llama3-405b-16k.json", target_s=60.0,
         faults=("gpu:ranks=8-15,type=a100",)),
]


def run_case(case: Case) -> dict:
    """Simulate one case here and measure wall time, events and peak memory (RSS)."""
    start, cpu_start = time.perf_counter(), time.process_time()
    plan = load_plan(case.plan)
    topology = apply_faults(topologies.build(plan.topology), case.faults)
    result = simulate(plan, topology, SimOptions(full=case.full,
                                                 fault_classes=bool(case.faults)))
    wall_s = time.perf_counter() - start
    # CPU time: on a shared machine it moves less with the others' load than wall time.
    cpu_s = time.process_time() - cpu_start
    # ru_maxrss is in KiB on Linux.
    rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"case": case.name, "plan": case.plan, "full": case.full, "wall_s": wall_s, "cpu_s": cpu_s,
            "events": result.events, "events_per_s": result.events / wall_s,
            "peak_rss_bytes": rss_bytes, "simulated_ranks": result.summary["simulated_ranks"],
            "step_time_s": result.summary["step_time_s"], "target_s": case.target_s,
            "target_rss_bytes": case.target_rss_bytes}
