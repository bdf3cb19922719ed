"""The device mesh of a plan: degrees, dimension order, coordinates, groups and peers.

One class, `ParallelDims`, owns the geometry, after torchtitan's class of that name
(torchtitan/distributed/parallel_dims.py): it is built from the parallel degrees, checks
each one and names the factor that fails, and answers every question about ranks:
coordinates, process groups, point-to-point peers, the ranks of a pipeline stage.
The Program, the lowering, the memory model and the simulator's engine all ask it.

Mesh dims, outermost first by default: pp, dp, cp, tp (tp ranks contiguous, so a TP
group stays inside a node, as Megatron-LM and torchtitan lay it out), with the ep digit
the innermost part of dp. `order` permutes them, ep included: a plan's `mesh.order` names
them innermost first, as Megatron-LM's `order` string does (default "tp-cp-ep-dp-pp",
megatron/core/parallel_state.py initialize_model_parallel and RankGenerator: rank =
tp_rank + tp * (cp_rank + cp * (ep_rank + ...)); the default order here is that one.
The rank number is mixed-radix in the order's digits: pp, cp, tp, ep (size ep) and the
rest of dp (size dp / ep); a rank's dp coordinate is ep digit + ep x that rest, wherever
the order puts the two digits.
Megatron-LM lays its expert layers out with a second generator over the same order, with
the expert data parallelism folded over tp x cp x dp / (etp x ep). With expert TP equal to
TP an EP group stays inside dp here (expert data parallelism is edp x cp), which agrees
with Megatron whenever cp = 1; with expert TP < TP (`etp`) the expert dims ep and edp are
that second generator's (workloads/expert_mesh.py), so EP may span the TP ranks.

Virtual sub-dimensions vary one "digit" (stride, size) of their parent's index:
  ep    blocks of ep consecutive dp indices (an expert-parallel group); ep folds into dp
        as in torchtitan, so it adds no ranks (under the expert mesh: its ep digit)
  edp   the dp indices with the same position inside their EP block (expert data
        parallelism, dp / ep of them; under the expert mesh: tp x cp x dp / (etp x ep))
  etp   expert TP, under the expert mesh only (with etp = tp experts split over "tp")
  tpx, tpy, tpz  the axes of a 2D / 2.5D / 3D TP grid of axis sizes X, Y, Z: the
        rank at grid point (x, y, z) has tp index x + X (y + Y z)
        (2D: Xu et al. 2021, arXiv:2104.05343; 2.5D: Wang et al. 2021, arXiv:2105.14500;
        3D: Bian et al. 2021, arXiv:2105.14450); a 1D TP plan has tpx = tp, tpy = tpz = 1

`Mesh` is the plan file's "mesh" object (dp may be "auto"); `Mesh.resolved` fills dp in
for a world size; `ParallelDims.from_plan` builds the geometry of a resolved plan.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Mapping

from .errors import WorkloadError
from .expert_mesh import EXPERT_DIMS, ExpertMesh
from .mesh_grid import GRID_SHAPES, GridSplit, grid_split
from .mesh_grid import check_degree as _degree
from .moe_options import check_etp

MESH_DIMS = ("pp", "dp", "cp", "tp")  # the default order, outermost first
ORDER_DIMS = ("tp", "cp", "ep", "dp", "pp")  # a plan's mesh.order: Megatron-LM's default,
                                             # innermost first
GRID_DIMS = ("tpx", "tpy", "tpz")   # the axes of a 2D/2.5D/3D TP grid
VIRTUAL_DIMS = ("ep", "edp") + GRID_DIMS
__all__ = ["GRID_DIMS", "MESH_DIMS", "ORDER_DIMS", "VIRTUAL_DIMS", "GridSplit", "Mesh",
           "ParallelDims", "grid_split"]


@dataclass(frozen=True)
class Mesh:
    """Parallel degrees as a plan gives them; `dp` 0 means "auto" until resolved."""

    pp: int = 1
    dp: int = 0
    cp: int = 1
    tp: int = 1
    ep: int = 1
    order: tuple[str, ...] | None = None   # innermost first; None: the default layout

    def __post_init__(self) -> None:
        for dim in ("pp", "cp", "tp", "ep"):
            _degree(getattr(self, dim), f"mesh.{dim}")
        _degree(self.dp, "mesh.dp", 0, 'an integer >= 1 or "auto"')
        if self.order is not None and (
                not isinstance(self.order, tuple)
                or not all(isinstance(d, str) for d in self.order)
                or sorted(self.order) != sorted(ORDER_DIMS)):
            raise WorkloadError("mesh.order", list(self.order) if isinstance(
                self.order, tuple) else self.order, "a list of " + ", ".join(ORDER_DIMS)
                + " each once, innermost first (Megatron-LM's default: "
                + ", ".join(ORDER_DIMS) + ")")

    @property
    def outermost_first(self) -> tuple[str, ...]:
        """The order as ParallelDims takes it (outermost first, ep included)."""
        return MESH_DIMS if self.order is None else tuple(reversed(self.order))

    def resolved(self, world_size: int) -> "Mesh":
        """These degrees with `dp: auto` filled in, checked against the GPU count."""
        others = self.pp * self.cp * self.tp
        if self.dp == 0:
            if world_size % others:
                raise WorkloadError("mesh", f"pp*cp*tp={others}",
                                    f"a divisor of the topology's {world_size} GPUs")
            return replace(self, dp=world_size // others)
        if others * self.dp != world_size:
            raise WorkloadError("mesh", f"pp*dp*cp*tp={others * self.dp}",
                                f"the topology's GPU count ({world_size})")
        return self


@dataclass(frozen=True)
class ParallelDims:
    """The device mesh of a resolved plan: degrees, order, coordinates, groups, peers.

    Built with checked degrees (each failure names its factor, as torchtitan's
    ParallelDims does); `grid` is the TP grid of a 2D/2.5D/3D plan (None: 1D TP).
    """

    pp: int = 1
    dp: int = 1
    cp: int = 1
    tp: int = 1
    ep: int = 1
    grid: GridSplit | None = None
    order: tuple[str, ...] = MESH_DIMS   # outermost first; "ep" optional (inside dp)
    etp: int | None = None   # expert TP degree (None: tp); etp < tp: the expert mesh
    # (digit, size) of the rank number, outermost first: pp, cp, tp, ep and "edp" (the
    # part of dp outside its EP block, dp / ep values; ep 1 under the expert mesh)
    _digits: tuple[tuple[str, int], ...] = field(init=False, repr=False, compare=False)
    # Megatron's expert generator when etp < tp (None: EP folds into dp)
    expert_mesh: ExpertMesh | None = field(init=False, repr=False, compare=False)
    # group_ranks' answers: lowering asks for the same groups once per layer and
    # micro-batch (a 256-GPU MoE row: 3,868 calls, 6 % of its simulation, for a few dozen
    # distinct groups); the mesh is frozen, so an answer never changes
    _groups: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for dim in MESH_DIMS + ("ep",):
            _degree(getattr(self, dim), f"mesh.{dim}")
        if sorted(self.order) not in (sorted(MESH_DIMS), sorted(MESH_DIMS + ("ep",))):
            raise WorkloadError("mesh.order", self.order,
                                "each of " + ", ".join(MESH_DIMS) + " once (and ep at most "
                                "once), outermost first")
        etp = self.tp if self.etp is None else self.etp
        _degree(etp, "moe.etp")
        if etp == self.tp and self.dp % self.ep:
            raise WorkloadError("mesh.ep", self.ep, f"a divisor of dp ({self.dp}): expert "
                                "parallelism splits the data-parallel ranks into EP groups "
                                "(with moe.etp < mesh.tp it may span the TP ranks)")
        if self.grid is not None and math.prod(self.grid.axes) != self.tp:
            raise WorkloadError("mesh.tp", self.tp, f"the product of the {self.grid.mode} "
                                f"grid's axes ({'*'.join(map(str, self.grid.axes))})")
        order = list(self.order)
        if "ep" not in order:      # the EP block is the innermost part of dp
            order.insert(order.index("dp") + 1, "ep")
        expert = None if etp == self.tp else ExpertMesh.build(
            tuple(order), self.pp, self.dp, self.cp, self.tp, self.ep, etp)
        fold = self.ep if expert is None else 1   # ep's digit inside dp
        sizes = {"pp": self.pp, "dp": self.dp // fold, "cp": self.cp, "tp": self.tp,
                 "ep": fold}
        object.__setattr__(self, "_digits", tuple(
            ("edp" if d == "dp" else d, sizes[d]) for d in order))
        object.__setattr__(self, "expert_mesh", expert)
        object.__setattr__(self, "_groups", {})
        if expert is not None and self.pp > 1 and expert.place("pp") != self._digit_place("pp"):
            raise WorkloadError("mesh.order", list(reversed(self.order)), "pp outermost when "
                                "EP spans TP (Megatron-Core asserts that the expert mesh's "
                                "pipeline groups are the attention part's)")

    @property
    def _fold(self) -> int:
        """The EP digit inside dp: ep, or 1 when the expert mesh holds EP."""
        return self.ep if self.expert_mesh is None else 1

    @classmethod
    def from_plan(cls, plan) -> "ParallelDims":
        """The mesh of a resolved plan (mesh.dp a number; `resolve` fills it in), in the
        plan's `mesh.order` (the default layout when it gives none)."""
        mesh, experts = plan.mesh, plan.model.num_experts
        if mesh.dp == 0:
            raise ValueError(f"plan {plan.name!r} is not resolved (mesh.dp is auto): "
                             "call resolve(plan, world_size) first")
        mode = plan.grid_strategy
        grid = GridSplit.of(mode, mesh.tp, plan.tp_depth) if mode in GRID_SHAPES else None
        if experts:      # the expert TP degrees the MoE layer builds, before the mesh
            check_etp(plan.moe, mesh.tp)
        etp = plan.moe.etp_of(mesh.tp) if experts else None
        return cls(mesh.pp, mesh.dp, mesh.cp, mesh.tp, mesh.ep, grid, mesh.outermost_first,
                   etp)

    # ---- sizes ----------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        """Ranks in the mesh: pp * dp * cp * tp (ep folds into dp)."""
        return math.prod(getattr(self, dim) for dim in MESH_DIMS)

    def layout(self, dim: str) -> tuple[str, int, int]:
        """(parent mesh dim, stride, size) of a mesh dim or a virtual sub-dimension."""
        if dim in MESH_DIMS:
            return dim, 1, getattr(self, dim)
        if dim in EXPERT_DIMS and self.expert_mesh is not None:
            raise ValueError(f"{dim} belongs to the expert mesh (EP spans TP): no layout "
                             "inside one mesh dim")
        if dim == "ep":
            return "dp", 1, self.ep
        if dim == "edp":
            return "dp", self.ep, self.dp // self.ep
        x, y, z = self.grid.axes if self.grid else (self.tp, 1, 1)
        layouts = {"tpx": ("tp", 1, x), "tpy": ("tp", x, y), "tpz": ("tp", x * y, z)}
        if dim not in layouts:
            raise ValueError(f"unknown mesh dim {dim!r}: one of "
                             + ", ".join(MESH_DIMS + VIRTUAL_DIMS))
        return layouts[dim]

    def size(self, dim: str) -> int:
        """Ranks along a mesh dim or a virtual sub-dimension."""
        if self._in_expert_mesh((dim,)):
            return self.expert_mesh.size(dim)
        return self.layout(dim)[2]

    def group_size(self, dims: tuple[str, ...]) -> int:
        """Ranks in a group over `dims` (len(group_ranks(rank, dims)) for every rank)."""
        if self._in_expert_mesh(dims):
            return self.expert_mesh.group_size(dims)
        return math.prod(size for _, _, size in self._layouts(dims))

    def _in_expert_mesh(self, dims: tuple[str, ...]) -> bool:
        """Whether a group over `dims` is the expert mesh's: it names ep, edp or etp while
        EP spans TP (then only those may be named: the two meshes' digits differ)."""
        if self.expert_mesh is None or not set(dims) & set(EXPERT_DIMS):
            return False
        if not set(dims) <= set(EXPERT_DIMS):
            raise ValueError(f"mesh dims {dims} mix the expert mesh's (ep, edp, etp) with "
                             "the attention part's while EP spans TP")
        return True

    def _layouts(self, dims: tuple[str, ...]) -> list[tuple[str, int, int]]:
        """The layouts of `dims`; two that vary the same digit of a parent are an error."""
        out = [self.layout(d) for d in dims]
        for i, (parent, stride, size) in enumerate(out):
            for other, o_stride, o_size in out[:i]:
                if (parent == other and size > 1 and o_size > 1
                        and stride < o_stride * o_size and o_stride < stride * size):
                    raise ValueError(f"mesh dims {dims} overlap on {parent}")
        return out

    # ---- coordinates ----------------------------------------------------------------------
    def _digit_place(self, digit: str) -> int:
        """Place value of one digit (pp, cp, tp, ep, edp) of the rank number."""
        place = 1
        for d, size in reversed(self._digits):
            if d == digit:
                return place
            place *= size
        raise ValueError(f"unknown mesh dim {digit!r}: one of {', '.join(self.order)}")

    def _dp_contiguous(self) -> bool:
        """Whether dp's two digits (ep inside, edp outside) sit side by side in that
        order, so that dp is one digit of the rank number (always so without `order`)."""
        fold = self._fold
        return (fold == 1 or fold == self.dp
                or self._digit_place("edp") == self._digit_place("ep") * fold)

    def place_value(self, dim: str) -> int:
        """What one step along a mesh dim (pp, dp, cp, tp) adds to the rank number; dp has
        one only when the order keeps its EP block inside it (ValueError otherwise)."""
        if dim == "dp":
            if not self._dp_contiguous():
                raise ValueError(f"mesh.order {self.order} splits dp around other dims")
            return self._digit_place("ep" if self._fold > 1 else "edp")
        if dim not in MESH_DIMS:
            raise ValueError(f"unknown mesh dim {dim!r}: one of {', '.join(self.order)}")
        return self._digit_place(dim)

    def span(self, dim: str) -> tuple[int, int]:
        """[low, high) place values of a mesh dim or virtual sub-dim in the rank number:
        its coordinate is (rank // low) % (high // low). ValueError for dp when the order
        splits it (`spans` gives its two runs)."""
        if self._in_expert_mesh((dim,)):
            return self.expert_mesh.span(dim)
        if dim in ("ep", "edp"):
            low = self._digit_place(dim)
            return low, low * self.size(dim)
        parent, stride, size = self.layout(dim)
        low = self.place_value(parent) * stride
        return low, low * size

    def spans(self, dim: str) -> tuple[tuple[int, int], ...]:
        """The runs [low, high) of the rank number's digits a dim varies: one, except dp
        under an order that puts other dims between its EP block and the rest of it."""
        if dim == "dp" and not self._dp_contiguous():
            return (self.span("ep"), self.span("edp"))
        return (self.span(dim),)

    def coords(self, rank: int) -> dict[str, int]:
        """Mesh coordinates of a rank (the last digit of the order varies fastest)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside the mesh of {self.world_size}")
        digit: dict[str, int] = {}
        for d, size in reversed(self._digits):
            digit[d] = rank % size
            rank //= size
        return {"pp": digit["pp"], "dp": digit["ep"] + self._fold * digit["edp"],
                "cp": digit["cp"], "tp": digit["tp"]}

    def rank_of(self, coords: Mapping[str, int]) -> int:
        """Rank of mesh coordinates (one per mesh dim)."""
        for dim in MESH_DIMS:
            size = getattr(self, dim)
            if not 0 <= coords[dim] < size:
                raise ValueError(f"{dim} coordinate {coords[dim]} outside 0..{size - 1}")
        digit = {"pp": coords["pp"], "cp": coords["cp"], "tp": coords["tp"],
                 "ep": coords["dp"] % self._fold, "edp": coords["dp"] // self._fold}
        rank = 0
        for d, size in self._digits:
            rank = rank * size + digit[d]
        return rank

    def index(self, rank: int, dim: str) -> int:
        """A rank's position along a mesh dim or a virtual sub-dimension."""
        if self._in_expert_mesh((dim,)):
            return self.expert_mesh.index(rank, dim)
        parent, stride, size = self.layout(dim)
        return (self.coords(rank)[parent] // stride) % size

    def stage_of(self, rank: int) -> int:
        """Pipeline stage (rank class) of a rank."""
        return self.coords(rank)["pp"]

    def representative(self, stage: int) -> int:
        """The rank simulated for a stage in rank-class mode (every other coordinate 0)."""
        return self.rank_of({dim: stage if dim == "pp" else 0 for dim in MESH_DIMS})

    def stage_ranks(self, stage: int) -> tuple[int, ...]:
        """Every rank of a pipeline stage, in rank order."""
        others = tuple(dim for dim in MESH_DIMS if dim != "pp")
        return self.group_ranks(self.representative(stage), others)

    # ---- groups and peers -----------------------------------------------------------------
    def group_ranks(self, rank: int, dims: tuple[str, ...]) -> tuple[int, ...]:
        """Ranks that differ from `rank` only along `dims` (mesh or virtual), in rank order."""
        key = (rank, tuple(dims))
        if key not in self._groups:
            self._groups[key] = self._group_ranks(rank, key[1])
        return self._groups[key]

    def _group_ranks(self, rank: int, dims: tuple[str, ...]) -> tuple[int, ...]:
        if self._in_expert_mesh(dims):
            return self.expert_mesh.group(rank, dims)
        members = [self.coords(rank)]
        for parent, stride, size in self._layouts(dims):
            grown = []
            for c in members:
                index = c[parent]
                digit = (index // stride) % size
                grown.extend({**c, parent: index + (v - digit) * stride} for v in range(size))
            members = grown
        return tuple(sorted({self.rank_of(c) for c in members}))

    def peer(self, rank: int, dim: str, step: int) -> int:
        """The rank `step` places along `dim` from `rank`, wrapping around (a ring)."""
        if self._in_expert_mesh((dim,)):
            return self.expert_mesh.peer(rank, dim, step)
        parent, stride, size = self.layout(dim)
        c = self.coords(rank)
        digit = (c[parent] // stride) % size
        moved = (digit + step) % size
        return self.rank_of({**c, parent: c[parent] + (moved - digit) * stride})
