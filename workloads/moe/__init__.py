"""Mixture-of-experts layers as events: router, dispatchers, grouped GEMMs, imbalance.

layer.py builds the layer's graph; dispatch.py the dispatchers' collectives and copies;
imbalance.py the hottest EP rank's rows; grouped_gemm.py the grouped-GEMM efficiency; the
plan's `moe` block is workloads/moe_options.py.
"""
from .layer import MOE_LAYER_NODES, build_moe_mlp, moe_param_groups

__all__ = ["MOE_LAYER_NODES", "build_moe_mlp", "moe_param_groups"]
