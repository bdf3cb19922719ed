#!/usr/bin/env bash
# The validation harness on ONE GPU, from the checkout, in under 5 minutes.
#
# It runs with the GPU machine's own torch and `PYTHONPATH=.` (no `pip install -e .`):
#   1. calibrate compute on the device (matmul against shape, copy bandwidth, causal
#      attention, launch overhead) into a one-GPU topology file;
#   2. train validation/plans/gpu-1rank.json (a 1.2B Llama-style model, bf16) for real;
#   3. simulate the recorded run on the calibrated device and on the bundled preset of the
#      same GPU, and print measured against simulated.
# Multi-rank collectives are NOT checked: one GPU has no peer (NVLink, NVSwitch and the
# network stay unmeasured); the one-rank run has no collective on its critical path.
#
# Usage
#   validation/gpu_check.sh --download [PYVER]   # here, with network: fills .gpu-wheels/
#                                                # (simpy, networkx, pyarrow, numpy wheels; PYVER
#                                                # e.g. 312 = the GPU machine's Python)
#   validation/gpu_check.sh [OUTDIR]             # on the GPU machine (OUTDIR default $OUT,
#                                                # else gpu-check-out)
#   validation/gpu_check.sh --cpu [OUTDIR]       # the same flow on the CPU (gloo, small
#                                                # dims): checks the script, not a GPU
# .gpu-wheels/ is ignored by git; hand it to the GPU machine with the checkout (the
# device tool's `carry`). Missing pure-Python or binary dependencies are installed from it
# into OUTDIR/.deps with `pip install --no-index --target`, nothing else is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=.gpu-wheels
PY=${PYTHON:-python3}

if [ "${1:-}" = "--download" ]; then
    pyver=${2:-$($PY -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')}
    $PY -m pip download --quiet --only-binary=:all: --no-deps --python-version "$pyver" \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux_2_28_x86_64 -d "$WHEELS" simpy networkx pyarrow numpy
    ls -la "$WHEELS"
    exit 0
fi

MODE=gpu
if [ "${1:-}" = "--cpu" ]; then MODE=cpu; shift; fi
OUTDIR=${1:-${OUT:-gpu-check-out}}
mkdir -p "$OUTDIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

missing=$($PY -c 'import importlib.util as u
print(" ".join(m for m in ("simpy", "networkx", "pyarrow", "numpy") if u.find_spec(m) is None))')
if [ -n "$missing" ]; then
    echo "installing from $WHEELS into $OUTDIR/.deps: $missing"
    $PY -m pip install --quiet --no-index --find-links "$WHEELS" --target "$OUTDIR/.deps" $missing
    export PYTHONPATH="$PYTHONPATH:$PWD/$OUTDIR/.deps"
fi

if [ "$MODE" = gpu ]; then
    BACKEND=nccl; DIMS=(); STEPS=(--steps 10 --warmup 3)
    $PY -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"
print("torch", torch.__version__, "on", torch.cuda.get_device_name(0))'
else
    BACKEND=gloo; STEPS=(--steps 3 --warmup 1)
    DIMS=(--dims "hidden=256,layers=2,heads=4,kv_heads=2,ffn=512,vocab=512,seq=128,batch=4,micro_batch=2")
fi

start=$(date +%s)
echo "== calibrate ($BACKEND, one rank)"
timeout 170 $PY -m validation calibrate --backend "$BACKEND" --nproc 1 --quick \
    -o "$OUTDIR/host.json"
echo "== run validation/plans/gpu-1rank.json"
timeout 120 $PY -m validation run --plan validation/plans/gpu-1rank.json --backend "$BACKEND" \
    --nproc 1 "${STEPS[@]}" "${DIMS[@]}" -o "$OUTDIR/gpu-1rank.parquet"
echo "== compare"
$PY -m validation.gpu_report "$OUTDIR" "$MODE"
echo "multi-rank collectives unchecked: this check runs on one GPU (no NVLink, NVSwitch or"
echo "network peer); the one-rank step has no collective on its critical path."
echo "elapsed $(( $(date +%s) - start )) s"
