"""Megatron-Core pipeline layout strings (workloads/pipeline_layout.py) and the reference
rows that carry their recipe's layout (validation/references/training_runs.csv pp_layout)."""
import pytest

from validation.reference_rows import load_rows, plan_dict
from validation.references import DEFAULT_CSV
from workloads import plan_from_dict
from workloads.errors import WorkloadError
from workloads.pipeline_layout import expand_layout, layout_layer_split
from workloads.schedules import chunk_units, stage_layers, EMBED, HEAD

# Megatron-Bridge src/megatron/bridge/recipes/deepseek/deepseek_v3.py
# set_deepseek_v3_pipeline_model_parallel_layout, (pp, vp) = (16, 1) / (8, 2) / (4, 4):
# [embedding + 4 decoders] + [4 decoders] * 14 + [decoder + mtp + loss]; the B200 MXFP8 perf
# config writes it "Et*4|(t*4|)*14tmL".
DSV3_16 = "Et*4|(t*4|)*14tmL"


def test_deepseek_v3_recipe_layout():
    assert layout_layer_split(DSV3_16, 16) == (4,) * 15 + (1,)
    chunks = expand_layout(DSV3_16)
    assert chunks[0] == "Etttt" and chunks[-1] == "tmL"


def test_h100_layout_last_chunk_without_decoders():
    # Megatron-Bridge 6725f70495 scripts/performance/run_script.py: "Et|(tt|)*30mL" on H100
    assert layout_layer_split("Et|(tt|)*30mL", 32) == (1,) + (2,) * 30 + (0,)


@pytest.mark.parametrize("layout, chunks", [
    (DSV3_16, 8),                 # wrong chunk count
    ("tE|tttt", 2),               # embedding not first
    ("Etm|tL", 2),                # MTP away from the last chunk
    ("Et|mtL", 2),                # a decoder after the MTP layer
    ("Et|tX", 2),                 # unknown symbol
])
def test_refused(layout, chunks):
    with pytest.raises(WorkloadError):
        layout_layer_split(layout, chunks)


def test_reference_row_uses_recipe_layout():
    """The DeepSeek-V3 B200 PP 16 row: the last stage holds one decoder layer with the MTP
    layer and output, not the default split's three."""
    rows = {r["id"]: r for r in load_rows(DEFAULT_CSV)}
    plan = plan_from_dict(plan_dict(rows["mb-dsv3-b200-mxfp8-256-pp16"]))
    assert [len(r) for r in stage_layers(plan)] == [4] * 15 + [1]
    assert chunk_units(plan, 15) == [[60, HEAD]]
    assert chunk_units(plan, 0) == [[EMBED, 0, 1, 2, 3]]
