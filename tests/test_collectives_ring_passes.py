"""A ring larger than one pass of NCCL's loop pays the steps' latencies once per pass.

NCCL's ring kernels (src/device/all_reduce.h, all_gather.h runRing) loop over a channel's
share in passes of nranks chunks; the Simple chunk is NCCL_BUFFSIZE / NCCL_STEPS x
NCCL_STEPS / 2 (src/enqueue.cc calcCollChunking, src/include/collectives.h), 2 MiB at
the default 4 MiB buffer. NCCL's tuner prices one pass of per-step latencies
(src/graph/tuning.cc); the model charges every further pass the same steps.
"""
import json
from pathlib import Path

import pytest

from simulator.network import CollectiveModel, CommOptions
from simulator.network.algorithms import group_shape
from simulator.network.channels import ring_chunk_bytes, ring_passes
from simulator.network.constants import base_latency_s
from simulator.network.latency import nccl_latency_s, ring_pass_latency_s
from topologies import build
from topologies.errors import TopologyError

GIB = 1 << 30
MIB = 1 << 20
FILES = Path(__file__).resolve().parents[1] / "validation" / "references" / "nccl_topologies"


def test_chunk_per_protocol_and_buffer():
    # Simple: 4 MiB / 8 steps x 4 chunk steps = 2 MiB; NCCL_BUFFSIZE 8 MiB doubles it.
    assert ring_chunk_bytes("Simple") == 2 * MIB
    assert ring_chunk_bytes("Simple", 8 * MIB) == 4 * MIB
    # LL: 8 lines x 512 threads x 8 steps x 16 B = 512 KiB, a step of 64 KiB, half data.
    assert ring_chunk_bytes("LL") == 32 * 1024
    # LL128: 120 x 640 x 8 x 8 B, a step of 614400 B of which 120/128 carry data.
    assert ring_chunk_bytes("LL128") == 576000


def test_passes_count_channels_ranks_and_chunks():
    # 32 channels x 8 ranks x 2 MiB = 512 MiB per pass.
    assert ring_passes(512 * MIB, 8, 32, 2 * MIB) == 1
    assert ring_passes(512 * MIB + 1, 8, 32, 2 * MIB) == 2
    assert ring_passes(8 * GIB, 8, 32, 2 * MIB) == 16
    assert ring_passes(1024, 8, 32, 2 * MIB) == 1


def test_pass_latency_is_nccl_ring_latency_without_base():
    topo = build("dgx-h100x2")
    shape = group_shape(topo, tuple(range(16)))
    for op in ("all_gather", "reduce_scatter"):
        for proto in ("LL", "LL128", "Simple"):
            whole = nccl_latency_s(shape, op, "ring", proto, 1024.0, 16, 5e-6)
            assert ring_pass_latency_s(shape, op, proto, 5e-6) == pytest.approx(
                whole - base_latency_s("ring", proto))


def test_8xh100_reduce_scatter_pays_each_further_pass():
    # One node: 32 channels [channels.coll_channels], 7 ring steps of 3.4 us (NVLink ring
    # Simple, tuning.cc) per pass; 8 GiB takes 16 passes of 512 MiB.
    model = CollectiveModel(build("dgx-h100"), CommOptions(algorithm="ring"))
    big = model.plan("reduce_scatter", tuple(range(8)), 8 * GIB)
    assert (big.algorithm, big.protocol, big.channels) == ("ring", "Simple", 32)
    assert big.passes_s == pytest.approx(15 * 7 * 3.4e-6)
    assert model.plan("reduce_scatter", tuple(range(8)), 512 * MIB).passes_s == 0.0
    # The passes are part of the latency, not of the bytes on the links.
    half = model.plan("reduce_scatter", tuple(range(8)), 4 * GIB)
    assert big.transfer_s == pytest.approx(2 * half.transfer_s, rel=1e-9)


def test_passes_only_for_rings():
    model = CollectiveModel(build("dgx-h100"), CommOptions(algorithm="nvls"))
    plan = model.plan("all_reduce", tuple(range(8)), 8 * GIB)
    assert plan.algorithm == "nvls" and plan.passes_s == 0.0


def _with_buffsize(tmp_path, value):
    raw = json.loads((FILES / "gcp-a3high-x2.json").read_text())
    raw["network"]["nccl_env"]["NCCL_BUFFSIZE"] = value
    path = tmp_path / "a3high-buffsize.json"
    path.write_text(json.dumps(raw))
    return build(str(path))


def test_nccl_buffsize_sets_the_chunk(tmp_path):
    # gcp-a3high: 8 channels (NCCL_MIN/MAX_NCHANNELS), 16 ranks: 4 MiB buffer -> 256 MiB
    # per pass, 8 MiB -> 512 MiB; a 2 GiB all-gather takes 8 or 4 passes.
    ranks = tuple(range(16))
    small = CollectiveModel(_with_buffsize(tmp_path, 4 * MIB)).plan("all_gather", ranks, 2 * GIB)
    large = CollectiveModel(_with_buffsize(tmp_path, 8 * MIB)).plan("all_gather", ranks, 2 * GIB)
    assert small.channels == large.channels == 8
    assert small.passes_s == pytest.approx(7 / 3 * large.passes_s)


@pytest.mark.parametrize("value", [1024, "lots", 1 << 31])
def test_bad_buffsize_names_the_field(tmp_path, value):
    with pytest.raises(TopologyError, match="NCCL_BUFFSIZE"):
        _with_buffsize(tmp_path, value)
