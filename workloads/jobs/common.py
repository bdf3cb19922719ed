"""Shared by the importers and exporters: the import result, model references, and the
check that tells what an exported config could not express."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..models import PRESETS, ModelSpec
from ..plan import Plan, plan_from_dict

# Plan fields a job config never holds: the plan's own name and the cluster it runs on.
NOT_JOB_FIELDS = ("name", "source", "topology")


@dataclass
class Imported:
    """A job config read as a plan object (the plan file's JSON shape) and the import's
    notes: one line per ignored key, per warning (lenient), per assumption."""

    plan: dict[str, Any]
    notes: list[str] = field(default_factory=list)


@dataclass
class Exported:
    """A plan written as a framework's config text, and one line per plan field the
    framework could not express (what the config runs instead)."""

    text: str
    notes: list[str] = field(default_factory=list)


def model_ref(model: ModelSpec) -> str | dict[str, Any]:
    """The preset name when `model` has a preset's dimensions, else the model object."""
    for name, preset in PRESETS.items():
        if dataclasses.replace(model, name=name) == preset:
            return name
    return model.to_dict()


def preset_of(model: ModelSpec) -> str | None:
    """The preset with these dimensions, or None."""
    ref = model_ref(model)
    return ref if isinstance(ref, str) else None


def unexpressed(plan: Plan, text_plan: dict[str, Any], framework: str,
                reasons: dict[str, str]) -> list[str]:
    """One line per field that differs between `plan` and the plan the exported config
    imports as: what the framework cannot express, with why where known."""
    back = plan_from_dict(text_plan)
    lines = []
    for f in dataclasses.fields(Plan):
        if f.name in NOT_JOB_FIELDS:
            continue
        want, got = getattr(plan, f.name), getattr(back, f.name)
        if f.name == "model":      # the dimensions; a model's name is not run
            got = dataclasses.replace(got, name=want.name)
        if want != got:
            why = reasons.get(f.name, f"{framework} has no key for it")
            lines.append(f"not expressible in {framework}: {f.name} = {_show(want)} "
                         f"(the config runs {_show(got)}; {why})")
    if plan.topology:
        lines.append(f"not in a {framework} config: topology = {plan.topology!r} (the "
                     f"cluster; give --topo, or --topology to import)")
    return lines


def _show(value: Any) -> str:
    if isinstance(value, ModelSpec):
        return repr(value.name)
    if hasattr(value, "items"):
        return repr(dict(value))
    return repr(value)
