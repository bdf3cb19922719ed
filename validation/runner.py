"""`validation run`: N processes train the plan for W + K steps; per-step times to Parquet.

Each step (forward + backward over the plan's micro-batches, then AdamW) starts after a
world barrier; every rank times its own step and rank 0 gathers them. The step time is
the maximum over ranks. Launch: torch.multiprocessing (spawn, one process per rank) or,
when the environment already holds RANK/WORLD_SIZE, the current process under torchrun.
"""
from __future__ import annotations

import json
import os
import platform
import socket
import time
from typing import Any

import torch

from .config import RunSpec, payload
from .io import write_parquet

COMM_WORDS = ("gloo", "nccl", "c10d", "all_gather", "allgather", "reduce_scatter",
              "reducescatter", "all_reduce", "allreduce", "all_to_all", "alltoall", "barrier",
              "broadcast", "wait_tensor")


def free_port() -> int:
    """An unused TCP port on localhost for the rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(rank: int, world: int, backend: str, port: int | None,
                     threads: int) -> torch.device:
    """Process group + device; `port` None means torchrun's env:// rendezvous."""
    import torch.distributed as dist

    torch.set_num_threads(threads)
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    if port is None:
        dist.init_process_group(backend, device_id=device if backend == "nccl" else None)
    else:
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world)
    return device


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


PROBE_SHAPE = (1024, 1536, 512)  # (m, n, k): a representative GEMM; calibrate measures it too


def host_probe(device: torch.device, dtype: torch.dtype) -> float:
    """This rank's matmul FLOP/s at PROBE_SHAPE over ~0.2 s (min over ranks is taken later).

    Recorded before and after the timed steps so that `compare` can tell a host whose
    speed drifted since calibration (a shared machine) from a model error.
    """
    m, n, k = PROBE_SHAPE
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    a @ b
    _sync(device)
    samples = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(3):
            a @ b
        _sync(device)
        samples.append((time.perf_counter() - t) / 3)
    samples.sort()
    return 2 * m * n * k / samples[len(samples) // 2]


def _profile_rows(prof, rank: int, step_offset_s: float) -> list[dict]:
    """Top-level profiler events (and communication at any depth) as trace rows."""
    rows = []
    for ev in prof.events():
        name = ev.name
        is_comm = any(w in name.lower() for w in COMM_WORDS)
        if ev.cpu_parent is not None and not is_comm:
            continue
        start = ev.time_range.start * 1e-6 - step_offset_s
        rows.append({"rank": rank, "stream": f"thread{ev.thread}", "phase": "profile",
                     "layer": -1, "microbatch": -1, "op": name,
                     "kind": "comm" if is_comm else "compute", "start_s": start,
                     "end_s": start + ev.time_range.elapsed_us() * 1e-6,
                     "flops": float(ev.flops or 0), "bytes": 0.0, "group": "", "algorithm": "",
                     "step": -1, "step_time_s": float("nan"), "rank_step_time_s": float("nan"),
                     "parent": "" if ev.cpu_parent is None else ev.cpu_parent.name})
    return rows


def worker(rank: int, data: dict, steps: int, warmup: int, port: int | None,
           out_path: str, profile: bool, threads: int) -> None:
    """One rank: build, shard, train W + K steps, gather the times on rank 0 and write."""
    import torch.distributed as dist
    import torch.nn.functional as F

    from .config import from_payload
    from .model import Transformer
    from .parallel import apply_data_parallel, apply_tensor_parallel, build_meshes

    spec = from_payload(data)
    world = spec.nproc if port is not None else int(os.environ["WORLD_SIZE"])
    device = init_distributed(rank, world, spec.backend, port, threads)
    rank = dist.get_rank()
    plan = spec.plan
    mesh, flat = build_meshes(plan, device.type)
    torch.manual_seed(0)
    with torch.device(device):
        model = Transformer(plan.model, spec.layouts, plan.recompute)
    model.init_weights(seed=0)
    apply_tensor_parallel(model, plan, spec.layouts, mesh)
    model = apply_data_parallel(model, plan, spec.layouts, mesh, flat, spec.dtype, device)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tp = plan.mesh.tp
    dp_rank = mesh.get_local_rank("dp")
    gen = torch.Generator().manual_seed(1000 + dp_rank)  # same data on every tp rank
    micro, seq, vocab = plan.training.micro_batch, plan.training.seq_len, plan.model.vocab_size
    batches = [torch.randint(0, vocab, (micro, seq + 1), generator=gen).to(device)
               for _ in range(plan.micro_batches)]
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16)
                if spec.dtype == "bf16" and not plan.fsdp else torch.autocast("cpu", enabled=False))

    def step() -> float:
        total = 0.0
        for tokens in batches:
            with autocast:
                logits = model(tokens[:, :-1])
            labels = tokens[:, 1:]
            if tp > 1:
                from torch.distributed.tensor.parallel import loss_parallel
                with loss_parallel():
                    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(0, 1))
                    (loss / len(batches)).backward()
            else:
                loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))
                (loss / len(batches)).backward()
            total += loss.detach()
        optim.step()
        optim.zero_grad(set_to_none=True)
        _sync(device)
        return total / len(batches)

    probe_dtype = torch.float32 if spec.dtype == "fp32" else torch.bfloat16
    dist.barrier()
    probe_before = host_probe(device, probe_dtype)
    for _ in range(warmup):
        step()
    prof = None
    if profile:
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU] + (
            [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else []))
        prof.__enter__()
    dist.barrier()
    origin = time.perf_counter()
    starts, ends, losses = [], [], []
    for _ in range(steps):
        dist.barrier()
        _sync(device)
        starts.append(time.perf_counter() - origin)
        losses.append(step())
        ends.append(time.perf_counter() - origin)
    dist.barrier()
    probe_after = host_probe(device, probe_dtype)
    probes = torch.tensor([probe_before, probe_after], dtype=torch.float64)
    dist.all_reduce(probes, op=dist.ReduceOp.MIN)
    profile_rows: list[dict] = []
    if prof is not None:
        prof.__exit__(None, None, None)
        # profiler timestamps are in us on its own clock; align its first event to origin
        first = min((ev.time_range.start for ev in prof.events()), default=0) * 1e-6
        profile_rows = _profile_rows(prof, rank, first)
    losses = [float(x.full_tensor() if hasattr(x, "full_tensor") else x) for x in losses]
    times = torch.tensor([starts, ends, losses], dtype=torch.float64)
    gathered = [torch.zeros_like(times) for _ in range(world)] if rank == 0 else None
    dist.gather(times, gathered, dst=0)
    all_profiles = [None] * world if rank == 0 else None
    if profile:
        dist.gather_object(profile_rows, all_profiles, dst=0)
    if rank == 0:
        probe = {"shape_mnk": list(PROBE_SHAPE), "flops_per_s_before": float(probes[0]),
                 "flops_per_s_after": float(probes[1])}
        _write(spec, steps, warmup, gathered, all_profiles or [], out_path, world, threads, probe)
    dist.barrier()
    dist.destroy_process_group()


def _write(spec: RunSpec, steps: int, warmup: int, gathered, profiles, out_path: str,
           world: int, threads: int, probe: dict) -> None:
    """Rank 0: one row per (step, rank) plus profile rows; run description in metadata."""
    per_rank = torch.stack(gathered)  # [world, 3 (start, end, loss), steps]
    durations = per_rank[:, 1, :] - per_rank[:, 0, :]
    step_max = durations.max(dim=0).values
    rows: list[dict[str, Any]] = []
    for s in range(steps):
        for r in range(world):
            rows.append({"step": s, "rank": r, "stream": "step", "phase": "step", "layer": -1,
                         "microbatch": -1, "op": "train_step", "kind": "step",
                         "start_s": float(per_rank[r, 0, s]), "end_s": float(per_rank[r, 1, s]),
                         "flops": 0.0, "bytes": 0.0, "group": "world", "algorithm": "",
                         "step_time_s": float(step_max[s]),
                         "rank_step_time_s": float(durations[r, s]), "parent": "",
                         "loss": float(per_rank[r, 2, s])})
    for part in profiles:
        rows.extend(part or [])
    meta = {"plan": spec.plan_json, "plan_name": spec.plan.name, "dims": spec.dims,
            "backend": spec.backend, "nproc": world, "dtype": spec.dtype, "steps": steps,
            "warmup": warmup, "threads_per_process": threads,
            "mesh": {"dp": spec.plan.mesh.dp, "tp": spec.plan.mesh.tp},
            "layouts": [list(l) for l in spec.layouts], "torch_version": torch.__version__,
            "host": platform.node(), "created_unix_s": time.time(),
            "profiled": bool(profiles), "host_probe": probe}
    write_parquet(rows, out_path, {"validation": json.dumps(meta),
                                   "plan": json.dumps(spec.plan_json)})


def launch(spec: RunSpec, steps: int, warmup: int, out_path: str, profile: bool,
           threads: int) -> None:
    """Run every rank: in-process under torchrun, else spawn `nproc` processes."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        worker(int(os.environ["RANK"]), payload(spec), steps, warmup, None, out_path, profile, threads)
        return
    import torch.multiprocessing as mp

    port = free_port()
    mp.spawn(worker, args=(payload(spec), steps, warmup, port, out_path, profile, threads),
             nprocs=spec.nproc, join=True)
