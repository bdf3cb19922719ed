"""`study NAME`: run one of the built-in studies (simulator/studies)."""
from __future__ import annotations

import argparse

from ..studies import registry


def register(sub) -> None:
    """Add the `study` subcommand with one sub-subcommand per study."""
    p = sub.add_parser("study", help="run a built-in study (table + plot)")
    studies = p.add_subparsers(dest="study", required=True, parser_class=type(p))
    for name, module in sorted(registry().items()):
        s = studies.add_parser(name, help=module.HELP)
        s.add_argument("--json", action="store_true", help="print JSON")
        s.add_argument("--plot", metavar="FILE.png", help="write the plot here")
        s.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
        module.add_arguments(s)
        s.set_defaults(handler=module.run)
