"""`list topologies|models|plans|studies`: what is bundled (`--json` too)."""
from __future__ import annotations

import argparse

import topologies
from workloads import MODEL_PRESETS, bundled_plans, load_plan

from .common import print_json


def register(sub) -> None:
    """Add the `list` subcommand."""
    p = sub.add_parser("list", help="list bundled topologies, models, plans or studies")
    p.add_argument("what", choices=("topologies", "models", "plans", "studies"))
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(handler=handle)


def rows(what: str) -> list[dict]:
    """The listing as rows."""
    if what == "topologies":
        out = []
        for name in topologies.preset_names():
            example = name.replace("xN", "x4")
            spec = topologies.cluster_spec(example)
            out.append({"name": name, "example": example,
                        "gpus_per_domain": spec.domain_size, "gpu": spec.gpu.name,
                        "description": spec.description})
        return out
    if what == "studies":
        from ..studies import registry
        return [{"name": name, "description": module.HELP}
                for name, module in sorted(registry().items())]
    if what == "models":
        return [{"name": m.name, "params": m.total_params(), "layers": m.num_layers,
                 "hidden_size": m.hidden_size} for m in MODEL_PRESETS.values()]
    out = []
    for name in bundled_plans():
        plan = load_plan(name)
        out.append({"name": name, "model": plan.model.name, "topology": plan.topology,
                    "description": plan.source.get("description", "")})
    return out


def handle(args: argparse.Namespace) -> int:
    """Print the listing."""
    items = rows(args.what)
    if args.json:
        print_json(items)
        return 0
    # columns as wide as their longest entry: plan names run from 7 to 20 characters
    widths = {key: max((len(str(item.get(key) or "")) for item in items), default=0)
              for key in ("name", "model", "topology")}
    for item in items:
        if args.what == "models":
            print(f"{item['name']:<{widths['name']}} {item['params'] / 1e9:8.2f} B params, "
                  f"{item['layers']} layers, hidden {item['hidden_size']}")
        elif args.what == "studies":
            print(f"{item['name']:<{widths['name']}} {item['description']}")
        elif args.what == "topologies":
            text = item["description"]
            print(f"{item['name']:<{widths['name']}} "
                  f"{text.replace('4 x', 'N x') if 'xN' in item['name'] else text}")
        else:
            print(f"{item['name']:<{widths['name']}} {item['model']:<{widths['model']}} "
                  f"{item['topology'] or '':<{widths['topology']}} {item['description']}")
    return 0
