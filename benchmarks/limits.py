"""`python -m benchmarks.limits`: how long the refusals of oversized requests take.

Each case asks for more than a documented limit (README, "Limits": `--max-gpus`,
`--max-tasks`, the model and JSON bounds) and must end with exit 2 and one line, before
anything large is built. Each runs in a fresh process under a 1 GiB address-space limit
(RLIMIT_AS) with a timeout; the table gives its wall time, peak RSS and exit status.
tests/test_bounded_work.py runs the same cases and holds them to the contract.

The address-space limit needs two settings to leave a normal run its room:
ARROW_DEFAULT_MEMORY_POOL=system (Arrow's default jemalloc pool reserves about 1 GB of
address space up front that it never touches) and OPENBLAS_NUM_THREADS=1 (each BLAS
thread reserves its own stack and buffers). So set, a normal `run --plan fsdp.json`
peaks at about 0.4 GB of address space (VmPeak, measured).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT_BYTES = 1 << 30
TIMEOUT_S = 60
CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
from simulator.cli import main
sys.exit(main(sys.argv[1:]))
"""

# (name, arguments, the field the one-line error names; None: a sweep that reports each
# oversized point as invalid and exits 0). {name} are files written by make_files.
CASES = [
    ("global_batch 2e9", ["run", "--plan", "{batch2e9}", "--topo", "dgx-h100"],
     "training.global_batch"),
    ("global_batch 1e30", ["run", "--plan", "{batch1e30}", "--topo", "dgx-h100"],
     "training.global_batch"),
    ("model of 1e9 layers", ["run", "--plan", "{layers}", "--topo", "dgx-h100"],
     "model.num_hidden_layers"),
    ("run on nvl72x14564", ["run", "--plan", "fsdp.json", "--topo", "nvl72x14564"], "topology"),
    ("run on dgx-h100x100000", ["run", "--plan", "fsdp.json", "--topo", "dgx-h100x100000"],
     "topology"),
    ("collective on dgx-h100x100000", ["collective", "--topo", "dgx-h100x100000", "--op",
                                       "all_reduce", "--group", "8"], "topology"),
    ("topo nvl72x14564", ["topo", "nvl72x14564"], "topology"),
    ("file: 5M GPUs in one domain", ["run", "--plan", "fsdp.json", "--topo", "{wide}"],
     "topology"),
    ("file: 4,000 domains of 3M GPUs", ["topo", "{many}"], "topology"),
    ("plan nested 5,000 deep", ["run", "--plan", "{nested}", "--topo", "dgx-h100"], "plan"),
    ("405B on 16,384 GPUs --full", ["run", "--plan", "llama3-405b-16k.json", "--full"],
     "simulated ranks"),
    ("whatif nodes=100000, 2e9 batch", ["whatif", "--plan", "fsdp.json", "--topo", "dgx-h100",
                                        "--vary", "nodes=1,100000", "--vary",
                                        "global_batch=2000000000"], None),
]


def make_files(folder: Path) -> dict[str, str]:
    """The oversized plan, model and topology files the cases name."""
    def write(name: str, obj) -> str:
        (folder / name).write_text(obj if isinstance(obj, str) else json.dumps(obj))
        return str(folder / name)

    def plan(name: str, batch: int) -> str:
        return write(name, {"model": "llama3-8b", "mesh": {"tp": 8},
                            "training": {"global_batch": batch, "seq_len": 8192}})

    write("deep_model.json", {"hidden_size": 4096, "num_hidden_layers": 10**9,
                              "num_attention_heads": 32, "intermediate_size": 14336,
                              "vocab_size": 128256})
    return {
        "batch2e9": plan("b9.json", 2_000_000_000), "batch1e30": plan("b30.json", 10**30),
        "layers": write("layers.json", {"model": "deep_model.json",
                                        "training": {"global_batch": 8, "seq_len": 8192}}),
        "wide": write("wide_topo.json", {"gpu": "h100", "domains": 1,
                                         "gpus_per_domain": 5_000_000}),
        "many": write("many_topo.json", {"gpu": "h100", "domains": 4_000,
                                         "gpus_per_domain": 3_000_000,
                                         "network": {"nics_per_domain": 8, "nic_GBps": 50}}),
        "nested": write("nested.json", "[" * 5000 + "]" * 5000),
    }


def run_limited(args: list[str], cwd: Path) -> tuple[int, str, str, float, float]:
    """`python -m simulator ARGS` under RLIMIT_AS = 1 GiB, killed after TIMEOUT_S:
    (exit status, stdout, stderr, wall seconds, peak RSS bytes). A killed run's status
    is -9."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), ARROW_DEFAULT_MEMORY_POOL="system",
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", CHILD.format(limit=LIMIT_BYTES), *args],
                                stdout=out, stderr=err, cwd=cwd, env=env, text=True)
        guard = threading.Timer(TIMEOUT_S, proc.kill)   # the hang guard
        guard.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            guard.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall_s = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        # ru_maxrss is in KiB on Linux.
        return proc.returncode, out.read(), err.read(), wall_s, usage.ru_maxrss * 1024.0


def main() -> int:
    """Run every case and print the table."""
    print(f"{'case':<34} {'exit':>4} {'wall (s)':>9} {'peak RSS':>9}  first line of stderr")
    with tempfile.TemporaryDirectory() as tmp:
        files = make_files(Path(tmp))
        for name, args, _ in CASES:
            status, _, err, wall_s, rss = run_limited([a.format(**files) for a in args],
                                                      Path(tmp))
            line = (err.strip().splitlines() or [""])[0]
            print(f"{name:<34} {status:>4} {wall_s:>9.2f} {rss / 1e9:>6.2f} GB  {line[:70]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
