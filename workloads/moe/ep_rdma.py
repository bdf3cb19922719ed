"""What the fused EP dispatch and combine kernels achieve across nodes over RDMA.

The plan's "deepep" dispatcher (Megatron-Core's flex dispatcher, moe.flex_backend HybridEP
or DeepEP) sends
a token once per destination node over RDMA and forwards it over NVLink inside the node
(dispatch.py, deepep_bytes). The engine prices that as a flat all-to-all whose inter-node
part runs at the links' rate. The kernels' own benchmarks measure less:

NVIDIA's HybridEP benchmark on H100 with 400 Gb/s CX7 IB (deepseek-ai/DeepEP hybrid-ep,
docs/README_Hybrid-EP.md commit 5fbafce2, "H100 Platform"; 4096 tokens per rank, hidden
7168, top-8 of 8 local experts per rank, uniform random routing, 8 ranks per node) prints
an "IB bandwidth" that counts every (token, destination node) pair, the token's own node
included: tests/utils.py count_rdma_send_from_routing_map keeps the local node "to align
with the implementation in the DeepEP" (DeepEP's legacy tests/legacy/test_internode.py
counts num_rdma_token_sent the same way). With 16 SMs (Megatron-Core's default
moe_hybridep_num_sms, megatron/core/transformer/transformer_config.py), kernel only (the
transfer: Megatron-Core's dispatch_with_permute replaces the Torch API's copy out of the
communication buffer with the permute that dispatch.py prices as a task of its own,
ep_nvlink.py), BF16:

    ranks (nodes)    dispatch   combine    (GB/s, every node counted; Torch API)
    16 (2)           71.71      62.95      (54.47, 53.35)
    32 (4)           57.69      57.46      (47.36, 52.53)
    64 (8)           49.97      49.77      (41.24, 46.57)

A token routed uniformly reaches each node with the same probability, so of those bytes
(n - 1) / n crossed the network: the bytes that really cross RDMA per GPU move at
35.9 / 31.5 GB/s (2 nodes), 43.3 / 43.1 (4) and 43.7 / 43.5 (8) of the NIC's 50 GB/s.
The kernel's time is that of its inter-node bytes at this rate. The engine's links carry
the kernel's bytes (the flat all-to-all of dispatch.py), and the task lasts at least its
inter-node bytes at the measured rate (`rdma_kernel_Bps`, a floor on the task: Task.
kernel_Bps), so the NIC is left as free as the kernel leaves it: a pipeline send or a
data-parallel collective beside it shares only the bytes the kernel really moves (an
all-to-all grown to take the kernel's time would hold the NIC for all of it). Larger node
counts take the 8-node figures (the largest measured).
The benchmark's node holds 8 ranks of the group; a group with fewer per node (EP strided
by TP) is taken at its node count.

DeepEP's legacy normal kernels (the deepep backend) on H800 with CX7 400 Gb/s
(deepseek-ai/DeepEP dd758caf docs/legacy.md "Performance": 4096 tokens, hidden 7168,
top-8, FP8 dispatch, BF16 combine, 8 ranks per node, the same counting) print 43 / 43
GB/s at EP16, 58 / 57 at EP32 and 51 / 50 at EP64: 21.5 / 21.5, 43.5 / 42.8 and
44.6 / 43.8 GB/s across RDMA per GPU. (The dispatch figure counts FP8 bytes; Megatron's
flex dispatcher sends BF16: the FP8 byte rate is taken for it.) DeepEP's maintainers put
the EP16 figure down to H800's reduced NVLink ("when the RDMA bandwidth reaches 43 GB/s,
the NVLink bandwidth will exceed 140 GB/s, making NVLink the bottleneck",
deepseek-ai/DeepEP issue 285), but the same test on two H200 nodes with CX7 400 Gb/s, whose
NVLink is not reduced, measures about as much (best BF16 dispatch 40.89, combine 44.37
GB/s counted the same way, issue 493): the two-node figures stand for Hopper's full NVLink
too.

Only where the dispatch group's nodes talk over a scale-out network: on GB200 / GB300
NVL72 racks HybridEP runs over multi-node NVLink (its MNNVL mode), with no RDMA stage.
"""
from __future__ import annotations

# HybridEP H100 "IB bandwidth", kernel only, BF16, 16 SMs, by nodes in the group (8 ranks
# each): (dispatch, combine), own node counted (deepseek-ai/DeepEP 5fbafce2,
# docs/README_Hybrid-EP.md, H100 Platform table, rows 16 / 32 / 64 ranks).
HYBRIDEP_LOGICAL_Bps = {2: (71.71e9, 62.95e9), 4: (57.69e9, 57.46e9),
                        8: (49.97e9, 49.77e9)}
# DeepEP legacy normal kernels, H800 + CX7 400 Gb/s, (dispatch, combine), own node counted
# (deepseek-ai/DeepEP dd758caf, docs/legacy.md, "Normal kernels with NVLink and RDMA
# forwarding", Internode rows EP16 / EP32 / EP64).
DEEPEP_LOGICAL_Bps = {2: (43e9, 43e9), 4: (58e9, 57e9), 8: (51e9, 50e9)}
LOGICAL_Bps = {"hybridep": HYBRIDEP_LOGICAL_Bps, "deepep": DEEPEP_LOGICAL_Bps}

# GPUs whose reference systems hold the EP group in one multi-node NVLink domain (GB200 /
# GB300 NVL72): HybridEP's MNNVL path there has no RDMA stage. Assumption: the device
# name stands for its system (the reference rows run these GPUs as NVL72 racks,
# validation/reference_rows.py _nvl72_job).
MNNVL_GPUS = ("gb200", "gb300")


def measured_size(table: dict, size: int) -> int:
    """The benchmark's group size standing for `size`: the largest measured at or below
    it, or the smallest measured (a kernel benchmark's rates by ranks or nodes)."""
    return ([n for n in sorted(table) if n <= size] or [min(table)])[-1]


def achieved_rdma_Bps(backend: str, nodes: int) -> tuple[float, float]:
    """Bytes per second that really cross RDMA per GPU in a backend's (dispatch, combine)
    with the group on `nodes` nodes: the benchmark's rate over all nodes hit, times the
    (nodes - 1) / nodes of them that are remote."""
    table = LOGICAL_Bps[backend]
    key = measured_size(table, nodes)
    remote = (key - 1) / key
    dispatch, combine = table[key]
    return dispatch * remote, combine * remote


def rdma_kernel_Bps(backend: str, nodes: int, gpu: str) -> tuple[float, float]:
    """(dispatch, combine) bytes per second that really cross RDMA per GPU in the
    backend's kernels, as its benchmark measured them; (0, 0) on one node or where the
    group sits in one NVLink domain (no RDMA stage)."""
    if nodes < 2 or gpu.lower() in MNNVL_GPUS:
        return 0.0, 0.0
    return achieved_rdma_Bps(backend, nodes)
