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
the expert data parallelism folded over cp x dp (an EP group may span cp ranks there);
here an EP group stays inside dp (expert data parallelism is edp x cp), so the two agree
whenever cp = 1.

Virtual sub-dimensions vary one "digit" (stride, size) of their parent's index:
  ep    blocks of ep consecutive dp indices (an expert-parallel group); ep folds into dp
        as in torchtitan, so it adds no ranks
  edp   the dp indices with the same position inside their EP block (expert data
        parallelism, dp / ep of them)
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

MESH_DIMS = ("pp", "dp", "cp", "tp")  # the default order, outermost first
ORDER_DIMS = ("tp", "cp", "ep", "dp", "pp")  # a plan's mesh.order: Megatron-LM's default,
                                             # innermost first
GRID_DIMS = ("tpx", "tpy", "tpz")   # the axes of a 2D/2.5D/3D TP grid
VIRTUAL_DIMS = ("ep", "edp") + GRID_DIMS

# TP grid strategies: the degree's shape each needs and the axes a stored activation's
# tokens are split over (its features go over tpx). tp3d_gather keeps activations 1/N
# (tokens over tpy and tpz), tp3d_allreduce replicates them over tpy (Bian et al. 2021).
_GRID_SHAPES = {"tp2d": "a square q*q", "tp2.5d": "d*q*q with d = {depth}",
                "tp3d_gather": "a cube q*q*q", "tp3d_allreduce": "a cube q*q*q"}
_GRID_TOKEN_AXES = {"tp2d": ("tpy",), "tp2.5d": ("tpy", "tpz"),
                    "tp3d_gather": ("tpy", "tpz"), "tp3d_allreduce": ("tpz",)}


def _degree(value, field_name: str, minimum: int = 1, allowed: str = "an integer >= 1") -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise WorkloadError(field_name, value, allowed)


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
class GridSplit:
    """A 2D/2.5D/3D TP grid: its axes (x, y, z) and how it splits a layer's tensors.

    Activations [tokens, features] are split over the token axes and over tpx (the
    feature axis); weights over x*y (2.5D: replicated over the depth z) or x*y*z (3D).
    """

    mode: str
    x: int
    y: int
    z: int

    @classmethod
    def of(cls, mode: str, tp: int, depth: int = 1) -> "GridSplit":
        """The grid of `mode` on `tp` ranks; names mesh.tp when tp has the wrong shape."""
        if mode not in _GRID_SHAPES:
            raise ValueError(f"not a grid strategy: {mode!r}")
        if mode.startswith("tp3d"):
            q = round(tp ** (1 / 3))
            axes = (q, q, q)
        else:
            if mode == "tp2.5d":
                _degree(depth, "tensor_parallel.depth")
            d = depth if mode == "tp2.5d" else 1
            q = round((tp // d) ** 0.5)
            axes = (q, q, d)
        if math.prod(axes) != tp:
            raise WorkloadError("mesh.tp", tp,
                                f"{_GRID_SHAPES[mode].format(depth=depth)} for {mode}")
        return cls(mode, *axes)

    @property
    def axes(self) -> tuple[int, int, int]:
        """(x, y, z) sizes of the tpx, tpy and tpz axes."""
        return self.x, self.y, self.z

    @property
    def q(self) -> int:
        """SUMMA block count (2D, 2.5D) or cube edge (3D)."""
        return self.x

    @property
    def depth(self) -> int:
        """The 2.5D depth d (1 for the other strategies)."""
        return self.z if self.mode == "tp2.5d" else 1

    @property
    def token_axes(self) -> tuple[str, ...]:
        """Grid axes a stored activation's tokens are split over."""
        return _GRID_TOKEN_AXES[self.mode]

    @property
    def feature_axis(self) -> str:
        """The grid axis a stored activation's features are split over."""
        return "tpx"

    @property
    def token_split(self) -> int:
        """Ways a stored activation's tokens are split."""
        sizes = {"tpx": self.x, "tpy": self.y, "tpz": self.z}
        return math.prod(sizes[axis] for axis in self.token_axes)

    @property
    def feature_split(self) -> int:
        """Ways a stored activation's features are split."""
        return self.x

    @property
    def weight_split(self) -> int:
        """Ways a weight is split (2.5D: q x q, replicated over the depth)."""
        return self.x * self.y if self.mode == "tp2.5d" else self.x * self.y * self.z

    @property
    def resid_fraction(self) -> float:
        """Fraction of an activation a rank stores: 1/N, or 1/N^(2/3) for tp3d_allreduce."""
        return 1.0 / (self.token_split * self.feature_split)


def grid_split(plan) -> GridSplit:
    """The TP grid of a resolved plan that uses a 2D/2.5D/3D strategy."""
    grid = plan.parallel_dims.grid
    if grid is None:
        raise ValueError(f"not a grid strategy: {plan.grid_strategy!r}")
    return grid


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
    # (digit, size) of the rank number, outermost first: pp, cp, tp, ep and "edp" (the
    # part of dp outside its EP block, dp / ep values)
    _digits: tuple[tuple[str, int], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for dim in MESH_DIMS + ("ep",):
            _degree(getattr(self, dim), f"mesh.{dim}")
        if sorted(self.order) not in (sorted(MESH_DIMS), sorted(MESH_DIMS + ("ep",))):
            raise WorkloadError("mesh.order", self.order,
                                "each of " + ", ".join(MESH_DIMS) + " once (and ep at most "
                                "once), outermost first")
        if self.dp % self.ep:
            raise WorkloadError("mesh.ep", self.ep, f"a divisor of dp ({self.dp}): expert "
                                "parallelism splits the data-parallel ranks into EP groups")
        if self.grid is not None and math.prod(self.grid.axes) != self.tp:
            raise WorkloadError("mesh.tp", self.tp, f"the product of the {self.grid.mode} "
                                f"grid's axes ({'*'.join(map(str, self.grid.axes))})")
        order = list(self.order)
        if "ep" not in order:      # the EP block is the innermost part of dp
            order.insert(order.index("dp") + 1, "ep")
        sizes = {"pp": self.pp, "dp": self.dp // self.ep, "cp": self.cp, "tp": self.tp,
                 "ep": self.ep}
        object.__setattr__(self, "_digits", tuple(
            ("edp" if d == "dp" else d, sizes[d]) for d in order))

    @classmethod
    def from_plan(cls, plan) -> "ParallelDims":
        """The mesh of a resolved plan (mesh.dp a number; `resolve` fills it in), in the
        plan's `mesh.order` (the default layout when it gives none)."""
        mesh = plan.mesh
        if mesh.dp == 0:
            raise ValueError(f"plan {plan.name!r} is not resolved (mesh.dp is auto): "
                             "call resolve(plan, world_size) first")
        mode = plan.grid_strategy
        grid = GridSplit.of(mode, mesh.tp, plan.tp_depth) if mode in _GRID_SHAPES else None
        return cls(mesh.pp, mesh.dp, mesh.cp, mesh.tp, mesh.ep, grid, mesh.outermost_first)

    # ---- sizes ----------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        """Ranks in the mesh: pp * dp * cp * tp (ep folds into dp)."""
        return math.prod(getattr(self, dim) for dim in MESH_DIMS)

    def layout(self, dim: str) -> tuple[str, int, int]:
        """(parent mesh dim, stride, size) of a mesh dim or a virtual sub-dimension."""
        if dim in MESH_DIMS:
            return dim, 1, getattr(self, dim)
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
        return self.layout(dim)[2]

    def group_size(self, dims: tuple[str, ...]) -> int:
        """Ranks in a group over `dims` (len(group_ranks(rank, dims)) for every rank)."""
        return math.prod(size for _, _, size in self._layouts(dims))

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
        return (self.ep == 1 or self.ep == self.dp
                or self._digit_place("edp") == self._digit_place("ep") * self.ep)

    def place_value(self, dim: str) -> int:
        """What one step along a mesh dim (pp, dp, cp, tp) adds to the rank number; dp has
        one only when the order keeps its EP block inside it (ValueError otherwise)."""
        if dim == "dp":
            if not self._dp_contiguous():
                raise ValueError(f"mesh.order {self.order} splits dp around other dims")
            return self._digit_place("ep" if self.ep > 1 else "edp")
        if dim not in MESH_DIMS:
            raise ValueError(f"unknown mesh dim {dim!r}: one of {', '.join(self.order)}")
        return self._digit_place(dim)

    def span(self, dim: str) -> tuple[int, int]:
        """[low, high) place values of a mesh dim or virtual sub-dim in the rank number:
        its coordinate is (rank // low) % (high // low). ValueError for dp when the order
        splits it (`spans` gives its two runs)."""
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
        return {"pp": digit["pp"], "dp": digit["ep"] + self.ep * digit["edp"],
                "cp": digit["cp"], "tp": digit["tp"]}

    def rank_of(self, coords: Mapping[str, int]) -> int:
        """Rank of mesh coordinates (one per mesh dim)."""
        for dim in MESH_DIMS:
            size = getattr(self, dim)
            if not 0 <= coords[dim] < size:
                raise ValueError(f"{dim} coordinate {coords[dim]} outside 0..{size - 1}")
        digit = {"pp": coords["pp"], "cp": coords["cp"], "tp": coords["tp"],
                 "ep": coords["dp"] % self.ep, "edp": coords["dp"] // self.ep}
        rank = 0
        for d, size in self._digits:
            rank = rank * size + digit[d]
        return rank

    def index(self, rank: int, dim: str) -> int:
        """A rank's position along a mesh dim or a virtual sub-dimension."""
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
        parent, stride, size = self.layout(dim)
        c = self.coords(rank)
        digit = (c[parent] // stride) % size
        moved = (digit + step) % size
        return self.rank_of({**c, parent: c[parent] + (moved - digit) * stride})
