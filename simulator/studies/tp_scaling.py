"""`study tp-scaling`: the tensor-parallel scaling analysis ("Splitting Every Layer", a
workshop on Megatron-LM tensor parallelism, Shoeybi et al. 2019): one Llama 3 layer's
compute against its four tensor-parallel all-reduces as t grows, over NVLink and over a
400 Gb/s network. Its published figures: 134.2 MB per all-reduce for Llama 3 70B on 8192
tokens; the four all-reduces take 20 % of the layer's compute at t = 8 over NVLink, 161 %
over the network, 330 % at t = 64 over NVLink.

Two models side by side (rows "model": "analysis" and "model": "simulator"):

* analysis: the analysis's own arithmetic. Compute 6 x (parameters per layer) x tokens / t at
  45 % of H100 BF16 peak (989 TFLOP/s); four ring all-reduces of 2 x tokens x d bytes
  (BF16 activations) among t devices, each taking
  2(t-1) x step latency + 2(t-1)/t x S / link bandwidth, at 450 GB/s (NVLink) or
  50 GB/s (400 Gb/s); model states 16 bytes/param / t. The step latency, 5 us, is what
  the published figures imply (20 %, 161 %, 330 %); NCCL's tuning.cc Simple ring would give
  3.4 us per NVLink step and 14 us per network step plus an 8.4 us base.
* simulator: the same layer lowered by workloads (Megatron col/row, no sequence
  parallelism: two all-reduces forward, two backward) and replayed by the engine with the
  NCCL collective model: on an H100 NVSwitch domain of t GPUs (t <= 8; a DGX H100), on a
  GB200 NVL72 rack's NVLink domain (8 < t <= 72; `--big-domain h100` keeps H100s), and
  over the network on t DGX H100 nodes with one TP rank each (TP spanning nodes). Compute
  and all-reduce times are rank 0's layer-0 rows of the trace. Llama 3 has 8 KV heads: for
  t > 8 the KV heads are replicated (as Megatron-LM does), which keeps each rank's FLOPs.
"""
from __future__ import annotations

import argparse
from dataclasses import replace

import topologies
from inputs import InputError, ascii_int, strict_int
from topologies import ClusterSpec
from topologies.builders import NDR_400G
from workloads import MODEL_PRESETS, ModelSpec
from workloads.memory import peak_memory
from workloads.plan import Mesh, Plan, Training, resolve

from ..api import simulate
from ..errors import UsageError
from ..output import print_json

NAME = "tp-scaling"
HELP = ("the tensor-parallel scaling analysis: one Llama 3 layer's compute vs its TP "
        "all-reduces, NVLink vs network")

TOKENS = 8192
H100_BF16_PEAK_FLOPS = 989e12        # NVIDIA H100 SXM datasheet, dense BF16
ANALYSIS_EFFICIENCY = 0.45               # the analysis: "at 45% of H100 peak"
ANALYSIS_LINK_BPS = {"nvlink": 450e9, "network": 50e9}   # the analysis: 450 GB/s, 400 Gb/s
ANALYSIS_STEP_LATENCY_S = 5e-6           # per ring step; implied by its published figures
ALLREDUCES_PER_LAYER = 4             # two forward, two backward (Megatron-LM)
STATE_BYTES_PER_PARAM = 16           # bf16 params + grads, fp32 master + Adam moments
DEFAULT_TS = (1, 2, 4, 8, 16, 32, 64)
LINKS = ("nvlink", "network")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the study."""
    parser.add_argument("--model", default="llama3-70b", choices=sorted(MODEL_PRESETS),
                        help="model preset (default llama3-70b, the analysis's)")
    parser.add_argument("--tokens", type=strict_int, default=TOKENS, help="tokens (one sequence)")
    parser.add_argument("--tp", default=",".join(map(str, DEFAULT_TS)),
                        help="tensor-parallel degrees, comma-separated")
    parser.add_argument("--big-domain", choices=("nvl72", "h100"), default="nvl72",
                        help="NVLink domain for t > 8 in the simulator rows: a GB200 NVL72 "
                             "rack, or a hypothetical H100 NVSwitch domain of t GPUs")
    parser.add_argument("--analysis-only", action="store_true",
                        help="only the analysis's own arithmetic")


# ------------------------------------------------------------ the analysis's own model
def analysis_row(model: ModelSpec, t: int, link: str, tokens: int = TOKENS) -> dict:
    """One row of the analysis's arithmetic ("model": "analysis")."""
    size = 2 * tokens * model.hidden_size                  # BF16 activations, bytes
    compute = 6 * model.layer_params() * tokens / t / (ANALYSIS_EFFICIENCY * H100_BF16_PEAK_FLOPS)
    steps = 2 * (t - 1)
    one = steps * ANALYSIS_STEP_LATENCY_S + (steps / t) * size / ANALYSIS_LINK_BPS[link] if t > 1 else 0.0
    comm = ALLREDUCES_PER_LAYER * one
    return {"t": t, "link": link, "model": "analysis", "allreduce_bytes": size,
            "compute_s": compute, "comm_s": comm, "comm_over_compute": comm / compute,
            "state_bytes_per_device": STATE_BYTES_PER_PARAM * model.total_params() / t,
            "topology": f"analysis {link} {ANALYSIS_LINK_BPS[link] / 1e9:g} GB/s", "gpu": "h100"}


# ------------------------------------------------------------------- the simulator's model
def layer_plan(model: ModelSpec, t: int, tokens: int, layers: int = 1) -> Plan:
    """One sequence through `layers` layers of the model, TP t, no DP/PP/SP."""
    kv = model.num_kv_heads
    if t > kv and model.num_heads % t == 0:   # Megatron KV replication; else resolve() says
        kv = t                                # which heads t must divide
    m = replace(model, name=f"{model.name}[{layers} layer]" if layers == 1 else model.name,
                num_layers=layers, num_kv_heads=kv)
    return Plan(name=f"tp{t}", model=m, training=Training(1, 1, tokens),
                mesh=Mesh(pp=1, dp=1, cp=1, tp=t))


def cluster(t: int, link: str, big_domain: str) -> ClusterSpec:
    """The cluster a simulator row runs on (exactly t GPUs)."""
    if link == "network":   # t DGX H100 nodes, one TP rank (and one NIC) per node
        base = topologies.cluster_spec("dgx-h100")
        return replace(base, name=f"{t} x dgx-h100, 1 GPU each", num_domains=t, domain_size=1,
                       fabric=replace(NDR_400G, nics_per_domain=1))
    if t <= 8:
        return replace(topologies.cluster_spec("dgx-h100"), name=f"dgx-h100 ({t} GPUs)",
                       domain_size=t)
    if big_domain == "h100":
        return replace(topologies.cluster_spec("dgx-h100"), name=f"h100 NVSwitch x{t} "
                       "(hypothetical)", domain_size=t, fabric=None)
    if t > 72:
        raise UsageError("--tp", t, "at most 72 on an NVL72 rack (or --big-domain h100)")
    return replace(topologies.cluster_spec("nvl72"), name=f"nvl72 ({t} GPUs)",
                   domain_size=t, fabric=None)


def simulator_row(model: ModelSpec, t: int, link: str, tokens: int = TOKENS,
                  big_domain: str = "nvl72") -> dict:
    """One row of the simulator's model: layer 0 of a simulated step, rank 0."""
    spec = cluster(t, link, big_domain)
    result = simulate(layer_plan(model, t, tokens), spec.build())
    cols = result.trace.to_pydict()
    compute = comm = 0.0
    size, algorithms = 0.0, set()
    for i, rank in enumerate(cols["rank"]):
        if rank != 0 or cols["layer"][i] != 0:
            continue
        dur = cols["end_s"][i] - cols["start_s"][i]
        if cols["kind"][i] == "compute":
            compute += dur
        elif cols["stream"][i] == "tp":
            comm += dur
            size = max(size, cols["bytes"][i])
            algorithms.add(cols["algorithm"][i])
    full = resolve(layer_plan(model, t, tokens, model.num_layers), t)
    mem = peak_memory(full)
    return {"t": t, "link": link, "model": "simulator", "allreduce_bytes": size or
            2 * tokens * model.hidden_size, "compute_s": compute, "comm_s": comm,
            "comm_over_compute": comm / compute,
            "state_bytes_per_device": mem.params_bytes + mem.grads_bytes + mem.optimizer_bytes,
            "topology": spec.name, "gpu": spec.gpu.name,
            "algorithm": ",".join(sorted(algorithms))}


def rows(model_name: str = "llama3-70b", ts=DEFAULT_TS, tokens: int = TOKENS,
         simulator: bool = True, big_domain: str = "nvl72") -> list[dict]:
    """Every row: t x link x model, the analysis's arithmetic first."""
    model = MODEL_PRESETS[model_name]
    out = [analysis_row(model, t, link, tokens) for link in LINKS for t in ts]
    if simulator:
        for link in LINKS:
            for t in ts:
                try:
                    out.append(simulator_row(model, t, link, tokens, big_domain))
                except InputError as exc:   # the plan or the flag: an error row
                    out.append({"t": t, "link": link, "model": "simulator", "error": str(exc)})
    return out


def _parse_ts(text: str) -> list[int]:
    ts = [ascii_int(x.strip()) for x in text.split(",") if x.strip()]
    if not ts or None in ts or min(ts) < 1:
        raise UsageError("--tp", text, "comma-separated integers >= 1")
    return ts


def plot(table: list[dict], model: ModelSpec, path: str) -> None:
    """Left: comm / compute vs t per link and model; right: model states per device."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..output import save_figure

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for link, color in (("nvlink", "#4c72b0"), ("network", "#dd8452")):
        for kind, style in (("analysis", "-o"), ("simulator", "--s")):
            pts = [(r["t"], 100 * r["comm_over_compute"]) for r in table
                   if r["link"] == link and r["model"] == kind and r["t"] > 1 and "error" not in r]
            if pts:
                left.plot(*zip(*pts), style, color=color, label=f"{link}, {kind}")
    left.axhline(100, color="#999999", lw=0.8)
    left.set_xscale("log", base=2)
    left.set_yscale("log")
    left.set_xlabel("tensor-parallel degree t")
    left.set_ylabel("4 all-reduces / layer compute (%)")
    left.set_title(f"one {model.name} layer, {TOKENS} tokens")
    left.legend(fontsize=8)
    states = [(r["t"], r["state_bytes_per_device"] / 1e9) for r in table
              if r["model"] == "analysis" and r["link"] == "nvlink"]
    right.plot(*zip(*states), "-o", color="#55a868", label=f"{model.name} states")
    right.axhline(80, color="#c44e52", lw=0.8, label="H100 HBM (80 GB)")
    right.set_xscale("log", base=2)
    right.set_yscale("log")
    right.set_xlabel("tensor-parallel degree t")
    right.set_ylabel("model states per device (GB)")
    right.set_title("16 bytes / parameter / t")
    right.legend(fontsize=8)
    save_figure(fig, path)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    """Print the table (or JSON) and write the plot."""
    if args.tokens < 1:
        raise UsageError("--tokens", args.tokens, "an integer >= 1")
    ts = _parse_ts(args.tp)
    table = rows(args.model, ts, args.tokens, not args.analysis_only, args.big_domain)
    if args.plot:
        plot(table, MODEL_PRESETS[args.model], args.plot)
    if args.json:
        print_json(table)
        return 0
    print(f"# {args.model}: one layer, {args.tokens} tokens; all-reduce "
          f"{table[0]['allreduce_bytes'] / 1e6:.1f} MB (2 x tokens x d, BF16)")
    print(f"{'t':>3} {'link':<8} {'model':<10} {'compute':>10} {'4 x AR':>10} {'AR/comp':>8} "
          f"{'states/dev':>11}  topology")
    for r in table:
        if "error" in r:
            print(f"{r['t']:>3} {r['link']:<8} {r['model']:<10} {r['error']}")
            continue
        print(f"{r['t']:>3} {r['link']:<8} {r['model']:<10} {1e3 * r['compute_s']:>8.3f}ms "
              f"{1e3 * r['comm_s']:>8.3f}ms {100 * r['comm_over_compute']:>7.1f}% "
              f"{r['state_bytes_per_device'] / 1e9:>9.1f}GB  {r['topology']}")
    return 0
