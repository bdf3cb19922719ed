"""One layer's FLOPs traced from a real torch module on the meta device, against ModelSpec."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from workloads.models import PRESETS
from workloads.trace_module import build_layer, trace_module, traced_layer_flops, traced_layer_trace

BATCH, SEQ = 2, 4096


def _sdpa_flops(batch, heads, kv_heads, seq, head_dim, causal):
    """What torch's own FlopCounterMode reports for one SDPA call (forward, backward)."""
    q = torch.empty(batch, heads, seq, head_dim, device="meta", dtype=torch.bfloat16,
                    requires_grad=True)
    kv = torch.empty(batch, kv_heads, seq, head_dim, device="meta", dtype=torch.bfloat16,
                     requires_grad=True)
    with FlopCounterMode(display=False) as fwd:
        out = F.scaled_dot_product_attention(q, kv, kv, is_causal=causal,
                                             enable_gqa=kv_heads != heads)
    with FlopCounterMode(display=False) as bwd:
        out.backward(torch.ones_like(out))
    return fwd.get_total_flops(), bwd.get_total_flops()


@pytest.mark.parametrize("name", ["llama3-8b", "llama3-70b"])
def test_projection_flops_match_model_spec(name):
    model = PRESETS[name]
    traced = traced_layer_flops(model, BATCH, SEQ)
    tokens = BATCH * SEQ
    shapes = model.projection_shapes()
    assert set(traced) == set(shapes) | {"attention"}
    for proj, (fan_in, fan_out) in shapes.items():
        assert traced[proj] == 2 * tokens * fan_in * fan_out, proj


@pytest.mark.parametrize("name", ["llama3-8b", "llama3-70b"])
def test_attention_flops_are_torch_sdpa_count_full_not_causal_half(name):
    model = PRESETS[name]
    traced = traced_layer_flops(model, BATCH, SEQ)["attention"]
    causal = _sdpa_flops(BATCH, model.num_heads, model.num_kv_heads, SEQ, model.head_dim, True)
    full = _sdpa_flops(BATCH, model.num_heads, model.num_kv_heads, SEQ, model.head_dim, False)
    assert traced == causal[0]
    # torch counts causal SDPA as the full s x s product: 4 b s^2 (heads x head_dim) forward,
    # with the query heads (GQA does not reduce it), and 2x that in the backward.
    assert causal == full
    assert traced == 4 * BATCH * SEQ ** 2 * model.num_heads * model.head_dim
    assert causal[1] == 2 * causal[0]


def test_backward_is_twice_forward_per_op():
    model = PRESETS["llama3-8b"]
    trace = traced_layer_trace(model, 1, 1024)
    fwd, bwd = trace.flops("forward"), trace.flops("backward")
    assert set(fwd) == set(bwd)
    for path in fwd:   # dgrad + wgrad per matmul; dq, dk, dv, dscores for attention
        assert bwd[path] == 2 * fwd[path], path
    back = traced_layer_flops(model, 1, 1024, phase="backward")
    assert back["w2"] == 2 * 2 * 1024 * model.ffn_size * model.hidden_size


def test_gelu_model_has_no_w3():
    model = PRESETS["gpt3-175b"]
    traced = traced_layer_flops(model, 1, 2048)
    assert "w3" not in traced
    assert traced["w1"] == 2 * 2048 * model.hidden_size * model.ffn_size


class _UserBlock(nn.Module):
    """A user architecture: an inline matmul in its own forward plus two child modules."""

    def __init__(self, d=64, f=256):
        super().__init__()
        self.mix = nn.Parameter(torch.ones(d, d))
        self.up = nn.Linear(d, f, bias=False)
        self.down = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x @ self.mix)))


def test_user_module_class_and_exclusive_attribution():
    trace = trace_module(_UserBlock, (2, 8, 64))
    tokens = 2 * 8
    fwd = trace.flops("forward")
    assert fwd == {"": 2 * tokens * 64 * 64, "up": 2 * tokens * 64 * 256,
                   "down": 2 * tokens * 256 * 64}
    assert trace.total_flops("backward") == 2 * trace.total_flops("forward")
    assert trace.flops("backward")["up"] == 2 * fwd["up"]


def test_cpu_module_is_traced_on_a_meta_copy():
    block = _UserBlock()
    trace = trace_module(block, (1, 4, 64), backward=False)
    assert trace.total_flops("backward") == 0
    assert trace.flops()["down"] == 2 * 4 * 256 * 64
    assert block.up.weight.device.type == "cpu" and block.up.weight.dtype == torch.float32


def test_reference_layer_lives_on_meta():
    layer = build_layer(PRESETS["llama3-70b"])
    assert all(p.device.type == "meta" for p in layer.parameters())
    n = sum(p.numel() for p in layer.parameters())
    assert n == PRESETS["llama3-70b"].layer_params()
