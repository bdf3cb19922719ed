"""`python -m validation.gpu_report OUTDIR gpu|cpu`: the table of validation/gpu_check.sh.

The one-rank run in OUTDIR/gpu-1rank.parquet is simulated on the calibrated device
(OUTDIR/host.json) and, on a GPU, on the bundled specification of the same chip as a
one-GPU topology (OUTDIR/preset-1gpu.json, written here), then printed as one table with the
calibrated compute figures. The comparisons are also written to OUTDIR/gpu_check.json.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from .compare import compare_run, format_report

# torch.cuda.get_device_name() substrings -> the bundled GPU specification (topologies/specs.py)
PRESET_GPUS = (("H200", "h200"), ("H100", "h100"), ("B200", "b200"), ("A100", "a100"))


def preset_gpu() -> str | None:
    """The bundled GPU specification matching this machine's CUDA device, if any."""
    import torch

    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0)
    return next((spec for key, spec in PRESET_GPUS if key in name), None)


def _row(label: str, c: dict[str, Any]) -> str:
    return (f"| {label} | {c['measured_step_s']:.4f} | {c['simulated_step_s']:.4f} "
            f"| {c['error_pct']:+.1f} % |")


def report(outdir: Path, mode: str) -> str:
    """The comparisons as a Markdown table plus each one's detail lines."""
    measured = str(outdir / "gpu-1rank.parquet")
    topologies = [("calibrated device (host.json)", str(outdir / "host.json"))]
    gpu = preset_gpu() if mode == "gpu" else None
    if gpu:
        preset = outdir / "preset-1gpu.json"
        preset.write_text(json.dumps({"name": f"{gpu}-1gpu", "domains": 1,
                                      "gpus_per_domain": 1, "gpu": gpu}))
        topologies.append((f"bundled {gpu} specification", str(preset)))
    results = {label: compare_run(measured, topo) for label, topo in topologies}
    (outdir / "gpu_check.json").write_text(json.dumps(results, indent=2, default=str))
    host = json.loads((outdir / "host.json").read_text())
    lines = ["| simulated on | measured step (s) | simulated step (s) | error |",
             "|---|---:|---:|---:|"]
    lines += [_row(label, c) for label, c in results.items()]
    gpu_raw = host.get("gpu", {})
    if isinstance(gpu_raw, dict):
        lines.append("")
        lines.append("calibrated: " + ", ".join(f"{k} {v}" for k, v in sorted(gpu_raw.items())
                                                if isinstance(v, (int, float))))
    for label, c in results.items():
        lines += ["", f"{label}:", format_report(c)]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Entry point: OUTDIR and mode (gpu or cpu)."""
    outdir, mode = Path(argv[0]), (argv[1] if len(argv) > 1 else "gpu")
    print(report(outdir, mode))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
