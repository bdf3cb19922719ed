"""Collectives as NCCL runs them, on links that concurrent transfers share.

  * `CollectiveModel`: closed-form plans (NCCL's tuner over ring/tree/NVLS/NVLS_tree/
    CollNet/PAT and LL/LL128/Simple), each with its channels, latency, NVLS pipeline fill
    and flows on the topology's links.
  * `Network`: flow-level max-min fair sharing of links, on a SimPy environment.
  * `CommModel`: what the engine calls; a collective as an event, with rank-class twins.
  * `report`: nccl-tests-style tables for `python -m simulator collective`.
"""
from .collectives import ALGORITHMS, OPS, CollectiveModel, CollectivePlan, CommOptions
from .comm import CommModel
from .constants import PROTOCOLS, bus_factor
from .fluid import Network, idle_time_s, maxmin_rates

__all__ = ["ALGORITHMS", "OPS", "PROTOCOLS", "CollectiveModel", "CollectivePlan",
           "CommModel", "CommOptions", "Network", "bus_factor", "idle_time_s",
           "maxmin_rates"]
