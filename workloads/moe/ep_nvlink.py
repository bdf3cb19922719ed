"""What HybridEP's fused dispatch and combine achieve inside one NVLink domain.

Across nodes the kernels' RDMA stage is slower than the NIC (ep_rdma.py). Inside one
NVLink domain (the 8 GPUs of a DGX B200, or the GPUs of a GB200 NVL72 rack, where
HybridEP runs its MNNVL path) the engine prices the dispatch as a flat all-to-all on the
NVLink links, at the rate its NCCL-style p2p all-to-all reaches there (about 750 GB/s per
GPU at these sizes on B200). The kernels are measured at or below that. NVIDIA's
benchmark (tests/test_hybrid_ep.py) prints GB/s of the rank's received rows
(nvl_recv_bytes = the dispatched hidden rows, the rank's own included, times 2 bytes for
BF16; the combine sends as many) two ways: through the Torch API (HybridEPBuffer.dispatch
/ combine: the kernel, the output allocation and the copy out of the registered
communication buffer) and for the kernel alone.

Megatron-Core does not call the dispatch / combine that benchmark times: its HybridEP
manager calls dispatch_with_permute / combine_with_unpermute (megatron/core/transformer/
moe/fused_a2a.py, token_dispatcher.py _HybridEPManager at NVIDIA/Megatron-LM d98e8a64,
since the backend entered in 3df200905e), where HybridEP's permute kernel reads the
received rows straight out of the communication buffer into expert order in place of
that copy (deep_ep/hybrid_ep_buffer.py dispatch_with_permute, hybrid-ep branch 94a9f8f;
fused into the dispatch kernel itself only with moe_permute_fusion_into_hybridep, which
no recipe of the reference rows sets). The simulator prices that permute as a task of
its own (dispatch.py), so the transfer is the kernel-only figure; the Torch API's would
count the copy twice.
The benchmark passes every timed call the handle of its warm-up dispatch, so neither
figure includes the metadata preprocessing (the routing maps' gather and the host's
wait for it, priced on their own: dispatch.py _routing_map_gather); at 8 GB200 ranks the
Torch API's dispatch takes 166 us more than the kernel's for 318 MB received, about half
of it a copy of those rows at the device's streaming rate.

deepseek-ai/DeepEP branch hybrid-ep, docs/README_Hybrid-EP.md (commit 17cfb81, 2026-05-13),
4096 tokens per rank, hidden 7168, top-8, 8 local experts per rank, uniform random
routing, BF16 dispatch, GB/s:

    GPU     ranks  SMs   kernel only: dispatch, combine   (Torch API: dispatch, combine)
    B200      8    16            734.95   673.84          (535.94, 530.86)
    GB200     8    32            764.03   737.13          (545.71, 568.94)
    GB200    16    32            706.95   666.26          (523.48, 521.55)
    GB200    24    32            665.97   639.80          (507.32, 483.76)
    GB200    32    32            642.23   605.15          (484.22, 464.54)
    GB200    36    32            632.31   596.99          (479.02, 447.89)

Cross-check, not used for pricing: NVIDIA's Megatron Core MoE report (arXiv 2603.07685,
Table 7) times HybridEP's dispatch and combine on GB200 for DeepSeek-V3's shape (hidden
7168, 4096 tokens, 256 experts) at EP 8, 16, 32 and 64: 391/353, 578/527, 612/646 and
675/744 us, "communication latency only"; the kernel-only rates above time those
dispatches within -6 .. +9 % and the combines within +2 .. +20 % (tests/test_ep_nvlink.py),
where the Torch API's are 27-55 % slower.

Megatron-Bridge's performance scripts run HybridEP with 32 SMs (scripts/performance/utils/
overrides.py, `moe_hybridep_num_sms = 32` from 97ad8cc6fb through 51885cf132), so the
GB200 rows are the 32-SM ones. Assumptions: the B200 figure, measured at 16 SMs only,
stands for 32 (on GB200 at 8 ranks the two differ by 2 % and 7 %); Megatron-LM's own
recipes, which leave the SM count at its default, run at these rates too (GB200's 16-SM
rows are within 12 % of them); the rates carry to other token counts, hidden sizes and
expert counts; a group larger than the largest measured takes that one's rates, a smaller
one the smallest's; a GB200 group is taken to sit in one rack (as ep_rdma.py takes it:
the reference rows use at most 64 GPUs of a rack). Hopper has no intra-node measurement
(the README's H100 table is 16-64 ranks over InfiniBand), so H100 groups keep the
engine's NVLink all-to-all.

The engine takes the rate as a ceiling on the collective's rate (Task.kernel_Bps): the
dispatch lasts at least its bytes at this rate, and longer where the links are slower
or shared.
"""
from __future__ import annotations

from .ep_rdma import measured_size

GB = 1e9

# (dispatch, combine) bytes per second of received rows, kernel only, BF16, by ranks in the
# NVLink domain's dispatch group (docs/README_Hybrid-EP.md tables above).
HYBRIDEP_NVLINK_Bps: dict[str, dict[int, tuple[float, float]]] = {
    "b200": {8: (734.95 * GB, 673.84 * GB)},
    "gb200": {8: (764.03 * GB, 737.13 * GB), 16: (706.95 * GB, 666.26 * GB),
              24: (665.97 * GB, 639.80 * GB), 32: (642.23 * GB, 605.15 * GB),
              36: (632.31 * GB, 596.99 * GB)},
}
# GPUs without a measurement that take another's: GB300's rack has GB200's NVLink5 and
# MNNVL path (18 links of 50 GB/s, the same NVSwitch trays); a DGX B300 board has the
# HGX B200's (8 GPUs, 18 NVLink5 links each, on NVLink switches). Assumption: their
# kernels reach the measured board's rates (Blackwell Ultra's extra SMs do not matter to
# a 32-SM kernel).
MEASURED_AS = {"gb300": "gb200", "b300": "b200"}


def nvlink_kernel_Bps(backend: str, gpu: str, ranks: int) -> tuple[float, float] | None:
    """(dispatch, combine) rate of a flex-dispatcher backend's kernels for a group of
    `ranks` inside one NVLink domain of `gpu`s; None where none is measured (then the
    engine's all-to-all alone prices it)."""
    name = MEASURED_AS.get(gpu.lower(), gpu.lower())
    table = HYBRIDEP_NVLINK_Bps.get(name) if backend == "hybridep" else None
    if not table or ranks < 2:
        return None
    return table[measured_size(table, ranks)]
