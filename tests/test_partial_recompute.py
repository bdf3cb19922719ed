"""Full recompute of the first N layers of each pipeline chunk (Megatron-LM's
--recompute-method block --recompute-num-layers N): the plan's `recompute_layers`."""
from __future__ import annotations

import pytest

import topologies
from simulator import simulate
from workloads import WorkloadError, plan_from_dict
from workloads.lowering import lower
from workloads.plan import resolve

from conftest import small_plan


def _recomputed_layers(raw: dict, world: int) -> set[int]:
    program = lower(resolve(plan_from_dict(raw), world))
    return {t.layer for st in program.stages for t in st if t.phase == "recompute"}


def test_only_the_first_layers_of_each_chunk_rerun():
    model = {**small_plan()["model"], "num_hidden_layers": 8}
    flat = small_plan(model=model, recompute="full", recompute_layers=3)
    assert _recomputed_layers(flat, 8) == {0, 1, 2}
    every = small_plan(model=model, recompute="full")
    assert _recomputed_layers(every, 8) == set(range(8))
    # 2 stages x 2 virtual stages: chunks of 2 layers, (0, 1) (2, 3) (4, 5) (6, 7); the
    # block method recomputes the first layer of each
    piped = small_plan(model=model, recompute="full", recompute_layers=1,
                       mesh={"dp": "auto", "tp": 1, "pp": 2},
                       pipeline={"schedule": "interleaved", "virtual_stages": 2})
    assert _recomputed_layers(piped, 8) == {0, 2, 4, 6}


def test_step_time_and_memory_lie_between_none_and_full():
    topo = topologies.build("dgx-h100")
    out = {}
    for name, extra in (("none", {}), ("full", {"recompute": "full"}),
                        ("half", {"recompute": "full", "recompute_layers": 2})):
        result = simulate(plan_from_dict(small_plan(**extra)), topo)   # 4 layers
        out[name] = (result.summary["step_time_s"], result.summary["peak_memory_bytes"])
    (none_s, none_b), (full_s, full_b), (half_s, half_b) = out["none"], out["full"], \
        out["half"]
    assert none_s < half_s < full_s
    # half the layers rerun: about half of full recompute's extra time
    assert (half_s - none_s) / (full_s - none_s) == pytest.approx(0.5, abs=0.1)
    assert full_b < half_b < none_b


@pytest.mark.parametrize("extra, allowed", [
    ({"recompute_layers": 2}, '0 unless recompute is "full"'),
    ({"recompute": "full", "recompute_layers": -1}, "an integer in [0, 2^53] (0: every layer)"),
    ({"recompute": "full", "recompute_layers": 2 ** 53 + 1},
     "an integer in [0, 2^53] (0: every layer)"),
    ({"recompute": "full", "recompute_layers": "some"}, "an integer in [0, 2^53] (0: every layer)")])
def test_bad_recompute_layers_name_the_field(extra, allowed):
    with pytest.raises(WorkloadError) as err:
        plan_from_dict(small_plan(**extra))
    assert err.value.field == "recompute_layers" and err.value.allowed == allowed


def test_reference_rows_say_full_colon_n():
    from validation.reference_rows import DEFAULT_CSV, load_rows, plan_dict
    rows = {r["id"]: r for r in load_rows(DEFAULT_CSV)}
    raw = plan_dict(rows["mb-llama3-8b-h100-fp8-8"])
    assert (raw["recompute"], raw["recompute_layers"]) == ("full", 5)
    assert plan_from_dict(raw).recomputes(4) and not plan_from_dict(raw).recomputes(5)


def test_megatron_block_method_round_trips():
    from workloads.jobs import read_megatron, write_megatron
    raw = {"framework": "megatron-core", "model": "llama3-8b", "recompute": "full",
           "recompute_layers": 5, "training": {"global_batch": 8, "micro_batch": 1,
                                               "seq_len": 8192}, "mesh": {"dp": "auto"}}
    text = write_megatron(plan_from_dict(raw)).text
    assert "--recompute-method block" in text and "--recompute-num-layers 5" in text
    back = read_megatron(text)
    assert back.plan["recompute_layers"] == 5
    assert not [n for n in back.notes if "recompute" in n], back.notes
    # 32 layers on one stage: 32 or more block layers is every layer
    every = text.replace("--recompute-num-layers 5", "--recompute-num-layers 32")
    assert "recompute_layers" not in read_megatron(every).plan
