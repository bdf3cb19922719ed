"""`validation calibrate`: micro-benchmarks of this host, written as a topology file.

N processes run every benchmark at the same time (the validation run shares the host's
cores the same way), each with `threads` intra-op threads:

* matmul throughput against shape (fp32 on CPU, bf16 on GPU): the best median becomes the
  device peak (every dtype slot: the run uses one dtype), gemm_efficiency is the geometric
  mean of the shapes' throughput over that peak; on CPU gemm_tile is 1 (a process has no
  SM waves to quantise);
* memory bandwidth: a large tensor copy (read + write bytes) sets hbm_GBps; eager
  elementwise kernels that allocate their outputs (add, mul, SiLU, RMSNorm) over that
  copy bandwidth set memory_efficiency (memory-bound ops of a training step are those);
* attention: causal SDPA forward + backward, FLOPs counted as the simulator does
  (workloads/attention.py AttentionCost, flash): forward 4 B H S^2 hd / 2, backward 2.5 x
  forward. The profile states attention_efficiency at the kernel-speed curve's reference
  (16k causal keys, workloads/attention.py kernel_speed), as the simulator reads it: the
  rate measured at 512 keys over the curve's speed there, so that a call of 512 keys is
  priced at the measured rate (the curve would otherwise slow it a second time, ~2x).
  Other lengths follow FlashAttention-2's GPU curve: an assumption, no CPU sweep;
* launch overhead: a tiny matmul's wall time;
* overlap: matmul throughput while an all-gather runs in the background, over alone;
* on CPU, the host overhead of a DTensor redistribution beyond its collective and copy
  (GPUs hide it behind their queue), and the ranks' wait for each other at a collective
  (validation/host_overheads.py);
* collectives all_reduce / all_gather / reduce_scatter / all_to_all against size (each
  call allocating its output, as training's do), fitted by
  least squares (relative error) to t = latency + S / algbw; busbw = algbw x nccl-tests
  factor (2(n-1)/n for all_reduce, (n-1)/n otherwise); S is the nccl-tests size (the
  all-reduce buffer, the all-gather output, the reduce-scatter input, the all-to-all buffer).
  The measured points themselves are written too: the simulator interpolates between them
  and uses the fit only outside their range (a CPU host's collectives are not linear in
  size);
* the run's host probe (a matmul and a DRAM copy, validation/runner.py HostProbe) at every
  phase boundary (`calibration.host_probe`): validation/steadiness.py tells from these and
  the run's own samples whether the host's load changed between calibration and the steps.
"""
from __future__ import annotations

import math
import os
import platform
import statistics
import tempfile
import time

import torch

from workloads.attention import AttentionCost

from .collective_bench import COLL_SIZES, QUICK_SIZES, bench_collectives
from .errors import ValidationError
from .host_overheads import collective_skew, redistribute_overhead
from .io import write_json
from .timing import timed

MATMUL_SHAPES = [(1024, 1536, 512), (256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048),
                 (2048, 512, 512), (2048, 1536, 512), (2048, 512, 1536), (4096, 512, 512),
                 (2048, 256, 512), (2048, 512, 128), (2048, 512, 64), (128, 512, 512),
                 (64, 512, 512), (2048, 2048, 512)]


def _bench_matmul(device, dtype, quick: bool, sync, barrier) -> list[dict]:
    """Median throughput per shape; shapes are visited round-robin so that every shape
    sees the same mix of host load (a shared machine's speed drifts over seconds)."""
    min_s, rounds = (0.03, 4) if quick else (0.05, 6)
    cases = []
    for m, n, k in MATMUL_SHAPES:
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        fn = (lambda a=a, b=b: a @ b)
        once = min(timed(fn, 0.0, 2, sync))
        cases.append(((m, n, k), fn, max(1, int(min_s / max(once, 1e-7))), []))
    for _ in range(rounds):
        for _, fn, reps, samples in cases:
            barrier()
            t = time.perf_counter()
            for _ in range(reps):
                fn()
            sync()
            samples.append((time.perf_counter() - t) / reps)
    return [{"m": m, "n": n, "k": k, "flops_per_s": 2 * m * n * k / statistics.median(samples)}
            for (m, n, k), _, _, samples in cases]


def fit_gemm(rows: list[dict], peak: float) -> float:
    """gemm_efficiency: geometric mean over the measured shapes of throughput / peak."""
    logs = [math.log(r["flops_per_s"] / peak) for r in rows]
    return min(1.0, math.exp(sum(logs) / len(logs)))


def _bench_elementwise(device, dtype, sync, barrier) -> float:
    """Bytes/s of eager elementwise kernels that allocate their output, as autograd runs
    them (add, mul, SiLU, RMSNorm forward on a 2048 x 1536 activation): read + written
    bytes over time. On CPU fresh outputs cost page faults, so this sits well below copy."""
    import torch.nn.functional as F

    x = torch.randn(2048, 1536, device=device, dtype=dtype)
    y = torch.randn_like(x)
    w = torch.ones(1536, device=device, dtype=dtype)
    size = x.numel() * x.element_size()
    kernels = [(lambda: x + y, 3 * size), (lambda: x * y, 3 * size),
               (lambda: F.silu(x), 2 * size), (lambda: F.rms_norm(x, (1536,), w), 2 * size)]
    # round-robin over the kernels, median of 7 rounds: measured one after the other with
    # 3 samples each, one slow patch of a shared host once priced every elementwise op 4x
    samples: list[list[float]] = [[] for _ in kernels]
    for _ in range(7):
        for (fn, _), out in zip(kernels, samples):
            barrier()
            out.extend(timed(fn, 0.03, 1, sync))
    total_s = sum(statistics.median(out) for out in samples)
    return sum(b for _, b in kernels) / total_s


def _overlap_factor(device, dtype, world: int, sync) -> float:
    """Matmul throughput while all-gathers run back to back in the background, over alone."""
    import torch.distributed as dist

    a = torch.randn(2048, 512, device=device, dtype=dtype)
    b = torch.randn(512, 1536, device=device, dtype=dtype)
    alone = statistics.median(timed(lambda: a @ b, 0.05, 3, sync))
    numel = (1 << 22) // 4 // world * world
    out = torch.empty(numel, device=device, dtype=dtype)
    inp = torch.ones(numel // world, device=device, dtype=dtype)
    one = statistics.median(timed(lambda: dist.all_gather_into_tensor(out, inp), 0.02, 3, sync,
                                  collective=True))
    count = torch.tensor([max(4, min(40, int(0.25 / one)))])
    dist.all_reduce(count, op=dist.ReduceOp.MAX)  # every rank issues the same collectives
    dist.barrier()
    mm, spent = 0, 0.0
    for _ in range(int(count)):
        work = dist.all_gather_into_tensor(out, inp, async_op=True)
        while not work.is_completed():
            t = time.perf_counter(); a @ b; sync(); spent += time.perf_counter() - t; mm += 1
        work.wait()
    dist.barrier()
    if mm == 0:
        return 1.0
    return min(1.0, alone / (spent / mm))


def _worker(rank: int, world: int, backend: str, port: int, out_path: str, threads: int,
            quick: bool) -> None:
    import torch.distributed as dist
    import torch.nn.functional as F

    from .runner import HostProbe, init_distributed

    device = init_distributed(rank, world, backend, port, threads)
    rank = dist.get_rank()
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    barrier = dist.barrier
    probe, probed = HostProbe(device, dtype), []
    marks = [("start", time.perf_counter())]
    _sample_probe(probe, probed, barrier)
    matmul = _bench_matmul(device, dtype, quick, sync, barrier)
    marks.append(("matmul", time.perf_counter()))
    _sample_probe(probe, probed, barrier)
    # per shape, the slowest rank sets the pace
    rates = torch.tensor([r["flops_per_s"] for r in matmul], dtype=torch.float64)
    dist.all_reduce(rates, op=dist.ReduceOp.MIN)
    for r, v in zip(matmul, rates.tolist()):
        r["flops_per_s"] = v
    src = torch.empty(1 << 24, device=device, dtype=torch.float32)  # 64 MiB
    dst = torch.empty_like(src)
    barrier()
    copy_s = statistics.median(timed(lambda: dst.copy_(src), 0.1, 5, sync))
    eltwise_Bps = _bench_elementwise(device, dtype, sync, barrier)
    mem = torch.tensor([2 * src.numel() * 4 / copy_s, eltwise_Bps], dtype=torch.float64)
    dist.all_reduce(mem, op=dist.ReduceOp.MIN)
    batch, heads, seq, head_dim = 4, 8, 512, 64
    q = torch.randn(batch, heads, seq, head_dim, device=device, dtype=dtype, requires_grad=True)
    k, v = torch.randn_like(q, requires_grad=True), torch.randn_like(q, requires_grad=True)
    def attention() -> None:
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    barrier()
    # median of 5 samples: a slow patch of a shared host may spoil two of them
    attn_s = statistics.median(timed(attention, 0.1, 5, sync))
    attn = AttentionCost(queries=batch * seq, keys=seq, heads=heads, kv_heads=heads,
                         head_dim=head_dim, act_bytes=dtype.itemsize, flash=True)
    attn_flops = attn.flops("forward") + attn.flops("backward")
    attn_speed = attention_curve_speed(attn)
    tiny = torch.randn(8, 8, device=device, dtype=dtype)
    launch_s = statistics.median(timed(lambda: tiny @ tiny, 0.02, 5, sync))
    marks.append(("copy_attention_launch", time.perf_counter()))
    _sample_probe(probe, probed, barrier)
    overlap = _overlap_factor(device, dtype, world, sync) if world > 1 else 1.0
    marks.append(("overlap", time.perf_counter()))
    _sample_probe(probe, probed, barrier)
    coll = bench_collectives(world, device, dtype, QUICK_SIZES if quick else COLL_SIZES,
                              sync) if world > 1 else {}
    marks.append(("collectives", time.perf_counter()))
    _sample_probe(probe, probed, barrier)
    on_cpu = world > 1 and device.type == "cpu"
    redistribute_s = redistribute_overhead(world, device, dtype, sync, float(mem[1])) \
        if on_cpu else 0.0
    skew_s = collective_skew(device, dtype, sync) if on_cpu else 0.0
    marks.append(("host_overheads", time.perf_counter()))
    _sample_probe(probe, probed, barrier)
    rates_min = torch.tensor(probed, dtype=torch.float64)   # [marks, (matmul, copy)]
    dist.all_reduce(rates_min, op=dist.ReduceOp.MIN)
    scalars = torch.tensor([attn_flops / attn_s, launch_s, overlap, redistribute_s, skew_s],
                           dtype=torch.float64)
    dist.all_reduce(scalars, op=dist.ReduceOp.SUM)
    scalars /= world
    if rank == 0:
        topo = host_topology(backend, world, threads, matmul, float(mem[0]), float(scalars[0]),
                             float(scalars[1]), float(scalars[2]), coll, str(dtype).split(".")[-1],
                             attn_speed=attn_speed,
                             eltwise_Bps=float(mem[1]), redistribute_s=float(scalars[3]),
                             skew_s=float(scalars[4]))
        topo["calibration"]["section_s"] = {name: round(t - prev, 3) for (_, prev), (name, t)
                                            in zip(marks, marks[1:])}
        topo["calibration"]["host_probe"] = _probe_record(rates_min)
        write_json(topo, out_path)
    dist.barrier()
    dist.destroy_process_group()


def attention_curve_speed(attn: AttentionCost) -> float:
    """The kernel-speed curve's speed at the calibration's attention call (forward and
    backward, weighted by their time at the reference speed) relative to its reference."""
    phases = ("forward", "backward")
    at_reference = sum(attn.flops(phase) / attn.speed(phase) for phase in phases)
    return sum(attn.flops(phase) for phase in phases) / at_reference


def _sample_probe(probe, probed: list, barrier) -> None:
    """The run's host probe (validation/runner.py HostProbe) at a phase boundary: the
    steadiness check (validation/steadiness.py) sets these against the run's samples."""
    barrier()
    probed.append((probe.sample(), probe.sample_copy()))


def _probe_record(rates: torch.Tensor) -> dict:
    """The calibration file's `host_probe`: matmul and copy rates at each phase boundary
    (the slowest rank's)."""
    from .runner import PROBE_COPY_BYTES, PROBE_SHAPE

    return {"shape_mnk": list(PROBE_SHAPE), "copy_bytes": PROBE_COPY_BYTES,
            "flops_per_s": [r[0] for r in rates.tolist()],
            "copy_Bps": [r[1] for r in rates.tolist()]}


def _profile(gemm_eff: float, attn_eff: float, launch_s: float, overlap: float,
             mem_eff: float = 1.0, cpu: bool = False, redistribute_s: float = 0.0,
             skew_s: float = 0.0) -> dict:
    """DeviceProfile fields (only those this version of topologies knows)."""
    from topologies import DeviceProfile

    # gemm_reference_k 0: the measured efficiency is the mean over this host's own shapes,
    # not re-priced by a per-tile K-loop cost (topologies/gemm_k_loop.py)
    values = {"gemm_efficiency": round(gemm_eff, 4), "gemm_tile": 1, "gemm_reference_k": 0.0,
              # no streams on a CPU: the training thread waits for every collective
              "concurrent_collectives": not cpu,
              "attention_efficiency": round(min(1.0, attn_eff), 4),
              "memory_efficiency": round(min(1.0, mem_eff), 4),
              "launch_overhead_s": launch_s, "redistribute_overhead_s": redistribute_s,
              "collective_skew_s": skew_s,
              "overlap_compute_factor": round(overlap, 4),
              "overlap_compute_factor_nvls": round(overlap, 4),
              # the measured rates are the ones this host sustains
              "sustained_tensor_ratio": 1.0}
    known = set(DeviceProfile.__dataclass_fields__)
    return {k: v for k, v in values.items() if k in known}


def host_topology(backend: str, world: int, threads: int, matmul: list[dict], mem_Bps: float,
                  attn_flops_per_s: float, launch_s: float, overlap: float, coll: dict,
                  dtype: str, eltwise_Bps: float | None = None,
                  redistribute_s: float = 0.0, skew_s: float = 0.0,
                  attn_speed: float = 1.0) -> dict:
    """The topology JSON (topologies/presets_file.py load_file format) for measured numbers;
    `attn_speed` is the kernel-speed curve's at the measured attention call
    (attention_curve_speed), which the profile's efficiency is divided by."""
    peak = max(r["flops_per_s"] for r in matmul)
    eff = fit_gemm(matmul, peak)
    gb = 1e9
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    link = coll.get("all_gather", {}).get("busbw_Bps", mem_Bps)
    measured = {op: {str(world): {"latency_us": round(c["latency_s"] * 1e6, 3),
                                  "busbw_GBps": round(c["busbw_Bps"] / gb, 6),
                                  "points": [[p["bytes"], round(p["time_s"] * 1e6, 3)]
                                             for p in c["points"]]}}
                for op, c in coll.items()}
    cpu = platform.processor() or platform.machine()
    return {
        "name": f"localhost-{backend}-{world}",
        "description": f"{world} {backend} processes x {threads} thread(s) on {platform.node()} "
                       f"({cpu}); calibrated {time.strftime('%Y-%m-%d %H:%M:%S')} with {dtype} "
                       "matmuls (the measured peak sits in bf16_tflops)",
        "gpu": {"name": f"host-{dtype}", "bf16_tflops": peak / 1e12, "fp8_tflops": peak / 1e12,
                "fp32_tflops": peak / 1e12, "hbm_gb": ram / world / gb,
                "hbm_GBps": mem_Bps / gb, "nvlink_GBps": link / gb, "nvlink_nccl_GBps": link / gb,
                "nvlink_links": 1, "nvls": False,
                "profile": _profile(eff, attn_flops_per_s / peak / attn_speed, launch_s, overlap,
                                    (eltwise_Bps or mem_Bps) / mem_Bps, backend == "gloo",
                                    redistribute_s, skew_s)},
        "domains": 1,
        "gpus_per_domain": world,
        "measured_collectives": measured,
        "calibration": {"backend": backend, "nproc": world, "threads_per_process": threads,
                        "dtype": dtype, "torch_version": torch.__version__,
                        "matmul": matmul, "copy_GBps": mem_Bps / gb,
                        "elementwise_GBps": (eltwise_Bps or mem_Bps) / gb,
                        "attention_flops_per_s": attn_flops_per_s,
                        "attention_curve_speed": attn_speed,
                        "collectives": {op: {k: v for k, v in c.items()}
                                        for op, c in coll.items()}},
    }


def run_calibration(backend: str, nproc: int, out_path: str, threads: int = 1,
                    quick: bool = False) -> str:
    """Spawn `nproc` benchmark processes; rank 0 writes the topology; returns a summary."""
    import json

    import torch.multiprocessing as mp

    from .runner import free_port, spawned

    if backend not in ("gloo", "nccl"):
        raise ValidationError("--backend", backend, "gloo, nccl")
    if nproc < 1:
        raise ValidationError("--nproc", nproc, "an integer >= 1")
    start = time.perf_counter()
    # Rank 0 writes into a private folder; this process reads it back and writes -o (a
    # regular file atomically, /dev/null or a pipe in place), so that a write failure is
    # this process's one-line error, not a spawned worker's traceback.
    with tempfile.TemporaryDirectory() as tmp:
        staged = os.path.join(tmp, "topology.json")
        mp.spawn(spawned, args=(_worker, nproc, backend, free_port(), staged, threads, quick),
                 nprocs=nproc, join=True)
        with open(staged) as fh:
            topo = json.load(fh)
    write_json(topo, out_path)
    g = topo["gpu"]
    lines = [f"wrote {out_path} in {time.perf_counter() - start:.1f} s: peak "
             f"{g['bf16_tflops'] * 1e3:.1f} GFLOP/s per process, copy {g['hbm_GBps']:.1f} GB/s, "
             f"profile {g['profile']}"]
    for op, by in topo["measured_collectives"].items():
        for n, v in by.items():
            lines.append(f"  {op} x{n}: latency {v['latency_us']:.1f} us, busbw "
                         f"{v['busbw_GBps']:.2f} GB/s")
    return "\n".join(lines)
