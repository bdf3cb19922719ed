"""Rank classes of a job whose topology carries faults: which ranks still behave alike.

Rank-class mode simulates one rank per pipeline stage because every rank of a stage sees
the same program, the same hardware and the same neighbours. A fault (a straggler, a
slower GPU type, a degraded or failed link) breaks that for the ranks it touches and for
those that wait on them. The classes here are the orbits of the ranks under a group of
mesh symmetries that fix the faults:

- Each rank gets a colour: its device, the links at its GPU, at its NIC and at that NIC's
  leaf switch (kind and rates, missing ones absent), and whether it relays traffic of a
  failed rail of its NVLink domain (routing falls back to the next working rail, which
  then carries both rails' traffic; topologies.Topology.route).
- The rank index is split into digits: the mesh dims (pp, dp, cp, tp), their virtual
  sub-dims (ep, edp, the TP grid axes) and the NVLink-domain boundary, each a contiguous
  run of the mixed-radix rank number (dp two runs, ep's and edp's, when the plan's
  mesh.order puts other dims between them). Two values of a digit are interchangeable when
  swapping them leaves every colour in place; the values of a digit fall into blocks of
  interchangeable ones, and the group H permutes each digit's values inside their blocks.
  H fixes every faulted rank, so its orbits (a rank's stage and the block of each digit)
  are classes whose ranks see the same program, hardware and neighbours up to H.
- Pipeline digits are never permuted (a stage is a class boundary, as before), and a dim
  used by ring point-to-point steps (context parallelism) keeps its digits only when the
  colours are invariant under its rotation; otherwise each value is its own block.

Collective groups fall into orbits too (`group_key`): groups of one orbit have the same
classes in them, so the engine runs one of them and counts the others as twins. With no
fault every digit outside the pipeline is one block and the classes are the stages.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from topologies import Topology
from topologies.topology import gpu_node, leaf_node, nic_node
from workloads.mesh import GRID_DIMS, MESH_DIMS, VIRTUAL_DIMS, ParallelDims


@dataclass(frozen=True)
class RankClasses:
    """A partition of a mesh's ranks into classes, with one representative each.

    `class_of[r]` is rank r's class, `class_rep[c]` the lowest rank of class c (its
    representative), `blocks[r]` the block of each digit of r (the class is the stage and
    these), `digit_spans` each digit's [low, high) place values in the rank number.
    """

    mesh: ParallelDims
    class_of: np.ndarray
    class_rep: np.ndarray
    blocks: np.ndarray
    digit_spans: tuple[tuple[int, int], ...]

    @property
    def representatives(self) -> tuple[int, ...]:
        """The simulated ranks, ascending."""
        return tuple(sorted(int(r) for r in self.class_rep))

    @property
    def trivial(self) -> bool:
        """Whether the classes are the pipeline stages (nothing broke the symmetry)."""
        return len(self.class_rep) == self.mesh.pp

    def representative(self, rank: int) -> int:
        """The simulated rank of `rank`'s class."""
        return int(self.class_rep[self.class_of[rank]])

    def varied_digits(self, dims: tuple[str, ...]) -> np.ndarray:
        """Mask of the digits a group over `dims` runs through (the others it fixes)."""
        mask = np.zeros(len(self.digit_spans), dtype=bool)
        for low, high in (run for d in dims for run in self.mesh.spans(d)):
            for i, (lo, hi) in enumerate(self.digit_spans):
                if low <= lo and hi <= high:
                    mask[i] = True
        return mask

    def group_key(self, rank: int, fixed: np.ndarray) -> tuple[int, ...]:
        """The orbit of `rank`'s group that fixes the digits in `fixed` (a mask)."""
        return tuple(self.blocks[rank][fixed].tolist())


def _digit_spans(mesh: ParallelDims, topology: Topology) -> list[tuple[int, int]] | None:
    """The common refinement of every dim's span and the domain boundary, or None when
    those do not nest (a boundary that does not divide the next)."""
    world = mesh.world_size
    cuts = {1, world}
    for dim in MESH_DIMS + VIRTUAL_DIMS:
        if dim in GRID_DIMS and mesh.grid is None:
            continue
        for run in mesh.spans(dim):   # dp is two runs when mesh.order splits it
            cuts.update(run)
    if 1 < topology.domain_size < world:
        cuts.add(topology.domain_size)
    ordered = sorted(c for c in cuts if 1 <= c <= world)
    if any(b % a for a, b in zip(ordered, ordered[1:])):
        return None
    return list(zip(ordered, ordered[1:]))


# ----------------------------------------------------------------------------- colours
def _edges_key(graph, node: str, skip: str = "") -> tuple:
    """Kinds, rates and latencies of a node's links, both directions, by the kind of
    node at the other end (none when the node is gone)."""
    if node not in graph:
        return ()

    def key(d: dict, other: str) -> tuple:
        return (d["kind"], d["bandwidth"], d.get("nccl_bandwidth", d["bandwidth"]),
                d["latency"], other[:3])
    out = sorted(key(d, v) for _, v, d in graph.out_edges(node, data=True) if v != skip)
    into = sorted(key(d, u) for u, _, d in graph.in_edges(node, data=True) if u != skip)
    return tuple(out), tuple(into)


def _device_key(spec) -> tuple:
    """Every field of a DeviceSpec, mappings as sorted items (it is not hashable)."""
    return tuple(tuple(sorted(v.items())) if hasattr(v, "items") else v
                 for v in (getattr(spec, f.name) for f in fields(spec)))


def _rail_works(topology: Topology, domain: int, rail: int) -> bool:
    """Whether rail `rail` of a domain has its GPU-NIC links and a link into the fabric."""
    graph = topology.graph
    gpu, nic = gpu_node(domain * topology.domain_size + rail), nic_node(domain, rail)
    return (graph.has_edge(gpu, nic) and graph.has_edge(nic, gpu)
            and any(not v.startswith("gpu") for v in graph.successors(nic)))


def _relay_marks(topology: Topology) -> dict[int, int]:
    """rank -> rails its NIC stands in for: a failed rail's traffic falls back to the
    next working rail of the domain (Topology.route), which carries both."""
    marks: dict[int, int] = {}
    if topology.num_domains <= 1 or topology.rails <= 1:
        return marks
    for domain in range(topology.num_domains):
        works = [_rail_works(topology, domain, r) for r in range(topology.rails)]
        for rail in range(topology.rails):
            if works[rail]:
                continue
            for k in range(1, topology.rails):
                if works[(rail + k) % topology.rails]:
                    relay = domain * topology.domain_size + (rail + k) % topology.rails
                    marks[relay] = marks.get(relay, 0) + 1
                    break
    return marks


def rank_colours(topology: Topology) -> np.ndarray:
    """A colour id per rank: equal colours mean the same device, the same links at the
    GPU, its NIC and that NIC's leaf, and the same relay load."""
    graph, ds = topology.graph, topology.domain_size
    relays = _relay_marks(topology)
    device_keys: dict[int, tuple] = {}
    leaf_keys: dict[str, tuple] = {}
    ids: dict[tuple, int] = {}
    out = np.empty(topology.world_size, dtype=np.int64)
    for rank in range(topology.world_size):
        spec = topology.device(rank)
        dkey = device_keys.get(id(spec))
        if dkey is None:
            dkey = device_keys[id(spec)] = _device_key(spec)
        key: tuple = (dkey, _edges_key(graph, gpu_node(rank)), relays.get(rank, 0))
        local, domain = rank % ds, rank // ds
        if topology.num_domains > 1 and local < topology.rails:
            nic = nic_node(domain, local)
            leaf = leaf_node(domain // max(topology.domains_per_leaf, 1), local)
            if leaf not in leaf_keys:
                leaf_keys[leaf] = tuple(sorted(
                    (d["bandwidth"], d.get("nccl_bandwidth", d["bandwidth"]), u[:4], v[:4])
                    for u, v, d in list(graph.out_edges(leaf, data=True))
                    + list(graph.in_edges(leaf, data=True))
                    if "spine" in (u, v))) if leaf in graph else ()
            key += (_edges_key(graph, nic, skip=gpu_node(rank)), leaf_keys[leaf])
        out[rank] = ids.setdefault(key, len(ids))
    return out


# ----------------------------------------------------------------------------- classes
def _digit_blocks(colours: np.ndarray, sizes: list[int], axis: int) -> np.ndarray:
    """Block id of each value of one digit: values whose colour slices are identical."""
    moved = np.moveaxis(colours.reshape(sizes), axis, 0).reshape(sizes[axis], -1)
    _, inverse = np.unique(moved, axis=0, return_inverse=True)
    return inverse.reshape(-1)


def _ring_dims(program) -> set[str]:
    """Mesh dims (other than pp) that point-to-point steps walk around as a ring."""
    return {t.group[0] for stage in program.stages for t in stage
            if t.op == "send_recv" and t.group and t.group[0] != "pp"}


def rank_classes(program, topology: Topology) -> RankClasses | None:
    """The fault-aware rank classes of a lowered program on a (faulted) topology, or
    None when the mesh and the NVLink domains do not nest into digits (then only
    simulating every rank is sound)."""
    mesh = program.plan.parallel_dims
    spans = _digit_spans(mesh, topology)
    if spans is None:
        return None
    colours = rank_colours(topology)
    world = mesh.world_size
    ranks = np.arange(world)
    # Most significant digit first, as numpy's C order reshapes.
    spans = spans[::-1]
    sizes = [hi // lo for lo, hi in spans]
    pp_low = mesh.span("pp")[0]
    fixed_ring: set[int] = set()
    for dim in _ring_dims(program):
        low, high = mesh.span(dim)
        ring = colours.reshape(world // high, high // low, low)
        if not np.array_equal(np.roll(ring, 1, axis=1), ring):
            fixed_ring.update(i for i, (lo, hi) in enumerate(spans) if low <= lo and hi <= high)
    blocks = np.empty((world, len(spans)), dtype=np.int64)
    for i, (lo, hi) in enumerate(spans):
        values = (ranks // lo) % (hi // lo)
        if lo >= pp_low or i in fixed_ring:
            blocks[:, i] = values
        else:
            blocks[:, i] = _digit_blocks(colours, sizes, i)[values]
    # np.unique's first occurrences are the lowest ranks of each class.
    _, first, class_of = np.unique(blocks, axis=0, return_index=True, return_inverse=True)
    return RankClasses(mesh, class_of.reshape(-1), first, blocks, tuple(spans))
