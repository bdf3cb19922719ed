"""User topology files (format in docs/design.md): a JSON object read into a ClusterSpec,
every field checked (a bad one is a TopologyError naming it, the value and what is
allowed), counts bounded before anything is sized by them.
"""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from inputs import decimal, finite, load_json_file

from .builders import FabricSpec
from .errors import TopologyError
from .gemm_k_loop import SHORTEST_MEASURED_K
from .presets_spec import ClusterSpec
from .racks import RackLayout, rack_layout
from .specs import DeviceProfile, DeviceSpec, device, training_dtype_peaks
from .topology import COLLECTIVE_OPS, MeasuredCollective
from .transport import NetTransport, host_staged_nic_Bps, parse_nccl_env, parse_tuner

GB = 1e9


# Every number of a topology file is a rate (GB/s, TFLOP/s), a time (us), a size or a
# count in human units: past 1e12 of any of them, or a positive value below 1e-6, is no
# hardware and would overflow or vanish once scaled to bytes and seconds (a 1e308 TFLOP/s
# peak, a 1e-300 bandwidth times a 1e-300 efficiency).
MAX_MAGNITUDE = 1e12
MIN_POSITIVE = 1e-6


def _number(obj: dict, key: str, where: str, default: Any = None, minimum: float = 0.0,
            integer: bool = False, maximum: float = math.inf, allow_minimum: bool = False) -> Any:
    """A finite number above `minimum` (or equal to it with allow_minimum), at most
    `maximum` and MAX_MAGNITUDE, at least MIN_POSITIVE where it must be positive; an
    integer when asked."""
    if key not in obj:
        if default is None:
            raise TopologyError(f"{where}.{key}", None, "a required number")
        return default
    value, maximum = obj[key], min(maximum, MAX_MAGNITUDE)
    if not allow_minimum and minimum < MIN_POSITIVE:
        minimum, allow_minimum = MIN_POSITIVE, True
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and finite(value)
    if ok and integer:
        ok = float(value).is_integer()
    if ok:
        ok = (value >= minimum if allow_minimum else value > minimum) and value <= maximum
    if not ok:
        kind = "an integer" if integer else "a finite number"
        low = ">=" if allow_minimum else ">"
        raise TopologyError(f"{where}.{key}", value,
                            f"{kind} {low} {minimum:g} and <= {maximum:g}")
    return int(value) if integer else float(value)


# DeviceProfile fields: (minimum, maximum, integer, minimum allowed)
_PROFILE_RANGES = {
    "gemm_efficiency": (0.0, 1.0, False, False), "attention_efficiency": (0.0, 1.0, False, False),
    "memory_efficiency": (0.0, 1.0, False, False), "gemm_tile": (1, math.inf, True, True),
    "launch_overhead_s": (0.0, 1.0, False, True),
    "redistribute_overhead_s": (0.0, 1.0, False, True),
    "collective_skew_s": (0.0, 1.0, False, True),
    "overlap_compute_factor": (0.0, 1.0, False, False),
    "overlap_compute_factor_nvls": (0.0, 1.0, False, False),
    "gemm_reference_k": (0.0, 2.0 ** 31, False, True),
    "gemm_k0_bf16": (0.0, 2.0 ** 31, False, True),
    "sustained_tensor_ratio": (0.0, 1.0, False, False),
}
_PROFILE_FLAGS = frozenset({"concurrent_collectives", "persistent_gemm_blocks"})


def _known_keys(raw: dict, where: str, allowed: tuple[str, ...]) -> None:
    """A key the file format does not have is an error, not silently ignored."""
    for key in raw:
        if key not in allowed:
            raise TopologyError(f"{where}.{key}", raw[key], "keys " + ", ".join(allowed))


def _text(raw: dict, key: str, where: str, default: str) -> str:
    """A string field (a name, a description)."""
    value = raw.get(key, default)
    if not isinstance(value, str) or len(value) > 1000:
        raise TopologyError(f"{where}.{key}", value, "a string of at most 1000 characters")
    return value


def _flag(raw: dict, key: str, where: str, default: bool) -> bool:
    """A JSON boolean (the string "no" is not false)."""
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise TopologyError(f"{where}.{key}", value, "true or false")
    return value


_GPU_KEYS = ("base", "name", "bf16_tflops", "fp32_tflops", "fp8_tflops", "hbm_gb",
             "hbm_GBps", "nvlink_GBps", "nvlink_nccl_GBps", "nvlink_links", "nvls",
             "sm_count", "profile")
# Upper bounds of a file's counts: far past any real part (an H100 has 18 NVLinks and
# 132 SMs, a B200 148), low enough that no count makes the model allocate without end.
MAX_LINKS, MAX_SMS = 1024, 1 << 16
# Any count of domains or GPUs a file gives (the GPU total is checked against --max-gpus).
MAX_COUNT = 1 << 30


def _gpu(raw: Any) -> DeviceSpec:
    if isinstance(raw, str):
        return device(raw)
    if not isinstance(raw, dict):
        raise TopologyError("gpu", raw, "a GPU name or an object")
    _known_keys(raw, "gpu", _GPU_KEYS)
    if "base" in raw and not isinstance(raw["base"], str):
        raise TopologyError("gpu.base", raw["base"], "a GPU name")
    base = device(raw["base"]) if "base" in raw else None
    def num(key: str, fallback: float | None) -> float:
        return _number(raw, key, "gpu", default=fallback)
    tflops = 1e12
    bf16 = num("bf16_tflops", base and base.peak("bf16") / tflops) * tflops
    # fp32 matmuls run on TF32 tensor cores at half the BF16 rate on NVIDIA GPUs (H100,
    # A100 datasheets), the default when neither the file nor a base GPU says.
    fp32 = num("fp32_tflops", base.peak("fp32") / tflops if base else bf16 / tflops / 2) \
        * tflops
    fp8_default = base.peak_flops["fp8"] / tflops if base and "fp8" in base.peak_flops else None
    fp8 = None
    if "fp8_tflops" in raw or fp8_default:   # no FP8 unless the file or the base has it
        fp8 = num("fp8_tflops", fp8_default) * tflops
    # every training dtype the FP8 (and a Blackwell base's FP4) tensor cores run, as the
    # presets have them (specs.py training_dtype_peaks)
    peaks = dict(training_dtype_peaks(bf16, fp8, fp32, base.peak_flops.get("nvfp4")
                                      if base else None))
    spec = DeviceSpec(
        name=_text(raw, "name", "gpu", base.name if base else "custom"),
        peak_flops=peaks,
        hbm_bytes=num("hbm_gb", base and base.hbm_bytes / GB) * GB,
        hbm_Bps=num("hbm_GBps", base and base.hbm_Bps / GB) * GB,
        nvlink_Bps=num("nvlink_GBps", base and base.nvlink_Bps / GB) * GB,
        nvlink_links=_number(raw, "nvlink_links", "gpu", base.nvlink_links if base else 1,
                             integer=True, maximum=MAX_LINKS),
        nccl_nvlink_link_Bps=0.0, nvls=_flag(raw, "nvls", "gpu", base.nvls if base else False),
        sm_count=_number(raw, "sm_count", "gpu", base.sm_count if base else 1, integer=True,
                         maximum=MAX_SMS))
    nccl_total = num("nvlink_nccl_GBps",
                     base.nccl_nvlink_Bps / GB if base else spec.nvlink_Bps / GB) * GB
    spec = replace(spec, nccl_nvlink_link_Bps=nccl_total / spec.nvlink_links)
    profile = raw.get("profile", {})
    if not isinstance(profile, dict):
        raise TopologyError("gpu.profile", profile, "an object of DeviceProfile fields")
    values = {}
    for key, value in profile.items():
        if key in _PROFILE_FLAGS:
            if not isinstance(value, bool):
                raise TopologyError(f"gpu.profile.{key}", value, "true or false")
            values[key] = value
            continue
        if key not in _PROFILE_RANGES:
            raise TopologyError(f"gpu.profile.{key}", value,
                                ", ".join(sorted(set(_PROFILE_RANGES) | _PROFILE_FLAGS)))
        low, high, integer, inclusive = _PROFILE_RANGES[key]
        values[key] = _number(profile, key, "gpu.profile", minimum=low, maximum=high,
                              integer=integer, allow_minimum=inclusive)
        if key == "gemm_reference_k" and 0 < values[key] < SHORTEST_MEASURED_K:
            raise TopologyError(f"gpu.profile.{key}", value,
                                f"0 (no K-loop pricing) or at least {SHORTEST_MEASURED_K}")
    # Without a base GPU or an SM count (1 by default) no tile is known: neither waves nor
    # the K loop's per-tile cost are priced (gemm_reference_k 0; simulator/compute.py also
    # prices no K loop on one SM).
    default = DeviceProfile(gemm_reference_k=0.0 if "sm_count" not in raw else
                            DeviceProfile.gemm_reference_k)
    return replace(spec, profile=replace(base.profile if base else default, **values))


def _fabric(raw: Any) -> FabricSpec | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise TopologyError("network", raw, "an object with nics_per_domain, nic_GBps")
    _known_keys(raw, "network", ("nics_per_domain", "nic_GBps", "nic_nccl_GBps",
                                 "domains_per_leaf", "spine_taper", "collnet", "latency_us",
                                 "nccl_env", "nccl_tuner", "message_us", "max_message_bytes",
                                 "wire_latency_us", "gpudirect_rdma"))
    nic = _number(raw, "nic_GBps", "network") * GB
    gpudirect = _flag(raw, "gpudirect_rdma", "network", True)
    nic_nccl = host_staged_nic_Bps(
        _number(raw, "nic_nccl_GBps", "network", default=nic / GB * 0.96) * GB, gpudirect)
    return FabricSpec(
        nics_per_domain=_number(raw, "nics_per_domain", "network", integer=True,
                                maximum=MAX_LINKS),
        nic_Bps=nic,
        nic_nccl_Bps=nic_nccl,
        domains_per_leaf=_number(raw, "domains_per_leaf", "network", default=32, integer=True,
                                 maximum=MAX_COUNT),
        spine_taper=_number(raw, "spine_taper", "network", default=1.0),
        collnet=_flag(raw, "collnet", "network", False),
        latency_s=_number(raw, "latency_us", "network", default=0.0, maximum=1e6,
                          allow_minimum=True) * 1e-6,
        transport=NetTransport(
            parse_nccl_env(raw.get("nccl_env")), parse_tuner(raw.get("nccl_tuner")),
            _number(raw, "message_us", "network", default=0.0, maximum=1e6,
                    allow_minimum=True) * 1e-6,
            _number(raw, "max_message_bytes", "network", default=0, integer=True,
                    maximum=1 << 40, allow_minimum=True),
            None if "wire_latency_us" not in raw else _number(
                raw, "wire_latency_us", "network", maximum=1e6, allow_minimum=True) * 1e-6,
            gpudirect_rdma=gpudirect))


def _measured(raw: Any) -> tuple:
    if not raw:
        return ()
    if not isinstance(raw, dict):
        raise TopologyError("measured_collectives", raw, "an object: op -> size -> values")
    rows = []
    for op, by_size in sorted(raw.items()):
        if op not in COLLECTIVE_OPS:
            raise TopologyError("measured_collectives", op,
                                "the collectives " + ", ".join(COLLECTIVE_OPS))
        if not isinstance(by_size, dict):
            raise TopologyError(f"measured_collectives.{op}", by_size, "an object: size -> values")
        for size, values in sorted(by_size.items()):
            where = f"measured_collectives.{op}.{size}"
            if (decimal(str(size), 9) or 0) < 1 or not isinstance(values, dict):
                raise TopologyError(where, values, "group size (an integer >= 1) -> "
                                                   "{latency_us, busbw_GBps}")
            _known_keys(values, where, ("latency_us", "busbw_GBps", "points"))
            rows.append((op, int(size), MeasuredCollective(
                _number(values, "latency_us", where, allow_minimum=True) * 1e-6,
                _number(values, "busbw_GBps", where) * GB,
                _points(values.get("points", []), f"{where}.points"))))
    return tuple(rows)


def _points(raw: Any, where: str) -> tuple[tuple[float, float], ...]:
    """[[bytes, microseconds], ...] with ascending, positive sizes and positive times."""
    if not isinstance(raw, list):
        raise TopologyError(where, raw, "a list of [bytes, microseconds] pairs")
    out = []
    for pair in raw:
        if not (isinstance(pair, list) and len(pair) == 2):
            raise TopologyError(where, pair, "[bytes, microseconds] pairs")
        size = _number({"bytes": pair[0]}, "bytes", where)
        time_us = _number({"us": pair[1]}, "us", where)
        if out and size <= out[-1][0]:
            raise TopologyError(where, pair, "pairs in ascending order of bytes")
        out.append((size, time_us * 1e-6))
    return tuple(out)


def load_file(path: Path) -> ClusterSpec:
    """Read a user topology JSON file (format in docs/design.md)."""
    raw = load_json_file(path, "topology", TopologyError)
    if not isinstance(raw, dict):
        raise TopologyError("topology", str(path), "a JSON object")
    _known_keys(raw, "topology", _FILE_KEYS)
    if "gpu" not in raw:
        raise TopologyError("gpu", None, "a GPU name or an object")
    # Counts first, bounded, so that no later step sizes anything by an absurd count.
    racks = _number(raw, "domains", "topology", default=1, integer=True, maximum=MAX_COUNT)
    size = _number(raw, "gpus_per_domain", "topology", integer=True, maximum=MAX_COUNT)
    layout = _layout(raw, size)
    gpu = _gpu(raw["gpu"])
    fabric = _fabric(raw.get("network"))
    domains = racks * layout.domains_per_rack
    if domains > 1 and fabric is None:
        raise TopologyError("network", None, "an object when domains > 1")
    if fabric and fabric.nics_per_domain > size:
        raise TopologyError("network.nics_per_domain", fabric.nics_per_domain,
                            f"at most gpus_per_domain ({size})")
    if fabric:
        rack_layout(size, layout.tray_gpus, layout.used_gpus, layout.partition_gpus,
                    fabric.nics_per_domain)
        fabric = replace(fabric, nics_per_domain=layout.nics_per_domain(fabric.nics_per_domain),
                         domains_per_leaf=fabric.domains_per_leaf * layout.domains_per_rack)
    if not isinstance(raw.get("calibration", {}), dict):
        raise TopologyError("topology.calibration", raw["calibration"],
                            "an object (the record `validation calibrate` writes)")
    description = _text(raw, "description", "topology", f"user topology {path.name}")
    if layout.describe():
        description += f" ({layout.describe()})"
    return ClusterSpec(_text(raw, "name", "topology", path.stem), gpu, domains,
                       layout.domain_gpus, fabric, description,
                       _measured(raw.get("measured_collectives")), layout)


def _layout(raw: dict, size: int) -> RackLayout:
    """Trays, the GPUs a job uses of each domain, and NVLink partitions (all optional)."""
    def count(key: str) -> int | None:
        if key not in raw:
            return None
        return _number(raw, key, "topology", integer=True, maximum=MAX_COUNT)
    return rack_layout(size, count("gpus_per_tray") or 0, count("gpus_used_per_domain"),
                       count("nvlink_partition"))


# Keys of a topology file (docs/design.md); `calibration` is the record of how
# `validation calibrate` measured the host, kept for the reader and not simulated.
_FILE_KEYS = ("name", "description", "gpu", "domains", "gpus_per_domain", "gpus_per_tray",
              "gpus_used_per_domain", "nvlink_partition", "network",
              "measured_collectives", "calibration")
