"""The nccl-tests golden table and `validation collectives` that scores the model on it."""
from __future__ import annotations

import json
import math

import pytest

from simulator.network.constants import bus_factor
from validation import cli
from validation.collective_scoring import (BUCKETS, COLUMNS, DEFAULT_CSV, DEFAULT_SYSTEMS,
                                           GENERATIONS, Point, bucket_of, load_points,
                                           load_systems, predict, run_collectives, score,
                                           stats)
from validation.errors import ValidationError

MIB = 1 << 20
HEADER = ",".join(COLUMNS)


@pytest.fixture(scope="module")
def points():
    return load_points()


def test_table_parses_with_150_or_more_points_each_cited(points):
    assert len(points) >= 150
    assert len({p.id for p in points}) == len(points)
    import csv
    with open(DEFAULT_CSV, newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            assert row["source"].startswith("https://github.com/"), row["id"]
            assert row["source_location"], row["id"]


def test_coverage_generations_sizes_collectives(points):
    generations = {GENERATIONS[p.gpu] for p in points}
    assert {"Ampere", "Hopper", "Blackwell"} <= generations
    assert min(p.gpus for p in points) <= 4 and max(p.gpus for p in points) >= 1000
    assert {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"} == \
        {p.collective for p in points}
    sizes = [p.size_bytes for p in points]
    assert min(sizes) <= 1024 and max(sizes) >= 1 << 30
    assert sum(s <= MIB for s in sizes) >= 15
    assert sum(p.nodes > 1 for p in points) >= 15
    assert sum(p.gpu == "gb200" for p in points) >= 10


def test_every_system_maps_to_a_buildable_topology_of_its_gpu_count(points):
    import topologies
    from simulator.network.report import group_ranks
    systems = load_systems()
    for name in {p.system for p in points}:
        entry = systems[name]
        if entry.get("inexpressible"):
            continue
        topo = topologies.build(entry["topology"])
        gpus = {p.gpus for p in points if p.system == name}
        assert len(gpus) == 1 and len(group_ranks(topo, entry["group"])) == gpus.pop(), name


def test_time_and_busbw_agree_with_the_bus_factor(points):
    """Where a row prints its time, busbw = size / time x nccl-tests' bus factor (to the
    source's two decimals): catches a transcription slip or a wrong GPU count."""
    import csv
    with open(DEFAULT_CSV, newline="", encoding="utf-8") as fh:
        rows = [r for r in csv.DictReader(fh) if r["time_us"]]
    assert len(rows) >= 80
    for r in rows:
        algbw = int(r["size_bytes"]) / float(r["time_us"]) / 1e3
        busbw = algbw * bus_factor(r["collective"], int(r["gpus"]))
        assert busbw == pytest.approx(float(r["busbw_GBps"]), rel=0.01, abs=0.011), r["id"]


def test_bus_factors_are_nccl_tests_performance_md():
    # doc/PERFORMANCE.md: allreduce 2(n-1)/n; allgather, reducescatter, alltoall (n-1)/n
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all_gather", 72) == pytest.approx(71 / 72)
    assert bus_factor("reduce_scatter", 16) == pytest.approx(15 / 16)
    assert bus_factor("all_to_all", 4) == pytest.approx(3 / 4)


def _point(i, size, measured, predicted, system="s", collective="all_reduce", gpu="h100"):
    return Point(f"p{i}", system, gpu, 8, 1, collective, size, measured, "out-of-place",
                 "default", predicted_GBps=predicted)


def test_scorer_mape_bias_and_buckets_on_a_hand_made_table():
    pts = [_point(0, 1024, 10.0, 12.0),            # +20 %
           _point(1, MIB, 100.0, 50.0),            # -50 %, still <= 1 MiB
           _point(2, 2 * MIB, 100.0, 110.0),       # +10 %
           _point(3, 64 * MIB, 200.0, 150.0, system="t", gpu="gb200"),   # -25 %
           _point(4, 1 << 30, 400.0, 400.0, system="t", collective="all_gather",
                  gpu="gb200")]                     # 0 %
    result = score(pts)
    assert result["overall"]["points"] == 5
    assert result["overall"]["mape_pct"] == pytest.approx((20 + 50 + 10 + 25 + 0) / 5)
    assert result["overall"]["bias_pct"] == pytest.approx((20 - 50 + 10 - 25 + 0) / 5)
    b = result["buckets"]
    assert b["<= 1 MiB"]["points"] == 2 and b["<= 1 MiB"]["mape_pct"] == pytest.approx(35)
    assert b["1-64 MiB"]["bias_pct"] == pytest.approx(10)
    assert b[">= 64 MiB"]["mape_pct"] == pytest.approx(12.5)
    assert result["systems"] == {}      # no system has 5 points
    assert result["generations"]["Blackwell"]["bias_pct"] == pytest.approx(-12.5)
    assert result["collectives"]["all_gather"]["points"] == 1
    assert stats([])["mape_pct"] is None


def test_bucket_edges():
    assert [name for name, _, _ in BUCKETS] == ["<= 1 MiB", "1-64 MiB", ">= 64 MiB"]
    assert bucket_of(MIB) == "<= 1 MiB" and bucket_of(MIB + 1) == "1-64 MiB"
    assert bucket_of(64 * MIB - 1) == "1-64 MiB" and bucket_of(64 * MIB) == ">= 64 MiB"


def test_inexpressible_points_are_listed_not_scored(tmp_path):
    systems = json.loads(DEFAULT_SYSTEMS.read_text())
    systems["h100-8-nccl1047"]["inexpressible"] = "NVL partition not modelled"
    for entry in systems.values():     # topology files stay where the bundled mapping is
        if isinstance(entry, dict) and entry["topology"].endswith(".json"):
            entry["topology"] = str(DEFAULT_SYSTEMS.parent / entry["topology"])
    path = tmp_path / "systems.json"
    path.write_text(json.dumps(systems))
    pts = load_points()
    scored, skipped = predict(pts, load_systems(path))
    assert len(skipped) == sum(p.system == "h100-8-nccl1047" for p in pts) > 0
    assert all(why == "NVL partition not modelled" for _, why in skipped)
    assert len(scored) + len(skipped) == len(pts)


@pytest.mark.parametrize("change,field", [
    ({"group": "tp=zz"}, "systems.h100-8-nccl1047.group"),
    ({"group": "xx=8"}, "systems.h100-8-nccl1047.group"),
    ({"group": "tp=8,tp=8"}, "systems.h100-8-nccl1047.group"),
    ({"gpus_per_process": "x"}, "systems.h100-8-nccl1047.gpus_per_process"),
    ({"gpus_per_process": 0}, "systems.h100-8-nccl1047.gpus_per_process"),
    ({"nccl_version": "newest", "nccl_version_rests_on": "x"},
     "systems.h100-8-nccl1047.nccl_version"),
    ({"nccl_version": "2.26.2"}, "systems.h100-8-nccl1047.nccl_version_rests_on"),
])
def test_bad_system_fields_are_input_errors(tmp_path, change, field):
    systems = json.loads(DEFAULT_SYSTEMS.read_text())
    systems["h100-8-nccl1047"].update(change)
    path = tmp_path / "systems.json"
    path.write_text(json.dumps(systems))
    with pytest.raises(ValidationError) as err:
        load_systems(path)
    assert err.value.field == field


def test_group_outside_the_topology_is_an_input_error(tmp_path):
    systems = json.loads(DEFAULT_SYSTEMS.read_text())
    for entry in systems.values():
        if isinstance(entry, dict) and entry["topology"].endswith(".json"):
            entry["topology"] = str(DEFAULT_SYSTEMS.parent / entry["topology"])
    systems["h100-8-nccl1047"]["group"] = "tp=100000"
    path = tmp_path / "systems.json"
    path.write_text(json.dumps(systems))
    pts = [p for p in load_points() if p.system == "h100-8-nccl1047"]
    with pytest.raises(ValidationError) as err:
        predict(pts, load_systems(path))
    assert err.value.field == "systems.h100-8-nccl1047.group"


def test_report_runs_and_stays_sane():
    result = run_collectives()
    overall = result["score"]["overall"]
    assert overall["points"] == len(result["rows"]) > 150
    assert math.isfinite(overall["mape_pct"]) and overall["mape_pct"] < 1000   # loose
    assert result["assumptions"] and all(a["rests_on"] for a in result["assumptions"])


def _write(tmp_path, body: str):
    path = tmp_path / "t.csv"
    path.write_text(HEADER + "\n" + body + "\n")
    return path


GOOD = ("a,s,h100,8,1,8,all_reduce,1024,0.5,,in-place,no,2.20,default,,"
        "https://github.com/x/y,README,")


def test_a_good_row_parses(tmp_path):
    assert load_points(_write(tmp_path, GOOD))[0].size_bytes == 1024


@pytest.mark.parametrize("bad, field", [
    (GOOD.replace("all_reduce", "allreduce"), "collective"),
    (GOOD.replace(",1024,", ",1K,"), "size_bytes"),
    (GOOD.replace(",0.5,", ",nan,"), "busbw_GBps"),
    (GOOD.replace("in-place", "inplace"), "placement"),
    (GOOD.replace("https://github.com/x/y", ""), "source"),
    (GOOD.replace(",h100,", ",v100,"), "gpu"),
])
def test_bad_cells_exit_2_with_one_line_naming_the_field(tmp_path, capsys, bad, field):
    path = _write(tmp_path, bad)
    with pytest.raises(ValidationError, match=field):
        load_points(path)
    assert cli.main(["collectives", "--csv", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err


def test_more_gpus_than_nodes_hold_is_refused(tmp_path):
    with pytest.raises(ValidationError, match="gpus"):
        load_points(_write(tmp_path, GOOD.replace(",8,1,8,", ",16,1,8,")))


def test_rows_with_a_time_are_scored_on_it():
    """busbw 0.02 printed for 1 KiB may be 0.015-0.025: the time (here 21.75 us, which
    gives 0.0235 GB/s) is the exact figure, and the error is measured / predicted time - 1."""
    from dataclasses import replace
    p = replace(_point(0, 1024, 0.02, 0.0), time_us=21.75, predicted_time_us=20.0)
    assert p.scored_on == "time"
    assert p.error == pytest.approx(21.75 / 20.0 - 1)
    q = replace(p, time_us=None)
    assert q.scored_on == "busbw" and q.error == pytest.approx((0.0 - 0.02) / 0.02)


def test_a_size_slower_than_the_next_larger_is_listed_as_an_outlier():
    from dataclasses import replace
    from validation.collective_scoring import outliers
    run = [replace(_point(i, size, 1.0, 1.0), time_us=t, run="r")
           for i, (size, t) in enumerate([(MIB // 2, 240.7), (MIB, 115.6), (2 * MIB, 114.4),
                                          (4 * MIB, 118.3)])]
    assert [(a.size_bytes, b.size_bytes) for a, b in outliers(run)] == [(MIB // 2, MIB)]
    other_run = [replace(run[0], run="s")] + run[1:]     # another run: not compared
    assert outliers(other_run) == []


def test_report_lists_the_lambda_one_off_and_keeps_it_scored():
    result = run_collectives()
    ids = {r["id"] for r in result["outliers"]}
    assert "lambda-b200-16-all_reduce-524288" in ids
    assert "lambda-b200-16-all_reduce-524288" in {r["id"] for r in result["rows"]}
    assert sum(r["scored_on"] == "time" for r in result["rows"]) >= 250


def test_rows_are_priced_with_their_nccl_release():
    # Lambda's B200 run states NCCL 2.26.2: its NVLS_Tree moves 128 KiB chunks
    # (NCCL_NVLS_CHUNKSIZE; the SM100 tuning that cuts them to 64 KiB on 2 nodes of 8
    # B200 behind PCIe switches came in 2.30), so at 512 MiB its pipeline fill is twice
    # the newest release's: the stated point is slower by one newest fill.
    from dataclasses import replace

    from simulator.network import CollectiveModel
    from topologies import build

    pts = [p for p in load_points() if p.id == "lambda-b200-16-all_reduce-536870912"]
    assert pts and pts[0].nccl_version == "2.26.2"
    systems = load_systems()
    stated, _ = predict(pts, systems)
    newest, _ = predict([replace(pts[0], nccl_version="unknown")], systems)
    assert stated[0].predicted_algorithm == newest[0].predicted_algorithm == "nvls_tree"
    plan = CollectiveModel(build("dgx-b200x2")).plan("all_reduce", tuple(range(16)),
                                                     1 << 29)
    assert plan.chunk_bytes == 64 * 1024
    assert stated[0].predicted_time_us - newest[0].predicted_time_us == pytest.approx(
        plan.fill_s * 1e6, rel=1e-6)


def test_system_release_prices_rows_without_one_and_is_listed():
    """nebius-h100-16's rows say 'unknown'; its system's inferred release (2.26.2, dstack's
    default image: docker/base/Dockerfile NCCL_VERSION=2.26.2-1 when the example was
    written) prices them. With 2.26.2's NVLS_Tree network step (14 us, tuning.cc of
    v2.23 .. v2.28.7) NCCL takes NVLS_Tree from 1 MiB, where the newest tables (20.9 us)
    keep Tree; the example measured 87.08 us there, NVLS_Tree's floor."""
    systems = load_systems()
    assert systems["nebius-h100-16"]["nccl_version"] == "2.26.2"
    pts = [p for p in load_points() if p.id == "nebius-h100-16-all_reduce-1048576"]
    (scored,), _ = predict(pts, systems)
    assert scored.predicted_algorithm == "nvls_tree"
    unset = {k: {kk: vv for kk, vv in v.items() if kk != "nccl_version"}
             for k, v in systems.items()}
    (newest,), _ = predict(pts, unset)
    assert newest.predicted_algorithm == "tree"
    names = [a["name"] for a in run_collectives()["assumptions"]]
    assert "nebius-h100-16 NCCL version" in names
    # a row naming its release keeps it
    from validation.collective_systems import row_version
    assert row_version("2.18.5", systems["nebius-h100-16"]) == "2.18.5"
    assert row_version("unknown", systems["nebius-h100-16"]) == "2.26.2"
