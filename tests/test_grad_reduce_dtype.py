"""The Megatron-Core DDP gradient reduce moves the gradient buffer in its dtype:
fp32 with ddp.grad_reduce_in_fp32 (the default), bf16 without it (Megatron-Core
distributed_data_parallel.py: grad_dtype = torch.float if grad_reduce_in_fp32 else
param.dtype; the bucket's reduce-scatter runs on that buffer)."""
from workloads import plan_from_dict, resolve
from workloads.lowering import lower


def _plan(fp32: bool):
    return resolve(plan_from_dict({
        "model": "llama3-8b", "framework": "megatron-core",
        "training": {"global_batch": 32, "micro_batch": 1, "seq_len": 2048, "dtype": "bf16"},
        "mesh": {"dp": 16, "tp": 1, "pp": 1, "cp": 1},
        "ddp": {"grad_reduce_in_fp32": fp32},
    }), 16)


def _grad_reduce_bytes(plan) -> float:
    program = lower(plan)
    return sum(t.bytes for stage in program.stages for t in stage
               if t.label.startswith("grad.reduce"))


def test_grad_reduce_bytes_follow_the_buffer_dtype():
    fp32 = _grad_reduce_bytes(_plan(True))
    bf16 = _grad_reduce_bytes(_plan(False))
    assert fp32 > 0
    assert bf16 == fp32 / 2
