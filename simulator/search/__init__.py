"""Search: find the best plan for a model, batch and topology by simulation.

    from simulator.search import Search, SearchSpace
    result = Search(model, "llama3-70b", topology, "dgx-h100x4", global_batch=32,
                    seq_len=8192).run()
    result.best.plan_dict        # a plan file object `python -m simulator run` accepts

See runner.py for the stages (feasibility, lower bounds, reduced simulations, full
simulations of the finalists).
"""
from .estimate import Estimator
from .prune import Checker, LowerBound, candidate_plan, reduced_plan
from .runner import Ranked, Search, SearchResult
from .space import GROUPS, Candidate, SearchSpace, enumerate_space, strategy_assignments

__all__ = ["Candidate", "Checker", "Estimator", "GROUPS", "LowerBound", "Ranked", "Search",
           "SearchResult", "SearchSpace", "candidate_plan", "enumerate_space", "reduced_plan",
           "strategy_assignments"]
