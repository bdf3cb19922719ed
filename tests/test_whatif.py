"""What-if sweeps: variations, invalid points, Parquet/PNG outputs, resume, Ray engine."""
from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from simulator.cli import main
from simulator.errors import UsageError
from simulator.whatif import checkpoint_path, parse_vary, run_points, to_table, whatif
from simulator.whatif.points import plan_source, study_points, topology_source
from simulator.whatif.variations import apply_cluster, apply_plan, parse_all

import topologies
from workloads import WorkloadError

# One tiny layer: a point simulates in tens of milliseconds.
TINY = {"name": "tiny",
        "model": {"hidden_size": 256, "num_hidden_layers": 1, "num_attention_heads": 8,
                  "num_key_value_heads": 8, "intermediate_size": 512, "vocab_size": 512},
        "training": {"global_batch": 8, "micro_batch": 1, "seq_len": 128},
        "mesh": {"dp": "auto", "tp": 1}, "fsdp": {"enabled": True}}
# 4 x 2 x 5 x 3 x 2 = 240 points; tp=1 with micro_batch=2 is invalid (dp 8 x 2 does not
# divide the global batch of 8), so the sweep also carries invalid rows.
SWEEP = ["tp=1,2,4,8", "micro_batch=1,2", "nvlink_bandwidth=x0.5,x1,x2,x4,x8",
         "recompute=none,selective,full", "dtype=bf16,fp8"]


def _points(vary, topos=("dgx-h100",), faults=()):
    return study_points(plan_source(TINY), [topology_source(t) for t in topos],
                        parse_all(list(vary)), list(faults), {})


def test_parse_vary_values_and_errors():
    assert parse_vary("tp=1,2,4").values == (1, 2, 4)
    assert parse_vary("ib_bandwidth=x0.5,100").values == ("x0.5", "100")
    assert parse_vary("fsdp=true,off").values == (True, False)
    assert parse_vary("dp=auto,2").values == ("auto", 2)
    for bad in ("foo=1", "tp=", "tp=0", "tp=two", "ib_bandwidth=fast", "ib_bandwidth=xinf",
                "fsdp=maybe", "async_tp=maybe", "overlap.tp_comm=true"):
        with pytest.raises(UsageError):
            parse_vary(bad)
    with pytest.raises(topologies.TopologyError):
        parse_vary("gpu=h900")
    with pytest.raises(UsageError):
        parse_all(["tp=1", "tp=2"])
    # a choice's meaning is the plan's to check (with a plan file's message), not the parser's
    assert parse_vary("recompute=some").values == ("some",)
    with pytest.raises(WorkloadError, match="^recompute: got 'some'"):
        _points(["recompute=none,some"])


def test_apply_cluster_and_plan():
    spec = topologies.cluster_spec("dgx-h100x2")
    changed = apply_cluster(spec, {"gpu": "h200", "ib_bandwidth": "x2",
                                   "nvlink_bandwidth": "900", "nodes": 4})
    assert changed.gpu.name == "h200" and changed.num_domains == 4
    assert changed.fabric.nic_Bps == 2 * spec.fabric.nic_Bps
    assert changed.fabric.nic_nccl_Bps == 2 * spec.fabric.nic_nccl_Bps
    assert changed.gpu.nvlink_Bps == 900e9
    assert changed.build().world_size == 32
    plan = apply_plan(plan_source("col"), {"tp": 4, "micro_batch": 2, "recompute": "full",
                                         "fsdp": False, "schedule": "gpipe"})
    assert (plan.mesh.tp, plan.training.micro_batch, plan.recompute, plan.fsdp,
            plan.pipeline.schedule) == (4, 2, "full", False, "gpipe")


def test_vary_packed_segment_is_the_plan_field():
    assert parse_vary("packed_segment=0,512").values == (0, 512)
    plan = apply_plan(plan_source("col"), {"packed_segment": 512})
    assert plan.training.packed_segment == 512


def test_invalid_points_are_rows_with_the_reason(tmp_path):
    out = tmp_path / "study.parquet"
    png = tmp_path / "study.png"
    rc = main(["whatif", "--plan", _write(tmp_path, TINY), "--topo",
               "dgx-h100", "--vary", "tp=1,8,16", "--vary", "ib_bandwidth=x1,x2", "-o",
               str(out), "--plot", str(png), "--workers", "1", "--no-progress", "--json"])
    assert rc == 0
    table = pq.read_table(out).to_pylist()
    assert len(table) == 6 and [r["point"] for r in table] == list(range(6))
    bad = [r for r in table if r["tp"] == 16]
    assert all(r["status"] == "invalid" and "mesh" in r["error"] for r in bad)
    good = [r for r in table if r["status"] == "ok"]
    for key in ("step_time_s", "compute_s", "exposed_comm_s", "bubble_s", "mfu",
                "peak_memory_bytes", "fits_in_memory", "mesh_tp", "memory_params_bytes",
                "tp", "ib_bandwidth", "topo"):
        assert all(r[key] is not None for r in good), key
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not checkpoint_path(out).exists()


def _write(tmp_path, raw) -> str:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(raw))
    return str(path)


def test_bad_input_exits_2(tmp_path, capsys):
    plan = _write(tmp_path, TINY)
    for argv in (["--vary", "nope=1"], ["--fault", "meteor:gpu=1"], ["--resume"],
                 ["--workers", "0"], ["-o", str(tmp_path / "x.csv")],
                 ["--fault", "straggler:gpu=99,slowdown=1.2", "--topo", "nvl72"]):
        rc = main(["whatif", "--plan", plan, "--topo", "dgx-h100", "--no-progress", *argv])
        err = capsys.readouterr().err.strip()
        # A fault naming a rank that is not there is an invalid point, not bad syntax.
        assert rc in (0, 2), argv
        if rc == 2:
            assert len(err.splitlines()) == 1 and err.startswith("error:"), argv


def test_parallel_workers_give_the_same_rows():
    points = _points(["tp=1,2,4,8", "micro_batch=1,2"])
    serial = run_points(points, workers=1, progress=False)
    parallel = run_points(points, workers=2, progress=False)
    assert serial == parallel


def test_resume_after_interruption_gives_the_same_table(tmp_path):
    points = _points(["tp=1,2,4,8", "nvlink_bandwidth=x0.5,x1,x2"])
    full = to_table(run_points(points, workers=1, progress=False), ["tp", "nvlink_bandwidth"])
    out = tmp_path / "study.parquet"
    # "Kill" the study half-way: only 5 points finish, the checkpoint stays on disk.
    run_points(points, workers=1, output=out, progress=False, stop_after=5)
    ckpt = checkpoint_path(out)
    lines = ckpt.read_text().splitlines()
    assert len(lines) == 1 + 5
    with open(ckpt, "a") as f:   # the kill also tore the line being written
        f.write('{"point": 7, "sta')
    rows = run_points(points, workers=2, output=out, resume=True, progress=False)
    resumed = to_table(rows, ["tp", "nvlink_bandwidth"])
    assert resumed.equals(full)
    assert len(ckpt.read_text().splitlines()) == 1 + len(points)


def test_resume_refuses_another_studys_checkpoint(tmp_path):
    out = tmp_path / "study.parquet"
    run_points(_points(["tp=1,2"]), workers=1, output=out, progress=False, stop_after=1)
    with pytest.raises(UsageError):
        run_points(_points(["tp=1,4"]), workers=1, output=out, resume=True, progress=False)


def test_api_writes_parquet_atomically(tmp_path):
    out = tmp_path / "s.parquet"
    rows = whatif(TINY, ["dgx-h100", "dgx-h100x2"], ["tp=2,4"], output=str(out), workers=1)
    assert [r["topo"] for r in rows] == ["dgx-h100"] * 2 + ["dgx-h100x2"] * 2
    assert pq.read_table(out).num_rows == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.parquet"]


def test_ray_engine_matches_local_on_200_points():
    ray = pytest.importorskip("ray", reason="ray not installed (pip install 'shardsim[ray]')")
    points = _points(SWEEP)
    assert len(points) >= 200
    local = run_points(points, workers=2, progress=False)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             ignore_reinit_error=True)
    try:
        remote = run_points(points, engine="ray", progress=False)
    finally:
        ray.shutdown()
    assert any(r["status"] == "invalid" for r in local)
    assert to_table(remote, [v.split("=")[0] for v in SWEEP]).equals(
        to_table(local, [v.split("=")[0] for v in SWEEP]))
