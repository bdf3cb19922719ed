"""The training and pipeline sections of a plan (`Training`, `Pipeline`), each checked on
its own when built; workloads/plan.py holds the whole plan and parses the file.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import WorkloadError
from .fields import MAX_INT, check_bool, check_choice, check_int, is_int
from .fp8_attention import ATTENTION_FORMAT
from .precision import DTYPES, RECIPES

LOW_PRECISION = tuple(RECIPES)   # the training dtypes with a GEMM recipe
SCHEDULES = ("gpipe", "1f1b", "interleaved")
__all__ = ["DTYPES", "LOW_PRECISION", "SCHEDULES", "Pipeline", "Training"]


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
        if self.fp8_attention and self.dtype not in ATTENTION_FORMAT:
            raise WorkloadError("training.fp8_attention", True, "false unless training.dtype "
                                "is one of " + ", ".join(ATTENTION_FORMAT) + " (the recipes "
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

    def __post_init__(self) -> None:
        check_choice(self.schedule, "pipeline.schedule", SCHEDULES)
        check_int(self.virtual_stages, "pipeline.virtual_stages")
        split = self.layer_split
        if split is not None and (not isinstance(split, tuple)
                                  or not all(is_int(n) and n >= 0 for n in split)):
            raise WorkloadError("pipeline.layer_split",
                                list(split) if isinstance(split, tuple) else split,
                                "a list of non-negative integers")
