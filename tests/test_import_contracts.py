"""The package boundaries of .importlinter, checked by import-linter on every test run.

Each contract runs on its own so that a failure names the contract it breaks: the layers
(validation -> simulator -> workloads | topologies -> inputs), the independence of workloads
and topologies, and no import cycle between the modules of any package.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# The console script installed next to this interpreter (import-linter is in the test extra).
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


@pytest.mark.parametrize("contract", ["layers", "independent", "acyclic"])
def test_import_contract_is_kept(contract):
    # PYTHONPATH first so that import-linter reads this tree's packages, not an installed copy.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    result = subprocess.run(
        [str(LINT_IMPORTS), str(REPO / ".importlinter"), "--contract", contract,
         "--no-cache", "--no-logo"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
