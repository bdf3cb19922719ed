"""NCCL's latency constants by release: a measurement is priced with the baseLat / hwLat
tables of the NCCL it ran (src/graph/tuning.cc at each NVIDIA/nccl release tag), the
newest tables when its release is unknown."""
from __future__ import annotations

import subprocess
import sys

import pytest

from simulator.network import CollectiveModel, CommOptions
from simulator.network.algorithms import GroupShape
from simulator.network.constants import base_latency_s, hw_latency_s
from simulator.network.latency import nccl_latency_s
from simulator.network.tuning_versions import linear_nvls_tree, modelled, parse_version
from topologies import build

US = 1e-6


def _shape(nodes: int, ppn: int = 8) -> GroupShape:
    ranks = tuple(range(nodes * ppn))
    return GroupShape(ranks, tuple(range(nodes)),
                      tuple(tuple(range(d * ppn, (d + 1) * ppn)) for d in range(nodes)))


@pytest.mark.parametrize("text,parsed", [
    ("2.26.2", (2, 26, 2)), ("2.18.5+cuda12.2", (2, 18, 5)), ("2.21", (2, 21, 0)),
    ("unknown", None), ("", None), (None, None)])
def test_versions_parse(text, parsed):
    assert parse_version(text) == parsed


@pytest.mark.parametrize("version,link,algo,us", [
    ("2.18.5", "net", "nvls_tree", 19.0),     # 2.18.x NET NVLSTree
    ("2.20.5", "net", "nvls_tree", 14.0),     # 2.19 .. 2.28.7
    ("2.26.2", "net", "nvls_tree", 14.0),
    ("2.28.9", "net", "nvls_tree", 20.9),     # from 2.28.9 (the newest tables)
    ("unknown", "net", "nvls_tree", 20.9),
    ("2.20.5", "nvlink", "tree", 28.0),       # 2.19 .. 2.22 Tree Simple 28 us per step
    ("2.23.4", "nvlink", "tree", 4.0),
    ("2.20.5", "nvlink", "nvls", 23.0),       # 23 us NVLS until 2.21, 25 after
    ("2.21.5", "nvlink", "nvls", 25.0),
    ("2.18.5", "nvlink", "nvls", 0.0),        # 2.18 kept NVLS latency in baseLat
])
def test_hw_latency_of_the_release(version, link, algo, us):
    assert hw_latency_s(link, algo, "Simple", version) == pytest.approx(us * US)


def test_base_latency_of_the_release():
    assert base_latency_s("nvls", "Simple", "2.18.5") == pytest.approx(23 * US)
    assert base_latency_s("nvls", "Simple", "2.26.2") == 0.0
    assert base_latency_s("tree", "Simple", "2.20.5") == 0.0    # 8.4 from 2.23
    assert base_latency_s("tree", "Simple", "2.23.4") == pytest.approx(8.4 * US)
    assert base_latency_s("ring", "LL", "2.18.5") == pytest.approx(6.6 * US)   # unchanged


def test_nvls_tree_latency_per_release():
    two = _shape(2)
    # 2.26: NVLink 25 + 2 x log2(2) x NET 14; 2.30: NET 20.9.
    assert nccl_latency_s(two, "all_reduce", "nvls_tree", "Simple", 1 << 22, 16,
                          version="2.26.2") == pytest.approx(53.0 * US)
    assert nccl_latency_s(two, "all_reduce", "nvls_tree", "Simple", 1 << 22, 16) \
        == pytest.approx(66.8 * US)
    # 2.18: base 23 + 2 x (nNodes - 1) x 19, linear in the node count.
    assert linear_nvls_tree("2.18.5") and not linear_nvls_tree("2.19.3")
    four = _shape(4)
    assert nccl_latency_s(four, "all_reduce", "nvls_tree", "Simple", 1 << 22, 16,
                          version="2.18.5") == pytest.approx((23 + 6 * 19) * US)


def test_the_model_prices_a_plan_with_its_release():
    # Tree + Simple on 2 x 8 H100: 2.20.5 has no base latency and 28 us per step on
    # NVLink and NET: 2 x (7 x 28 + 28); the newest 8.4 + 2 x (7 x 4 + 14).
    topo = build("dgx-h100x2")
    ranks = tuple(range(16))
    forced = dict(algorithm="tree", protocol="Simple")
    new = CollectiveModel(topo, CommOptions(**forced)).plan("all_reduce", ranks, 1 << 22)
    old = CollectiveModel(topo, CommOptions(nccl_version="2.20.5", **forced)).plan(
        "all_reduce", ranks, 1 << 22)
    assert old.latency_s - new.latency_s == pytest.approx(
        (2 * (7 * 28 + 28) - (8.4 + 2 * (7 * 4 + 14))) * US)
    # NVLS_Tree on 2 x 8 B200 under 2.26.2: NCCL chose by 14 us per network step, the
    # kernel's time takes 2.28.9's recalibrated 20.9 (test below).
    b200 = build("dgx-b200x2")
    newest = CollectiveModel(b200).plan("all_reduce", ranks, 1 << 22)
    v226 = CollectiveModel(b200, CommOptions(nccl_version="2.26.2")).plan(
        "all_reduce", ranks, 1 << 22)
    assert newest.algorithm == v226.algorithm == "nvls_tree"
    assert newest.latency_s - newest.fill_s == pytest.approx(v226.latency_s - v226.fill_s)


@pytest.mark.parametrize("version", ["latest", "2.2.5", "2.17.1", "2.31.0"])
def test_cli_refuses_a_version_it_has_no_tables_for(version):
    # unreadable, or outside the releases the tables were read at (2.18 .. 2.30): a typo
    # of 2.25 as 2.2.5 would otherwise be priced with the newest tables
    proc = subprocess.run([sys.executable, "-m", "simulator", "collective", "--topo",
                           "dgx-h100", "--op", "all_reduce", "--group", "8", "--sizes",
                           "1K:1K", "--nccl-version", version],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: --nccl-version: got '{version}'")
    assert "2.18 to 2.30" in proc.stderr


@pytest.mark.parametrize("version, known", [
    ("2.18.3", True), ("2.30.7", True), ("2.26.2+cuda12.8", True), ("2.17.1", False),
    ("2.31.0", False), ("3.0.0", False), ("unknown", False)])
def test_the_modelled_releases_are_those_the_tables_were_read_at(version, known):
    assert modelled(version) is known


def test_recalibrated_nvls_tree_step_prices_the_time_not_the_choice():
    # NVLS_Tree's NET step: 14 us as 2.26.2 shipped it (NCCL's choice), 20.9 us as 2.28.9
    # recalibrated the same kernel (the time) [NVIDIA/nccl v2.28.7-1..v2.28.9-1 tuning.cc].
    assert hw_latency_s("net", "nvls_tree", "Simple", "2.26.2") == pytest.approx(14.0 * US)
    assert hw_latency_s("net", "nvls_tree", "Simple", "2.26.2", timing=True) == \
        pytest.approx(20.9 * US)
    # Releases not checked keep their own value; other entries are not recalibrated.
    assert hw_latency_s("net", "nvls_tree", "Simple", "2.20.5", timing=True) == \
        pytest.approx(14.0 * US)
    assert hw_latency_s("nvlink", "tree", "Simple", "2.20.5", timing=True) == \
        pytest.approx(28.0 * US)
    shape = _shape(2)
    choice = nccl_latency_s(shape, "all_reduce", "nvls_tree", "Simple", 1 << 20, 32,
                            version="2.26.2")
    time = nccl_latency_s(shape, "all_reduce", "nvls_tree", "Simple", 1 << 20, 32,
                          version="2.26.2", timing=True)
    assert time - choice == pytest.approx(2 * (20.9 - 14.0) * US)   # 2 x log2(2) steps


def test_plan_times_nvls_tree_with_the_recalibrated_step():
    topo = build("dgx-b200x2")
    ranks = tuple(range(16))
    model = CollectiveModel(topo, CommOptions(algorithm="nvls_tree", nccl_version="2.26.2"))
    newest = CollectiveModel(topo, CommOptions(algorithm="nvls_tree", nccl_version="2.30.7"))
    old, new = model.plan("all_reduce", ranks, 1 << 20), newest.plan("all_reduce", ranks,
                                                                      1 << 20)
    # Same latency term (2.30.7's chunk and channels differ, so compare latency less fill).
    assert old.latency_s - old.fill_s == pytest.approx(new.latency_s - new.fill_s)
