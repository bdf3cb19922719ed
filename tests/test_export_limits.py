"""`export --max-gpus`: the topology an export reads is bounded as `run` bounds it (README,
"Limits"), and it is read as a ClusterSpec only, never built."""
from __future__ import annotations

import pytest

import topologies
from simulator.cli import build_parser, main
from topologies.presets import MAX_GPUS


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_export_takes_max_gpus_like_run():
    # The export's flags frozen as tests/test_cli.py freezes run's: change on purpose.
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for command in ("run", "export"):
        flags = {s for a in sub.choices[command]._actions for s in a.option_strings}
        assert "--max-gpus" in flags, command
    flags = {s for a in sub.choices["export"]._actions for s in a.option_strings}
    assert flags >= {"-o", "--output", "--topo", "--max-gpus"}
    assert "--max-tasks" not in flags   # nothing is simulated


@pytest.mark.parametrize("framework, plan", [("torchtitan", "fsdp.json"),
                                             ("megatron", "col.json")])
def test_a_topology_past_max_gpus_exits_2_with_one_line(framework, plan, capsys):
    # dgx-h100x200: 200 nodes x 8 GPUs = 1,600 GPUs (topologies/presets.py, _dgx).
    code, out, err = _run(capsys, "export", framework, plan, "--topo", "dgx-h100x200",
                          "--max-gpus", "1024")
    assert code == 2 and out == ""
    assert err.strip() == ("error: topology: got 'dgx-h100x200 (1,600 GPUs)'; allowed: at "
                           "most 1,024 GPUs (--max-gpus raises the limit)")


def test_the_default_bound_is_run_s_and_max_gpus_raises_it(monkeypatch, capsys):
    # 16,385 nodes x 8 = 131,080 GPUs: just past MAX_GPUS (131,072).
    big = "dgx-h100x16385"
    assert 16385 * 8 > MAX_GPUS
    code, _, err = _run(capsys, "export", "torchtitan", "fsdp.json", "--topo", big)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"at most {MAX_GPUS:,} GPUs" in err
    code, _, err = _run(capsys, "run", "--plan", "fsdp.json", "--topo", big)
    assert code == 2 and f"at most {MAX_GPUS:,} GPUs" in err
    # Raised, the export reads the size only: building the 131,080-GPU graph (seconds,
    # most of a GB) would be work the export does not need.
    def no_build(*_args, **_kwargs):
        raise AssertionError("export built a topology graph")
    monkeypatch.setattr(topologies.ClusterSpec, "build", no_build)
    code, out, _ = _run(capsys, "export", "torchtitan", "fsdp.json", "--topo", big,
                        "--max-gpus", "200000")
    assert code == 0 and "[parallelism]" in out


def test_a_bad_topology_is_refused_even_where_the_mesh_does_not_need_it(capsys):
    # A Megatron flags file needs no world size, so the topology is not needed, but a
    # --topo given is checked, never silently ignored.
    code, _, err = _run(capsys, "export", "megatron", "col.json", "--topo", "dgx-x100")
    assert code == 2 and err.startswith("error: topology: got 'dgx-x100'")


@pytest.mark.parametrize("value", ["0", "-5", "many"])
def test_max_gpus_must_be_a_positive_integer(value, capsys):
    code, _, err = _run(capsys, "export", "megatron", "col.json", f"--max-gpus={value}")
    assert code == 2 and "--max-gpus" in err
