"""The expert layers' own mesh when expert parallelism spans the tensor-parallel ranks.

Megatron-Core lays its expert layers out with a second rank generator over the same
ranks as the attention part (NVIDIA/Megatron-LM commit d98e8a64,
megatron/core/parallel_state.py, initialize_model_parallel): the attention part's
generator has sizes tp, cp, dp, pp; the experts' has tp = expert_tensor_parallel_size
(etp), ep = expert_model_parallel_size, cp = 1 and dp = expert data parallelism,
edp = world / (etp x ep x pp), both in the one `order` string (default
"tp-cp-ep-dp-pp", innermost first). So a pipeline stage's tp x cp x dp ranks are split
again as etp x ep x edp: with expert TP 1 under TP 2, an EP group runs through the TP
ranks first (it may be up to tp x cp x dp ranks), and expert data parallelism folds in
whatever of tp, cp and dp the EP group does not use. Megatron-Core asserts that the
pipeline groups of the two generators are the same (so pp stays outermost unless
edp = dp).

`ExpertMesh` is that second generator: the rank number read as mixed-radix digits pp,
edp, ep, etp in the order's places; a group over some of those digits is every rank
that differs only in them, as RankGenerator.get_ranks builds it.

The decoupled mesh is used when etp < tp; with etp = tp the expert mesh keeps EP inside
dp (workloads/mesh.py), which is the same rank layout whenever cp = 1.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import WorkloadError

EXPERT_DIMS = ("ep", "edp", "etp")
# what each dim of a plan's order becomes in the expert generator (cp has size 1 there)
_EXPERT_DIGIT = {"pp": "pp", "dp": "edp", "ep": "ep", "tp": "etp"}


@dataclass(frozen=True)
class ExpertMesh:
    """Megatron-Core's expert rank generator for one mesh: (digit, size) outermost
    first, over the digits pp, edp, ep and etp (module doc)."""

    digits: tuple[tuple[str, int], ...]

    @classmethod
    def build(cls, order: tuple[str, ...], pp: int, dp: int, cp: int, tp: int, ep: int,
              etp: int) -> "ExpertMesh":
        """The expert mesh of degrees pp, dp, cp, tp re-split as etp x ep x edp, in
        `order` (outermost first, ep included). Each impossible split names its factor."""
        stage = tp * cp * dp
        if stage % etp:
            raise WorkloadError("moe.etp", etp, f"a divisor of tp x cp x dp = {tp} x {cp} "
                                f"x {dp} = {stage} (the ranks the expert mesh re-splits)")
        if (stage // etp) % ep:
            raise WorkloadError("mesh.ep", ep, f"a divisor of tp x cp x dp / etp = {tp} x "
                                f"{cp} x {dp} / {etp} = {stage // etp}: Megatron-Core "
                                "re-splits a stage's tp x cp x dp ranks as etp x ep x edp "
                                "(expert data parallelism edp a whole number)")
        sizes = {"pp": pp, "edp": stage // (etp * ep), "ep": ep, "etp": etp}
        return cls(tuple((_EXPERT_DIGIT[d], sizes[_EXPERT_DIGIT[d]])
                         for d in order if d in _EXPERT_DIGIT))

    @property
    def world_size(self) -> int:
        """Ranks in the mesh (the attention part's world)."""
        total = 1
        for _, size in self.digits:
            total *= size
        return total

    def size(self, digit: str) -> int:
        """Ranks along one expert digit (pp, edp, ep, etp)."""
        return dict(self.digits)[self._known(digit)]

    def place(self, digit: str) -> int:
        """Place value of one digit of the rank number."""
        self._known(digit)
        value = 1
        for d, size in reversed(self.digits):
            if d == digit:
                return value
            value *= size
        raise AssertionError(digit)   # unreachable: _known checked it

    def span(self, digit: str) -> tuple[int, int]:
        """[low, high) place values of a digit: its coordinate is (rank // low) % (high //
        low)."""
        low = self.place(digit)
        return low, low * self.size(digit)

    def index(self, rank: int, digit: str) -> int:
        """A rank's position along one expert digit."""
        low, high = self.span(digit)
        return (rank // low) % (high // low)

    def group_size(self, dims: tuple[str, ...]) -> int:
        """Ranks in a group over `dims` (expert digits)."""
        total = 1
        for d in set(dims):
            total *= self.size(d)
        return total

    def group(self, rank: int, dims: tuple[str, ...]) -> tuple[int, ...]:
        """Ranks that differ from `rank` only in the expert digits `dims`, in rank order
        (RankGenerator.get_ranks of the expert generator)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside the mesh of {self.world_size}")
        members = [rank]
        for d in sorted(set(dims)):
            low, high = self.span(d)
            base = [m - self.index(m, d) * low for m in members]
            members = [b + v * low for b in base for v in range(high // low)]
        return tuple(sorted(members))

    def peer(self, rank: int, digit: str, step: int) -> int:
        """The rank `step` places along an expert digit from `rank`, wrapping around."""
        low, high = self.span(digit)
        here = self.index(rank, digit)
        return rank + ((here + step) % (high // low) - here) * low

    def _known(self, digit: str) -> str:
        if digit not in dict(self.digits):
            raise ValueError(f"unknown expert mesh dim {digit!r}: one of "
                             + ", ".join(d for d, _ in self.digits))
        return digit
