"""Megatron-LM's recompute flags -> the plan's recompute and recompute_modules.

core_v0.15.0's megatron/training/arguments.py: --recompute-granularity selective (or
--recompute-activations) checkpoints the modules of --recompute-modules, default
["core_attn"]: the attention core is the plan's "selective", the other modules the plan
models are its recompute_modules (workloads/module_recompute.py); a list without core_attn
recomputes no attention core (recompute "none"). --recompute-granularity full is the plan's
"full" (megatron.py reads its method and layer count).
"""
from __future__ import annotations

from typing import Any

from ..module_recompute import RECOMPUTE_MODULES
from .findings import Findings, need_choice

CORE_ATTN = "core_attn"


def recompute_fields(get, findings: Findings) -> dict[str, Any]:
    """The plan's recompute (and recompute_modules, where the flags list any it models)."""
    granularity = get.str("recompute-granularity")
    if granularity is None and get.on("recompute-activations"):
        granularity = "selective"
    if granularity is None:
        return {"recompute": "none"}
    need_choice(granularity, get.name("recompute-granularity"), ("full", "selective"))
    if granularity == "full":
        return {"recompute": "full"}
    modules = get.str("recompute-modules", [CORE_ATTN])
    modules = modules if isinstance(modules, list) else [modules]
    unknown = [m for m in modules if m != CORE_ATTN and m not in RECOMPUTE_MODULES]
    if unknown:
        findings.problem(get.name("recompute-modules"), unknown, "recompute of modules the "
                         f"simulator does not model (it models {CORE_ATTN}, "
                         + ", ".join(RECOMPUTE_MODULES) + ")")
    fields: dict[str, Any] = {"recompute": "selective" if CORE_ATTN in modules else "none"}
    known = [m for m in modules if m in RECOMPUTE_MODULES]
    if known:
        fields["recompute_modules"] = known
    return fields


def recompute_module_flags(plan) -> list[str]:
    """The selective-recompute flags of a plan with recompute_modules (none without)."""
    if not plan.recompute_modules:
        return []
    core = [CORE_ATTN] if plan.recompute == "selective" else []
    return ["--recompute-granularity selective",
            "--recompute-modules " + " ".join(core + list(plan.recompute_modules))]
