"""The typed reader of the reference CSV (`validation references --csv`).

csv.DictReader gives every cell as a string, a row with too many cells an extra `None`
key and a short row `None` values, and accepts any column name; a typo ("gpus" as
"8x8", a metric value of "nan", a column "tpp") would surface later as an exit-1
ValueError or as a silently defaulted setting. `read_reference_csv` checks every cell
against its column's kind where the file is read, and raises a ValidationError naming
the row, the column, the value and what is allowed. Rows come back as the same
string-valued dicts (cells stripped), so the code that turns them into plans is unchanged.
"""
from __future__ import annotations

import csv
import math
import os
from pathlib import Path

from inputs import decimal
from inputs import require_regular_file as regular_file
from topologies.presets import FAMILIES
from workloads.attention_impls import ATTENTION_IMPLS
from workloads.kernels import OPTIMIZERS
from workloads.moe_options import GATES

from .errors import ValidationError
from .job_topologies import job_topology_names

# Bounds of one reference file: far past the bundled one (153 rows, well under 1 MiB).
MAX_BYTES = 16 << 20
MAX_ROWS = 10_000
MAX_INT = 1 << 53

TEXT, INT, NUMBER, BOOL = "text", "integer", "number", "bool"
# What a row's measurement may be, and whose FLOP count a tflops row uses
# (validation/reference_rows.py turns each into a step time).
METRICS = ("tokens_per_s_per_gpu", "tflops_per_gpu", "step_time_s")
FLOPS_FORMULAS = ("megatron", "narayanan", "nemo-llama2", "nemo-llama2-full")
MOE_DISPATCHERS = ("alltoall", "allgather", "deepep", "hybridep")
# column -> (kind, required, allowed): allowed is (low, high) for numbers, a tuple of
# names for text choices, None for free text.
COLUMNS: dict[str, tuple[str, bool, object]] = {
    "id": (TEXT, False, None), "source": (TEXT, True, None), "hardware": (TEXT, True, None),
    # a preset family (N = gpus / 8) or a job topology file's stem (validation/job_topologies.py)
    "topology": (TEXT, False, tuple(FAMILIES) + job_topology_names()),
    "gpus": (INT, True, (1, 1 << 20)), "model": (TEXT, True, None),
    "tp": (INT, True, (1, MAX_INT)), "pp": (INT, True, (1, MAX_INT)),
    "dp": (INT, True, (1, MAX_INT)), "cp": (INT, False, (1, MAX_INT)),
    "cp_mode": (TEXT, False, ("ring", "all_gather", "all_to_all")),
    "global_batch_seqs": (INT, True, (1, MAX_INT)), "seq_len": (INT, True, (1, MAX_INT)),
    "metric": (TEXT, True, METRICS),
    "value": (NUMBER, True, (0.0, math.inf)),
    # fp8: per-tensor FP8 (delayed scaling, torchao tensorwise); fp8_cs: Transformer
    # Engine's current scaling; fp8_rowwise: torchao's row-wise FP8 recipe; fp8_blockwise:
    # Transformer Engine's Float8BlockScaling (128-element blocks, FP32 scales, Hopper);
    # mxfp8: MX FP8 (32-element blocks, E8M0
    # scales); nvfp4: NVFP4 (16-element blocks, E4M3 scales), the Transformer Engine recipes
    # of Blackwell rows (reference_rows.py maps them)
    "dtype": (TEXT, False, ("bf16", "fp8", "fp8_cs", "fp8_rowwise", "fp8_blockwise", "fp32",
                             "mxfp8", "nvfp4")),
    "micro_batch": (INT, False, (1, MAX_INT)), "virtual_stages": (INT, False, (1, MAX_INT)),
    "fsdp": (BOOL, False, None), "reshard_after_forward": (BOOL, False, None),
    "zero_stage": (INT, False, (0, 3)), "recompute": (TEXT, False, None),
    "kernels": (TEXT, False, None), "sequence_parallel": (BOOL, False, None),
    # loss_kernels: the cross-entropy compiled (fused) or eager when it differs from the
    # model's kernels (torchtitan before bbb1b616e compiled the model only)
    "loss_kernels": (TEXT, False, ("fused", "eager")),
    # loss_metrics: the trainer's no-grad cross-entropies per micro-batch for its training
    # metrics (workloads/train_metrics.py; Composer with llm-foundry's MPT: 2); empty: 0
    "loss_metrics": (INT, False, (0, 8)),
    # attention: the plan's attention implementation where it is not the framework's
    # default (llm-foundry's MPT: flash_varlen, workloads/varlen_padding.py); empty: default
    "attention": (TEXT, False, ATTENTION_IMPLS),
    # optimizer: the Adam step's implementation where it is not the framework's default
    # (workloads/kernels.py ADAM_STEP; Composer's DecoupledAdamW: for_loop)
    "optimizer": (TEXT, False, OPTIMIZERS),
    # grad_accumulation_fusion: Megatron-Core's gradient_accumulation_fusion where a recipe
    # turns it off (workloads/main_grad.py); empty: on
    "grad_accumulation_fusion": (BOOL, False, None),
    "notes": (TEXT, False, None),
    # the published-runs table's provenance and framework settings (reference_rows.py)
    "source_family": (TEXT, False, None), "flops_formula": (TEXT, False, FLOPS_FORMULAS),
    "framework": (TEXT, False, ("generic", "megatron-core", "megatron-lm", "torchtitan",
                                "nemo-automodel")),
    # fsdp_version: 1 (FSDP1), 2 (FSDP2) or megatron (Megatron-FSDP)
    "fsdp_version": (TEXT, False, ("1", "2", "megatron")), "overlap": (TEXT, False, None),
    # fsdp_grad_sync: when FSDP reduce-scatters under gradient accumulation (the plan's
    # fsdp.grad_sync: every micro-batch, or once a step); empty: the profile's default
    "fsdp_grad_sync": (TEXT, False, ("microbatch", "step")),
    "cuda_graphs": (BOOL, False, None), "measured_mem_gib": (NUMBER, False, (0.0, math.inf)),
    "mem_quantity": (TEXT, False, None), "settings": (TEXT, False, None),
    # mixture of experts and Blackwell rows (reference_rows.py turns them into plan keys):
    # ep / etp: expert-parallel and expert-tensor-parallel sizes; moe_dispatcher: the token
    # dispatcher (Megatron-Core alltoall | allgather, or the flex dispatcher's DeepEP or
    # HybridEP kernels); force_balanced: the router forced to balance tokens over experts;
    # capacity_factor: token-drop capacity (empty: dropless); mtp_layers: multi-token
    # prediction layers; bf16_layers: transformer layers at each end kept in BF16 by the
    # precision recipe; rack_gpus: GPUs the job uses in each NVLink domain (64 of an NVL72
    # rack's 72); release: the table's release (container) the row was read from;
    # pp_layout: the recipe's Megatron-Core pipeline_model_parallel_layout (the decoder
    # layers of each pipeline chunk: workloads/pipeline_layout.py), empty: Megatron's split.
    "ep": (INT, False, (1, MAX_INT)), "etp": (INT, False, (1, MAX_INT)),
    "moe_dispatcher": (TEXT, False, MOE_DISPATCHERS),
    "force_balanced": (BOOL, False, None),
    # moe_gate: round_robin where the run replaces the router by NeMo AutoModel's fake
    # balanced gate (the plan's moe.gate); empty: the learned router
    "moe_gate": (TEXT, False, GATES),
    "capacity_factor": (NUMBER, False, (0.0, 1024.0)),
    "mtp_layers": (INT, False, (0, 64)), "bf16_layers": (INT, False, (0, 1024)),
    "rack_gpus": (INT, False, (1, 1024)), "release": (TEXT, False, None),
    "pp_layout": (TEXT, False, None),
    # pp_rounds: the training loop's calls of its pipeline schedule per step (gradient
    # accumulation around torch pipelining's schedule.step: the plan's pipeline.rounds);
    # empty: one
    "pp_rounds": (INT, False, (1, MAX_INT)),
    # packed_segment: tokens of each example a fine-tuning run packs into its sequences
    # (attention stays within each example: workloads/attention.py); empty: no packing
    "packed_segment": (INT, False, (1, MAX_INT)),
    # lora: LoRA fine-tuning as RANK:MODULE+MODULE (Megatron-Core module names, e.g.
    # 16:linear_qkv; workloads/lora.py); empty: every weight trains
    "lora": (TEXT, False, None),
    # fp8_param_gather: whether the run gathers its weights in FP8: Megatron-Core's FP8
    # primary weights (fp8_param, NeMo fp8_params), or with fsdp torchao's float8 FSDP
    # all-gather (fsdp.float8_all_gather); empty: the framework profile's default
    "fp8_param_gather": (BOOL, False, None),
    # grad_reduce_fp32: Megatron-Core's gradient buffer in fp32 (ddp.grad_reduce_in_fp32);
    # empty: off for runs of Megatron-Bridge's performance scripts, else the profile's default
    "grad_reduce_fp32": (BOOL, False, None),
    # moe_fused_mlp: the routed experts run Transformer Engine's fused grouped MLP (the
    # recipe's use_transformer_engine_op_fuser with NVTE_CUTEDSL_FUSED_GROUPED_MLP=1):
    # the plan's moe.fused_mlp; empty: TE's GroupedLinear modules
    "moe_fused_mlp": (BOOL, False, None),
    # fp8_attention: the recipe's fp8_dot_product_attention (the attention core quantized
    # in the recipe's format): the plan's training.fp8_attention; empty: BF16 attention
    "fp8_attention": (BOOL, False, None),
    # flex_num_sms: the SMs the recipe gives the flex dispatcher's kernels (moe_deepep_num_sms,
    # moe_hybridep_num_sms or moe_flex_dispatcher_num_sms) where it is not the backend's
    # default (DeepEP 20, HybridEP 32): the plan's moe.flex_num_sms
    "flex_num_sms": (INT, False, (1, 1024)),
    # A published Nsight profile of the same run, as the source prints it: measured_busy_s,
    # the GPU-active interval union of a step's kernels (compute and communication); and
    # measured_comm_hidden_pct, the share of the communication kernels' interval union that
    # runs beside GEMM and attention kernels (both or neither). Scored apart from the step
    # time (reference_scoring.py profile_score): a right step time can rest on a wrong split.
    "measured_busy_s": (NUMBER, False, (0.0, math.inf)),
    "measured_comm_hidden_pct": (NUMBER, False, (0.0, 100.0)),
    # precision_aware_optimizer: Megatron-Core's precision-aware optimizer with both Adam
    # moments in this dtype (fp32 main parameters): the plan's precision_aware_optimizer
    # section (workloads/optimizer_states.py); empty: off
    "precision_aware_optimizer": (TEXT, False, ("fp32", "bf16")),
    # activation_offload_layers: Megatron-Core's --cpu-offloading-num-layers (activations
    # of the first N layers in host memory): the plan's activation_offload section
    # (workloads/activation_offload.py); empty: off
    "activation_offload_layers": (INT, False, (1, MAX_INT)),
    # distributed_fused_adam: NeMo 1's optimizer, Apex's DistributedFusedAdam, with its
    # states in this dtype (the config's optim.dtype; fp32 when unset), "+store_params"
    # where the run keeps a copy of the parameters without FP8 weights (NeMo's fp8_params
    # set on a BF16 run): the plan's distributed_fused_adam section (workloads/
    # optimizer_states.py); empty: not Apex's
    "distributed_fused_adam": (TEXT, False, ("fp32", "bf16", "fp32+store_params")),
    # ddp_bucket_params: the gradient bucket in parameters where the run's DDP is not its
    # framework profile's (e.g. torch DistributedDataParallel's 25 MiB buckets under
    # Megatron-LM 2021's --DDP-impl torch): the plan's ddp.bucket_params; empty: the profile's
    "ddp_bucket_params": (INT, False, (1, MAX_INT)),
    # muon_ns_steps: the run trained with Muon under Megatron-Core's layer-wise distributed
    # optimizer (optimizer dist_muon), this many Newton-Schulz steps: the plan's muon
    # section (workloads/muon.py); empty: Adam
    "muon_ns_steps": (INT, False, (1, 50)),
    # assumed: the training settings the run's sources do not publish and the row takes as
    # an assumption (micro-batch, gradient accumulation, recompute, overlap flags, CUDA
    # graphs), named with the evidence the row rests on; `validation references` lists
    # these rows and counts them as unverified. Empty: every such setting was read from
    # the source or its recipe, config or scripts (the hardware placement assumptions that
    # a row's settings state, such as GPUs used per NVL72 rack, are not counted here). A
    # row's settings text marks such a setting "(assumption)" or "... assumed)", which
    # tests/test_reference_scoring.py ties to this column.
    "assumed": (TEXT, False, None),
}


def read_reference_csv(path: str | Path) -> list[dict[str, str]]:
    """Every row of a reference CSV, each cell checked against COLUMNS."""
    return read_typed_csv(path, COLUMNS)


def read_typed_csv(path: str | Path, columns: dict[str, tuple[str, bool, object]]
                   ) -> list[dict[str, str]]:
    """Every row of a CSV whose header and cells must match `columns` (the COLUMNS form:
    column -> (kind, required, allowed)); a bad cell raises a ValidationError naming the
    row, the column, the value and what is allowed."""
    path = Path(path)
    require_regular_file(path, "--csv")
    try:
        if path.stat().st_size > MAX_BYTES:
            raise ValidationError("--csv", str(path), f"a CSV of at most {MAX_BYTES >> 20} MiB")
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            header = reader.fieldnames or []
            _check_header(header, str(path), columns)
            rows = []
            for row in reader:
                if len(rows) == MAX_ROWS:
                    raise ValidationError("--csv", str(path), f"at most {MAX_ROWS:,} rows")
                rows.append(_checked_row(row, len(rows) + 1, columns))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ValidationError("--csv", str(path), f"a readable UTF-8 CSV file ({reason})") from None
    if not rows:
        raise ValidationError("--csv", str(path), "a CSV with at least one row")
    return rows


def require_regular_file(path: str | os.PathLike, field: str) -> None:
    """ValidationError naming `field` unless `path` is a regular file (inputs'
    require_regular_file: a FIFO, folder or device is no input file)."""
    regular_file(path, field, ValidationError)


def _check_header(header: list[str], path: str, columns: dict = COLUMNS) -> None:
    missing = [c for c, (_, required, _) in columns.items() if required and c not in header]
    unknown = [c for c in header if c not in columns]
    repeated = sorted({c for c in header if header.count(c) > 1})
    if missing or unknown or repeated:
        what = (f"missing {', '.join(missing)}" if missing else
                f"unknown column {unknown[0]!r}" if unknown else f"column {repeated[0]!r} twice")
        raise ValidationError("--csv", path, f"a header of the columns {', '.join(columns)} "
                                             f"({what})")


def _checked_row(row: dict, number: int, columns: dict = COLUMNS) -> dict[str, str]:
    if None in row:
        raise ValidationError(f"row {number}", row[None], "as many cells as header columns")
    out = {}
    for column, cell in row.items():
        if cell is None:
            raise ValidationError(f"row {number}", "a short row", "a cell for every column")
        out[column] = cell.strip()
        _check_cell(out[column], column, number, columns)
    return out


def _check_cell(cell: str, column: str, number: int, columns: dict = COLUMNS) -> None:
    kind, required, allowed = columns[column]
    where = f"row {number}.{column}"
    if cell == "":
        if required:
            raise ValidationError(where, cell, f"a {kind} (required)")
        return
    if kind == INT:
        low, high = allowed
        # decimal, not str.isdigit: '²' is a digit that int() cannot read (exit 1)
        value = decimal(cell, 20)
        if value is None or not low <= value <= high:
            raise ValidationError(where, cell, f"an integer in [{low}, {high:,}]")
    elif kind == NUMBER:
        low, high = allowed
        try:
            value = float(cell)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or not low < value < high:
            raise ValidationError(where, cell, f"a finite number > {low:g}")
    elif kind == BOOL:
        if cell.lower() not in ("true", "false"):
            raise ValidationError(where, cell, "true or false")
    elif allowed is not None and cell not in allowed:
        raise ValidationError(where, cell, ", ".join(allowed))
    elif len(cell) > 10_000:
        raise ValidationError(where, cell[:40] + "...", "text of at most 10,000 characters")
