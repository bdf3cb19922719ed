"""Workloads: model specs, the plan file, its mesh, sharding rules and lowering to a Program."""
from .errors import WorkloadError
from .mesh import Mesh, ParallelDims
from .models import PRESETS as MODEL_PRESETS, ModelSpec, load_model
from .plan import Plan, bundled_plans, find_plan, load_plan, plan_from_dict, resolve

__all__ = ["MODEL_PRESETS", "Mesh", "ModelSpec", "ParallelDims", "Plan", "WorkloadError",
           "bundled_plans", "find_plan", "load_model", "load_plan", "plan_from_dict", "resolve"]
