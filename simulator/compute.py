"""Compute cost: a roofline per kernel with per-op-class efficiency from the device profile.

time = max(FLOPs / (peak x efficiency x sustained ratio),
           bytes / (HBM bandwidth x memory efficiency)) + launch overhead x kernel launches
The sustained ratio (DeviceProfile.sustained_tensor_ratio) is what a power-limited GPU's
settled clock leaves of the burst-measured tensor-core rates through a training step.
GEMM efficiency also pays for wave quantisation: a GEMM of few output tiles cannot fill
every SM (cuBLAS falls back to split-K when the reduction dimension is long), and for the
length of its K loop against the K the device profile's efficiency was measured at (a
fixed cost per output tile: topologies/gemm_k_loop.py).
"""
from __future__ import annotations

import math

from topologies import DeviceSpec
from topologies.gemm_k_loop import TILE_COST_FACTOR, k_loop_fraction, tile_overhead_k
from topologies.host_link import host_link_Bps
from workloads.offload_copies import OFFLOAD_OP
from workloads.program import ATTENTION, COMPUTE, GEMM, HOST_COPY, MEMORY, Task

# Split-K needs enough of the reduction dimension per split to stay efficient.
# Assumption: at least 1024 elements of k per split (4 K-tiles of 256).
SPLIT_K_MIN = 1024


def gemm_tiles(m: int, n: int, k: int, sms: int, tile: int, groups: int = 1) -> int:
    """Output tiles (thread blocks' work items) of `groups` m x n outputs in one launch,
    split along K (k the reduction) when there are fewer tiles than SMs."""
    tiles = math.ceil(m / tile) * math.ceil(n / tile) * max(1, groups)
    if tiles < sms:
        tiles *= max(1, min(sms // tiles, k // SPLIT_K_MIN))
    return tiles


def wave_efficiency(m: int, n: int, k: int, sms: int, tile: int, groups: int = 1) -> float:
    """Fraction of SM-time doing useful tiles for `groups` m x n outputs (k the reduction)
    computed by one launch."""
    if m <= 0 or n <= 0:
        return 1.0
    tiles = gemm_tiles(m, n, k, sms, tile, groups)
    waves = math.ceil(tiles / sms)
    return tiles / (waves * sms)


def persistent_grid(task: Task, device: DeviceSpec) -> int:
    """Thread blocks a GEMM task's persistent kernel launches, min(tiles, SMs), on a device
    whose GEMMs are persistent (DeviceProfile.persistent_gemm_blocks); 0 otherwise."""
    if task.op_class != GEMM or not device.profile.persistent_gemm_blocks \
            or device.sm_count <= 1:
        return 0
    m, n, k = task.gemm_mnk
    if m <= 0 or n <= 0:
        return 0
    tiles = gemm_tiles(m, n, k, device.sm_count, device.profile.gemm_tile, task.gemm_groups)
    return min(tiles, device.sm_count)


def k_loop_efficiency(k: int, device: DeviceSpec, dtype: str) -> float:
    """A GEMM's speed with a K loop of `k` relative to the device profile's reference K:
    the ratio of their loop fractions at this GPU's per-tile cost for `dtype`
    (topologies/gemm_k_loop.py's rule, or the profile's gemm_k0_bf16 where measured). 1
    for an unknown K, on a profile without a reference K (a calibrated host:
    gemm_reference_k 0) and on a GPU without a known SM count (no tile to cost)."""
    reference_k = device.profile.gemm_reference_k
    if k <= 0 or reference_k <= 0 or device.sm_count <= 1:
        return 1.0
    overhead_k = tile_overhead_k(device.peak(dtype), device.sm_count)
    measured = device.profile.gemm_k0_bf16
    if measured is not None:   # the GPU's own K sweep, at this dtype's MMA rate
        overhead_k *= measured / tile_overhead_k(device.peak("bf16"), device.sm_count)
    # the profile's rate was measured on GEMMs with the plain per-tile cost; a dtype whose
    # kernels pay more per tile (block-scaled FP8: gemm_k_loop.py) pays it at every K
    return (k_loop_fraction(k, overhead_k * TILE_COST_FACTOR.get(dtype, 1.0))
            / k_loop_fraction(reference_k, overhead_k))


# Host CPUs that issue kernels more slowly than the x86 hosts the per-kernel host cost is
# stated for (workloads/frameworks.py: DGX H100 and DGX B200 carry Intel Xeon Platinum
# hosts). Measured: the host time of one torch.nn.Linear forward (BF16, hidden 2048,
# 8192 tokens) is 37.08 us on GB200 and 33.17 us on GH200 (Grace, Neoverse V2) against
# 13.48 us on a DGX H100 (Xeon Platinum 8480C); Transformer Engine's Linear shows the same
# Grace slowness (99.66 us GB200, 90.53 us GH200) (github.com/NVIDIA/TransformerEngine/
# issues/2053, 2025-08-11, the reporter's benchmark script). Factor: 37.08 / 13.48 and
# 33.17 / 13.48, by the device whose host it is (a Grace CPU drives GB200 and GB300 trays
# and GH200; GB300's is the same Grace, assumed the same factor as GB200's).
GRACE_HOST_FACTOR = {"gb200": 37.08 / 13.48, "gb300": 37.08 / 13.48, "gh200": 33.17 / 13.48}


def host_factor(device: DeviceSpec) -> float:
    """How much longer this device's host takes to issue a kernel than an x86 DGX host."""
    return GRACE_HOST_FACTOR.get(device.name, 1.0)


def compute_time_s(task: Task, device: DeviceSpec, dtype: str) -> float:
    """One compute task's duration alone (studies that price a single kernel): the device
    time, or the host's time to issue it (task.host_s) when that is longer. Summed over
    tasks it is not a lower bound of a step, since the host runs ahead of the device; the
    engine runs the host on its own timeline (engine.py) and the search bounds device and
    host separately (simulator/search/prune.py)."""
    return max(device_time_s(task, device, dtype), task.host_s * host_factor(device))


def cost_key(task: Task) -> tuple:
    """The fields of a compute task that device_time_s and persistent_grid read: tasks
    with equal keys cost the same on a device (a step repeats each layer's kernels once
    per micro-batch, so a stage's durations are computed once per distinct key)."""
    return (task.op_class, task.op, task.flops, task.bytes, task.kernels, task.efficiency,
            task.gemm_mnk, task.gemm_dtype, task.gemm_groups, task.launch_streams)


def device_time_s(task: Task, device: DeviceSpec, dtype: str) -> float:
    """Roofline time of one compute task's kernels plus their launch overhead."""
    if (task.flops == 0.0 and task.bytes == 0.0) or task.kernels == 0:
        return 0.0  # a pure synchronisation point (join), or no kernel at all
    if task.op_class == HOST_COPY:
        # a copy engine's transfer to or from pinned host memory (activation offloading)
        return task.bytes / host_link_Bps(device, to_host=task.op == OFFLOAD_OP)
    prof = device.profile
    memory_s = task.bytes / (device.hbm_Bps * prof.memory_efficiency)
    if task.op_class == MEMORY:
        # a kernel measured slower than the profile's streaming kernel (workloads/te_quant.py)
        memory_s /= task.efficiency
    flops_s = 0.0
    if task.op_class == GEMM:
        m, n, k = task.gemm_mnk
        gemm_dtype = task.gemm_dtype or dtype
        # no GEMM beats its peak, whatever a profile file and a long K loop multiply to
        eff = min(1.0, device.gemm_efficiency(gemm_dtype) * task.efficiency
                  * wave_efficiency(m, n, k, device.sm_count, prof.gemm_tile, task.gemm_groups)
                  * k_loop_efficiency(k, device, gemm_dtype))
        flops_s = task.flops / (device.peak(gemm_dtype) * eff * prof.sustained_tensor_ratio)
    elif task.op_class == ATTENTION:
        # Attention is priced at the bf16 peak under bf16 and FP8/FP4 training (the recipes
        # leave it in bf16: workloads/precision.py), at fp32's under fp32 training. The
        # profile's efficiency is its attention kernel's at 16k causal tokens
        # (FlashAttention-2's; cuDNN's on Blackwell); the task's is that kernel's speed at
        # its call's length and mask (workloads/attention.py kernel_speed), times FP8
        # attention's measured speed over bf16's where a plan quantizes it
        # (training.fp8_attention, workloads/fp8_attention.py).
        peak = min(device.peak(dtype), device.peak("bf16"))
        flops_s = task.flops / (peak * prof.attention_efficiency * task.efficiency
                                * prof.sustained_tensor_ratio)
    # kernels spread over several streams (task.launch_streams) overlap their launch gaps
    launches = math.ceil(task.kernels / max(1, task.launch_streams))
    return max(flops_s, memory_s) + prof.launch_overhead_s * launches


def stage_costs(tasks: list[Task], device: DeviceSpec, dtype: str
                ) -> tuple[list[float], list[int]]:
    """Every task's interference-free duration on `device` (0 for communication) and each
    persistent GEMM's thread blocks (persistent_grid; 0 for others), each distinct
    cost_key priced once."""
    priced: dict[tuple, tuple[float, int]] = {}
    durations, grids = [], []
    for task in tasks:
        if task.kind != COMPUTE:
            durations.append(0.0)
            grids.append(0)
            continue
        key = cost_key(task)
        cost = priced.get(key)
        if cost is None:
            cost = priced[key] = (device_time_s(task, device, dtype),
                                  persistent_grid(task, device))
        durations.append(cost[0])
        grids.append(cost[1])
    return durations, grids
