"""Google's GPU recipes (source family `google-gpu-recipes`): step times that
AI-Hypercomputer/gpu-recipes READMEs print as an example DLLogger entry of their own run
(NeMo's `train_step_timing in s`, a mean over the last 5 steps), each on the nodes and
NCCL environment of its launcher, described by a job topology file
(validation/job_topologies.py)."""
from __future__ import annotations

import pytest

from validation.csv_input import read_reference_csv
from validation.errors import ValidationError
from validation.job_topologies import job_topology, job_topology_names
from topologies import TopologyError
from validation.reference_rows import (DEFAULT_CSV, cannot_express, hardware_name, load_rows,
                                       measured_step_s, plan_dict, topology_for)
from workloads import plan_from_dict

ROWS = {r["id"]: r for r in load_rows(DEFAULT_CSV) if r["source_family"] == "google-gpu-recipes"}
# Each entry's step and consumed_samples, as its README prints them (the run's identity:
# consumed_samples = global batch x (step + 1) on the config the row takes).
ENTRIES = {"gcp-llama3.1-70b-h200-fp8-256": (15, 16384, 20.0213),
           "gcp-mixtral-8x7b-h200-bf16-256": (26, 27648, 2.7396),
           "gcp-gpt3-175b-h100-fp8-256": (47, 98304, 25.1156),
           "gcp-llama3.1-70b-h100-bf16-256": (37, 77824, 67.8204),
           "gcp-llama3.1-405b-b200-fp8-224": (12, 26208, 118.1897),
           "gcp-llama3.1-70b-b200-fp8-256": (11, 24576, 19.9545),
           # scored on a named assumption (the CSV's `assumed` column): the GPU count; the
           # committed config, whose warm-up the run's learning rate contradicts
           "gcp-llama3-70b-h100-fp8-128": (36, 37888, 45.8136),
           "gcp-mixtral-8x7b-b200-fp8-256": (38, 39936, 1.0826)}


def test_each_row_is_its_entrys_run():
    assert set(ENTRIES) == set(ROWS)
    for row_id, (step, consumed, seconds) in ENTRIES.items():
        row = ROWS[row_id]
        assert int(row["global_batch_seqs"]) * (step + 1) == consumed, row_id
        plan = plan_from_dict(plan_dict(row))
        assert measured_step_s(row, plan) == pytest.approx(seconds, rel=1e-4)
        assert f"step {step}" in row["source"] and str(consumed) in row["source"], row_id


def test_job_topology_is_the_launchers_nodes_and_nccl_environment():
    ultra = topology_for(ROWS["gcp-llama3.1-70b-h200-fp8-256"])
    assert ultra.num_domains == 32 and ultra.domain_size == 8 and len(ultra.gpus) == 256
    assert hardware_name(ROWS["gcp-llama3.1-70b-h200-fp8-256"]) == "h200"
    env = ultra.transport.nccl_env     # the chart's NCCL_ALGO=Ring,Tree: no NVLS
    assert env.algorithms == {"ring", "tree"} and env.min_channels == 4
    mega = topology_for(ROWS["gcp-gpt3-175b-h100-fp8-256"])
    assert hardware_name(ROWS["gcp-gpt3-175b-h100-fp8-256"]) == "h100"
    env = mega.transport.nccl_env      # the chart's NCCL_PROTO=Simple and NVLS off
    assert env.protocols == {"Simple"} and not env.nvls and env.buffsize_bytes == 8 << 20
    assert mega.transport.wire_latency_s == pytest.approx(40.7e-6)   # TCPXO's per-step cost
    assert mega.nic_Bps < ultra.nic_Bps    # 200 against 400 Gb/s per GPU
    with pytest.raises(TopologyError, match="multiple of the 8 GPUs"):
        job_topology("gcp-a3mega-nemo2407", 12)


def test_gpt2_vocabulary_is_padded_as_nemo_pads_it():
    # NeMo 1 pads the GPT-2 BPE vocabulary (50257) to make_vocab_size_divisible_by (128) x TP
    # (GPT-3 175B keeps its preset's unpadded 50257: under 1 % of its head's FLOPs)
    for row_id, row in ROWS.items():
        if not row["model"].startswith("gcp-"):
            continue
        vocab = plan_from_dict(plan_dict(row)).model.vocab_size
        multiple = 128 * int(row["tp"])
        assert vocab % multiple == 0 and 50257 <= vocab < 50257 + multiple, row_id


def test_mixtral_drops_and_pads_so_its_routing_does_not_size_the_work():
    plan = plan_from_dict(plan_dict(ROWS["gcp-mixtral-8x7b-h200-bf16-256"]))
    assert plan.moe.capacity_factor == 1.0 and plan.moe.pad_to_capacity
    assert plan.moe.aux_loss     # the config's moe_aux_loss_coeff 0.01
    assert plan.mesh.ep == 8 and plan.model.num_experts == 8


def test_a_row_names_only_a_job_topology_of_the_directory(tmp_path):
    assert {"gcp-a3mega-nemo2407", "gcp-a3ultra-nemo2407", "gcp-a4-nemo2502"} <= set(
        job_topology_names())
    header = "source,hardware,topology,gpus,model,tp,pp,dp,global_batch_seqs,seq_len,metric,value\n"
    good = tmp_path / "good.csv"
    good.write_text(header + "x,y,gcp-a4-nemo2502,16,llama3-8b,1,1,16,16,8192,step_time_s,1.0\n")
    row = read_reference_csv(good)[0]
    topology = topology_for(row)
    assert len(topology.gpus) == 16 and topology.num_domains == 2 and hardware_name(row) == "b200"
    for name in ("../nccl_topologies/gcp-a3mega-x2", "/etc/passwd", "gcp-a3mega-x2"):
        bad = tmp_path / "bad.csv"
        bad.write_text(header + f"x,y,{name},16,llama3-8b,1,1,16,16,8192,step_time_s,1.0\n")
        with pytest.raises(ValidationError, match="topology"):
            read_reference_csv(bad)


def test_a_job_on_part_of_a_node_is_reported_not_raised():
    row = dict(ROWS["gcp-gpt3-175b-h100-fp8-256"], gpus="12", dp="12", tp="1", pp="1",
               global_batch_seqs="24")
    assert "gpus" in cannot_express(row) and "gcp-a3mega-nemo2407" in cannot_express(row)


def test_a_job_file_takes_its_nodes_network_and_only_a_nodes_file(tmp_path, monkeypatch):
    import validation.job_topologies as jt
    from topologies.presets_file import load_file

    # the A3 Mega job runs the nccl-tests file's TCPXO network under its chart's NCCL env
    nodes = load_file(jt.NODES_DIR / "gcp-a3mega-x2.json").fabric
    job = topology_for(ROWS["gcp-gpt3-175b-h100-fp8-256"])
    assert job.transport.wire_latency_s == nodes.transport.wire_latency_s
    assert nodes.transport.nccl_env.protocols == {"Simple", "LL128"}
    assert job.transport.nccl_env.protocols == {"Simple"}
    monkeypatch.setattr(jt, "JOB_TOPOLOGY_DIR", tmp_path)
    (tmp_path / "bad.json").write_text('{"nodes": "../job_topologies/gcp-a4-nemo2502"}')
    with pytest.raises(TopologyError, match="bad.nodes"):
        job_topology("bad", 16)
    (tmp_path / "odd.json").write_text('{"nodes": "gcp-a4-x2", "network": {}}')
    with pytest.raises(TopologyError, match="keys"):
        job_topology("odd", 16)
