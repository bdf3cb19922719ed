"""Clusters of published training jobs that no preset describes: a job topology file under
references/job_topologies/ names the nodes (`nodes`: a file of references/nccl_topologies/,
whose GPUs and network the nccl-tests table scores) and the NCCL environment the job's
launcher set (`nccl_env`, in place of that file's; absent: the file's own). A reference row
names the job file's stem in its `topology` column and gets gpus / gpus_per_domain nodes.

The files are data (JSON, never executed); a row may name only a file of this directory,
and a job file only a nodes file of the nccl_topologies one, so a CSV given with --csv
reaches no other path.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from inputs import load_json_file

REFERENCES = Path(__file__).parent / "references"
JOB_TOPOLOGY_DIR = REFERENCES / "job_topologies"
NODES_DIR = REFERENCES / "nccl_topologies"
JOB_KEYS = ("name", "description", "nodes", "nccl_env")


def job_topology_names() -> tuple[str, ...]:
    """The stems of the job topology files, sorted (the names a row may use)."""
    return tuple(sorted(p.stem for p in JOB_TOPOLOGY_DIR.glob("*.json")))


def _spec(name: str):
    """The job's ClusterSpec: its nodes file's, with the job's name, description and NCCL
    environment."""
    from topologies import TopologyError
    from topologies.presets_file import load_file
    from topologies.transport import parse_nccl_env

    job = load_json_file(JOB_TOPOLOGY_DIR / f"{name}.json", "job topology", TopologyError)
    unknown = sorted(set(job) - set(JOB_KEYS)) if isinstance(job, dict) else None
    if unknown is None or unknown:
        raise TopologyError(f"job topology {name}", unknown, "keys " + ", ".join(JOB_KEYS))
    nodes = {p.stem for p in NODES_DIR.glob("*.json")}
    if job.get("nodes") not in nodes:
        raise TopologyError(f"{name}.nodes", job.get("nodes"), "one of " + ", ".join(sorted(nodes)))
    spec = load_file(NODES_DIR / f"{job['nodes']}.json")
    if "nccl_env" in job:
        transport = replace(spec.fabric.transport,
                            nccl_env=parse_nccl_env(job["nccl_env"], f"{name}.nccl_env"))
        spec = replace(spec, fabric=replace(spec.fabric, transport=transport))
    return replace(spec, name=name, description=job.get("description", spec.description))


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
