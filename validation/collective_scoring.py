"""`validation collectives`: score the collective model on published nccl-tests points.

validation/references/nccl_tests.csv holds measured nccl-tests points copied from public
sources (one row per collective, GPU count and size; the source and how it was run beside
each). validation/references/nccl_systems.json maps each system (one cluster type at one
GPU count) to a simulator topology and group. Every point is predicted with the
simulator's collective model, as `python -m simulator collective` does (its closed-form
time on idle links, which stands for nccl-tests' out-of-place figure), and the error of
the predicted bus bandwidth is reported overall, by size bucket, system, collective and
GPU generation, with the signed bias beside every MAPE.

Where a row carries nccl-tests' time, the error is taken on the time: the bus bandwidth
error is measured_time / predicted_time - 1, the same quantity, but nccl-tests prints
busbw to two decimals (0.02 GB/s at 1 KiB is anything from 0.015 to 0.025, +-25 %) and
its time to four significant digits. Rows with only a bus bandwidth are scored on it.
A point whose measured time exceeds that of the next larger size of the same run (a
bigger message cannot be cheaper) is listed as an outlier; it stays in the MAPE.

Bus bandwidth is nccl-tests' (doc/PERFORMANCE.md): algbw = S / t and busbw = algbw x
2(n-1)/n for all-reduce, x (n-1)/n for all-gather, reduce-scatter and all-to-all.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from simulator.output import print_json

from .csv_input import INT, NUMBER, TEXT, read_typed_csv
from .collective_systems import (DEFAULT_SYSTEMS, load_systems, row_version,
                                 system_assumptions)
from .errors import ValidationError

REFERENCES = Path(__file__).resolve().parent / "references"
DEFAULT_CSV = REFERENCES / "nccl_tests.csv"
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
# The algorithm a row says was forced (NCCL_ALGO), as the model's CommOptions names it;
# "default" and "unknown" leave NCCL's (the model's) choice.
FORCED = {"default": None, "unknown": None, "ring": "ring", "tree": "tree", "nvls": "nvls",
          "nvls_tree": "nvls_tree", "collnet_direct": None, "collnet_chain": None}
# Algorithms the model cannot express yet: a row forcing one is listed, not scored.
INEXPRESSIBLE_ALGORITHMS = {"collnet_direct": "CollNet/SHARP (NCCL_ALGO=CollNetDirect) is "
                                              "not modelled",
                            "collnet_chain": "CollNet/SHARP (NCCL_ALGO=CollNetChain) is "
                                             "not modelled"}
GENERATIONS = {"a100": "Ampere", "h100": "Hopper", "h200": "Hopper", "b200": "Blackwell",
               "gb200": "Blackwell", "gb300": "Blackwell", "b300": "Blackwell"}
MIB = 1 << 20
# Size buckets of the report: up to 1 MiB (latency-bound), 1-64 MiB (ramp), 64 MiB and up.
BUCKETS = (("<= 1 MiB", 0, MIB), ("1-64 MiB", MIB + 1, 64 * MIB - 1),
           (">= 64 MiB", 64 * MIB, math.inf))
MIN_SYSTEM_POINTS = 5   # a system is reported on its own from this many points
MAX_GPUS_PER_POINT = 1 << 17
# A size is listed as an outlier when it takes this much longer than the next larger size
# of its run: beyond the jitter of the table's latency-bound sizes, whose times wander by
# up to about 15 % between neighbours (for example nebius-h100-16 at 32 and 64 KiB).
OUTLIER_RATIO = 1.25

COLUMNS: dict[str, tuple[str, bool, object]] = {
    "id": (TEXT, True, None), "system": (TEXT, True, None),
    "gpu": (TEXT, True, tuple(GENERATIONS)),
    "gpus": (INT, True, (2, MAX_GPUS_PER_POINT)), "nodes": (INT, True, (1, MAX_GPUS_PER_POINT)),
    "gpus_per_node": (INT, True, (1, MAX_GPUS_PER_POINT)),
    "collective": (TEXT, True, COLLECTIVES),
    "size_bytes": (INT, True, (1, 1 << 40)),
    "busbw_GBps": (NUMBER, True, (0.0, math.inf)),
    "time_us": (NUMBER, False, (0.0, math.inf)),
    "placement": (TEXT, True, ("out-of-place", "in-place")),
    "cuda_graph": (TEXT, True, ("yes", "no", "unknown")),
    "nccl_version": (TEXT, True, None),
    "algorithm": (TEXT, True, tuple(FORCED)),
    "env": (TEXT, False, None),
    "source": (TEXT, True, None), "source_location": (TEXT, True, None),
    "notes": (TEXT, False, None),
}


@dataclass(frozen=True)
class Point:
    """One measured nccl-tests point and, once scored, the model's prediction."""

    id: str
    system: str
    gpu: str
    gpus: int
    nodes: int
    collective: str
    size_bytes: int
    busbw_GBps: float
    placement: str
    algorithm: str
    time_us: float | None = None
    run: str = ""           # the source's location: points of one nccl-tests run
    predicted_GBps: float | None = None
    predicted_time_us: float | None = None
    predicted_algorithm: str = ""
    predicted_protocol: str = ""
    nccl_version: str = ""  # the row's NCCL release ("unknown": the newest tables)

    @property
    def generation(self) -> str:
        """GPU generation (Ampere, Hopper, Blackwell)."""
        return GENERATIONS[self.gpu]

    @property
    def scored_on(self) -> str:
        """'time' where the row prints nccl-tests' time (and a time was predicted), else
        'busbw'."""
        return "time" if self.time_us and self.predicted_time_us else "busbw"

    @property
    def error(self) -> float:
        """Signed relative error of the predicted bus bandwidth, from the times where the
        row has one (busbw is inversely proportional to time at one size)."""
        if self.scored_on == "time":
            return self.time_us / self.predicted_time_us - 1.0
        return (self.predicted_GBps - self.busbw_GBps) / self.busbw_GBps

    @property
    def measured_time_us(self) -> float:
        """nccl-tests' time, or the time its bus bandwidth implies."""
        if self.time_us:
            return self.time_us
        return self.size_bytes * _bus_factor(self.collective, self.gpus) \
            / (self.busbw_GBps * 1e3)


def load_points(path: str | Path = DEFAULT_CSV) -> list[Point]:
    """The table's rows as Points; a bad cell, a duplicate id or an inconsistent GPU count
    raises a ValidationError naming it."""
    rows = read_typed_csv(path, COLUMNS)
    points, seen = [], set()
    for number, row in enumerate(rows, start=1):
        if row["id"] in seen:
            raise ValidationError(f"row {number}.id", row["id"], "an id used once")
        seen.add(row["id"])
        gpus, nodes, per_node = int(row["gpus"]), int(row["nodes"]), int(row["gpus_per_node"])
        if gpus > nodes * per_node:
            raise ValidationError(f"row {number}.gpus", gpus,
                                  f"at most nodes x gpus_per_node ({nodes * per_node})")
        points.append(Point(row["id"], row["system"], row["gpu"], gpus, nodes,
                            row["collective"], int(row["size_bytes"]),
                            float(row["busbw_GBps"]), row["placement"], row["algorithm"],
                            float(row["time_us"]) if row.get("time_us") else None,
                            _run_of(row), nccl_version=row["nccl_version"]))
    return points


def _run_of(row: dict) -> str:
    """The nccl-tests run a row comes from: its source and location, less the line."""
    import re
    return row["source"] + " " + re.sub(r",?\s*lines?\s+[\d-]+", "", row["source_location"])


def _bus_factor(collective: str, gpus: int) -> float:
    from simulator.network.constants import bus_factor
    return bus_factor(collective, gpus)


def outliers(points: list[Point]) -> list[tuple[Point, Point]]:
    """[(point, next larger size of the same run)] where the point's measured time exceeds
    the larger message's: a one-off slow run (nccl-tests times each size once, as a mean
    over its iterations). Listed by the report, kept in the MAPE."""
    runs: dict[tuple, list[Point]] = {}
    for p in points:
        runs.setdefault((p.system, p.run, p.collective, p.placement, p.algorithm),
                        []).append(p)
    found = []
    for run in runs.values():
        run = sorted(run, key=lambda q: q.size_bytes)
        found.extend((a, b) for a, b in zip(run, run[1:]) if b.size_bytes > a.size_bytes
                     and a.measured_time_us > b.measured_time_us * OUTLIER_RATIO)
    return found


def predict(points: list[Point], systems: dict[str, dict]
            ) -> tuple[list[Point], list[tuple[Point, str]]]:
    """(scored points with predictions, [(point, why it is not expressible)])."""
    import topologies
    from simulator.network import CommOptions
    from simulator.network.report import collective_table, group_ranks

    scored, skipped, topos = [], [], {}
    for p in points:
        system = systems.get(p.system)
        reason = _inexpressible(p, system)
        if reason:
            skipped.append((p, reason))
            continue
        if system["topology"] not in topos:
            topos[system["topology"]] = topologies.build(system["topology"])
        topo = topos[system["topology"]]
        try:
            ranks = group_ranks(topo, system["group"])
        except ValueError as exc:
            raise ValidationError(f"systems.{p.system}.group", system["group"],
                                  str(exc).partition(": ")[2]) from None
        if len(ranks) != p.gpus:
            raise ValidationError(f"systems.{p.system}.group", system["group"],
                                  f"a group of {p.gpus} ranks (the row's gpus)")
        # NCCL's latency constants of the row's release price its latency and choice.
        options = CommOptions(algorithm=FORCED[p.algorithm],
                              gpus_per_process=system.get("gpus_per_process", 1),
                              nccl_version=row_version(p.nccl_version, system))
        row = collective_table(topo, p.collective, ranks, [p.size_bytes], options)[0]
        scored.append(_with_prediction(p, row))
    return scored, skipped


def _inexpressible(p: Point, system: dict | None) -> str:
    if system is None:
        return "system not in the systems mapping"
    if system.get("inexpressible"):
        return str(system["inexpressible"])
    return INEXPRESSIBLE_ALGORITHMS.get(p.algorithm, "")


def _with_prediction(p: Point, row: dict) -> Point:
    from dataclasses import replace
    return replace(p, predicted_GBps=float(row["busbw_GBps"]),
                   predicted_time_us=float(row["time_us"]),
                   predicted_algorithm=str(row["algorithm"]),
                   predicted_protocol=str(row["protocol"]))


def stats(errors: list[float]) -> dict:
    """{points, mape_pct, bias_pct}: mean |error| and mean signed error, in percent."""
    if not errors:
        return {"points": 0, "mape_pct": None, "bias_pct": None}
    return {"points": len(errors),
            "mape_pct": 100.0 * sum(abs(e) for e in errors) / len(errors),
            "bias_pct": 100.0 * sum(errors) / len(errors)}


def bucket_of(size_bytes: int) -> str:
    """The report's size bucket of a message size."""
    return next(name for name, low, high in BUCKETS if low <= size_bytes <= high)


def score(scored: list[Point]) -> dict:
    """Overall, per-bucket, per-system (5+ points), per-collective and per-generation
    MAPE and signed bias."""
    def grouped(key) -> dict:
        groups: dict[str, list[float]] = {}
        for p in scored:
            groups.setdefault(key(p), []).append(p.error)
        return {k: stats(v) for k, v in sorted(groups.items())}

    systems = {k: v for k, v in grouped(lambda p: p.system).items()
               if v["points"] >= MIN_SYSTEM_POINTS}
    buckets = grouped(lambda p: bucket_of(p.size_bytes))
    return {"overall": stats([p.error for p in scored]),
            "buckets": {name: buckets.get(name, stats([])) for name, _, _ in BUCKETS},
            "systems": systems, "collectives": grouped(lambda p: p.collective),
            "generations": grouped(lambda p: p.generation)}


# What the model assumes where NCCL's tuning tables or a datasheet do not say, as marked
# "Assumption" in simulator/network/constants.py and topologies/builders.py|presets.py
# (used when the model does not list its assumptions itself: ASSUMPTIONS in
# simulator.network.constants, (name, value, what it rests on) tuples).
KNOWN_ASSUMPTIONS = (
    ("NET_OVERHEAD_S", "1.0 us", "NCCL getNetOverhead() on Intel x86 hosts (2.0 on AMD); "
     "Intel assumed (DGX H100 ships Xeon 8480C) [nccl src/graph/tuning.cc]"),
    ("LATENCY_INTER_S", "0", "graph->latencyInter, the extra latency a net plugin reports; "
     "0 assumed for InfiniBand"),
    ("NVLS_EFFICIENCY_DEFAULT", "0.85", "Hopper's nvlsEfficiency for NVLS-capable devices "
     "NCCL's table does not name [tuning.cc]"),
    ("LL_MAX_BW_ONE_NODE_DEFAULT_BPS", "141 GB/s", "Hopper's llMaxBw row for custom devices "
     "[tuning.cc]"),
    ("LL_MAX_BW_MULTI_NODE_BPS", "39 / 20.4 GB/s", "llMaxBw across nodes, Intel CPU row "
     "assumed [tuning.cc]"),
    ("hierarchical base latency", "ring's", "not an NCCL algorithm; pays the ring's base "
     "latency once"),
    ("HDR_200G nic_nccl_Bps", "24 GB/s", "DGX A100 ConnectX-6: 96 % of 25 GB/s, the ratio "
     "NDR reaches (46-48 of 50 GB/s, NVIDIA/nccl-tests issue 290)"),
    ("nvl72 scale-out", "one 400 Gb/s NIC per GPU", "typical GB200 deployments; to check per "
     "deployment"),
)


def assumptions() -> list[tuple[str, str, str]]:
    """The model's assumptions: its own list when it exposes one, else KNOWN_ASSUMPTIONS."""
    from simulator.network import constants
    listed = getattr(constants, "ASSUMPTIONS", None)
    if listed:
        return [tuple(str(x) for x in item) for item in listed]
    return list(KNOWN_ASSUMPTIONS)


def run_collectives(csv_path: str | Path = DEFAULT_CSV,
                    systems_path: str | Path = DEFAULT_SYSTEMS) -> dict:
    """Predict every point and score them: the report as one JSON-able dict."""
    points = load_points(csv_path)
    systems = load_systems(systems_path)
    scored, skipped = predict(points, systems)
    return {"table": str(csv_path), "points": len(points),
            "reported_figure": "nccl-tests out-of-place busbw (in-place rows scored against "
                               "the same prediction)",
            "scored_on": "the time where a row prints it (measured / predicted time - 1, "
                         "busbw's error without its two-decimal rounding), else busbw; "
                         f"{sum(p.scored_on == 'time' for p in scored)} of {len(scored)} "
                         "points on time",
            "score": score(scored),
            "not_expressible": [{"id": p.id, "system": p.system, "reason": why}
                                for p, why in skipped],
            "outliers": [{"id": a.id, "time_us": round(a.measured_time_us, 2),
                          "larger_size_id": b.id,
                          "larger_size_time_us": round(b.measured_time_us, 2)}
                         for a, b in outliers(scored)],
            "assumptions": [{"name": n, "value": v, "rests_on": r}
                            for n, v, r in assumptions() + system_assumptions(systems)],
            "rows": [{"id": p.id, "system": p.system, "collective": p.collective,
                      "size_bytes": p.size_bytes, "measured_GBps": p.busbw_GBps,
                      "predicted_GBps": round(p.predicted_GBps, 4),
                      "measured_time_us": round(p.measured_time_us, 3),
                      "predicted_time_us": round(p.predicted_time_us, 3),
                      "scored_on": p.scored_on, "error_pct": round(100 * p.error, 2),
                      "algorithm": p.predicted_algorithm, "protocol": p.predicted_protocol}
                     for p in scored]}


def _line(name: str, s: dict) -> str:
    if not s["points"]:
        return f"  {name:<34} {0:>6}        -          -"
    return f"  {name:<34} {s['points']:>6} {s['mape_pct']:>8.1f} % {s['bias_pct']:>+8.1f} %"


def format_report(result: dict) -> str:
    """The plain-text report of run_collectives."""
    sc = result["score"]
    out = [f"nccl-tests golden table: {result['points']} points, "
           f"{sc['overall']['points']} scored, {len(result['not_expressible'])} not "
           f"expressible; predicted figure: {result['reported_figure']}",
           f"error: signed bus-bandwidth error, taken on {result['scored_on']}",
           f"  {'group':<34} {'points':>6} {'MAPE':>10} {'bias':>10}",
           _line("overall", sc["overall"])]
    for title, key in (("size bucket", "buckets"), ("system (5+ points)", "systems"),
                       ("collective", "collectives"), ("GPU generation", "generations")):
        out.append(f"by {title}:")
        out.extend(_line(name, s) for name, s in sc[key].items())
    out.append(f"not expressible yet ({len(result['not_expressible'])}, not in the MAPE):")
    out.extend(f"  {r['id']}: {r['reason']}" for r in result["not_expressible"])
    out.append(f"outliers ({len(result['outliers'])}, kept in the MAPE): slower than the "
               "next larger size of the same run")
    out.extend(f"  {r['id']}: {r['time_us']} us > {r['larger_size_id']} "
               f"{r['larger_size_time_us']} us" for r in result["outliers"])
    out.append("assumptions of the model:")
    out.extend(f"  {a['name']} = {a['value']}: {a['rests_on']}" for a in result["assumptions"])
    return "\n".join(out)


def collectives_main(csv_path: str | None, systems_path: str | None, as_json: bool) -> int:
    """`validation collectives`: print the report (or JSON); exit 0."""
    result = run_collectives(csv_path or DEFAULT_CSV, systems_path or DEFAULT_SYSTEMS)
    print_json(result) if as_json else print(format_report(result))
    return 0
