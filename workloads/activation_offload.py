"""Activation offloading: a layer's saved tensors copied to host memory after its forward
and back before its backward (Megatron-Core's cpu_offloading with cpu_offloading_num_layers
N, activations only: TransformerConfig fields, which Megatron-Bridge sets and which
core_v0.16.0's --cpu-offloading-num-layers turns on; core_v0.15.0 has no flag).

A plan says `"activation_offload": {"layers": N}`. Megatron-Core wraps each transformer
layer's forward in Transformer Engine's offload context (megatron/core/transformer/
transformer_block.py get_cpu_offload_context, core_v0.15.0; transformer_engine/pytorch/
cpu_offload.py at v2.13, DefaultOffloadSynchronizer), which does, for L layers of which N
are offloaded:

* Which layers: the first N (layers 0 .. N-1), "to minimize memory usage by the end of the
  forward pass".
* Offload: when layer i+1's forward starts, every tensor layer i saved for its backward
  (all of at least 256 Ki elements that are not parameters: in practice all of them) is
  copied to pinned host memory on a side stream (start_offload).
* Release: when layer L - N + i's forward starts, the compute stream waits for layer i's
  copies (release_activation_forward_gpu_memory: wait_event) and the GPU copy is freed.
  So at most L - N layers' saved tensors are on the GPU at once.
* Reload: when layer L - 1 - N + i's backward starts, the side stream waits for the
  compute stream (wait_stream) and copies layer i back (start_reload); layer i's backward
  waits for it (pop_tensor: wait_event).

The lowering adds those copies as tasks on their own stream ("offload", a copy engine: no
SMs), at the host link's rate (topologies/host_link.py), with those waits as dependencies
(workloads/offload_copies.py); the memory timeline frees and re-allocates the layer at the
release and the reload (simulator/memory_timeline.py); the analytic peak counts the
heaviest L - N consecutive layers, the most the GPU holds at once (resident_saved_bytes).

Megatron-Core refuses it with pipeline parallelism, with activation recompute and with
CUDA graphs ("CUDA graphs not supported with CPU offloading": transformer_config.py
__post_init__ at core_v0.15.0), and so does the plan. Assumptions: the older handler of
Megatron-Bridge's 25.09 runs (Transformer Engine before 2.8, cpu_offload_v1.py) keeps the
same number of layers on the GPU; EP all-to-all overlap, whose combined 1F1B interleaves
two micro-batches' layers under the one offload context, is refused as not modelled.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import WorkloadError
from .fields import check_int, json_object, known_keys

SECTION = "activation_offload"


@dataclass(frozen=True)
class ActivationOffload:
    """How many of the model's first layers keep their saved tensors in host memory."""

    layers: int

    def __post_init__(self) -> None:
        check_int(self.layers, f"{SECTION}.layers")


def parse_activation_offload(raw: Any) -> ActivationOffload | None:
    """The plan's `activation_offload` section (None when absent)."""
    if raw is None:
        return None
    raw = json_object(raw, SECTION)
    known_keys(raw, SECTION, ("layers",))
    if "layers" not in raw:
        raise WorkloadError(f"{SECTION}.layers", None, "an integer >= 1 (layers offloaded)")
    return ActivationOffload(layers=raw["layers"])


def check_activation_offload_plan(plan) -> None:
    """Megatron-Core's conditions (module docstring); the error names the setting."""
    offload = plan.activation_offload
    if offload is None:
        return
    layers = plan.model.num_layers
    needs = (
        (f"{SECTION}.layers", offload.layers, offload.layers < layers,
         f"fewer than the model's {layers} layers (Megatron-Core's limit)"),
        ("framework", plan.framework, plan.framework == "megatron-core",
         "megatron-core (Megatron-Core's --cpu-offloading)"),
        (f"{SECTION} with mesh.pp", plan.mesh.pp, plan.mesh.pp == 1,
         "1 (Megatron-Core has no offloading with pipeline parallelism)"),
        (f"{SECTION} with recompute", plan.recompute,
         plan.recompute == "none" and not plan.recompute_modules,
         "none (Megatron-Core refuses offloading with activation recompute)"),
        (f"{SECTION} with moe.overlap_a2a", plan.moe.overlap_a2a, not plan.moe.overlap_a2a,
         "false (offloading beside the combined 1F1B is not modelled)"),
        (f"{SECTION} with cuda_graphs", plan.cuda_graphs, not plan.cuda_graphs,
         "false (Megatron-Core: CUDA graphs not supported with CPU offloading)"))
    for field, value, ok, allowed in needs:
        if not ok:
            raise WorkloadError(field, value, allowed)


def offloaded_layers(plan) -> range:
    """The layers whose saved tensors go to the host: the first N (empty without)."""
    return range(plan.activation_offload.layers if plan.activation_offload else 0)


def release_layer(plan, layer: int) -> int:
    """The layer whose forward start frees offloaded `layer` on the GPU (L - N + i)."""
    return plan.model.num_layers - plan.activation_offload.layers + layer


def reload_layer(plan, layer: int) -> int:
    """The layer whose backward start reloads offloaded `layer` (L - 1 - N + i)."""
    return release_layer(plan, layer) - 1


def resident_saved_bytes(plan, layer_bytes: list[float]) -> float:
    """The most saved bytes the layers keep on the GPU at once, given each layer's (in
    order): all of them without offloading; with it, L - N consecutive layers, the most
    of the windows [i, L - N + i) (from layer L - N + i's forward, after layer i's release,
    to its backward, before layer i's reload, the GPU holds exactly that window)."""
    if plan.activation_offload is None:
        return sum(layer_bytes)
    width = len(layer_bytes) - plan.activation_offload.layers
    return max(sum(layer_bytes[i:i + width])
               for i in range(plan.activation_offload.layers + 1))
