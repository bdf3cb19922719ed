"""`validation run`: N processes train the plan for W + K steps; per-step times to Parquet.

Each step (forward + backward over the plan's micro-batches, then AdamW) starts after a
world barrier; every rank times its own step and rank 0 gathers them. The step time is
the maximum over ranks. Launch: torch.multiprocessing (spawn, one process per rank) or,
when the environment already holds RANK/WORLD_SIZE, the current process under torchrun.

Several plans can train in the same processes, their steps taken in turn (A, B, C, A,
...): on a shared host whose speed drifts from minute to minute, that is what makes
their step times comparable with each other. Each plan still gets its own file.
"""
from __future__ import annotations

import gc
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


def spawned(rank: int, target, *args) -> None:
    """mp.spawn entry: run `target(rank, *args)`, then leave without the interpreter's
    teardown. Once a worker has written its outputs (atomically) and destroyed its process
    groups, nothing is left to do; but gloo's threads and c10d's objects, torn down at
    interpreter exit, have been seen to abort a finished process (std::terminate,
    SIGABRT), which spawn reports as a failed run."""
    import sys

    target(rank, *args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


PROBE_SHAPE = (1024, 1536, 512)  # (m, n, k): a representative GEMM; calibrate measures it too
PROBE_EVENT = "validation::host_probe"  # its profiler range, left out of the profile rows
# The copy probe's buffer: 64 MiB, twice this host class's last-level cache (32 MiB L3 on the
# CI host, `lscpu`), so that the copy measures DRAM bandwidth, which a neighbour's
# memory-bound load takes from the steps' elementwise ops and gloo's memcpy while leaving a
# cache-resident matmul nearly untouched.
PROBE_COPY_BYTES = 64 << 20


class HostProbe:
    """This rank's matmul FLOP/s at PROBE_SHAPE and copy bytes/s, sampled before each round
    of timed steps and once after the last (min over ranks is taken later); calibrate
    samples the same probe between its phases.

    `compare` sets the samples against the calibration file's same-shape entry to tell a
    host whose speed drifted since calibration (a shared machine) from a model error. The
    samples between rounds of steps are what the steps themselves ran at; a probe taken
    only before and after the steps misses a neighbour's load that comes and goes.
    """

    def __init__(self, device: torch.device, dtype: torch.dtype) -> None:
        m, n, k = PROBE_SHAPE
        self.device = device
        self.a = torch.randn(m, k, device=device, dtype=dtype)
        self.b = torch.randn(k, n, device=device, dtype=dtype)
        self.src = torch.ones(PROBE_COPY_BYTES // 4, device=device, dtype=torch.float32)
        self.dst = torch.empty_like(self.src)
        self.a @ self.b
        self.dst.copy_(self.src)
        _sync(device)

    def sample_copy(self, reps: int = 3) -> float:
        """Bytes/s (read + written) of `reps` copies of PROBE_COPY_BYTES, after an untimed
        one: the memory-bound half of a step's work, which the matmul probe does not see."""
        with torch.profiler.record_function(PROBE_EVENT):
            self.dst.copy_(self.src)
            _sync(self.device)
            t = time.perf_counter()
            for _ in range(reps):
                self.dst.copy_(self.src)
            _sync(self.device)
            elapsed_s = time.perf_counter() - t
        return 2 * PROBE_COPY_BYTES * reps / elapsed_s

    def sample(self, reps: int = 3) -> float:
        """FLOP/s of one timed batch of `reps` matmuls (~50 ms on a CPU core), after an
        untimed one: calibration times this shape with its operands in cache, and a step
        that just ran has evicted them."""
        m, n, k = PROBE_SHAPE
        with torch.profiler.record_function(PROBE_EVENT):
            self.a @ self.b
            _sync(self.device)
            t = time.perf_counter()
            for _ in range(reps):
                self.a @ self.b
            _sync(self.device)
            elapsed_s = time.perf_counter() - t
        return 2 * m * n * k * reps / elapsed_s


def _profile_rows(prof, rank: int, step_offset_s: float) -> list[dict]:
    """Top-level profiler events (and communication at any depth) as trace rows."""
    rows = []
    for ev in prof.events():
        name = ev.name
        is_comm = any(w in name.lower() for w in COMM_WORDS)
        if (ev.cpu_parent is not None and not is_comm) or name == PROBE_EVENT:
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


class _Trainer:
    """One plan built on this rank: its sharded model, AdamW and fixed batches."""

    def __init__(self, spec: RunSpec, device: torch.device) -> None:
        from .model import Transformer
        from .parallel import apply_data_parallel, apply_tensor_parallel, build_meshes

        plan = spec.plan
        mesh, flat = build_meshes(plan, device.type)
        torch.manual_seed(0)
        with torch.device(device):
            model = Transformer(plan.model, spec.layouts, plan.recompute)
        model.init_weights(seed=0)
        apply_tensor_parallel(model, plan, spec.layouts, mesh)
        self.spec, self.device = spec, device
        self.model = apply_data_parallel(model, plan, spec.layouts, mesh, flat, spec.dtype, device)
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        gen = torch.Generator().manual_seed(1000 + mesh.get_local_rank("dp"))  # same on tp ranks
        micro, seq = plan.training.micro_batch, plan.training.seq_len
        self.batches = [torch.randint(0, plan.model.vocab_size, (micro, seq + 1),
                                      generator=gen).to(device)
                        for _ in range(plan.micro_batches)]
        self.autocast = (torch.autocast("cuda", dtype=torch.bfloat16)
                         if spec.dtype == "bf16" and not plan.fsdp
                         else torch.autocast("cpu", enabled=False))

    def step(self):
        """Forward and backward over every micro-batch, then AdamW; the mean loss."""
        import torch.nn.functional as F

        total = 0.0
        for tokens in self.batches:
            with self.autocast:
                logits = self.model(tokens[:, :-1])
            labels = tokens[:, 1:]
            if self.spec.plan.mesh.tp > 1:
                from torch.distributed.tensor.parallel import loss_parallel
                with loss_parallel():
                    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(0, 1))
                    (loss / len(self.batches)).backward()
            else:
                loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))
                (loss / len(self.batches)).backward()
            total += loss.detach()
        self.optim.step()
        self.optim.zero_grad(set_to_none=True)
        _sync(self.device)
        return total / len(self.batches)


def _timed_steps(trainers: list[_Trainer], steps: int, origin: float,
                 probe: HostProbe) -> tuple[list[list], list[float]]:
    """Per trainer: [starts, ends, losses] of `steps` steps taken round-robin over the
    trainers, so that a shared host's drift falls on every plan alike; and a host probe
    sample before each round."""
    import torch.distributed as dist

    records = [[[], [], []] for _ in trainers]
    samples = []
    for _ in range(steps):
        dist.barrier()
        samples.append((probe.sample(), probe.sample_copy()))
        for trainer, (starts, ends, losses) in zip(trainers, records):
            dist.barrier()
            _sync(trainer.device)
            starts.append(time.perf_counter() - origin)
            losses.append(trainer.step())
            ends.append(time.perf_counter() - origin)
    dist.barrier()
    samples.append((probe.sample(), probe.sample_copy()))   # after the last round
    return records, samples


def worker(rank: int, data: list[dict], steps: int, warmup: int, port: int | None,
           out_paths: list[str], profile: bool, threads: int) -> None:
    """One rank: build every plan, train W + K steps of each (interleaved), gather the
    times on rank 0 and write one file per plan."""
    import torch.distributed as dist

    from .config import from_payload

    specs = [from_payload(d) for d in data]
    world = specs[0].nproc if port is not None else int(os.environ["WORLD_SIZE"])
    device = init_distributed(rank, world, specs[0].backend, port, threads)
    rank = dist.get_rank()
    trainers = [_Trainer(spec, device) for spec in specs]
    probe_dtype = torch.float32 if specs[0].dtype == "fp32" else torch.bfloat16
    dist.barrier()
    probe = HostProbe(device, probe_dtype)
    for trainer in trainers:
        for _ in range(warmup):
            trainer.step()
    prof = None
    if profile:
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU] + (
            [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else []))
        prof.__enter__()
    dist.barrier()
    records, during = _timed_steps(trainers, steps, time.perf_counter(), probe)
    dist.barrier()
    probes = torch.tensor(during, dtype=torch.float64)    # [rounds + 1, (matmul, copy)]
    dist.all_reduce(probes, op=dist.ReduceOp.MIN)
    profile_rows: list[dict] = []
    if prof is not None:
        prof.__exit__(None, None, None)
        # profiler timestamps are in us on its own clock; align its first event to origin
        first = min((ev.time_range.start for ev in prof.events()), default=0) * 1e-6
        profile_rows = _profile_rows(prof, rank, first)
    all_profiles = [None] * world if rank == 0 else None
    if profile:
        dist.gather_object(profile_rows, all_profiles, dst=0)
    rates = probes.tolist()
    # flops_per_s_during: before each round (compare's drift); the steadiness check
    # (validation/steadiness.py) also uses the copy rate and the samples after the last round
    probed = {"shape_mnk": list(PROBE_SHAPE), "copy_bytes": PROBE_COPY_BYTES,
              "flops_per_s_during": [r[0] for r in rates[:-1]],
              "copy_Bps_during": [r[1] for r in rates[:-1]],
              "flops_per_s_after_steps": rates[-1][0], "copy_Bps_after_steps": rates[-1][1]}
    for spec, (starts, ends, losses), out_path in zip(specs, records, out_paths):
        losses = [float(x.full_tensor() if hasattr(x, "full_tensor") else x) for x in losses]
        times = torch.tensor([starts, ends, losses], dtype=torch.float64)
        gathered = [torch.zeros_like(times) for _ in range(world)] if rank == 0 else None
        dist.gather(times, gathered, dst=0)
        if rank == 0:
            _write(spec, steps, warmup, gathered, all_profiles or [], out_path, world, threads,
                   probed, [s.plan.name for s in specs])
    dist.barrier()
    del trainers  # modules, optimizers and their work objects go while the group lives
    gc.collect()
    dist.destroy_process_group()


def _write(spec: RunSpec, steps: int, warmup: int, gathered, profiles, out_path: str,
           world: int, threads: int, probe: dict, interleaved: list[str]) -> None:
    """Rank 0: one row per (step, rank) plus profile rows; run description in metadata
    (`interleaved_with`: the plans whose steps alternated with this one's)."""
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
            "profiled": bool(profiles), "host_probe": probe,
            "interleaved_with": [name for name in interleaved if name != spec.plan.name]}
    write_parquet(rows, out_path, {"validation": json.dumps(meta),
                                   "plan": json.dumps(spec.plan_json)})


def launch(specs: list[RunSpec], steps: int, warmup: int, out_paths: list[str],
           profile: bool, threads: int) -> None:
    """Run every rank: in-process under torchrun, else spawn `nproc` processes. Several
    specs (same backend, nproc and dtype) train in the same processes, step by step in turn."""
    data = [payload(spec) for spec in specs]
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        worker(int(os.environ["RANK"]), data, steps, warmup, None, out_paths, profile, threads)
        return
    import torch.multiprocessing as mp

    port = free_port()
    mp.spawn(spawned, args=(worker, data, steps, warmup, port, out_paths, profile, threads),
             nprocs=specs[0].nproc, join=True)
