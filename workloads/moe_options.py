"""The plan's `moe` block: how an MoE layer dispatches, splits and routes its tokens.

    "moe": {"dispatcher": "alltoall" | "allgather" | "deepep",
            "flex_backend": "deepep" | "hybridep",   # the deepep dispatcher's kernels
            "flex_num_sms": 32,             # SMs its kernels hold (default by backend)
            "etp": 1,                       # expert tensor parallelism (default: mesh.tp)
            "capacity_factor": 1.25,        # default none: dropless
            "pad_to_capacity": false,
            "load_imbalance": 1.2 | [shares...] | {"distribution": "measured", "shares": [...]},
            "force_balance": false,
            "gate": "router" | "round_robin",  # round_robin: AutoModel's fake balanced gate
            "aux_loss": false,
            "overlap_a2a": false,           # EP all-to-all overlap (combined 1F1B)
            "delay_wgrad": false,           # wgrads after the dgrads (needs overlap_a2a)
            "fused_mlp": false}             # TE's fused grouped MLP (block-scaled FP8/FP4)

Defaults follow Megatron-Core (NVIDIA/Megatron-LM, commit d98e8a64):
- dispatcher: "alltoall". Megatron-Core's TransformerConfig default is "allgather"
  (megatron/core/transformer/transformer_config.py, moe_token_dispatcher_type), but its MoE
  guide recommends alltoall whenever EP > 1 (megatron/core/transformer/moe/README.md,
  "Set token dispatcher" and the dispatcher table), which is what expert-parallel runs use;
  "allgather" is one key away.
- etp: None means mesh.tp (model_parallel_config.py: expert_tensor_parallel_size None "will
  be set to the value of tensor_model_parallel_size"; training/arguments.py does the same).
- capacity_factor None: dropless (transformer_config.py moe_expert_capacity_factor None, "no
  token will be dropped"); pad_to_capacity False (moe_pad_expert_input_to_capacity).
- aux_loss False: moe_aux_loss_coeff defaults to 0.0, and the router skips the loss at 0
  (megatron/core/transformer/moe/router.py, get_aux_loss_coeff / "if aux_loss_coeff == 0").
- force_balance: Megatron's --moe-router-force-load-balancing (router.py: random logits
  replace the router's, "only for benchmark"); a published run that used it routes
  uniformly at random (workloads/moe/imbalance.py prices what that leaves).

- gate: "router" (default), the learned router (a d x E GEMM, softmax, top-k), or
  "round_robin", NeMo AutoModel's FakeBalancedGate for benchmarks (NVIDIA-NeMo/Automodel
  nemo_automodel/components/moe/layers.py at 89e3a9fdd, class FakeBalancedGate, selected
  by its BackendConfig's fake_balanced_gate): no router GEMM and no parameters; weights
  1/k from torch.ones and expert indices arange(T k).view(T, k) % E, so slot i of the
  flattened token-by-choice grid goes to expert i mod E. Every expert gets exactly its
  share, and a token's k experts are consecutive, so it reaches fewer EP ranks and nodes
  than random routing would (workloads/moe/group_routing.py round_robin_hit).

- flex_num_sms: Megatron-Core's moe_flex_dispatcher_num_sms (the deprecated
  moe_deepep_num_sms / moe_hybridep_num_sms route to it), the SMs the fused dispatch and
  combine kernels run on; compute beside them keeps the rest (simulator/sm_share.py). None:
  the backend's default, DeepEP 20 (megatron/core/transformer/moe/token_dispatcher.py,
  _DeepepManager: "None -> 20"), HybridEP 32 (HybridEpBuffer's num_sms_dispatch_api and
  num_sms_combine_api defaults, deepseek-ai/DeepEP@017a5202 deep_ep/hybrid_ep_buffer.py;
  Megatron-Bridge sets 32 for every HybridEP perf recipe, scripts/performance/utils/
  overrides.py since c3e43e6aa, December 2025, and perf_recipes/_common.py).

- overlap_a2a: Megatron-Core's overlap_moe_expert_parallel_comm (model_parallel_config.py,
  default False): one micro-batch's forward runs interleaved with another's backward, layer
  by layer, so that each one's dispatch and combine all-to-alls hide behind the other's
  compute (workloads/moe/a2a_overlap.py prices it as task order; workloads/schedules.py
  the schedule it needs). delay_wgrad: its delay_wgrad_compute (default False; it
  asserts overlap_moe_expert_parallel_comm, transformer_config.py __post_init__).

- fused_mlp: Transformer Engine's fused grouped MLP (transformer_engine/pytorch/ops/fused/
  grouped_mlp.py, GroupedMLP_CuTeGEMMGLU at NVIDIA/TransformerEngine d0067d0d), which
  Megatron-Core runs for the routed experts when use_transformer_engine_op_fuser is on and
  NVTE_CUTEDSL_FUSED_GROUPED_MLP=1 (default off): cuDNN's sm100 grouped GEMM kernels with
  the gated activation (SwiGLU, or GPT-OSS's clamped variant) and its block-scaled output
  quantization in the first GEMM's epilogue, and the activation's backward in the second
  GEMM's data-gradient epilogue (workloads/moe/layer.py prices what that removes). Only
  under MXFP8 or NVFP4 (the kernels take MXFP8Quantizer / NVFP4Quantizer operands, which
  only Blackwell's tensor cores run: simulator/api.py check_dtype), gated experts, and
  Transformer Engine frameworks.

The scalar `load_imbalance` stays the Plan field it always was; a distribution goes here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inputs import finite

from .errors import WorkloadError
from .fields import check_bool, check_choice, check_number, int_as_float, is_int, known_keys
from .framework_traits import frameworks_with, traits
from .precision import recipe_dtypes

DISPATCHERS = ("alltoall", "allgather", "deepep")
# Megatron-Core's flex dispatcher backends (moe_flex_dispatcher_backend): the plan's
# "deepep" dispatcher runs DeepEP's or NVIDIA's HybridEP kernels; they share the design
# (NVLink within a node, RDMA across) but measure different RDMA rates (moe/ep_rdma.py).
FLEX_BACKENDS = ("deepep", "hybridep")
DISTRIBUTIONS = ("measured",)
GATES = ("router", "round_robin")
MOE_KEYS = ("load_imbalance", "dispatcher", "etp", "capacity_factor", "pad_to_capacity",
            "force_balance", "gate", "aux_loss", "overlap_a2a", "delay_wgrad", "flex_backend",
            "fused_mlp", "flex_num_sms")
# SMs the fused dispatcher's kernels run on by default, per backend (module docstring).
FLEX_DEFAULT_SMS = {"deepep": 20, "hybridep": 32}
MAX_FLEX_SMS = 1024     # beyond any GPU's SM count (GB300: 160)
# Bounds: a capacity factor past the number of experts keeps every token anyway (an expert
# can receive at most all tokens); 4096 shares is beyond any published router (256 experts).
MAX_CAPACITY_FACTOR = 1024.0
MAX_SHARES = 4096


@dataclass(frozen=True)
class MoEOptions:
    """The `moe` block besides the scalar load imbalance (Plan.load_imbalance)."""

    dispatcher: str = "alltoall"
    etp: int | None = None                  # expert TP degree; None: the plan's mesh.tp
    capacity_factor: float | None = None    # None: dropless routing
    pad_to_capacity: bool = False
    expert_shares: tuple[float, ...] | None = None   # measured token share per expert
    force_balance: bool = False
    gate: str = "router"                    # or "round_robin" (module docstring)
    aux_loss: bool = False
    overlap_a2a: bool = False               # combined 1F1B (workloads/moe/a2a_overlap.py)
    delay_wgrad: bool = False               # wgrads after the layer's dgrads (needs it)
    flex_backend: str = "deepep"            # the deepep dispatcher's kernels
    fused_mlp: bool = False                 # TE's fused grouped MLP (module docstring)
    flex_num_sms: int | None = None         # None: FLEX_DEFAULT_SMS[flex_backend]

    def __post_init__(self) -> None:
        check_choice(self.dispatcher, "moe.dispatcher", DISPATCHERS)
        check_choice(self.flex_backend, "moe.flex_backend", FLEX_BACKENDS)
        check_choice(self.gate, "moe.gate", GATES)
        if self.flex_backend != "deepep" and self.dispatcher != "deepep":
            raise WorkloadError("moe.flex_backend", self.flex_backend, '"deepep" unless '
                                'moe.dispatcher is "deepep" (the fused dispatcher\'s kernels)')
        if self.flex_num_sms is not None:
            if not is_int(self.flex_num_sms) or not 1 <= self.flex_num_sms <= MAX_FLEX_SMS:
                raise WorkloadError("moe.flex_num_sms", self.flex_num_sms,
                                    f"an integer in 1..{MAX_FLEX_SMS} or null (the backend's "
                                    "default)")
            if self.dispatcher != "deepep":
                raise WorkloadError("moe.flex_num_sms", self.flex_num_sms, "null unless "
                                    'moe.dispatcher is "deepep" (the fused dispatcher\'s '
                                    "kernels)")
        if self.etp is not None and (not is_int(self.etp) or self.etp < 1):
            raise WorkloadError("moe.etp", self.etp, "an integer >= 1 (1 or mesh.tp)")
        if self.capacity_factor is not None:
            check_number(self.capacity_factor, "moe.capacity_factor", 1e-3, MAX_CAPACITY_FACTOR,
                         f"a number in (0, {MAX_CAPACITY_FACTOR:g}] or null (dropless)")
        for name in ("pad_to_capacity", "force_balance", "aux_loss", "overlap_a2a",
                     "delay_wgrad", "fused_mlp"):
            check_bool(getattr(self, name), f"moe.{name}")
        if self.delay_wgrad and not self.overlap_a2a:
            raise WorkloadError("moe.delay_wgrad", True, "false unless moe.overlap_a2a is true "
                                "(Megatron-Core: delay_wgrad_compute needs "
                                "overlap_moe_expert_parallel_comm)")
        if self.overlap_a2a and self.dispatcher == "allgather":
            raise WorkloadError("moe.overlap_a2a", True, "false with the allgather dispatcher "
                                "(Megatron-Core overlaps the alltoall and flex dispatchers "
                                "only)")
        if self.pad_to_capacity and self.capacity_factor is None:
            raise WorkloadError("moe.pad_to_capacity", True,
                                "false unless moe.capacity_factor is set (Megatron-LM: "
                                "padding needs a capacity)")
        if self.pad_to_capacity and self.dispatcher != "alltoall":
            raise WorkloadError("moe.pad_to_capacity", True,
                                "false unless moe.dispatcher is alltoall (Megatron-LM pads "
                                "in MoEAlltoAllTokenDispatcher only)")
        if self.gate == "round_robin":
            if self.capacity_factor is not None:
                raise WorkloadError("moe.capacity_factor", self.capacity_factor, 'null with '
                                    'moe.gate "round_robin" (its experts get exactly their '
                                    "share: nothing to drop)")
            for name in ("force_balance", "aux_loss"):
                if getattr(self, name):
                    raise WorkloadError(f"moe.{name}", True, 'false with moe.gate '
                                        '"round_robin" (a fixed gate: no router to '
                                        'balance)')
            if self.expert_shares is not None:
                raise WorkloadError("moe.load_imbalance", "a distribution", 'a scalar 1 '
                                    'with moe.gate "round_robin" (every expert gets its '
                                    'share)')
        if self.expert_shares is not None:
            _check_shares(self.expert_shares)
            if self.force_balance:
                raise WorkloadError("moe.force_balance", True, "false with a measured "
                                    "moe.load_imbalance (a force-balanced router routes at "
                                    "random)")

    @property
    def dropless(self) -> bool:
        """No token is dropped (no capacity factor)."""
        return self.capacity_factor is None

    @property
    def dispatcher_sms(self) -> int:
        """SMs the fused dispatcher's kernels hold (0: NCCL's collectives run it)."""
        if self.dispatcher != "deepep":
            return 0
        return self.flex_num_sms or FLEX_DEFAULT_SMS[self.flex_backend]

    def etp_of(self, tp: int) -> int:
        """The expert TP degree under a mesh of TP degree `tp`."""
        return tp if self.etp is None else self.etp


def _check_shares(shares: Any) -> None:
    where = "moe.load_imbalance.shares"
    if (not isinstance(shares, tuple) or not 1 <= len(shares) <= MAX_SHARES
            or any(isinstance(s, bool) or not isinstance(s, (int, float))
                   or not finite(s) or s < 0 for s in shares)
            or not (0 < sum(shares) and finite(sum(shares)))):
        raise WorkloadError(where, list(shares) if isinstance(shares, tuple) else shares,
                            f"a list of 1 to {MAX_SHARES} non-negative numbers, not all 0, "
                            "with a finite sum (each expert's share of the routed tokens)")


def parse_moe(raw: dict) -> dict:
    """Plan keyword arguments from a plan's `moe` object: load_imbalance (scalar) and moe."""
    known_keys(raw, "moe", MOE_KEYS)
    imbalance = raw.get("load_imbalance", 1.0)
    shares = None
    if isinstance(imbalance, dict):
        known_keys(imbalance, "moe.load_imbalance", ("distribution", "shares"))
        check_choice(imbalance.get("distribution"), "moe.load_imbalance.distribution",
                     DISTRIBUTIONS)
        shares, imbalance = imbalance.get("shares"), 1.0
        if not isinstance(shares, list):
            raise WorkloadError("moe.load_imbalance.shares", shares,
                                "a list of each expert's share of the routed tokens")
    elif isinstance(imbalance, list):
        shares, imbalance = imbalance, 1.0
    imbalance = int_as_float(imbalance)
    capacity = int_as_float(raw.get("capacity_factor"))
    options = MoEOptions(
        dispatcher=raw.get("dispatcher", "alltoall"), etp=raw.get("etp"),
        capacity_factor=capacity, pad_to_capacity=raw.get("pad_to_capacity", False),
        expert_shares=tuple(shares) if shares is not None else None,
        force_balance=raw.get("force_balance", False), gate=raw.get("gate", "router"),
        aux_loss=raw.get("aux_loss", False),
        overlap_a2a=raw.get("overlap_a2a", False), delay_wgrad=raw.get("delay_wgrad", False),
        flex_backend=raw.get("flex_backend", "deepep"), fused_mlp=raw.get("fused_mlp", False),
        flex_num_sms=raw.get("flex_num_sms"))
    return {"load_imbalance": imbalance, "moe": options}


def check_etp(opt: MoEOptions, tp: int) -> None:
    """Expert TP is 1 or the TP degree: the two layouts the MoE layer builds (with etp 1
    < tp, the expert mesh of workloads/expert_mesh.py)."""
    etp = opt.etp_of(tp)
    if etp not in (1, tp):
        raise WorkloadError("moe.etp", etp, f"1 or mesh.tp ({tp}): an expert-TP group "
                            "inside the TP group is not modelled")


def check_moe_resolved(plan) -> None:
    """What the `moe` block asks of the resolved mesh and the model (plan_checks)."""
    m, mesh, opt = plan.model, plan.parallel_dims, plan.moe
    if not m.num_experts:
        if opt != MoEOptions():
            raise WorkloadError("moe", "options", f"absent for a dense model ({m.name} has "
                                "no experts)")
        return
    check_etp(opt, mesh.tp)
    etp = opt.etp_of(mesh.tp)
    if m.moe_ffn_size % etp:   # each expert's FFN is split over expert TP, as the dense one
        raise WorkloadError("moe.etp" if opt.etp is not None else "mesh.tp", etp,
                            f"a divisor of moe_intermediate_size ({m.moe_ffn_size})")
    shares = opt.expert_shares
    if shares is not None and len(shares) not in (m.num_experts, mesh.ep):
        raise WorkloadError("moe.load_imbalance.shares", f"{len(shares)} shares",
                            f"one share per expert ({m.num_experts}) or per EP rank "
                            f"({mesh.ep})")
    if plan.load_imbalance != 1.0 and opt.gate == "round_robin":
        raise WorkloadError("moe.load_imbalance", plan.load_imbalance, '1 with moe.gate '
                            '"round_robin" (every expert gets its share)')
    if plan.load_imbalance != 1.0 and opt.force_balance:
        raise WorkloadError("moe.force_balance", True, "false with a moe.load_imbalance "
                            "factor (a force-balanced router routes at random)")
    if opt.overlap_a2a:
        check_a2a_overlap(plan)
    if opt.fused_mlp:
        check_fused_mlp(plan)


def check_fused_mlp(plan) -> None:
    """What TE's fused grouped MLP needs of the plan (module docstring, fused_mlp); the
    GPU is checked where the topology is known (simulator/api.py)."""
    why = None
    fused_dtypes = recipe_dtypes("fused_grouped_mlp")
    if plan.training.dtype not in fused_dtypes:
        why = (f"false unless training.dtype is one of {', '.join(fused_dtypes)} (its "
               "kernels take block-scaled operands)")
    elif plan.model.mlp != "swiglu":
        why = "false unless the experts are gated (mlp swiglu): it fuses a GLU"
    elif not traits(plan.framework).te_modules:
        why = (f"false unless framework is {' or '.join(frameworks_with('te_modules'))} "
               "(Transformer Engine's "
               "op fuser)")
    elif plan.kernels != "fused":
        why = f"false with kernels {plan.kernels!r} (its kernels are Transformer Engine's)"
    elif "moe_act" in plan.recompute_modules:
        why = ("false with recompute_modules moe_act (the activation runs inside the GEMM: "
               "there is no activation to recompute)")
    if why:
        raise WorkloadError("moe.fused_mlp", True, why)


def check_a2a_overlap(plan) -> None:
    """What Megatron-Core asserts of overlap_moe_expert_parallel_comm (NVIDIA/Megatron-LM
    d98e8a64, transformer_config.py __post_init__), for the plan's resolved mesh."""
    mesh, pipe = plan.mesh, plan.pipeline
    why = None
    if mesh.ep < 2:
        why = "false unless mesh.ep > 1 (it overlaps the expert-parallel all-to-alls)"
    elif mesh.pp > 1 and (pipe.schedule != "interleaved" or pipe.virtual_stages < 2):
        why = ("false with pipeline parallelism unless pipeline.schedule is interleaved "
               "with virtual_stages > 1 (Megatron-Core asserts a virtual pipeline size)")
    elif plan.recompute in ("full", "selective_op"):
        why = "false with layer recompute (Megatron-Core asserts no full recomputation)"
    elif plan.fsdp or plan.zero_stage == 3:
        why = "false with FSDP / ZeRO-3 (not modelled with the combined schedule)"
    elif plan.training.dtype == "fp32":
        why = "false with fp32 training (Megatron-Core asserts a bf16 or fp16 model)"
    elif plan.model.mtp_layers > 1:
        why = "false with more than one MTP layer (Megatron-Core asserts at most one)"
    elif "moe" in plan.recompute_modules:
        why = "false with recompute_modules moe (Megatron-Core asserts it off)"
    if why:
        raise WorkloadError("moe.overlap_a2a", True, why)
