"""`search`: the staged search agrees with brute force on a tiny model, respects the
memory budget, and writes a plan that `run` simulates to the same step time."""
from __future__ import annotations

import json

import pytest

import topologies
from simulator.cli import main
from simulator.search import Search, SearchSpace, enumerate_space
from simulator.search.estimate import points
from simulator.search.prune import Checker, LowerBound, candidate_plan
from simulator import simulate
from workloads import load_model, resolve
from workloads.memory import peak_memory

TINY = {"name": "tiny", "hidden_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
        "num_key_value_heads": 4, "intermediate_size": 1536, "vocab_size": 4096}
SPACE = SearchSpace(tp=(1, 4), pp=(1,), micro_batch=(1,), recompute=("none",), fsdp=(True,),
                    strategies=("col", "row", "seq"))
BIG = SearchSpace(tp=(1, 2, 4), pp=(1, 2), micro_batch=(1, 2), recompute=("none", "full"))


@pytest.fixture(scope="module")
def topo():
    return topologies.build("dgx-h100")


def _search(topo, exhaustive: bool, budget=None, space=SPACE) -> object:
    model = load_model(TINY)
    return Search(model, model.to_dict(), topo, "dgx-h100", global_batch=8, seq_len=1024,
                  space=space, budget_bytes=budget, top_k=3, exhaustive=exhaustive).run()


def test_staged_search_finds_the_brute_force_best(topo):
    brute = _search(topo, exhaustive=True)
    staged = _search(topo, exhaustive=False)
    assert brute.counts["full_simulations"] == brute.counts["feasible"] > 150
    assert staged.counts["full_simulations"] < brute.counts["full_simulations"]
    assert staged.best.candidate == brute.best.candidate
    assert staged.best.step_time_s == brute.best.step_time_s
    # the brute-force ranking is sorted by full simulation, ties by the stable key
    times = [r.step_time_s for r in brute.top]
    assert times == sorted(times)


def test_search_never_returns_a_plan_over_the_budget(topo):
    free = _search(topo, exhaustive=False)
    budget = 0.97 * free.best.summary["peak_memory_bytes"]
    tight = _search(topo, exhaustive=False, budget=budget)
    assert tight.dropped.get("memory: exceeds budget", 0) > 0
    assert tight.top
    for r in tight.top:
        assert r.summary["peak_memory_bytes"] <= budget


def test_the_feasibility_check_prices_each_candidates_own_memory(topo):
    """The memory cache shares a peak only between candidates whose strategies the memory
    model cannot tell apart: a seq weight is whole on every TP rank, col / row split it
    (it once keyed on 'replicated or not', admitting all-seq plans over the budget)."""
    model = load_model(TINY)
    space = SearchSpace(tp=(4,), pp=(1,), micro_batch=(1,), recompute=("none",),
                        fsdp=(True, False), strategies=("col", "row", "seq", "replicate"))
    checker = Checker(topo, float("inf"), model.to_dict())
    peaks = set()
    for c in enumerate_space(space, model, 8, 8, 1024).candidates:
        found = checker.check(c)
        if found.plan is None:
            continue
        assert found.peak_memory_bytes == peak_memory(found.plan).peak_bytes, c.key
        peaks.add(found.peak_memory_bytes)
    assert len(peaks) > 4    # strategies do change the peak


def test_lower_bound_is_below_the_full_simulation(topo):
    model = load_model(TINY)
    en = enumerate_space(BIG, model, 8, 8, 1024)
    bound = LowerBound(topo)
    for c in en.candidates[::97]:
        plan = resolve(candidate_plan(c, model.to_dict()), 8)
        assert bound.bound_s(plan) <= simulate(plan, topo).summary["step_time_s"]


def test_estimate_points_are_exact_for_small_programs(topo):
    model = load_model(TINY)
    c = enumerate_space(SPACE, model, 8, 8, 1024).candidates[0]
    p = points(resolve(candidate_plan(c, model.to_dict()), 8))
    assert p.k == (p.k_full,) and p.m == (p.m_full,)


def test_enumeration_folds_equivalent_points():
    model = load_model(TINY)
    en = enumerate_space(SearchSpace(tp=(1,), pp=(1,), micro_batch=(1,)), model, 8, 8, 1024)
    # tp 1: one strategy assignment, SP folded, selective folded into none
    assert {c.recompute for c in en.candidates} == {"none", "full"}
    assert not any(c.sequence_parallel for c in en.candidates)
    assert en.folded["selective recompute = none under flash attention"] > 0
    keys = [c.key for c in en.candidates]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)


def test_cli_best_plan_reproduces_the_step_time(tmp_path, capsys):
    best = tmp_path / "best.json"
    code = main(["search", "--topo", "dgx-h100", "--model", "llama3-8b", "--global-batch", "8",
                 "--seq-len", "4096", "--tp", "8", "--pp", "1", "--micro-batch", "1",
                 "--recompute", "none", "--fsdp", "on", "--strategies", "col,row,seq",
                 "--top", "2", "--json", "-o", str(best)])
    out, err = capsys.readouterr()
    assert code == 0, err
    found = json.loads(out)
    assert json.loads(best.read_text()) == found["best"]
    assert len(found["top"]) == 2 and found["counts"]["full_simulations"] >= 2
    code = main(["run", "--plan", str(best), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["step_time_s"] == found["top"][0]["summary"]["step_time_s"]


@pytest.mark.parametrize("argv", [
    ["--micro-batch", "0"], ["--recompute", "some"], ["--global-batch", "0"],
    ["--model", "no-such-model"], ["--topo", "no-such-topo"], ["--memory-budget", "-1"],
])
def test_cli_bad_input_exits_2_with_one_line(argv, capsys):
    base = {"--topo": "dgx-h100", "--model": "llama3-8b", "--global-batch": "8",
            "--seq-len": "4096"}
    for flag, value in zip(argv[::2], argv[1::2]):
        base[flag] = value
    code = main(["search", *[x for kv in base.items() for x in kv]])
    _, err = capsys.readouterr()
    assert code == 2
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("flag, value", [
    ("--tp", "3"), ("--pp", "5,7"), ("--cp", "3"), ("--micro-batch", "9,16")])
def test_cli_a_degree_no_plan_can_take_names_its_flag(flag, value, capsys):
    code = main(["search", "--topo", "dgx-h100", "--model", "llama3-8b", "--global-batch", "8",
                 "--seq-len", "4096", flag, value])
    _, err = capsys.readouterr()
    assert code == 2 and err.startswith(f"error: {flag}: got '{value}'"), err


def test_cli_nothing_fits_is_bad_input(capsys):
    code = main(["search", "--topo", "dgx-h100", "--model", "llama3-70b", "--global-batch", "8",
                 "--seq-len", "8192", "--memory-budget", "1", "--tp", "8", "--pp", "1"])
    _, err = capsys.readouterr()
    assert code == 2 and "memory" in err and len(err.strip().splitlines()) == 1
