"""Requests for more work than the documented limits end with exit 2 and one line, before
anything large is built: under a 1 GiB address-space limit and a timeout.

The memory limit is RLIMIT_AS in the child (the address space, which every allocation,
numpy's and Arrow's included, counts against). Two settings keep a normal run far below
it: ARROW_DEFAULT_MEMORY_POOL=system (Arrow's default jemalloc pool reserves about 1 GB of
address space up front that it never touches) and OPENBLAS_NUM_THREADS=1 (each BLAS
thread reserves its own stack and buffers). So set, a normal run of fsdp.json peaks at
about 0.4 GB of address space (VmPeak, measured), and the control case below checks that
the limit leaves room for real work: the refusals are not the limit's doing.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from topologies.presets import MAX_GPUS, cluster_spec
from workloads import bundled_plans, load_plan, resolve
from workloads.budget import MAX_TASKS, check_work, estimate_tasks

ROOT = Path(__file__).resolve().parent.parent
LIMIT_BYTES = 1 << 30
TIMEOUT_S = 60
CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
from simulator.cli import main
sys.exit(main(sys.argv[1:]))
"""


def run_limited(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`python -m simulator ARGS` under RLIMIT_AS = 1 GiB and a timeout (hang guard)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), ARROW_DEFAULT_MEMORY_POOL="system",
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", CHILD.format(limit=LIMIT_BYTES), *args],
                          capture_output=True, text=True, timeout=TIMEOUT_S, cwd=cwd, env=env)


def _plan(tmp: Path, name: str, **training) -> str:
    raw = {"model": "llama3-8b", "mesh": {"tp": 8},
           "training": {"global_batch": 8, "seq_len": 8192, **training}}
    (tmp / name).write_text(json.dumps(raw))
    return str(tmp / name)


def _files(tmp: Path) -> dict[str, str]:
    model = {"hidden_size": 4096, "num_hidden_layers": 10**9, "num_attention_heads": 32,
             "intermediate_size": 14336, "vocab_size": 128256}
    (tmp / "deep_model.json").write_text(json.dumps(model))
    (tmp / "layers.json").write_text(json.dumps(
        {"model": "deep_model.json", "training": {"global_batch": 8, "seq_len": 8192}}))
    (tmp / "wide_topo.json").write_text(json.dumps(
        {"gpu": "h100", "domains": 1, "gpus_per_domain": 5_000_000}))
    (tmp / "many_topo.json").write_text(json.dumps(
        {"gpu": "h100", "domains": 4_000, "gpus_per_domain": 3_000_000,
         "network": {"nics_per_domain": 8, "nic_GBps": 50}}))
    (tmp / "nested.json").write_text("[" * 5000 + "]" * 5000)
    return {"batch2e9": _plan(tmp, "b9.json", global_batch=2_000_000_000),
            "batch1e30": _plan(tmp, "b30.json", global_batch=10**30),
            "layers": str(tmp / "layers.json")}


# (arguments, the field the one-line error names); {name} are files made by _files.
CASES = [
    (["run", "--plan", "{batch2e9}", "--topo", "dgx-h100"], "training.global_batch"),
    (["run", "--plan", "{batch1e30}", "--topo", "dgx-h100"], "training.global_batch"),
    (["run", "--plan", "{layers}", "--topo", "dgx-h100"], "model.num_hidden_layers"),
    (["run", "--plan", "fsdp.json", "--topo", "nvl72x14564"], "topology"),
    (["run", "--plan", "fsdp.json", "--topo", "dgx-h100x100000"], "topology"),
    (["collective", "--topo", "dgx-h100x100000", "--op", "all_reduce", "--group", "8"],
     "topology"),
    (["topo", "nvl72x14564"], "topology"),
    (["run", "--plan", "fsdp.json", "--topo", "wide_topo.json"], "topology"),
    (["topo", "many_topo.json"], "topology"),
    (["run", "--plan", "nested.json", "--topo", "dgx-h100"], "plan"),
    (["run", "--plan", "llama3-405b-16k.json", "--full"], "simulated ranks"),
    (["whatif", "--plan", "fsdp.json", "--topo", "dgx-h100", "--vary", "nodes=1,100000",
      "--vary", "global_batch=2000000000"], None),   # per-point errors, the sweep goes on
]


@pytest.mark.parametrize("args,field", CASES, ids=[" ".join(c[0][:2] + c[0][3:4])
                                                   for c in CASES])
def test_oversized_request_exits_2_under_1_GiB(tmp_path, args, field):
    files = _files(tmp_path)
    done = run_limited([a.format(**files) for a in args], tmp_path)
    lines = done.stderr.strip().splitlines()
    if field is None:   # a sweep reports each oversized point as invalid, exit 0
        assert done.returncode == 0 and "at most" in done.stdout, done.stderr
        return
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}: got "), done.stderr
    assert any(w in lines[0] for w in ("limit", "at most", "<="))


def test_the_limit_leaves_room_for_a_normal_run(tmp_path):
    done = run_limited(["run", "--plan", "fsdp.json", "--json"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["step_time_s"] > 0


def test_every_bundled_plan_is_within_the_limits():
    for name in bundled_plans():
        plan = load_plan(name)
        spec = cluster_spec(plan.topology)
        assert spec.num_domains * spec.domain_size <= MAX_GPUS
        resolved = resolve(plan, spec.num_domains * spec.domain_size)
        check_work(resolved, resolved.mesh.pp)
    # The benchmarks' --full case (benchmarks/cases.py) too.
    plan = resolve(load_plan("llama3-70b-1k.json"), 1024)
    assert check_work(plan, 1024).simulated_tasks <= MAX_TASKS


def test_the_estimate_is_near_the_lowering():
    """The estimate is within 2x above what the lowering builds (fsdp, Megatron TP,
    pipeline): an estimate that ran far below would let oversized plans through."""
    from workloads.lowering import lower
    for name in ("fsdp.json", "col.json", "pipeline_1f1b.json", "cp_ring.json"):
        plan = load_plan(name)
        spec = cluster_spec(plan.topology)
        resolved = resolve(plan, spec.num_domains * spec.domain_size)
        built = max(len(stage) for stage in lower(resolved).stages)
        estimate = estimate_tasks(resolved, 1).tasks_per_rank
        assert built <= estimate <= 2.5 * built, (name, built, estimate)
