"""`topo NAME`: describe a topology (GPUs, domains, devices, link classes)."""
from __future__ import annotations

import argparse

import topologies

from .common import add_limits, print_json


def register(sub) -> None:
    """Add the `topo` subcommand."""
    p = sub.add_parser("topo", help="describe a topology preset or file")
    p.add_argument("name", help="preset (dgx-h100x4, nvl72, ...) or topology JSON file")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_limits(p, tasks=False)
    p.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    """Print the description."""
    topo = topologies.build(args.name, args.max_gpus)
    d = topo.describe()
    dev = topo.device(0)
    d["device"] = {"name": dev.name, "bf16_tflops": dev.peak("bf16") / 1e12,
                   "fp8_tflops": dev.peak_flops["fp8"] / 1e12 if "fp8" in dev.peak_flops else None, "hbm_gb": dev.hbm_bytes / 1e9,
                   "hbm_GBps": dev.hbm_Bps / 1e9, "nvlink_GBps": dev.nvlink_Bps / 1e9,
                   "sm_count": dev.sm_count}
    if args.json:
        print_json(d)
        return 0
    print(f"{d['name']}: {d['description']}")
    print(f"  {d['gpus']} GPUs in {d['domains']} NVLink domain(s) of {d['gpus_per_domain']}; "
          f"NVLS {'yes' if d['nvls'] else 'no'}")
    dv = d["device"]
    print(f"  device {dv['name']}: {dv['bf16_tflops']:.0f} TFLOP/s bf16, "
          f"{'no' if dv['fp8_tflops'] is None else format(dv['fp8_tflops'], '.0f')} fp8, "
          f"{dv['hbm_gb']:.0f} GB HBM at {dv['hbm_GBps']:.0f} GB/s, NVLink {dv['nvlink_GBps']:.0f} GB/s "
          f"per direction, {dv['sm_count']} SMs")
    print(f"  {'links':<8} {'count':>7} {'GB/s raw':>12} {'GB/s NCCL':>12}")
    for kind, info in d["links"].items():
        raw = "/".join(f"{x:g}" for x in info["bandwidth_GBps"])
        nccl = "/".join(f"{x:g}" for x in info["nccl_bandwidth_GBps"])
        print(f"  {kind:<8} {info['links']:>7} {raw:>12} {nccl:>12}")
    return 0
