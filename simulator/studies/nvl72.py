"""`study nvl72`: Llama 3 70B and 405B on DGX H100 nodes against GB200 NVL72 racks.

The same job on the same number of GPUs (default 576: 72 DGX H100 nodes or 8 NVL72
racks, so that TP 8, 16, 32, 64 and 72 all divide it): FSDP across the data-parallel
ranks, Megatron TP with sequence parallelism inside, 72 sequences of 8192 tokens per step.
On DGX H100, TP above 8 spans nodes over 400 Gb/s InfiniBand; on NVL72, TP up to 72 stays
in one NVLink domain. Llama 3 has 8 KV heads: for TP > 8 they are replicated (Megatron-LM),
which keeps each rank's FLOPs. TP 72 divides neither model's query heads (64, 128): those
rows say so. Points run in parallel through the what-if engine.
"""
from __future__ import annotations

import argparse

from workloads import MODEL_PRESETS
from workloads.frameworks import FRAMEWORKS

from topologies import build as build_topology
from inputs import strict_int

from ..band import prediction_band
from ..errors import UsageError
from ..output import print_json
from ..whatif.engines import run_points
from ..whatif.points import study_points, topology_source
from ..whatif.variations import Variation

NAME = "nvl72"
HELP = "Llama 3 70B/405B on DGX H100 nodes vs GB200 NVL72 racks at TP 8..72"

DEFAULT_MODELS = ("llama3-70b", "llama3-405b")
DEFAULT_TPS = (8, 16, 32, 64, 72)
ASSUMPTIONS = (
    "GB200 per-GPU peaks are NVIDIA's published figures (topologies/specs.py: 2.5 PFLOP/s "
    "BF16 dense, 186 GiB HBM3e at 8 TB/s, NVLink5 1.8 TB/s); the rack is 18 trays of 4 GPUs "
    "with one 400 Gb/s NIC per GPU (typical scale-out, verify per deployment).",
    "Collectives are checked against published nccl-tests (`python -m validation "
    "collectives`, all-reduce of 64 MiB and up on CoreWeave's GB200 NVL72): one rack "
    "14 % (simulated fast), two racks 4 %, twenty racks (1,440 GPUs) 7 %; the network "
    "rate per NVLS head between racks is estimated on the two-rack run (an assumption "
    "that command lists; its cause is not identified).",
    "Step times of GB200 runs are checked against Megatron-Bridge's published GB200 NVL72 "
    "runs; each row prints where comparable published runs landed against the simulator "
    "(the band); `none published` means no run of that GPU, framework and kind was scored.",
    "DGX H100: 8 x H100 SXM (989 TFLOP/s BF16, 80 GiB) per node on NVSwitch, 8 x 400 Gb/s "
    "NDR rail-optimised.",
    "KV heads replicated for TP > 8 (Megatron-LM); compute per rank unchanged.",
    "Memory: analytic (bf16 params/grads, fp32 Adam, FSDP-sharded; Korthikanti activations).",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the study."""
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help="model presets, comma-separated")
    parser.add_argument("--tp", default=",".join(map(str, DEFAULT_TPS)),
                        help="tensor-parallel degrees, comma-separated")
    parser.add_argument("--racks", type=strict_int, default=8,
                        help="NVL72 racks (x72 GPUs); the DGX H100 side has as many GPUs")
    parser.add_argument("--global-batch", type=strict_int, default=72, help="sequences per step")
    parser.add_argument("--seq-len", type=strict_int, default=8192)
    parser.add_argument("--recompute", choices=("none", "selective", "full"), default="none")
    parser.add_argument("--framework", choices=FRAMEWORKS,
                        default="megatron-core",
                        help="framework profile of the plans (its published runs give the band)")
    parser.add_argument("--workers", type=strict_int, default=None, help="worker processes")


def _list(text: str, flag: str, kind=str) -> list:
    try:
        items = [kind(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        items = []
    if not items:
        raise UsageError(flag, text, "a comma-separated list")
    return items


def plan_raw(model: str, tp: int, args: argparse.Namespace) -> dict:
    """The plan of one (model, TP) point, KV heads replicated above 8."""
    spec = MODEL_PRESETS[model].to_dict()
    if spec["num_heads"] % tp == 0:   # else resolve() reports the heads TP must divide
        spec["num_kv_heads"] = max(spec["num_kv_heads"], tp)
    return {"name": f"{model}-tp{tp}", "model": spec, "framework": args.framework,
            "training": {"global_batch": args.global_batch, "micro_batch": 1,
                         "seq_len": args.seq_len},
            "mesh": {"dp": "auto", "tp": tp}, "fsdp": {"enabled": True},
            "sharding": {"sequence_parallel": True}, "recompute": args.recompute}


def rows(args: argparse.Namespace) -> list[dict]:
    """One row per model x cluster x TP."""
    models = _list(args.models, "--models")
    for m in models:
        if m not in MODEL_PRESETS:
            raise UsageError("--models", m, ", ".join(MODEL_PRESETS))
    tps = _list(args.tp, "--tp", int)
    if args.racks < 1 or min(tps) < 1:
        raise UsageError("--racks/--tp", f"{args.racks}/{args.tp}", "integers >= 1")
    topos = [topology_source(f"dgx-h100x{9 * args.racks}"),
             topology_source("nvl72" if args.racks == 1 else f"nvl72x{args.racks}")]
    points = []
    for model in models:
        for tp in tps:
            for p in study_points(plan_raw(model, tp, args), topos, [Variation("tp", (tp,))],
                                  [], {}):
                points.append({**p, "point": len(points), "model_name": model})
    out = run_points(points, "local", args.workers, progress=False)
    devices = {t["ref"]: build_topology(t["ref"]).device(0).name for t in topos}
    for p, r in zip(points, out):
        r["model"] = p["model_name"]
        if r.get("status") == "ok":
            kind = "moe" if MODEL_PRESETS[p["model_name"]].num_experts else "dense"
            r.update(prediction_band(devices[p["topo"]["ref"]], args.framework,
                                     float(r["step_time_s"]), model_kind=kind))
    return out


def plot(table: list[dict], path: str) -> None:
    """Step time (stacked compute / exposed comm / bubble) per model, cluster and TP."""
    from ..whatif.table import plot as bars
    for r in table:
        r.setdefault("cluster", r["topo"])
    bars(table, ["model", "tp"], path, "DGX H100 vs GB200 NVL72")


def _band_text(row: dict) -> str:
    """The band of comparable published runs, or that there is none."""
    band = row.get("step_time_band")
    if not band or not band["n"]:
        return "none published"
    return f"{band['low_pct']:+.0f} % .. {band['high_pct']:+.0f} % (n = {band['n']}, {band['group']})"


def run(args: argparse.Namespace) -> int:
    """Print the assumptions and the table (or JSON), write the plot."""
    table = rows(args)
    keep = ("model", "topo", "tp", "status", "error", "step_time_s", "compute_s",
            "exposed_comm_s", "bubble_s", "peak_memory_bytes", "memory_capacity_bytes",
            "fits_in_memory", "mfu", "tokens_per_s", "world_size", "step_time_band_s",
            "step_time_band")
    table = [{k: r.get(k) for k in keep} for r in table]
    if args.plot:
        plot(table, args.plot)
    if args.json:
        print_json({"assumptions": list(ASSUMPTIONS), "rows": table})
        return 0
    print("Assumptions:")
    for a in ASSUMPTIONS:
        print(f"  - {a}")
    print(f"{'model':<12} {'cluster':<12} {'tp':>3} {'step':>9} {'exp.comm':>9} {'mem GB':>7} "
          f"{'of':>4} {'MFU':>6}  published runs of this kind (measured vs simulated)")
    for r in table:
        head = f"{r['model']:<12} {r['topo']:<12} {r['tp']:>3}"
        if r["status"] != "ok":
            print(f"{head} {r['status']}: {r['error']}")
            continue
        print(f"{head} {r['step_time_s']:>8.2f}s {r['exposed_comm_s']:>8.2f}s "
              f"{r['peak_memory_bytes'] / 1e9:>7.1f} {r['memory_capacity_bytes'] / 1e9:>4.0f} "
              f"{100 * r['mfu']:>5.1f}%  {_band_text(r)}"
              + ("" if r["fits_in_memory"] else "  does not fit"))
    return 0
