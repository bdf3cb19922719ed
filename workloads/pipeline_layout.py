"""Megatron-Core's pipeline layout string: the decoder layers of each pipeline chunk.

Megatron-Core's `pipeline_model_parallel_layout` (megatron/core/transformer/
pipeline_parallel_layer_layout.py, PipelineParallelLayerLayout.from_str; NVIDIA/
Megatron-LM core_v0.14 onwards) names what each of the pp x vp chunks holds, in model
order, chunks separated by "|": "E" the embedding, "t" a decoder (transformer) layer, "m" a
multi-token-prediction layer, "L" the loss (final norm and output layer); "X*N" repeats a
symbol and "(...)*N" a group. Chunk c runs on pipeline rank c % pp, as in the simulator's
stage_layers. Megatron-Bridge's DeepSeek-V3 recipe sets one for (pp, vp) = (16, 1), (8, 2)
and (4, 4): "Et*4|(t*4|)*14tmL", the embedding and 4 layers first, one layer with the MTP
layer and loss last (src/megatron/bridge/recipes/deepseek/deepseek_v3.py
set_deepseek_v3_pipeline_model_parallel_layout, Megatron-Bridge 7af9601c9d to 51885cf132).

The simulator places the embedding on the first chunk and the MTP layers with the output
layer and loss on the last (workloads/layers.py); a layout that puts them elsewhere is
refused. What it keeps is the decoder layers per chunk: the plan's pipeline.layer_split.
"""
from __future__ import annotations

import re

from .errors import WorkloadError

_GROUP = re.compile(r"\(([^()]*)\)\*(\d{1,9})", re.ASCII)
_REPEAT = re.compile(r"([EtmL])\*(\d{1,9})", re.ASCII)


# A layout names one letter per layer or chunk boundary: far more than any model has
# layers means a repetition that asks for gigabytes, refused before it is built.
MAX_LAYOUT_CHARS = 1 << 20


def expand_layout(layout: str) -> list[str]:
    """The layout's chunks, each a string of E / t / m / L, repetitions expanded."""
    text = layout.replace(" ", "")
    while True:
        expanded = _GROUP.sub(lambda g: _repeat(layout, g.group(1), g.group(2)), text)
        if expanded == text:
            break
        text = expanded
    text = _REPEAT.sub(lambda g: _repeat(layout, g.group(1), g.group(2)), text)
    chunks = text.split("|")
    if any(set(c) - set("EtmL") for c in chunks):
        raise WorkloadError("pipeline layout", layout,
                            "chunks of E, t, m, L separated by '|' (X*N and (...)*N repeat)")
    return chunks


def layout_layer_split(layout: str, chunks: int) -> tuple[int, ...]:
    """Decoder layers of each of the `chunks` chunks of a Megatron layout string; the
    embedding must open the first chunk and the MTP layers and loss close the last."""
    parts = expand_layout(layout)
    if len(parts) != chunks:
        raise WorkloadError("pipeline layout", layout,
                            f"{chunks} chunks (pp x virtual stages), not {len(parts)}")
    where = {s: [i for i, p in enumerate(parts) if s in p] for s in "EmL"}
    if where["E"] not in ([0], []) or not parts[0].startswith("E") and where["E"]:
        raise WorkloadError("pipeline layout", layout, "the embedding (E) first in chunk 0")
    last = len(parts) - 1
    if any(i != last for i in where["m"] + where["L"]) or "t" in parts[last].lstrip("t"):
        raise WorkloadError("pipeline layout", layout,
                            "MTP layers (m) and loss (L) after the decoder layers of the last "
                            "chunk (where the simulator places them)")
    return tuple(p.count("t") for p in parts)


def _repeat(layout: str, text: str, times: str) -> str:
    """`text` repeated `times` times, if that stays within MAX_LAYOUT_CHARS."""
    if len(text) * int(times) > MAX_LAYOUT_CHARS:
        raise WorkloadError("pipeline layout", layout, f"repetitions that expand to at most "
                            f"{MAX_LAYOUT_CHARS:,} characters")
    return text * int(times)
