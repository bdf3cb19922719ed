"""Megatron's MoE flags <-> the plan's `moe` block (workloads/moe_options.py).

Flags of Megatron-LM core_v0.15.0 (megatron/training/arguments.py): the token dispatcher
(--moe-token-dispatcher-type, default allgather; flex with --moe-enable-deepep, or with
--moe-flex-dispatcher-backend deepep | hybridep (Megatron-Bridge's
moe_flex_dispatcher_backend), is the deepep dispatcher with those kernels), expert TP
(--expert-tensor-parallel-size, default the TP size), capacity (--moe-expert-capacity-
factor, --moe-pad-expert-input-to-capacity), the SMs of the flex dispatcher's kernels
(--moe-deepep-num-sms; a Bridge YAML's model.moe_hybridep_num_sms for HybridEP, or the
later moe_flex_dispatcher_num_sms, which wins), the force-balanced router
(--moe-router-force-load-balancing), the load-balancing loss (--moe-aux-loss-coeff > 0), and
the EP all-to-all overlap (--overlap-moe-expert-parallel-comm, --delay-wgrad-compute: both
store_true switches, default off; Megatron-Core's TransformerConfig fields of the same names,
which Megatron-Bridge v0.6.0 also writes under comm_overlap).
"""
from __future__ import annotations

from typing import Any

from ..moe_options import FLEX_BACKENDS, FLEX_DEFAULT_SMS
from ..precision import recipe_dtypes
from ..plan import Plan
from .findings import JobConfigError

FLAGS = ("moe-token-dispatcher-type", "moe-enable-deepep", "moe-flex-dispatcher-backend",
         "moe-deepep-num-sms", "moe-hybridep-num-sms", "moe-flex-dispatcher-num-sms",
         "expert-tensor-parallel-size", "moe-expert-capacity-factor",
         "moe-pad-expert-input-to-capacity", "moe-router-force-load-balancing",
         "moe-aux-loss-coeff", "overlap-moe-expert-parallel-comm", "delay-wgrad-compute")
OVERLAP, DELAY = "overlap-moe-expert-parallel-comm", "delay-wgrad-compute"
# Transformer Engine's op fuser for the routed experts (Megatron-LM after core_v0.15.0:
# use_transformer_engine_op_fuser, which Megatron-LM's MXFP8 MoE recipes set at e5ad09802d
# with NVTE_CUTEDSL_FUSED_GROUPED_MLP=1 in their environment): the plan's moe.fused_mlp.
# The environment variable is not a flag; a job that sets the flag without it runs TE's
# ops unfused, which the plan cannot say.
OP_FUSER = "use-transformer-engine-op-fuser"


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


def _flex_sms(get, backend: str) -> int | None:
    """The SMs of the flex dispatcher's `backend` kernels: moe_flex_dispatcher_num_sms
    (Megatron-Core after core_v0.15.0), else that backend's own knob (moe_deepep_num_sms,
    moe_hybridep_num_sms: each applied to its own backend before the unified knob, so a
    written-out config may carry both, DeepEP's at its default 20)."""
    unified = get.int("moe-flex-dispatcher-num-sms")
    return unified if unified is not None else get.int(f"moe-{backend}-num-sms")


def _dispatcher(get, findings) -> tuple[str, str]:
    """The plan's dispatcher and, for the flex dispatcher, its kernels (deepep | hybridep:
    moe.flex_backend, workloads/moe/ep_rdma.py)."""
    kind = get.str("moe-token-dispatcher-type", "allgather")
    if kind in ("alltoall", "allgather"):
        return kind, "deepep"
    backend = get.str("moe-flex-dispatcher-backend", "deepep" if get.on("moe-enable-deepep")
                      else None)
    if kind != "flex" or backend not in FLEX_BACKENDS:
        findings.problem(get.name("moe-token-dispatcher-type"), kind if kind != "flex" else
                         f"flex ({backend})", "a dispatcher other than alltoall, allgather, "
                         "DeepEP and HybridEP (simulated as DeepEP)")
        return "deepep", "deepep"
    return "deepep", backend


def moe_block(get, tp: int, findings, dtype: str) -> dict[str, Any]:
    """The plan's `moe` object for an MoE model's flags (only keys off their default);
    `dtype` the plan's training dtype (the fused grouped MLP needs a block-scaled one)."""
    out: dict[str, Any] = {}
    dispatcher, backend = _dispatcher(get, findings)
    if dispatcher != "alltoall":
        out["dispatcher"] = dispatcher
    if backend != "deepep":
        out["flex_backend"] = backend
    sms = _flex_sms(get, backend)
    if dispatcher == "deepep" and sms is not None and sms != FLEX_DEFAULT_SMS[backend]:
        out["flex_num_sms"] = sms
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
    if get.on(OVERLAP):
        out["overlap_a2a"] = True
    if get.on(DELAY):
        out["delay_wgrad"] = True
    if get.on(OP_FUSER) and dtype in recipe_dtypes("fused_grouped_mlp"):
        out["fused_mlp"] = True
    elif get.on(OP_FUSER):   # TE fuses the grouped MLP only for block-scaled operands
        findings.ignore(get.name(OP_FUSER), f"training dtype {dtype}: the fused grouped MLP "
                                            "needs mxfp8 or nvfp4 (TE runs its ops unfused)")
    return out


def check_a2a_overlap_flags(get, plan: dict, spec) -> None:
    """Megatron's refusals of --overlap-moe-expert-parallel-comm / --delay-wgrad-compute,
    as one JobConfigError naming the flag (exit 2), where the plan would refuse
    moe.overlap_a2a / moe.delay_wgrad (workloads/moe_options.py, check_a2a_overlap).

    The asserts are TransformerConfig.__post_init__'s (NVIDIA/Megatron-LM core_v0.15.0,
    megatron/core/transformer/transformer_config.py): delay_wgrad_compute needs
    overlap_moe_expert_parallel_comm; that needs expert_model_parallel_size > 1, a virtual
    pipeline size when pipeline_model_parallel_size > 1, the alltoall or flex dispatcher, no
    full recompute and no recompute method or layer count, a bf16/fp16 model, at most one
    MTP layer. Megatron-Bridge v0.6.0 (training/comm_overlap.py) also asserts experts."""
    if get.on(DELAY) and not get.on(OVERLAP):
        raise JobConfigError(get.name(DELAY), True, f"absent unless {get.name(OVERLAP)} is "
                             "given (Megatron-Core asserts overlap_moe_expert_parallel_comm)")
    if not get.on(OVERLAP):
        return
    why = _overlap_refusal(get, plan, spec)
    if why:
        raise JobConfigError(get.name(OVERLAP), True, f"absent {why}")


def _overlap_refusal(get, plan: dict, spec) -> str | None:
    mesh, pipe = plan["mesh"], plan["pipeline"]
    if not spec.num_experts:
        return "for a dense model (it overlaps the expert all-to-alls; --num-experts is unset)"
    if mesh["ep"] < 2:
        return "unless --expert-model-parallel-size > 1 (Megatron-Core asserts EP)"
    if plan.get("moe", {}).get("dispatcher", "alltoall") == "allgather":
        return ("unless --moe-token-dispatcher-type is alltoall or flex (Megatron-Core asserts; "
                "the flag's default is allgather)")
    if mesh["pp"] > 1 and pipe["virtual_stages"] < 2:
        return ("with --pipeline-model-parallel-size > 1 unless virtual pipeline stages are "
                "given (Megatron-Core asserts a virtual pipeline size)")
    if plan["recompute"] == "full":
        return "with --recompute-granularity full (Megatron-Core asserts no full recompute)"
    for flag in ("recompute-method", "recompute-num-layers"):
        if get.str(flag) is not None:
            return f"with {get.name(flag)} (Megatron-Core asserts it is unset)"
    if not (get.on("bf16") or get.on("fp16")):
        return "without --bf16 (Megatron-Core asserts a bf16 or fp16 model)"
    if spec.mtp_layers > 1:
        return "with --mtp-num-layers > 1 (Megatron-Core asserts at most one MTP layer)"
    if plan["fsdp"]["enabled"]:
        megatron = plan["fsdp"]["version"] == "megatron"
        flag = "--use-megatron-fsdp" if megatron else "--use-torch-fsdp2"
        return f"with {flag} (the combined schedule is not modelled with FSDP)"
    return None


def moe_flags(plan: Plan) -> list[str]:
    """The flags of a plan's `moe` block (its scalar or measured imbalance has none)."""
    opt = plan.model.num_experts and plan.moe
    if not opt:
        return []
    out = {"alltoall": ["--moe-token-dispatcher-type alltoall"],
           "allgather": ["--moe-token-dispatcher-type allgather"],
           "deepep": ["--moe-token-dispatcher-type flex", "--moe-enable-deepep"]}[opt.dispatcher]
    if opt.dispatcher == "deepep" and opt.flex_backend != "deepep":
        out[-1] = f"--moe-flex-dispatcher-backend {opt.flex_backend}"
    if opt.flex_num_sms and opt.flex_backend == "deepep":   # core_v0.15.0's only SM flag
        out.append(f"--moe-deepep-num-sms {opt.flex_num_sms}")
    out.append(f"--expert-tensor-parallel-size {opt.etp_of(plan.mesh.tp)}")
    if opt.capacity_factor is not None:
        out.append(f"--moe-expert-capacity-factor {opt.capacity_factor}")
    out += [flag for flag, on in (("--moe-pad-expert-input-to-capacity", opt.pad_to_capacity),
                                  ("--moe-router-force-load-balancing", opt.force_balance))
            if on]
    out.append(f"--moe-aux-loss-coeff {0.01 if opt.aux_loss else 0.0}")
    out += [flag for flag, on in (("--overlap-moe-expert-parallel-comm", opt.overlap_a2a),
                                  ("--delay-wgrad-compute", opt.delay_wgrad),
                                  (f"--{OP_FUSER}", opt.fused_mlp)) if on]
    return out
