"""The axes of a 2D / 2.5D / 3D tensor-parallel grid (`GridSplit`) and the degree check
the mesh uses (workloads/mesh.py builds the mesh; this module splits its TP degree).

The axes tpx, tpy, tpz of a grid of sizes X, Y, Z: the rank at grid point (x, y, z) has
tp index x + X (y + Y z) (2D: Xu et al. 2021, arXiv:2104.05343; 2.5D: Wang et al. 2021,
arXiv:2105.14500; 3D: Bian et al. 2021, arXiv:2105.14450).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import WorkloadError

# TP grid strategies: the degree's shape each needs and the axes a stored activation's
# tokens are split over (its features go over tpx). tp3d_gather keeps activations 1/N
# (tokens over tpy and tpz), tp3d_allreduce replicates them over tpy (Bian et al. 2021).
GRID_SHAPES = {"tp2d": "a square q*q", "tp2.5d": "d*q*q with d = {depth}",
               "tp3d_gather": "a cube q*q*q", "tp3d_allreduce": "a cube q*q*q"}
_GRID_TOKEN_AXES = {"tp2d": ("tpy",), "tp2.5d": ("tpy", "tpz"),
                    "tp3d_gather": ("tpy", "tpz"), "tp3d_allreduce": ("tpz",)}


def check_degree(value, field_name: str, minimum: int = 1,
                 allowed: str = "an integer >= 1") -> None:
    """A parallel degree: an integer >= minimum, else WorkloadError naming it."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise WorkloadError(field_name, value, allowed)


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
        if mode not in GRID_SHAPES:
            raise ValueError(f"not a grid strategy: {mode!r}")
        if mode.startswith("tp3d"):
            q = round(tp ** (1 / 3))
            axes = (q, q, q)
        else:
            if mode == "tp2.5d":
                check_degree(depth, "tensor_parallel.depth")
            d = depth if mode == "tp2.5d" else 1
            q = round((tp // d) ** 0.5)
            axes = (q, q, d)
        if math.prod(axes) != tp:
            raise WorkloadError("mesh.tp", tp,
                                f"{GRID_SHAPES[mode].format(depth=depth)} for {mode}")
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


def activation_fraction_3d(n: int, design: int = 1) -> float:
    """Activation memory of a 3D tensor-parallel linear layer, relative to one device (the
    3D tensor-parallel designs, Bian et al. 2021, arXiv:2105.14450).

    Design 1 (all-gather the input, reduce-scatter the output): 1/N. Design 2 (all-reduce the
    output): 1/N^(2/3). N must be a cube q^3 (a q x q x q device cube).
    """
    q = round(n ** (1 / 3))
    if n < 1 or q ** 3 != n:
        raise ValueError(f"3D tensor parallelism needs a cube number of devices, got {n}")
    if design == 1:
        return 1.0 / n
    if design == 2:
        return 1.0 / q ** 2   # 1 / N^(2/3)
    raise ValueError(f"design must be 1 or 2, got {design}")
