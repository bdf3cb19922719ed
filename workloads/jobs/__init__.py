"""Framework job configs in and out: torchtitan TOML, Megatron-LM arguments and
Megatron-Bridge YAML read as plan objects, and plans written back as configs.

Readers return `Imported` (the plan object and one note per ignored key or warning);
writers return `Exported` (the config text and one note per plan field the framework
cannot express). Nothing in a config is evaluated: TOML through tomllib, YAML through
yaml.safe_load, flags through shlex. The key tables (framework key -> plan field,
ignored keys, unmodelled keys) are torchtitan_keys.py and megatron_keys.py.
"""
from .common import Exported, Imported
from .files import job_framework, load_job, read_job
from .findings import JobConfigError
from .megatron import read_megatron
from .megatron_export import write_megatron
from .torchtitan import read_torchtitan
from .torchtitan_export import write_torchtitan

__all__ = ["Exported", "Imported", "JobConfigError", "job_framework", "load_job",
           "read_job", "read_megatron", "read_torchtitan", "write_megatron",
           "write_torchtitan"]
