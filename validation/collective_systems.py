"""Systems of the nccl-tests table (references/nccl_systems.json): each maps a cluster
type at one GPU count to a simulator topology and group, and says what the rows' sources
leave implicit: nccl-tests -g (`gpus_per_process`) and, where a row does not name its
NCCL release, the release inferred from how the run was set up (`nccl_version`, with
`nccl_version_rests_on`, which `validation collectives` lists among its assumptions).
"""
from __future__ import annotations

from pathlib import Path

from inputs import decimal, load_json_file

from .csv_input import require_regular_file
from .errors import ValidationError

DEFAULT_SYSTEMS = Path(__file__).resolve().parent / "references" / "nccl_systems.json"
# A group's rank count (or one DIM=N's N): 7 digits is past any topology's GPU count, and
# keeps int() far from the interpreter's digit limit.
MAX_GROUP_DIGITS = 7
# nccl-tests -g: the GPUs one process drives, all on one host; an integer of hundreds of
# digits would overflow the host floor's float (simulator/network/latency.py).
MAX_GPUS_PER_PROCESS = 1024


def load_systems(path: str | Path = DEFAULT_SYSTEMS) -> dict[str, dict]:
    """System id -> {topology, group, hardware[, inexpressible]}; topology files are
    resolved beside the JSON file."""
    path = Path(path)
    require_regular_file(path, "--systems")   # a FIFO would block the read for ever
    # the strict reader: bounded size and depth, no NaN, no key given twice
    raw = load_json_file(path, "--systems", ValidationError)
    if not isinstance(raw, dict):
        raise ValidationError("--systems", str(path), "a JSON object: system -> mapping")
    systems = {}
    for name, entry in raw.items():
        if name.startswith("_"):
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("topology"), str) \
                or not isinstance(entry.get("group"), str):
            raise ValidationError(f"systems.{name}", entry, "an object with topology and group")
        _check_system_fields(name, entry)
        topo = entry["topology"]
        if topo.endswith(".json"):
            topo = str(path.parent / topo)
        systems[name] = {**entry, "topology": topo}
    return systems


def _check_system_fields(name: str, entry: dict) -> None:
    """The group's form (a rank count or DIM=N[,DIM=N]; its fit to the topology's world
    is checked when the topology is built) and gpus_per_process (an integer >= 1)."""
    from simulator.network.report import MESH_ORDER

    group = entry["group"].strip()
    parts = [part.partition("=") for part in group.split(",")]
    dims = [key.strip().lower() for key, _, _ in parts]
    # inputs.decimal, not str.isdigit ('²' is a digit int() cannot read), and bounded
    # (MAX_GROUP_DIGITS): a longer count fits no topology
    ranks = decimal(group, MAX_GROUP_DIGITS)
    well_formed = (ranks is not None and ranks >= 1) or (
        all(sep and key in MESH_ORDER and decimal(value.strip(), MAX_GROUP_DIGITS) is not None
            for (_, sep, value), key in zip(parts, dims))
        and len(set(dims)) == len(dims))
    if not well_formed:
        raise ValidationError(f"systems.{name}.group", entry["group"],
                              "a rank count or DIM=N[,DIM=N] with each DIM once, in "
                              + ", ".join(MESH_ORDER)
                              + f" (N of at most {MAX_GROUP_DIGITS} digits)")
    per_process = entry.get("gpus_per_process", 1)
    if isinstance(per_process, bool) or not isinstance(per_process, int) \
            or not 1 <= per_process <= MAX_GPUS_PER_PROCESS:
        raise ValidationError(f"systems.{name}.gpus_per_process", per_process,
                              f"an integer in [1, {MAX_GPUS_PER_PROCESS}] (nccl-tests -g)")
    _check_system_version(name, entry)


def _check_system_version(name: str, entry: dict) -> None:
    """`nccl_version` (optional): the release a system's rows ran where they do not say,
    inferred from how the run was set up; it must parse and carry `nccl_version_rests_on`
    (the evidence), which the report lists among the assumptions."""
    from simulator.network.tuning_versions import parse_version

    version = entry.get("nccl_version")
    if version is None:
        return
    if not isinstance(version, str) or parse_version(version) is None:
        raise ValidationError(f"systems.{name}.nccl_version", version,
                              "an NCCL release such as 2.26.2")
    if not str(entry.get("nccl_version_rests_on", "")).strip():
        raise ValidationError(f"systems.{name}.nccl_version_rests_on",
                              entry.get("nccl_version_rests_on"),
                              "the evidence for the inferred release (text)")


def row_version(row_release: str, system: dict) -> str | None:
    """The NCCL release whose tables price a point: the row's own (`row_release`) where it
    names one,
    else its system's inferred `nccl_version`, else None (the newest tables)."""
    from simulator.network.tuning_versions import parse_version

    if parse_version(row_release) is not None:
        return row_release
    return system.get("nccl_version") or row_release or None


def system_assumptions(systems: dict[str, dict]) -> list[tuple[str, str, str]]:
    """(name, value, rests on) of each system's inferred NCCL release."""
    return [(f"{name} NCCL version", str(entry["nccl_version"]),
             str(entry["nccl_version_rests_on"]))
            for name, entry in systems.items() if entry.get("nccl_version")]
