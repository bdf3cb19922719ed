"""Clusters of published training jobs that no preset describes: a topology file under
references/job_topologies/ (the format of docs/design.md, "Topology file") names a node's
GPUs and network and the NCCL environment the job's launcher set; a reference row names
the file's stem in its `topology` column and gets gpus / gpus_per_domain such nodes.

The files are data read by the topology loader (never executed); a row may name only a
file of this directory, so a CSV given with --csv reaches no other path.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

JOB_TOPOLOGY_DIR = Path(__file__).parent / "references" / "job_topologies"


def job_topology_names() -> tuple[str, ...]:
    """The stems of the job topology files, sorted (the names a row may use)."""
    return tuple(sorted(p.stem for p in JOB_TOPOLOGY_DIR.glob("*.json")))


def _spec(name: str):
    from topologies.presets_file import load_file

    return load_file(JOB_TOPOLOGY_DIR / f"{name}.json")


def job_topology(name: str, gpus: int):
    """The topology of a job on `gpus` GPUs of the file's nodes (whole nodes only: the
    file describes a node's NICs and NCCL environment as its launcher ran them)."""
    from topologies import TopologyError

    spec = _spec(name)
    if gpus <= 0 or gpus % spec.domain_size:
        raise TopologyError("gpus", gpus, f"a multiple of the {spec.domain_size} GPUs of a "
                            f"{name} node")
    return replace(spec, num_domains=gpus // spec.domain_size).build()


def job_topology_gpu(name: str) -> str:
    """The GPU the file's nodes hold, as the hardware group names it."""
    return _spec(name).gpu.name
