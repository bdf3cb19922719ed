"""Shared fixtures: bundled plans, small plans and cached simulations."""
from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

import topologies
from simulator import simulate
from workloads import load_plan, plan_from_dict


@functools.lru_cache(maxsize=None)
def simulated(plan_name: str, topo: str | None = None):
    """A cached simulation of a bundled plan (tests must not mutate the result)."""
    plan = load_plan(plan_name)
    return simulate(plan, topologies.build(topo or plan.topology))


# A small GPT-2-style model, as the Megatron-LM README's 2020 models: biases, LayerNorm,
# GELU, learned positions, tied embeddings.
SMALL_GPT = {"hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 16,
             "num_key_value_heads": 16, "intermediate_size": 4096, "vocab_size": 8192,
             "mlp": "gelu", "linear_bias": True, "hidden_dropout": True,
             "position_embedding": "learned_absolute", "tie_word_embeddings": True}


def small_plan(**over) -> dict:
    """A small Llama-like plan as raw JSON data, overridable per test."""
    raw = {
        "name": "small",
        "model": {"hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 16,
                  "num_key_value_heads": 8, "intermediate_size": 4096, "vocab_size": 8192},
        "training": {"global_batch": 8, "micro_batch": 1, "seq_len": 2048},
        "mesh": {"dp": "auto", "tp": 1},
    }
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    return raw


# Shared, read-only topologies (a test that changes one builds its own).
@pytest.fixture(scope="session")
def h100():
    """One DGX H100 node."""
    return topologies.build("dgx-h100")


@pytest.fixture(scope="session")
def h100x2():
    """Two DGX H100 nodes."""
    return topologies.build("dgx-h100x2")


@pytest.fixture(scope="session")
def h100x4():
    """Four DGX H100 nodes."""
    return topologies.build("dgx-h100x4")


@pytest.fixture
def write_json(tmp_path: Path):
    """Write an object as JSON into tmp_path and return the path as a string."""
    def write(name: str, obj) -> str:
        path = tmp_path / name
        path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
        return str(path)
    return write


def plan_of(raw: dict):
    """A Plan from raw data."""
    return plan_from_dict(raw)
