"""Pipeline schedules: Megatron's interleaved 1F1B order, chunk placement, the p2p sends
between chunks (closed-form counts and bytes) and the bubble measured from the trace.

Source: Narayanan et al. 2021, arXiv:2104.04473, section 2.2: the 1F1B bubble is
(p - 1) / (m + p - 1) of the step; interleaving v chunks per stage divides the bubble time
by v, so its fraction is (p - 1) / (v m + p - 1).
"""
from __future__ import annotations

import functools
import json

import pytest

import topologies
from simulator import simulate
from workloads import plan_from_dict, resolve
from workloads.lowering import lower
from workloads.schedules import interleaved_order, stage_order

from conftest import small_plan


def test_megatron_interleaved_order_p2_v2_m4():
    # Hand-derived from Megatron-LM's get_model_chunk_id with p = 2, v = 2, m = 4, stage 0:
    # warm-up 2 (p - 1) + (v - 1) p = 4 forwards, then 1F1B, then the cool-down.
    assert interleaved_order(0, 2, 4, 2) == [
        ("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("F", 1, 1),
        ("F", 2, 0), ("B", 0, 1), ("F", 3, 0), ("B", 1, 1),
        ("F", 2, 1), ("B", 0, 0), ("F", 3, 1), ("B", 1, 0),
        ("B", 2, 1), ("B", 3, 1), ("B", 2, 0), ("B", 3, 0)]


@pytest.mark.parametrize("p,v,m", [(2, 2, 4), (4, 2, 8), (4, 3, 4), (3, 4, 6), (8, 2, 16)])
def test_interleaved_order_runs_every_chunk_once_each_way(p, v, m):
    for stage in range(p):
        order = interleaved_order(stage, p, m, v)
        forwards = [(mb, c) for k, mb, c in order if k == "F"]
        backwards = [(mb, c) for k, mb, c in order if k == "B"]
        every = sorted((mb, c) for mb in range(m) for c in range(v))
        assert sorted(forwards) == every and sorted(backwards) == every
        for mb, c in backwards:        # a backward after its forward
            assert order.index(("F", mb, c)) < order.index(("B", mb, c))
        first_b = next(i for i, s in enumerate(order) if s[0] == "B")
        warmup = min(2 * (p - stage - 1) + (v - 1) * p, m * v)
        # The steady phase starts with a forward (1F1B), unless the warm-up took them all.
        assert first_b == (warmup + 1 if warmup < m * v else m * v)


def test_1f1b_order_is_unchanged_for_v1():
    assert stage_order("1f1b", 0, 4, 6) == [("F", 0, 0), ("F", 1, 0), ("F", 2, 0),
                                           ("F", 3, 0), ("B", 0, 0), ("F", 4, 0), ("B", 1, 0),
                                           ("F", 5, 0), ("B", 2, 0), ("B", 3, 0), ("B", 4, 0),
                                           ("B", 5, 0)]


def _program(raw, world):
    return lower(resolve(plan_from_dict(raw), world))


def test_chunks_sit_on_stage_c_mod_p_and_sends_match_the_closed_form():
    p, v, m = 2, 2, 4
    raw = small_plan(mesh={"pp": p, "dp": 1, "tp": 1}, training={"global_batch": m},
                     pipeline={"schedule": "interleaved", "virtual_stages": v})
    prog = _program(raw, p)
    # 4 layers in p v = 4 chunks of one layer: stage 0 holds layers 0 and 2, stage 1 1 and 3.
    assert prog.notes["layers_per_chunk"] == [1, 1, 1, 1]
    for stage, layers in enumerate(({0, 2}, {1, 3})):
        assert {t.layer for t in prog.stages[stage] if t.layer >= 0} == layers
    sends = [t for st in prog.stages for t in st if t.stream == "pp_send"]
    recvs = [t for st in prog.stages for t in st if t.stream == "pp_recv"]
    # Per micro-batch, p v - 1 chunk boundaries, each crossed by one activation and one
    # gradient: 2 m (p v - 1) sends, as many receives, with matching tags.
    assert len(sends) == len(recvs) == 2 * m * (p * v - 1)
    assert sorted(t.tag for t in sends) == sorted(t.tag for t in recvs)
    tokens, h = 2048, 1024
    assert {t.bytes for t in sends} == {tokens * h * 2}
    # Stage p - 1 sends chunk 1's activations to chunk 2 on stage 0: the wrap-around.
    last = [t for t in prog.stages[p - 1] if t.stream == "pp_send" and t.tag[0] == "act"]
    assert {t.peer for t in last} == {+1} and {t.tag[1] for t in last} == {1}


def test_interleaved_plan_simulates_with_wraparound_sends():
    raw = small_plan(mesh={"pp": 2, "dp": 4}, training={"global_batch": 16},
                     pipeline={"schedule": "interleaved", "virtual_stages": 2})
    result = simulate(plan_from_dict(raw), topologies.build("dgx-h100"))
    groups = set(result.trace.filter(
        result.trace["stream"].to_numpy(zero_copy_only=False) == "pp_send")["group"].to_pylist())
    assert "pp:1->0" in groups and "pp:0->1" in groups


# ------------------------------------------------------------------ bubble from the trace
@functools.lru_cache(maxsize=None)
def _bubble(m: int, v: int, tmp: str) -> tuple[float, float]:
    """(idle fraction, idle seconds) of the critical rank (stage 0) from the trace.

    Equal stages: 8 layers of a compute-heavy model on p = 4 stages, a 256-token
    vocabulary so the embedding and output layer are negligible, no data parallelism (no
    gradient reductions), 4 GPUs on one NVSwitch so activation sends (16 MiB at ~360 GB/s)
    are ~1 % of a stage's compute. The step is measured to the end of the last backward
    (the optimizer step is not part of the pipeline).
    """
    raw = {"name": "bubble", "model": {"hidden_size": 4096, "num_hidden_layers": 8,
                                       "num_attention_heads": 32, "num_key_value_heads": 8,
                                       "intermediate_size": 14336, "vocab_size": 256},
           "training": {"global_batch": m, "micro_batch": 1, "seq_len": 4096},
           "mesh": {"pp": 4, "dp": 1},
           "pipeline": {"schedule": "interleaved" if v > 1 else "1f1b", "virtual_stages": v}}
    result = simulate(plan_from_dict(raw), topologies.build(tmp))
    t = result.trace.to_pandas()
    assert result.summary["critical_rank"] == 0
    c = t[(t["rank"] == 0) & (t["kind"] == "compute") & (t["phase"] != "optimizer")]
    end = c["end_s"].max()
    busy = (c["end_s"] - c["start_s"]).sum()
    return 1 - busy / end, end - busy


@pytest.fixture(scope="module")
def quad_topology(tmp_path_factory):
    path = tmp_path_factory.mktemp("topo") / "quad.json"
    path.write_text(json.dumps({"name": "quad", "gpu": "h100", "domains": 1,
                                "gpus_per_domain": 4}))
    return str(path)


def test_1f1b_bubble_fraction_matches_closed_form(quad_topology):
    p, m = 4, 8
    fraction, _ = _bubble(m, 1, quad_topology)
    assert fraction == pytest.approx((p - 1) / (m + p - 1), rel=0.04)   # 0.2727


def test_interleaving_divides_the_bubble_by_v(quad_topology):
    p, m, v = 4, 8, 2
    fraction, idle = _bubble(m, v, quad_topology)
    assert fraction == pytest.approx((p - 1) / (v * m + p - 1), rel=0.07)   # 0.1579
    _, idle_1f1b = _bubble(m, 1, quad_topology)
    assert idle_1f1b / idle == pytest.approx(v, rel=0.12)


@pytest.mark.parametrize("name,chunks", [("interleaved.json", 8), ("pipeline_1f1b.json", 4),
                                         ("deepseek_v3.json", 8)])
def test_bundled_pipeline_plans_lower(name, chunks):
    from workloads import load_plan
    plan = load_plan(name)
    prog = lower(resolve(plan, topologies.build(plan.topology).world_size))
    assert len(prog.notes["layers_per_chunk"]) == chunks
    assert sum(prog.notes["layers_per_stage"]) == plan.model.num_layers
    sends = sum(1 for st in prog.stages for t in st if t.stream == "pp_send")
    assert sends == 2 * prog.plan.micro_batches * (chunks - 1)


def test_llama3_split_first_chunk_embedding_only_last_chunk_head_only():
    # Llama 3 405B (arXiv:2407.21783 section 3.3.2): one layer fewer on the first and last
    # stages, "the first model chunk on the first stage has only the embedding, and the
    # last model chunk on the last stage has only output projection and loss": 126 layers
    # + 2 = 16 stages x 8 chunks of one layer. Here: 4 layers on p = 2, v = 3.
    p, v, m = 2, 3, 4
    raw = small_plan(mesh={"pp": p, "dp": 1, "tp": 1}, training={"global_batch": m},
                     pipeline={"schedule": "interleaved", "virtual_stages": v})
    prog = _program(raw, p)
    assert prog.notes["layers_per_chunk"] == [0, 1, 1, 1, 1, 0]
    # Stage 0 holds chunks 0 (embedding), 2, 4 (layers 1, 3); stage 1 chunks 1, 3, 5 (head).
    assert {t.layer for t in prog.stages[0] if t.layer >= 0} == {1, 3}
    assert {t.layer for t in prog.stages[1] if t.layer >= 0} == {0, 2}
    ops0 = {t.op for t in prog.stages[0]}
    ops1 = {t.op for t in prog.stages[1]}
    assert "embedding" in ops0 and "output" not in ops0
    assert "output" in ops1 and "embedding" not in ops1
    raw["mesh"]["dp"] = 4
    raw["training"]["global_batch"] = 4 * m
    result = simulate(plan_from_dict(raw), topologies.build("dgx-h100"))
    step = result.summary["step_time_s"]
    trace = result.trace.to_pandas()
    compute = trace[trace["kind"] == "compute"]
    by_rank = dict(tuple(compute.groupby("rank")))
    assert len(by_rank) == 2   # one rank of each stage (dp twins)
    first, last = (by_rank[r] for r in sorted(by_rank))
    # the replay ran the split: embedding only on the first stage, the head only on the
    # last, each for every micro-batch, and each stage's own layers
    assert set(first.loc[first["op"] == "embedding", "microbatch"]) == set(range(m))
    assert set(last.loc[last["op"] == "output", "microbatch"]) == set(range(m))
    assert "output" not in set(first["op"]) and "embedding" not in set(last["op"])
    assert set(first["layer"]) - {-1} == {1, 3} and set(last["layer"]) - {-1} == {0, 2}
    # no stage finishes before its own compute
    for rows in (first, last):
        assert (rows["end_s"] - rows["start_s"]).sum() <= step * (1 + 1e-9)
