"""Requests for more work than the documented limits end with exit 2 and one line, before
anything large is built: under a 1 GiB address-space limit (RLIMIT_AS) and a timeout.

The cases, the limit and why the child runs with ARROW_DEFAULT_MEMORY_POOL=system and one
BLAS thread are in benchmarks/limits.py (`python -m benchmarks.limits` times them). The
control case checks that the limit leaves room for real work: the refusals are not the
memory limit's doing.
"""
from __future__ import annotations

import json

import pytest

from benchmarks.limits import CASES, make_files, run_limited
from topologies.presets import MAX_GPUS, cluster_spec
from workloads import bundled_plans, load_plan, resolve
from workloads.budget import MAX_TASKS, check_work, estimate_tasks

@pytest.mark.parametrize("name,args,field", CASES, ids=[c[0] for c in CASES])
def test_oversized_request_exits_2_under_1_GiB(tmp_path, name, args, field):
    files = make_files(tmp_path)
    status, out, err, _, _ = run_limited([a.format(**files) for a in args], tmp_path)
    lines = err.strip().splitlines()
    if field is None:   # a sweep reports each oversized point as invalid, exit 0
        assert status == 0 and "at most" in out, err
        return
    assert status == 2, err
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}: got "), err
    assert any(w in lines[0] for w in ("limit", "at most", "<="))


def test_the_limit_leaves_room_for_a_normal_run(tmp_path):
    status, out, err, _, _ = run_limited(["run", "--plan", "fsdp.json", "--json"], tmp_path)
    assert status == 0, err
    assert json.loads(out)["step_time_s"] > 0


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
