"""The training and pipeline sections of a plan (`Training`, `Pipeline`), each checked on
its own when built, and the parsing of the sections each owned by its own module (moe,
lora, the optimizer states, activation offload); workloads/plan.py holds the whole plan
and parses the file.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import WorkloadError
from .activation_offload import parse_activation_offload
from .fields import MAX_INT, check_bool, check_choice, check_int, is_int, json_object, known_keys
from .lora import parse_lora
from .moe_options import parse_moe
from .muon import parse_muon
from .optimizer_states import parse_distributed_fused_adam, parse_precision_aware_optimizer
from .precision import DTYPES, RECIPES, recipe_dtypes

LOW_PRECISION = tuple(RECIPES)   # the training dtypes with a GEMM recipe
SCHEDULES = ("gpipe", "1f1b", "interleaved")
__all__ = ["DTYPES", "LOW_PRECISION", "SCHEDULES", "TOP_KEYS", "Pipeline", "Training",
           "extensions", "pipeline_section"]


@dataclass(frozen=True)
class Training:
    """Batch and precision of one optimizer step."""

    global_batch: int       # sequences per step
    micro_batch: int        # sequences per micro-batch per DP rank
    seq_len: int
    dtype: str = "bf16"
    # Layers kept in BF16 at the start and the end under an FP8/FP4 dtype (Megatron-LM's
    # --num-layers-at-start/end-in-bf16); None: the recipe's (workloads/precision.py).
    bf16_layers: tuple[int, int] | None = None
    # Sequence packing (fine-tuning): tokens of each packed example, whose attention stays
    # within its own example (workloads/attention.py, "Packed sequences"); 0: one sequence.
    packed_segment: int = 0
    # Transformer Engine's fp8_dot_product_attention: the attention core on quantized
    # q, k, v in the recipe's format (workloads/fp8_attention.py prices it).
    fp8_attention: bool = False

    def __post_init__(self) -> None:
        for name in ("global_batch", "micro_batch", "seq_len"):
            check_int(getattr(self, name), f"training.{name}")
        check_bool(self.fp8_attention, "training.fp8_attention")
        quantized_attention = recipe_dtypes("attention_format")
        if self.fp8_attention and self.dtype not in quantized_attention:
            raise WorkloadError("training.fp8_attention", True, "false unless training.dtype "
                                "is one of " + ", ".join(quantized_attention) + " (the recipes "
                                "that quantize attention)")
        if not is_int(self.packed_segment) or not 0 <= self.packed_segment <= self.seq_len:
            raise WorkloadError("training.packed_segment", self.packed_segment,
                                f"an integer in [0, seq_len = {self.seq_len}] (0: no packing)")
        check_choice(self.dtype, "training.dtype", DTYPES)
        layers = self.bf16_layers
        if layers is None:
            return
        if not (isinstance(layers, tuple) and len(layers) == 2
                and all(is_int(n) and 0 <= n <= MAX_INT for n in layers)):
            raise WorkloadError("training.bf16_layers", list(layers) if isinstance(
                layers, tuple) else layers, "[first, last]: two integers >= 0")
        if self.dtype not in LOW_PRECISION:
            raise WorkloadError("training.bf16_layers", list(layers), "only with dtype "
                                + ", ".join(LOW_PRECISION) + f" (a {self.dtype} plan's "
                                "GEMMs are not quantised)")

    @property
    def tokens(self) -> int:
        """Tokens per optimizer step."""
        return self.global_batch * self.seq_len


@dataclass(frozen=True)
class Pipeline:
    """Pipeline schedule; layer_split gives layers per stage (None: balanced default)."""

    schedule: str = "1f1b"
    virtual_stages: int = 1
    layer_split: tuple[int, ...] | None = None
    # Megatron-LM 2021's scatter/gather of pipeline transfers (workloads/p2p_sync.py
    # pipeline_scatter_gather); None: the framework's default
    scatter_gather: bool | None = None
    # The step's micro-batches as `rounds` consecutive runs of the schedule over m / rounds
    # each, every one filling and draining the pipeline: a training loop that accumulates
    # gradients over several calls of its pipeline schedule (NeMo AutoModel's benchmark
    # loop calls torch.distributed.pipelining's schedule.step once per gradient-
    # accumulation step: NVIDIA-NeMo/Automodel@89e3a9fdd nemo_automodel/recipes/llm/
    # benchmark.py, local_batch_size / pp_microbatch_size micro-batches a call). 1: one run.
    rounds: int = 1

    @property
    def interleaved(self) -> bool:
        """Whether the schedule interleaves several model chunks per stage."""
        return self.schedule == "interleaved" and self.virtual_stages > 1

    def __post_init__(self) -> None:
        check_choice(self.schedule, "pipeline.schedule", SCHEDULES)
        check_int(self.virtual_stages, "pipeline.virtual_stages")
        check_int(self.rounds, "pipeline.rounds")
        if self.scatter_gather is not None and not isinstance(self.scatter_gather, bool):
            raise WorkloadError("pipeline.scatter_gather", self.scatter_gather,
                                "true or false")
        split = self.layer_split
        if split is not None and (not isinstance(split, tuple)
                                  or not all(is_int(n) and n >= 0 for n in split)):
            raise WorkloadError("pipeline.layer_split",
                                list(split) if isinstance(split, tuple) else split,
                                "a list of non-negative integers")


def pipeline_section(raw: dict) -> Pipeline:
    """The plan's pipeline section."""
    known_keys(raw, "pipeline", ("schedule", "virtual_stages", "layer_split", "scatter_gather",
                                 "rounds"))
    split = raw.get("layer_split")
    if isinstance(split, list):
        split = tuple(split)
    elif split is not None:
        raise WorkloadError("pipeline.layer_split", split, "a list of non-negative integers")
    return Pipeline(raw.get("schedule", "1f1b"), raw.get("virtual_stages", 1), split,
                    raw.get("scatter_gather"), raw.get("rounds", 1))


TOP_KEYS = ("name", "model", "training", "mesh", "fsdp", "zero_stage", "sharding", "layers",
            "recompute", "recompute_layers", "recompute_modules", "attention", "kernels",
            "optimizer", "pipeline", "overlap", "topology",
            "description", "framework", "cuda_graphs", "host_overhead", "ddp",
            "context_parallel", "moe", "tensor_parallel", "collectives", "lora",
            "precision_aware_optimizer", "distributed_fused_adam", "activation_offload", "loss",
            "muon")


def extensions(raw: dict) -> dict:
    """The sections each parsed by its own module: context_parallel.mode, the moe block
    (moe_options.py), tensor_parallel.depth, collectives, the recompute details, lora
    (lora.py), the optimizer states (optimizer_states.py) and activation_offload
    (activation_offload.py); Plan checks the values."""
    cp = json_object(raw.get("context_parallel"), "context_parallel")
    known_keys(cp, "context_parallel", ("mode",))
    moe = parse_moe(json_object(raw.get("moe"), "moe"))
    tp = json_object(raw.get("tensor_parallel"), "tensor_parallel")
    known_keys(tp, "tensor_parallel", ("depth",))
    coll = json_object(raw.get("collectives"), "collectives")
    known_keys(coll, "collectives", ("algorithm", "protocol"))
    return {"cp_mode": cp.get("mode", "ring"), **moe,
            "recompute_layers": raw.get("recompute_layers", 0),
            "recompute_modules": _modules(raw.get("recompute_modules", [])),
            "tp_depth": tp.get("depth", 1), "lora": parse_lora(raw.get("lora")),
            "precision_aware_optimizer": parse_precision_aware_optimizer(
                raw.get("precision_aware_optimizer")),
            "distributed_fused_adam": parse_distributed_fused_adam(
                raw.get("distributed_fused_adam")),
            "activation_offload": parse_activation_offload(raw.get("activation_offload")),
            "muon": parse_muon(raw.get("muon")),
            "collective_algorithm": coll.get("algorithm"),
            "collective_protocol": coll.get("protocol")}


def _modules(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value
