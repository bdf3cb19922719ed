"""Megatron's MoE flags <-> the plan's `moe` block (workloads/moe_options.py).

Flags of Megatron-LM core_v0.15.0 (megatron/training/arguments.py): the token dispatcher
(--moe-token-dispatcher-type, default allgather; flex with --moe-enable-deepep, or with
Megatron-Bridge's moe_flex_dispatcher_backend deepep, is DeepEP), expert TP
(--expert-tensor-parallel-size, default the TP size), capacity (--moe-expert-capacity-
factor, --moe-pad-expert-input-to-capacity), the force-balanced router
(--moe-router-force-load-balancing) and the load-balancing loss (--moe-aux-loss-coeff > 0).
"""
from __future__ import annotations

from typing import Any

from ..plan import Plan
from .findings import JobConfigError

FLAGS = ("moe-token-dispatcher-type", "moe-enable-deepep", "moe-flex-dispatcher-backend",
         "expert-tensor-parallel-size", "moe-expert-capacity-factor",
         "moe-pad-expert-input-to-capacity", "moe-router-force-load-balancing",
         "moe-aux-loss-coeff")


def _float(get, flag: str) -> float | None:
    value = get.str(flag)
    if isinstance(value, list):       # nargs='+': one value per load-balancing type
        value = max(value) if value else None
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise JobConfigError(get.name(flag), value, "a number") from None


def _dispatcher(get, findings) -> str:
    kind = get.str("moe-token-dispatcher-type", "allgather")
    if kind in ("alltoall", "allgather"):
        return kind
    backend = get.str("moe-flex-dispatcher-backend", "deepep" if get.on("moe-enable-deepep")
                      else None)
    if kind != "flex" or backend != "deepep":
        findings.problem(get.name("moe-token-dispatcher-type"), kind if kind != "flex" else
                         f"flex ({backend})", "a dispatcher other than alltoall, allgather "
                         "and DeepEP (simulated as DeepEP)")
    return "deepep"


def moe_block(get, tp: int, findings) -> dict[str, Any]:
    """The plan's `moe` object for an MoE model's flags (only keys off their default)."""
    out: dict[str, Any] = {}
    dispatcher = _dispatcher(get, findings)
    if dispatcher != "alltoall":
        out["dispatcher"] = dispatcher
    etp = get.int("expert-tensor-parallel-size")
    if etp is not None and etp != tp:
        out["etp"] = etp
    capacity = _float(get, "moe-expert-capacity-factor")
    if capacity is not None:
        out["capacity_factor"] = capacity
    if get.on("moe-pad-expert-input-to-capacity"):
        out["pad_to_capacity"] = True
    if get.on("moe-router-force-load-balancing"):
        out["force_balance"] = True
    if (_float(get, "moe-aux-loss-coeff") or 0.0) > 0:
        out["aux_loss"] = True
    return out


def moe_flags(plan: Plan) -> list[str]:
    """The flags of a plan's `moe` block (its scalar or measured imbalance has none)."""
    opt = plan.model.num_experts and plan.moe
    if not opt:
        return []
    out = {"alltoall": ["--moe-token-dispatcher-type alltoall"],
           "allgather": ["--moe-token-dispatcher-type allgather"],
           "deepep": ["--moe-token-dispatcher-type flex", "--moe-enable-deepep"]}[opt.dispatcher]
    out.append(f"--expert-tensor-parallel-size {opt.etp_of(plan.mesh.tp)}")
    if opt.capacity_factor is not None:
        out.append(f"--moe-expert-capacity-factor {opt.capacity_factor}")
    out += [flag for flag, on in (("--moe-pad-expert-input-to-capacity", opt.pad_to_capacity),
                                  ("--moe-router-force-load-balancing", opt.force_balance))
            if on]
    out.append(f"--moe-aux-loss-coeff {0.01 if opt.aux_loss else 0.0}")
    return out
