"""Model architectures: presets, model JSON files and Hugging Face config.json files.

The spec itself is workloads/model_spec.py, the presets and their sources
workloads/model_presets.py, the config.json keys workloads/hf_config.py; this module is
where a plan's `model` is looked up.
"""
from __future__ import annotations

from pathlib import Path

from inputs import load_json_file

from .errors import WorkloadError
from .hf_config import HF_IGNORED_KEYS, HF_KEYS, INTERPRETED_KEYS, model_from_dict
from .model_presets import PRESETS
from .model_spec import FULL, MAX_EXPERTS, MAX_LAYERS, MAX_SIZE, SLIDING, ModelSpec

__all__ = ["FULL", "HF_IGNORED_KEYS", "HF_KEYS", "INTERPRETED_KEYS", "MAX_EXPERTS",
           "MAX_LAYERS", "MAX_SIZE", "PRESETS", "SLIDING", "ModelSpec", "load_model",
           "model_from_dict"]


def load_model(ref: str | dict, base_dir: Path | None = None) -> ModelSpec:
    """A model by preset name, JSON path (relative to base_dir) or inline object."""
    if isinstance(ref, dict):
        return model_from_dict(ref)
    if not isinstance(ref, str):
        raise WorkloadError("model", ref, "a preset name, a JSON path or an object")
    if ref in PRESETS:
        return PRESETS[ref]
    path = Path(ref)
    if base_dir is not None and not path.is_absolute():
        path = base_dir / path
    if not path.suffix == ".json" or not path.is_file():
        raise WorkloadError("model", ref, ", ".join(PRESETS) + ", or a model JSON file")
    raw = load_json_file(path, "model", WorkloadError)
    return model_from_dict(raw, default_name=path.stem)
