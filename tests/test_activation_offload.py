"""Activation offloading (workloads/activation_offload.py, workloads/offload_copies.py):
Transformer Engine's schedule of copies out and back (v2.13 cpu_offload.py
DefaultOffloadSynchronizer), what stays on the GPU, the copies' cost on the host link
(topologies/host_link.py), Megatron-Core's refusals, and the reference CSV column."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from megatron_flags import LLAMA3_8B_FLAGS

from simulator import SimOptions, simulate
from topologies import build
from simulator.compute import device_time_s
from topologies.host_link import PCIE_GEN5_X16_COPY_BPS
from topologies.specs import device
from validation.reference_rows import DEFAULT_CSV, load_rows, plan_dict
from workloads.errors import WorkloadError
from workloads.memory import memory_breakdown, saved_layer_bytes
from workloads.offload_copies import OFFLOAD_OP, RELOAD_OP
from workloads.plan import plan_from_dict, resolve

BASE = {"framework": "megatron-core", "model": "llama3-8b", "recompute": "none",
        "training": {"global_batch": 16, "micro_batch": 1, "seq_len": 8192, "dtype": "bf16"},
        "mesh": {"dp": 8, "tp": 1, "pp": 1}}
LAYERS = 32     # llama3-8b


def _plan(layers=None, **over):
    raw = {**BASE, **over}
    if layers is not None:
        raw["activation_offload"] = {"layers": layers}
    return resolve(plan_from_dict(raw), 8)


def test_only_the_last_layers_stay_on_the_gpu():
    # TE's synchroniser keeps at most L - N layers' saved tensors (the first N offloaded)
    plan, off = _plan(), _plan(layers=20)
    dropped = sum(saved_layer_bytes(plan, layer) for layer in range(20))
    assert dropped > 0
    assert memory_breakdown(off).activations_bytes == pytest.approx(
        memory_breakdown(plan).activations_bytes - dropped)


def _tasks(plan):
    from workloads.lowering import lower
    return lower(plan).stages[0]


def test_copies_wait_where_transformer_engine_waits():
    plan = _plan(layers=5)
    tasks = _tasks(plan)
    by_id = {t.id: t for t in tasks}
    outs = [t for t in tasks if t.op == OFFLOAD_OP]
    backs = [t for t in tasks if t.op == RELOAD_OP]
    assert len(outs) == len(backs) == 5 * plan.micro_batches
    for task in tasks:
        assert all(d < task.id for d in task.deps)      # an issue order
    for out in outs:
        layer, mb = out.layer, out.microbatch
        assert out.bytes == pytest.approx(saved_layer_bytes(plan, layer))
        assert by_id[out.deps[0]].layer == layer and by_id[out.deps[0]].phase == "forward"
        # the forward of layer L - N + i waits for the copy (release)
        release = min(t.id for t in tasks if t.stream == "compute" and t.phase == "forward"
                      and t.layer == LAYERS - 5 + layer and t.microbatch == mb)
        assert out.id in by_id[release].deps
    def ids(phase, layer, mb):
        return [t.id for t in tasks if t.stream == "compute" and t.phase == phase
                and t.layer == layer and t.microbatch == mb]
    for out in outs:   # issued right after its layer's forward, before the next layer's
        assert max(ids("forward", out.layer, out.microbatch)) < out.id \
            < min(ids("forward", out.layer + 1, out.microbatch))
    for back in backs:
        layer, mb = back.layer, back.microbatch
        # issued before layer L - 1 - N + i's backward, after the backward before it
        assert by_id[back.deps[0]].layer == LAYERS - 5 + layer
        assert max(ids("backward", LAYERS - 5 + layer, mb)) < back.id \
            < min(ids("backward", LAYERS - 6 + layer, mb))
        first_bwd = min(t.id for t in tasks if t.stream == "compute" and t.layer == layer
                        and t.phase == "backward" and t.microbatch == mb)
        assert back.id in by_id[first_bwd].deps


def test_timeline_frees_and_reloads():
    plan = _plan(layers=24)
    result = simulate(plan, build("dgx-b200"), SimOptions())
    memory = result.summary["memory"]
    # the trace's peak is the analytic one: the offloaded layers leave before the last
    # layers' saved tensors arrive
    assert memory["timeline_peak_bytes"] == pytest.approx(memory["peak_bytes"], rel=1e-9)
    plain = simulate(_plan(), build("dgx-b200"), SimOptions()).summary["memory"]
    assert memory["timeline_peak_bytes"] < plain["timeline_peak_bytes"] - 20 * 2 ** 30


def test_copies_cost_the_step_only_where_the_link_is_slow():
    # on PCIe (52.8 GB/s) a B200's 8B layer saves ~1 GB in ~2 ms of forward: the copies
    # cannot hide, and the forward waits for them; they never make a step faster
    topo = build("dgx-b200")
    plain = simulate(_plan(), topo, SimOptions()).summary["step_time_s"]
    few = simulate(_plan(layers=2), topo, SimOptions()).summary["step_time_s"]
    many = simulate(_plan(layers=31), topo, SimOptions()).summary["step_time_s"]
    assert plain <= few + 1e-9 < many
    per_mb_bytes = sum(saved_layer_bytes(_plan(), layer) for layer in range(31))
    # at least the copies out that no forward can cover: 31 layers out and back
    assert many - plain > 0.5 * 2 * per_mb_bytes / PCIE_GEN5_X16_COPY_BPS


def test_each_copy_is_priced_on_its_direction_of_the_host_link():
    # nvbandwidth issue 23: GH200 346 GB/s host to device, device to host ~15 % slower;
    # a GB200's Grace serves two GPUs
    plan = _plan(layers=4)
    tasks = _tasks(plan)
    out = next(t for t in tasks if t.op == OFFLOAD_OP)
    back = next(t for t in tasks if t.op == RELOAD_OP and t.layer == out.layer)
    gb200 = device("gb200")
    assert device_time_s(out, gb200, "bf16") == pytest.approx(out.bytes / (346e9 / 1.15 / 2))
    assert device_time_s(back, gb200, "bf16") == pytest.approx(back.bytes / (346e9 / 2))
    assert device_time_s(out, device("h100"), "bf16") == pytest.approx(out.bytes / 52.77e9)


@pytest.mark.parametrize("over, field", [
    ({"activation_offload": {"layers": 32}}, "activation_offload.layers"),
    ({"activation_offload": {"layers": 4}, "mesh": {"dp": 4, "tp": 1, "pp": 2}},
     "activation_offload with mesh.pp"),
    ({"activation_offload": {"layers": 4}, "recompute": "full"},
     "activation_offload with recompute"),
    ({"activation_offload": {"layers": 4}, "framework": "torchtitan"}, "framework"),
    ({"activation_offload": {"layers": 4, "weights": True}}, "activation_offload"),
    ({"activation_offload": {}}, "activation_offload.layers"),
    ({"activation_offload": {"layers": 0}}, "activation_offload.layers"),
    ({"activation_offload": {"layers": 4}, "cuda_graphs": True},
     "activation_offload with cuda_graphs"),
    ({"activation_offload": {"layers": 4}, "mesh": {"dp": 8, "tp": 1, "pp": 1, "ep": 8},
      "model": {"name": "tiny-moe", "hidden_size": 1024, "num_hidden_layers": 8,
                "num_attention_heads": 8, "num_key_value_heads": 8,
                "intermediate_size": 4096, "n_routed_experts": 16, "num_experts_per_tok": 2,
                "vocab_size": 32000},
      "moe": {"overlap_a2a": True}}, "activation_offload with moe.overlap_a2a"),
])
def test_refusals_name_the_setting(over, field):
    with pytest.raises(WorkloadError) as err:
        resolve(plan_from_dict({**BASE, **over}), 8)
    assert err.value.field.startswith(field)


def test_cli_refuses_with_one_line(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({**BASE, "activation_offload": {"layers": 4},
                                "recompute": "selective"}))
    out = subprocess.run([sys.executable, "-m", "simulator", "run", "--topo", "dgx-b200",
                          "--plan", str(path)], capture_output=True, text=True)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "activation_offload with recompute" in lines[0]


def test_reference_rows_carry_the_recipes_offload():
    # Megatron-Bridge llama3_workload_base_configs.py at c810129341: GB200 FP8-CS V2
    # cpu_offloading_num_layers 40, GB300 FP8-CS V2 20; 25.09's llama31_405b yaml: 95
    rows = {r["id"]: r for r in load_rows(DEFAULT_CSV)}
    expected = {"mb-llama3-70b-gb200-fp8-64": 40, "mb-llama3-70b-gb300-fp8-64": 20,
                "mb-llama3-70b-gb200-fp8-64-gbs128": 40, "mb-llama31-405b-gb200-fp8-128": 95}
    for rid, layers in expected.items():
        assert plan_dict(rows[rid])["activation_offload"] == {"layers": layers}
    assert sum("activation_offload" in plan_dict(r) for r in rows.values()) == len(expected)


FLAGS = LLAMA3_8B_FLAGS


def test_megatron_flags_import_and_export():
    from workloads.jobs import JobConfigError, read_megatron, write_megatron
    # core_v0.16.0's arguments.py: --cpu-offloading-num-layers N > 0 turns it on
    plan = plan_from_dict(read_megatron(FLAGS.format(
        extra="--cpu-offloading-num-layers 12")).plan)
    assert plan.activation_offload.layers == 12
    assert plan_from_dict(read_megatron(FLAGS.format(extra="--cpu-offloading-num-layers 0"))
                          .plan).activation_offload is None
    # core_v0.15.0 has no flag for it: the export says so instead of writing one
    exported = write_megatron(plan)
    assert "cpu-offloading" not in exported.text
    assert any("activation_offload" in note and "core_v0.16.0" in note
               for note in exported.notes)
    with pytest.raises(JobConfigError) as err:      # weights: not modelled
        read_megatron(FLAGS.format(extra="--cpu-offloading-num-layers 4 "
                                         "--cpu-offloading-weights"))
    assert "--cpu-offloading-weights" in str(err.value)


def test_bridge_yaml_import():
    from workloads.jobs import read_megatron
    yaml_text = """model:
  num_layers: 32
  hidden_size: 4096
  ffn_hidden_size: 14336
  num_attention_heads: 32
  num_query_groups: 8
  vocab_size: 128256
  seq_length: 4096
  cpu_offloading: true
  cpu_offloading_num_layers: 20
  cpu_offloading_double_buffering: true
train:
  micro_batch_size: 1
  global_batch_size: 64
"""
    job = read_megatron(yaml_text, source="run_config.yaml", lenient=True)
    assert job.plan["activation_offload"] == {"layers": 20}
    # a Bridge config turns it on with model.cpu_offloading, not with the count alone
    off = yaml_text.replace("cpu_offloading: true", "cpu_offloading: false")
    assert "activation_offload" not in read_megatron(off, source="run_config.yaml",
                                                     lenient=True).plan


def test_a_step_waiting_for_copies_reports_the_wait_not_compute():
    topo = build("dgx-b200")
    plain = simulate(_plan(), topo, SimOptions()).summary
    many = simulate(_plan(layers=31), topo, SimOptions()).summary
    # the same kernels run (a collective may overlap them a little differently); the
    # copies' stalls show as waits
    assert many["compute_s"] == pytest.approx(plain["compute_s"], rel=0.02)
    assert many["bubble_s"] > plain["bubble_s"] + 0.9 * (many["step_time_s"]
                                                  - plain["step_time_s"])


def test_search_bounds_and_reduced_plans_keep_the_offload_valid():
    # the search lowers one-layer and fewer-layer copies of a plan (simulator/search/
    # prune.py): the offload keeps its share of the layers, fewer than all
    from simulator.search.prune import LowerBound, reduced_plan
    plan = _plan(layers=24)
    assert reduced_plan(plan, 8, 1).activation_offload.layers == 6
    assert reduced_plan(plan, 1, 1).activation_offload is None
    topo = build("dgx-b200")
    step = simulate(plan, topo, SimOptions()).summary["step_time_s"]
    assert 0 < LowerBound(topo).bound_s(plan) <= step


def test_uneven_layers_keep_the_heaviest_window():
    # DeepSeek-style dense first layers save more than the MoE ones: the GPU's most is the
    # heaviest run of L - N consecutive layers (the first, here), not the last L - N
    model = {"name": "tiny-moe", "hidden_size": 1024, "num_hidden_layers": 8,
             "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 8192,
             "moe_intermediate_size": 512, "n_routed_experts": 16, "num_experts_per_tok": 2,
             "first_k_dense_replace": 3, "vocab_size": 32000}
    raw = {**BASE, "model": model, "training": {**BASE["training"], "seq_len": 4096},
           "mesh": {"dp": 8, "tp": 1, "pp": 1, "ep": 8}}
    plain = resolve(plan_from_dict(raw), 8)
    off = resolve(plan_from_dict({**raw, "activation_offload": {"layers": 3}}), 8)
    sizes = [saved_layer_bytes(plain, layer) for layer in range(8)]
    assert sizes[0] > sizes[-1]
    assert memory_breakdown(plain).activations_bytes - memory_breakdown(off).activations_bytes \
        == pytest.approx(sum(sizes) - sum(sizes[:5]))
    memory = simulate(off, build("dgx-b200"), SimOptions()).summary["memory"]
    assert memory["timeline_peak_bytes"] <= memory["peak_bytes"]
