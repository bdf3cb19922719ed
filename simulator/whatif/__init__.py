"""What-if studies: the cross product of topologies and varied parameters, simulated.

    from simulator.whatif import whatif
    rows = whatif("fsdp", ["dgx-h100"], ["tp=1,2,4,8", "ib_bandwidth=x0.5,x1,x2"])

Modules: `variations` (what can vary and how it is applied), `points` (a point as plain
data, and the simulation of one point in a worker), `engines` (local processes or Ray
tasks), `pool` (the local worker processes), `signals` (stopping on SIGINT/SIGTERM),
`checkpoint` (finished points on disk, resume), `rows` (what a checkpoint row must
hold), `table` (Parquet, PNG and terminal table).
"""
from __future__ import annotations

from typing import Any

from ..errors import UsageError
from ..output import output_kind
from .checkpoint import checkpoint_path
from .engines import ENGINES, drop_checkpoint, run_points
from .points import evaluate, plan_source, study_points, topology_source
from .signals import StopSignals, SweepInterrupted
from .table import plot, render, to_table, write_table
from .variations import PARAMS, Variation, parse_all, parse_vary


def whatif(plan: str | dict, topos: list[str], vary: list[str] | None = None,
           faults: list[str] | None = None, options: dict[str, Any] | None = None,
           engine: str = "local", workers: int | None = None, address: str | None = None,
           output: str | None = None, resume: bool = False,
           progress: bool = False) -> list[dict[str, Any]]:
    """Run a study and return its rows (point order); with `output`, also the Parquet.

    plan: a plan path, bundled name or raw plan object; topos: preset names or files
    (empty: the plan's own topology); vary: `NAME=V1,V2` strings; faults: `--fault`
    strings (the rank classes are then split around what they touch); options: full, algorithm, protocol,
    flow_sharing. Bad input of any kind, an unwritable `output` included, raises an
    InputError before any point runs. SIGINT or SIGTERM raise SweepInterrupted (a
    KeyboardInterrupt) once the finished points are in the checkpoint.
    `python -m simulator whatif` is this function plus the plot and the printed table.
    Local workers are spawned processes (simulator.whatif.pool): a script that calls this
    with several workers needs the usual `if __name__ == "__main__":` guard.
    """
    variations = parse_all(vary)
    raw = plan_source(plan)
    topos = list(topos) or ([raw["topology"]] if raw.get("topology") else [])
    if not topos:
        raise UsageError("--topo", None, "a topology name or file (the plan names none)")
    options = dict(options or {})
    points = study_points(raw, [topology_source(t) for t in topos], variations,
                          list(faults or []), options)
    if output:   # refused now, not after the sweep
        output_kind(output, "output", create_parents=True)
        output_kind(checkpoint_path(output), "output", create_parents=True)
    resumed = bool(output and resume and checkpoint_path(output).exists())
    with StopSignals():
        rows = run_points(points, engine, workers, address, output, resume, progress)
        if output:
            _write(rows, variations, output, resumed,
                   {"whatif": {"plan": raw.get("name"), "topos": topos,
                               "vary": list(vary or []), "faults": list(faults or []),
                               "options": options}})
    return rows


def _write(rows: list[dict[str, Any]], variations: list[Variation], output: str,
           resumed: bool, metadata: dict[str, Any]) -> None:
    """The Parquet, then no checkpoint. A failed write removes the checkpoint too, unless
    it held points of an earlier run; an interrupted one keeps it for --resume."""
    try:
        write_table(to_table(rows, [v.name for v in variations]), output, metadata)
    except SweepInterrupted as exc:
        exc.checkpoint, exc.kept, exc.total = str(checkpoint_path(output)), len(rows), len(rows)
        raise
    except KeyboardInterrupt:
        raise
    except BaseException:
        if not resumed:
            drop_checkpoint(output)
        raise
    drop_checkpoint(output)


__all__ = ["ENGINES", "PARAMS", "SweepInterrupted", "Variation", "checkpoint_path", "evaluate", "parse_all", "parse_vary", "plot", "render",
           "run_points", "study_points", "to_table", "whatif", "write_table"]
