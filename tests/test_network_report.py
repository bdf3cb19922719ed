"""nccl-tests-style tables, size lists and group expressions (simulator/network/report)."""
import pytest

from simulator.network.report import collective_table, group_ranks, parse_sizes
from topologies import build


def test_parse_sizes():
    assert parse_sizes("1K:8K") == [1024, 2048, 4096, 8192]
    assert parse_sizes("1K:8G")[-1] == 8 << 30 and len(parse_sizes("1K:8G")) == 24
    assert parse_sizes("64M") == [64 << 20]
    assert parse_sizes("1K,3K") == [1024, 3072]
    assert parse_sizes("1K:64K:4") == [1024, 4096, 16384, 65536]
    with pytest.raises(ValueError):
        parse_sizes("8G:1K")
    with pytest.raises(ValueError):
        parse_sizes("lots")


def test_group_ranks():
    topo = build("dgx-h100x4")
    assert group_ranks(topo, "32") == tuple(range(32))
    assert group_ranks(topo, 4) == (0, 1, 2, 3)
    assert group_ranks(topo, "tp=8") == tuple(range(8))
    assert group_ranks(topo, "dp=4") == (0, 8, 16, 24)
    assert group_ranks(topo, "dp=8") == (0, 4, 8, 12, 16, 20, 24, 28)
    assert group_ranks(topo, "pp=4,tp=8") == (0, 8, 16, 24)
    assert group_ranks(topo, "tp=4,dp=2") == (0, 1, 2, 3)
    for bad in ("0", "64", "xx=2", "tp=5", "dp=two"):
        with pytest.raises(ValueError):
            group_ranks(topo, bad)


def test_collective_table_rows():
    topo = build("dgx-h100")
    rows = collective_table(topo, "all_reduce", tuple(range(8)), parse_sizes("1K:1G"))
    assert set(rows[0]) == {"size_bytes", "time_us", "algbw_GBps", "busbw_GBps",
                            "algorithm", "protocol", "channels", "latency_us", "fill_us",
                            "bandwidth_us", "host_floor_us", "chunk_bytes"}
    for r in rows:   # the split adds up to the time, and every row has its channels
        parts = r["latency_us"] + r["fill_us"] + r["bandwidth_us"]
        assert parts == pytest.approx(r["time_us"], rel=1e-9) and r["channels"] >= 1
    assert rows[-1]["chunk_bytes"] > 0 and rows[0]["chunk_bytes"] == 0   # NVLS vs ring
    assert rows[0]["protocol"] == "LL" and rows[-1]["algorithm"] == "nvls"
    assert rows[-1]["busbw_GBps"] == pytest.approx(rows[-1]["algbw_GBps"] * 14 / 8)
    times = [r["time_us"] for r in rows]
    assert times == sorted(times)
