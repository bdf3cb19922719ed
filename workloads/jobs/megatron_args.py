"""Megatron job configs as flags: a file of pretrain_gpt.py arguments (shlex) or the YAML a
Megatron-Bridge run writes out (yaml.safe_load), both turned into one flag -> value map.

Nothing is evaluated: shlex splits words (quoting, comments, backslash line endings), a
"$VAR" stays the text "$VAR", YAML's safe loader builds only plain data (a `_target_`
class path is a string, never imported).
"""
from __future__ import annotations

import shlex
from typing import Any

from . import megatron_keys as K
from .findings import Findings, JobConfigError

Flags = dict[str, Any]   # flag without "--" -> True (a switch), a string or a list of strings
# The activation Megatron-Bridge writes as a callable's class path, with gated_linear_unit.
BRIDGE_ACTIVATIONS = {"torch.nn.functional.silu": True, "torch.nn.functional.gelu": False}


def parse_args_text(text: str, source: str = "args.txt") -> tuple[Flags, list[str]]:
    """Flags of a command-line file; the launcher before `*.py` is skipped (a note)."""
    # A backslash at a line's end continues the command (as in a shell script).
    joined = text.replace("\\\r\n", " ").replace("\\\n", " ")
    try:
        words = shlex.split(joined, comments=True, posix=True)
    except ValueError as exc:
        raise JobConfigError(source, "arguments", f"shell-quoted words ({exc})") from None
    notes = []
    scripts = [i for i, w in enumerate(words) if w.endswith(".py")]
    if scripts:
        notes.append("ignored: " + " ".join(words[:scripts[0] + 1]) + " (the launcher and "
                     "script; the world size comes from the topology)")
        words = words[scripts[0] + 1:]
    flags: Flags = {}
    current = None
    for word in words:
        if word.startswith("--") and len(word) > 2:
            name, eq, value = word[2:].partition("=")
            if name in flags:
                raise JobConfigError(f"--{name}", word, "each flag once")
            flags[name] = value if eq else True
            current = None if eq else name
        elif current is None:
            raise JobConfigError(source, word, "--flag [value ...] words (a value must "
                                 "follow a flag)")
        elif flags[current] is True:
            flags[current] = word
        elif isinstance(flags[current], list):
            flags[current].append(word)      # in place: a long value list stays linear
        else:
            flags[current] = [flags[current], word]
    return flags, notes


MERGE_TAG = "tag:yaml.org,2002:merge"


def _strict_loader(yaml):
    """PyYAML's SafeLoader refusing a mapping key given twice, as a JSON input is refused
    (safe_load keeps the last one silently). Keys that are not strings are named where
    their section is read (_section, and the top level in parse_bridge_yaml)."""
    class StrictLoader(yaml.SafeLoader):
        """SafeLoader with unique mapping keys."""

    def mapping(loader, node):
        seen = set()
        for key_node, _ in node.value:   # the mapping's own keys; merged ones may be
            if key_node.tag == MERGE_TAG:  # overridden, as YAML's merge key allows
                continue
            key = loader.construct_object(key_node, deep=True)
            try:
                why = "a duplicate key" if key in seen else ""
            except TypeError:   # a list or mapping as a key
                why = "an unhashable key"
            if why:
                raise yaml.constructor.ConstructorError(
                    None, None, f"{why}: {key!r}", key_node.start_mark)
            seen.add(key)
        loader.flatten_mapping(node)   # YAML merge keys (<<), as SafeLoader does
        return {loader.construct_object(k, deep=True): loader.construct_object(v, deep=True)
                for k, v in node.value}

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return StrictLoader


def parse_bridge_yaml(text: str, source: str, findings: Findings) -> tuple[Flags, dict]:
    """Flags of a Megatron-Bridge ConfigContainer YAML (v0.6.0 shape), and each flag's
    YAML key (for messages)."""
    import yaml   # PyYAML (pyproject: a dependency for this reader)
    try:
        raw = yaml.load(text, Loader=_strict_loader(yaml))
    except (yaml.YAMLError, ValueError, RecursionError) as exc:   # a huge integer, nesting
        reason = str(exc).replace("\n", " ")[:200]
        raise JobConfigError(source, "YAML", f"valid YAML ({reason})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("model"), dict):
        raise JobConfigError(source, type(raw).__name__, f"a {K.BRIDGE_RELEASE} "
                             "ConfigContainer YAML (a mapping with a model section)")
    if "trainer" in raw or "encoder_seq_length" in raw["model"]:
        raise JobConfigError(source, "NeMo 1.x", f"the {K.BRIDGE_RELEASE} YAML shape "
                             "(model, train, ddp, ...); NeMo 1.x configs are not read")
    flags: Flags = {}
    names: dict[str, str] = {}
    recipe = raw.get("mixed_precision")
    for section, body in raw.items():
        if not isinstance(section, str):
            raise JobConfigError(repr(section), body, "a section name of "
                                 f"{K.BRIDGE_RELEASE}'s YAML (a string)")
        if section in K.BRIDGE_IGNORED:
            findings.ignore(section, K.BRIDGE_IGNORED[section])
        elif section == "env_vars":
            if body:
                findings.problem("env_vars", body, "environment variables (NCCL's change "
                                 "the collectives)")
        elif section == "mixed_precision" and isinstance(body, str):
            _mixed_precision_recipe(body, flags, findings)
        elif isinstance(body, dict):
            _section(section, body, flags, names, findings)
        elif body is not None:
            findings.problem(section, body, f"not a section of {K.BRIDGE_RELEASE}'s YAML")
    grad_fp32 = _recipe_grad_fp32(recipe)
    if grad_fp32 is not None:
        flags[K.ACCUMULATE_FP32] = grad_fp32
        names[K.ACCUMULATE_FP32] = "mixed_precision"
    return flags, names


def _recipe_grad_fp32(recipe: Any) -> bool | None:
    """The grad_reduce_in_fp32 a mixed-precision config copies over the DDP config's at
    setup (Megatron-Bridge v0.6.0 mixed_precision.py, update_config_with_precision_
    overrides): a MixedPrecisionConfig's field (default true), or a named bf16 recipe's
    (each is built on bf16_mixed: true). None: no mixed-precision config, or an fp16 one
    (not modelled: the recipe check reports it)."""
    if isinstance(recipe, dict):
        value = recipe.get("grad_reduce_in_fp32", True)
        if not isinstance(value, bool):
            raise JobConfigError("mixed_precision.grad_reduce_in_fp32", value, "true or false")
        return value
    if isinstance(recipe, str) and recipe.startswith("bf16"):
        return True
    return None


def _section(section: str, body: dict, flags: Flags, names: dict, findings: Findings) -> None:
    for field, value in body.items():
        field = str(field)               # YAML keys may be numbers or null
        key = f"{section}.{field}"
        flag = K.BRIDGE_KEYS.get((section, field))
        if (section, field) == ("mixed_precision", "grad_reduce_in_fp32"):
            continue                     # copied over the DDP config's (_recipe_grad_fp32)
        if (section, field) == ("model", "activation_func"):
            _activation(value, body.get("gated_linear_unit", False), findings)
        elif field in K.BRIDGE_IGNORED:
            findings.ignore(key, K.BRIDGE_IGNORED[field])
        elif flag is None and section in K.BRIDGE_IGNORED_SECTIONS:
            findings.ignore(key, K.BRIDGE_IGNORED_SECTIONS[section])
        elif flag is None and section not in K.BRIDGE_FLAG_SECTIONS:
            findings.problem(key, value, f"not a section of {K.BRIDGE_RELEASE}'s YAML")
        else:
            flag = flag or field.replace("_", "-")
            names[flag.lstrip("!")] = key
            _set_flag(flags, key, flag, value)


def _activation(value: Any, gated: bool, findings: Findings) -> None:
    """model.activation_func: SiLU with a gated unit (SwiGLU) or GeLU without one."""
    target = value.get("_target_") if isinstance(value, dict) else value
    if not isinstance(target, str) or BRIDGE_ACTIVATIONS.get(target) != bool(gated):
        findings.problem("model.activation_func", target, "an activation other than SwiGLU "
                         "(silu, gated) or GeLU")
    else:
        findings.ignore("model.activation_func", "the activation gated_linear_unit implies")


def _set_flag(flags: Flags, key: str, flag: str, value: Any) -> None:
    if flag.startswith("!"):             # an inverted switch
        flag, value = flag[1:], (not value if isinstance(value, bool) else value)
    if value is None or value is False and flag not in K.BRIDGE_KEEP_FALSE:
        return                           # an unset option or an off switch: the default
    if flag in flags and flags[flag] != value:
        raise JobConfigError(key, value, f"the value another section gives --{flag} "
                             f"({flags[flag]!r})")
    flags[flag] = value


def _mixed_precision_recipe(name: str, flags: Flags, findings: Findings) -> None:
    """Bridge's named recipes: bf16_mixed, bf16_with_fp8_* (FP8 GEMMs), bf16_with_mxfp8_mixed
    (fp8 e4m3, fp8_recipe mxfp8) and bf16_with_nvfp4_mixed (fp4 e2m1, fp4_recipe nvfp4)
    (Megatron-Bridge src/megatron/bridge/training/mixed_precision.py)."""
    if name == "bf16_mixed":
        flags["bf16"] = True
    elif name == "bf16_with_mxfp8_mixed":
        flags.update({"bf16": True, "fp8-format": "e4m3", "fp8-recipe": "mxfp8"})
    elif name == "bf16_with_nvfp4_mixed":
        flags.update({"bf16": True, "fp4-format": "e2m1", "fp4-recipe": "nvfp4"})
    elif name == "bf16_with_fp8_subchannel_scaling_mixed":   # fp8 hybrid, recipe blockwise
        flags.update({"bf16": True, "fp8-format": "hybrid", "fp8-recipe": "blockwise"})
    elif name.startswith("bf16_with_fp8_"):
        flags["bf16"] = True
        flags["fp8-format"] = "hybrid"
        if "delayed" not in name and "current" not in name:
            findings.problem("mixed_precision", name, "an FP8 recipe other than tensor-wise "
                             "or block-wise")
    else:
        findings.problem("mixed_precision", name, "a precision recipe other than bf16_mixed, "
                         "bf16_with_fp8_*, bf16_with_mxfp8_mixed or bf16_with_nvfp4_mixed")
