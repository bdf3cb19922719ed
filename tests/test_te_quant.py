"""Transformer Engine's MXFP8 cast speed (workloads/te_quant.py).

Golden figures: NVIDIA/TransformerEngine pull request #3137, benchmark comment of
2026-07-08 (B200, TE C++ MXFP8 cast, bf16 -> E4M3, row-wise and column-wise outputs):
4096 x 4096 at 2792.7 GB/s, 4096 x 14336 at 4105.1 GB/s; the device profile's B200 memory
speed is torchao's best cast, 6462 GB/s (topologies/specs.py).
"""
from __future__ import annotations

import pytest

from simulator.compute import device_time_s
from topologies.specs import B200_BEST_MEMORY_KERNEL_Bps, device
from workloads.precision import RECIPES
from workloads.program import Task
from workloads.te_quant import (PROFILE_MEMORY_Bps, TE_MXFP8_CAST, cast_efficiency,
                                te_mxfp8_cast_Bps)
from workloads.torchao_recipes import MXFP8 as TORCHAO_MXFP8

SMALL, LARGE = 4096 * 4096, 4096 * 14336


def test_measured_points_and_clamps():
    assert te_mxfp8_cast_Bps(SMALL) == pytest.approx(2792.7e9)
    assert te_mxfp8_cast_Bps(LARGE) == pytest.approx(4105.1e9)
    assert te_mxfp8_cast_Bps(SMALL / 8) == pytest.approx(2792.7e9)     # below: smaller's
    assert te_mxfp8_cast_Bps(LARGE * 8) == pytest.approx(4105.1e9)     # above: larger's
    mid = te_mxfp8_cast_Bps((SMALL * LARGE) ** 0.5)                   # log midpoint
    assert mid == pytest.approx((2792.7e9 + 4105.1e9) / 2)


def test_efficiency_is_relative_to_the_profile_kernel():
    assert PROFILE_MEMORY_Bps == B200_BEST_MEMORY_KERNEL_Bps
    assert cast_efficiency(TE_MXFP8_CAST, SMALL) == pytest.approx(2792.7 / 6462)
    assert cast_efficiency(TE_MXFP8_CAST, LARGE) == pytest.approx(4105.1 / 6462)
    assert cast_efficiency("", SMALL) == 1.0


def test_only_transformer_engines_mxfp8_recipe_names_the_kernel():
    assert RECIPES["mxfp8"].cast_kernel == TE_MXFP8_CAST
    assert TORCHAO_MXFP8.cast_kernel == ""     # torchtitan: torchao's own cast kernels
    assert RECIPES["fp8"].cast_kernel == ""


def test_memory_task_priced_at_the_measured_bandwidth_on_b200():
    b200 = device("b200")
    elements = SMALL
    nbytes = elements * RECIPES["mxfp8"].cast_bytes_per_element

    def cast(eff: float) -> Task:
        return Task(id=0, kind="compute", stream="compute", op="mxfp8_cast",
                    phase="forward", layer=0, microbatch=0, bytes=nbytes,
                    op_class="memory", kernels=1, efficiency=eff)

    launch_s = b200.profile.launch_overhead_s
    slow = device_time_s(cast(cast_efficiency(TE_MXFP8_CAST, elements)), b200, "mxfp8")
    assert slow - launch_s == pytest.approx(nbytes / 2792.7e9, rel=1e-3)
    best = device_time_s(cast(1.0), b200, "mxfp8")
    assert best - launch_s == pytest.approx(nbytes / 6462e9, rel=2e-3)
