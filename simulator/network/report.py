"""nccl-tests-style tables of the collective model (`python -m simulator collective`).

Rows predict nccl-tests' out-of-place figure (the closed-form time on idle links; NCCL
runs in-place the same way, nccl-tests reports both). Sizes follow nccl-tests: `-b 1K -e 8G -f 2` is `parse_sizes("1K:8G")`; K/M/G are powers
of 1024 as in nccl-tests. Rows report algbw = S / t and busbw = algbw x bus factor
(doc/PERFORMANCE.md), in GB/s of 1e9 bytes.
"""
from __future__ import annotations

import re

from inputs import decimal
from workloads.mesh import ParallelDims

from .collectives import CollectiveModel, CommOptions
from .constants import bus_factor

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d{1,19})\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE | re.ASCII)
# Mesh dimensions of a `--group` expression, outermost first. tp is innermost
# (consecutive ranks) as in plans; unlike plans (pp outermost) dp comes first here, so
# that "dp=4" on a 4-node cluster means one rank per node.
MESH_ORDER = ("dp", "pp", "cp", "ep", "tp")
# Largest message of a table: 1 TiB, 128 x nccl-tests' usual 8 GiB maximum (-e 8G); and
# at most 64 sizes (1 B to 1 TiB doubling is 41).
MAX_SIZE_BYTES = 1 << 40
MAX_SIZES = 64


def parse_size(text: str) -> int:
    """'64K' -> 65536; a plain number is bytes."""
    m = _SIZE.match(text)
    if not m or len(m[1]) > 20:
        raise ValueError(f"size {text!r}: expected a number with an optional K/M/G/T suffix")
    size = int(m[1]) * _UNITS[m[2].upper()]
    if not 1 <= size <= MAX_SIZE_BYTES:
        raise ValueError(f"size {text!r}: expected 1 B to {MAX_SIZE_BYTES >> 40} TiB")
    return size


def parse_sizes(expr: str) -> list[int]:
    """'1K:8G' -> 1K, 2K, 4K, ... 8G (x2 steps, like nccl-tests -f 2); 'A:B:F' steps by
    factor F; a comma list gives those sizes."""
    if "," in expr:
        sizes = [parse_size(p) for p in expr.split(",") if p.strip()]
        if not 1 <= len(sizes) <= MAX_SIZES:
            raise ValueError(f"sizes {expr!r}: expected 1 to {MAX_SIZES} sizes")
        return sizes
    parts = expr.split(":")
    if len(parts) == 1:
        return [parse_size(parts[0])]
    if len(parts) > 3:
        raise ValueError(f"sizes {expr!r}: expected MIN:MAX or MIN:MAX:FACTOR")
    lo, hi = parse_size(parts[0]), parse_size(parts[1])
    factor = decimal(parts[2].strip(), 9) if len(parts) == 3 else 2
    if factor is None:
        raise ValueError(f"sizes {expr!r}: FACTOR must be an integer >= 2")
    if lo <= 0 or hi < lo or factor < 2:
        raise ValueError(f"sizes {expr!r}: need 0 < MIN <= MAX and FACTOR >= 2")
    sizes, s = [], lo
    while s <= hi:
        sizes.append(s)
        s *= factor
    return sizes


def group_ranks(topology, expr: str | int) -> tuple[int, ...]:
    """Ranks of a group: a count ('32' = ranks 0..31) or a mesh expression.

    Mesh expressions name dimensions, e.g. 'tp=8', 'dp=4', 'pp=4,tp=8'. The group is the
    first named dimension's group that contains rank 0. Dimensions are laid out
    dp, pp, cp, ep, tp from outermost to innermost (tp = consecutive ranks); unnamed
    dimensions are 1, except that what is left of the world goes to tp when tp is not
    named, else to dp. So on 32 GPUs 'tp=8' is ranks 0..7 and 'dp=4' is 0, 8, 16, 24
    (one per domain when tp=8 fills a domain).
    """
    world = topology.world_size
    text = str(expr).strip()
    if text.isdecimal():
        n = decimal(text, 20) or 0
        if not 1 <= n <= world:
            raise ValueError(f"group {text}: expected 1..{world} ranks")
        return tuple(range(n))
    dims: dict[str, int] = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        key = key.strip().lower()
        n = decimal(value.strip(), 9)
        if key not in MESH_ORDER or key in dims or n is None or not 1 <= n <= world:
            raise ValueError(f"group {text!r}: expected a rank count or DIM=N[,DIM=N] with "
                             f"each DIM once, in {', '.join(MESH_ORDER)}, N in 1..{world}")
        dims[key] = n
    named = next(iter(dims))
    product = 1
    for v in dims.values():
        product *= v
    if world % product:
        raise ValueError(f"group {text!r}: {product} ranks do not divide the world of {world}")
    sizes = {d: dims.get(d, 1) for d in MESH_ORDER}
    sizes["tp" if "tp" not in dims else "dp"] *= world // product
    # The plans' mesh geometry in this layout: ep is the EP block inside dp there, so dp
    # here is the rest of it ("edp"). The group is the named count of its ranks: what is
    # left of the world extends dp outward, past the named dp ranks.
    mesh = ParallelDims(pp=sizes["pp"], dp=sizes["dp"] * sizes["ep"], cp=sizes["cp"],
                        tp=sizes["tp"], ep=sizes["ep"], order=MESH_ORDER)
    return mesh.group_ranks(0, ("edp" if named == "dp" else named,))[:dims[named]]


def collective_table(topology, op: str, ranks: tuple[int, ...], sizes: list[int],
                     options: CommOptions = CommOptions()) -> list[dict]:
    """One nccl-tests-like row per size: size, time, algbw, busbw, and why it costs that:
    NCCL's algorithm, protocol and channels, and the time split into latency (NCCL's
    per-step latencies, plus the host floor of nccl-tests -g N), pipeline fill (NVLS) and
    bandwidth (the bytes on the links)."""
    model = CollectiveModel(topology, options)
    factor = bus_factor(op, len(ranks))
    rows = []
    for size in sizes:
        plan = model.plan(op, tuple(ranks), size)
        t = plan.closed_form_s
        algbw = size / t / 1e9 if t > 0 else 0.0
        rows.append({"size_bytes": int(size), "time_us": float(t * 1e6),
                     "algbw_GBps": float(algbw), "busbw_GBps": float(algbw * factor),
                     "algorithm": plan.algorithm, "protocol": plan.protocol,
                     "channels": int(plan.channels),
                     "latency_us": float((plan.latency_s - plan.fill_s) * 1e6),
                     "fill_us": float(plan.fill_s * 1e6),
                     "bandwidth_us": float(plan.transfer_s * 1e6),
                     "host_floor_us": float(plan.floor_s * 1e6),
                     "chunk_bytes": int(plan.chunk_bytes)})
    return rows
