"""SPEC_DRAFT_LOOP_GRAPH (scripts/patches/draft_loop_graph.py) on CPU, against vLLM 0.26's own draft loop.

Real: AutoRegressiveSpeculator's `capture` and `_multi_step_decode`, and attn_utils' `build_slot_mappings_by_layer`,
from 0.26's source (the version the GPU host runs; $KIT_VLLM026_SRC, default .cache/vllm-0.26.0/vllm, `make
vllm026-src`), run as they are; CUDAGraphMode.
Stood in, for what needs a GPU (the names say so): the CUDA graphs, the drafter's forward, the slot-mapping kernel and
the attention metadata build. The stand-in graph has a CUDA graph's semantics where they matter here: what a function
does on the "device" (each stand-in op) is recorded while it is captured and replayed in order, with the host values
it had at capture; the Python around those ops runs only at capture. So a host value frozen at capture (the padded
batch, max_seq_len) shows, a step that reads a stale buffer shows (each op reads the buffers at replay), and a step
left out of the graph shows. The stand-in ops follow 0.26's kernels: slot mappings from the block table and the
positions (padded rows have empty queries, the tail is padded), the scheduler metadata from seq_lens into the
builder's persistent buffer, the draft step's token from its inputs, its KV write at its slot, and the update of
input ids, positions and seq_lens for the next step.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import os
import sys
from types import SimpleNamespace

import pytest
import torch

from scripts.kit import vllm026
from scripts.patches import draft_loop_graph as DL
from scripts.patches.on_import import AfterImport

SRC026 = vllm026.src_dir() / "v1/worker/gpu/spec_decode/autoregressive/speculator.py"
K = 4  # MTP K=4, as the kit's Qwen3.5 variants
MAX_REQS, BLOCK, BLOCKS, VOCAB, MAX_MODEL_LEN = 8, 4, 16, 97, 4096
SIZES = (1, 2, 4, 8)  # the decode graphs' padded batch sizes
PAD = -1


def _require_026() -> None:
    if not SRC026.is_file():
        if os.environ.get(vllm026.ENV):  # CI fetches it: a skip there would hide a failure
            pytest.fail(f"{vllm026.ENV} is set, but {SRC026} does not exist")
        pytest.skip(f"{vllm026.SKIP}: no {SRC026}")


def _methods026():
    _require_026()
    (c,) = [n for n in ast.parse(SRC026.read_text()).body
            if isinstance(n, ast.ClassDef) and n.name == "AutoRegressiveSpeculator"]
    return {n.name: n for n in c.body if isinstance(n, ast.FunctionDef)}


# A CUDA graph stood in: device ops run now, and are also recorded while a graph captures -------------------------
class Device:
    def __init__(self):
        self.tape = None  # the graph being captured, or None

    def op(self, fn):
        fn()
        if self.tape is not None:
            self.tape.append(fn)


DEV = Device()


class Step:  # current_draft_step: a device scalar whose fill_ is a device op
    def __init__(self):
        self.t = torch.zeros((), dtype=torch.int64)

    def fill_(self, v):
        DEV.op(lambda: self.t.fill_(v))


@dataclasses.dataclass(frozen=True)
class Desc:  # BatchExecutionDescriptor's fields that 0.26's loop and the patch read
    cg_mode: object
    num_tokens: int
    num_reqs: int | None
    uniform_token_count: int | None = None
    num_active_loras: int = 0


class StandInGraphs:
    """SpeculatorCudaGraphManager stood in: for each size, inputs prepared as 0.26's prepare_inputs_to_capture does
    (dummy batch, padded slots, metadata built with max_model_len), a warm-up call, then a captured call."""

    def __init__(self, spec, mode, fail_on=None):
        self.spec, self.mode, self.graphs, self.replays, self.fail_on = spec, mode, {}, 0, fail_on
        self.captured_fns = []

    def capture(self, fn, model_state, input_buffers, block_tables, attn_groups, kv_cache_config,
                progress_bar_desc=""):
        s, full = self.spec, self.mode.FULL
        self.captured_fns.append(getattr(fn, "__name__", fn))
        for p in SIZES:
            b = s.input_buffers
            b.seq_lens[:p], b.seq_lens[p:] = 1, 0
            b.query_start_loc.copy_(torch.arange(MAX_REQS + 1).clamp(max=p))
            b.positions.zero_()
            s.block_tables.slot_mappings.fill_(PAD)
            run_max, s.draft_max_seq_len = s.draft_max_seq_len, MAX_MODEL_LEN
            md = s.build_stand_in(p, p, host=False)
            s.draft_max_seq_len = run_max
            slots = {"draft.attn": s.block_tables.slot_mappings[0, :p]}
            fn(p, p, md, slots, None, self.mode.NONE)  # warm-up
            if self.fail_on is not None and getattr(fn, "__name__", "") == self.fail_on:
                raise RuntimeError("stand-in capture failure")
            DEV.tape = tape = []
            try:
                fn(p, p, md, slots, None, self.mode.NONE)
            finally:
                DEV.tape = None
            self.graphs[Desc(full, p, p)] = tape

    def run_fullgraph(self, desc):
        assert desc.cg_mode == self.mode.FULL and desc in self.graphs
        self.replays += 1
        for fn in self.graphs[desc]:
            fn()


class StandInBlockTables:
    def __init__(self, g):
        # per request state; 0 (vLLM's null block, never a request's) until requests arrive, as at capture
        self.block_table = torch.zeros(MAX_REQS, BLOCKS, dtype=torch.int64)
        self.later = torch.randint(1, 1000, (MAX_REQS, BLOCKS), generator=g)
        self.slot_mappings = torch.full((1, MAX_REQS), PAD, dtype=torch.int64)
        self.cp_size = 1
        self.calls = 0

    def compute_slot_mappings(self, idx_mapping, query_start_loc, positions, num_tokens_padded):
        """0.26's _compute_slot_mappings_kernel: one program per request of the grid (fixed at launch), and one that
        pads from query_start_loc[grid] to the end."""
        self.calls += 1
        n, out = idx_mapping.shape[0], self.slot_mappings

        def op():
            for i in range(n):
                for t in range(int(query_start_loc[i]), int(query_start_loc[i + 1])):
                    pos = int(positions[t])
                    out[0, t] = self.block_table[int(idx_mapping[i]), pos // BLOCK] * BLOCK + pos % BLOCK
            out[0, int(query_start_loc[n]):] = PAD
        DEV.op(op)
        return out[:, :num_tokens_padded]


class StandInGroup:
    def __init__(self, builder):
        self.builder = builder

    def get_metadata_builder(self, i):
        return self.builder


class FlashAttentionMetadataBuilder:  # the name static_reason looks for; its build is stood in below
    pass


class StandInSpeculator:
    """The attributes 0.26's loop and capture read; `_generate_draft` and the metadata build stand in for the
    drafter's forward (a GPU model) and FlashAttention's build (FA3's scheduler-metadata kernel)."""
    num_speculative_steps = K
    max_model_len = MAX_MODEL_LEN
    advance_draft_positions = True

    def __init__(self, mode, seed=0, fail_on=None):
        g = torch.Generator().manual_seed(seed)
        self.input_buffers = SimpleNamespace(input_ids=torch.zeros(MAX_REQS, dtype=torch.int64),
                                             positions=torch.zeros(MAX_REQS, dtype=torch.int64),
                                             seq_lens=torch.zeros(MAX_REQS, dtype=torch.int64),
                                             query_start_loc=torch.zeros(MAX_REQS + 1, dtype=torch.int64))
        self.hidden_states = torch.zeros(MAX_REQS, 3)
        self.idx_mapping = torch.zeros(MAX_REQS, dtype=torch.int64)
        self.last_token_indices = torch.zeros(MAX_REQS, dtype=torch.int64)
        self.draft_tokens = torch.zeros(MAX_REQS, K, dtype=torch.int64)
        self.current_draft_step = Step()
        self.block_tables = StandInBlockTables(g)
        self.sched = torch.zeros(MAX_REQS, dtype=torch.int64)  # the builder's persistent scheduler metadata
        self.kv = torch.zeros(1000 * BLOCK, dtype=torch.int64)  # the drafter's KV cache, one value a slot
        self.attn_groups = [[StandInGroup(FlashAttentionMetadataBuilder())]]
        self.kv_cache_config = SimpleNamespace(kv_cache_groups=[SimpleNamespace(layer_names=["draft.attn"])])
        self.dp_size, self.eplb_state, self.model_state = 1, None, None
        self.draft_max_seq_len = 7  # what the profile's dummy propose leaves before capture
        self.builds = []  # (num_reqs, num_reqs_padded, max_seq_len, captured) of every build
        self.prefill_cudagraph_manager = SimpleNamespace(use_breakable_cg=False, capture=self._prefill_capture)
        self.decode_cudagraph_manager = StandInGraphs(self, mode, fail_on)
        self.target_input_buffers = self.target_attn_groups = None

    def _prefill_capture(self, fn, *a, **kw):
        assert fn == self._prefill  # the prefill graphs are 0.26's, patched or not
        self.prefill_captured = True

    def _prefill(self, *a, **kw):
        raise AssertionError("not run here")

    def build_stand_in(self, num_reqs, num_reqs_padded, host=True):
        """FlashAttention's build stood in: the host values it is given, and its device work (the scheduler metadata
        from seq_lens into the persistent buffer, the rest zeroed)."""
        p, b = num_reqs_padded, self.input_buffers
        if host:
            self.builds.append((num_reqs, p, self.draft_max_seq_len, DEV.tape is not None))

        def op():
            self.sched[:p] = b.seq_lens[:p]
            self.sched[p:] = 0
        DEV.op(op)
        return {"draft.attn": SimpleNamespace(sched=self.sched[:p], max_seq_len=self.draft_max_seq_len)}

    def _build_draft_attn_metadata(self, num_reqs, num_reqs_padded, num_tokens_padded, num_query_per_req=1,
                                   causal=True):
        return self.build_stand_in(num_reqs, num_reqs_padded)

    def _generate_draft(self, num_reqs, num_tokens_padded, attn_metadata, slot_mappings, num_tokens_across_dp,
                        cudagraph_runtime_mode=None):
        """The draft step stood in: a token from the step's inputs and its scheduler metadata, a KV write at its
        slot (PAD: none), the token into draft_tokens[:, step], and the next step's inputs (0.26's
        update_draft_inputs: the token, position + 1 and seq_len + 1)."""
        b, sched, slot = self.input_buffers, attn_metadata["draft.attn"].sched, slot_mappings["draft.attn"]
        n = num_reqs

        def op():
            step = int(self.current_draft_step.t)
            tok = (b.input_ids[:n] * 31 + b.positions[:n] * 7 + sched[:n] * 3 + step) % VOCAB
            for i in range(n):
                if int(slot[i]) != PAD:
                    self.kv[int(slot[i])] = int(b.input_ids[i]) + 1
            self.draft_tokens[:n, step] = tok
            self.hidden_states[:n] += 1
            if step < K - 1:
                b.input_ids[:n] = tok
                b.positions[:n] += 1
                b.seq_lens[:n] += 1
        DEV.op(op)


def _speculator_class(mode_mod):
    """StandInSpeculator with 0.26's own capture and _multi_step_decode (from its source)."""
    m = _methods026()
    ns = {"CUDAGraphMode": mode_mod, "build_slot_mappings_by_layer": build_slot_mappings_by_layer,
          "logger": SimpleNamespace(info=lambda *a, **kw: None), "torch": torch, "Any": object}
    body = [m["capture"], m["_multi_step_decode"]]
    for f in body:
        f.decorator_list = []
    exec(compile(ast.fix_missing_locations(ast.Module(body=body, type_ignores=[])), str(SRC026), "exec"), ns)
    return type("AutoRegressiveSpeculator", (StandInSpeculator,), {"capture": ns["capture"],
                                                                    "_multi_step_decode": ns["_multi_step_decode"]})


@functools.lru_cache(maxsize=1)
def _slot_mappings_by_layer_026():
    src = vllm026.src_dir() / "v1/worker/gpu/attn_utils.py"
    if not src.is_file():
        _require_026()
        pytest.fail(f"no {src}")
    (f,) = [n for n in ast.parse(src.read_text()).body
            if isinstance(n, ast.FunctionDef) and n.name == "build_slot_mappings_by_layer"]
    ns = {"torch": torch, "KVCacheConfig": object}
    exec(compile(ast.Module(body=[f], type_ignores=[]), str(src), "exec"), ns)
    return ns["build_slot_mappings_by_layer"]


def build_slot_mappings_by_layer(slot_mappings, kv_cache_config):
    """0.26's own function (vllm/v1/worker/gpu/attn_utils.py), from its source."""
    return _slot_mappings_by_layer_026()(slot_mappings, kv_cache_config)


@pytest.fixture(scope="module")
def mode():
    from vllm.config.compilation import CUDAGraphMode
    return CUDAGraphMode


def _patched(mode, check=None):
    cls = _speculator_class(mode)
    assert DL.patch_class(cls, build_slot_mappings_by_layer, mode.FULL, mode.NONE, check)
    return cls


def _engine_steps(spec, cg, seed, steps=12):
    """Engine steps of random batches (1..MAX_REQS requests, random request states and lengths), each set up as
    0.26's prepare_decode_inputs leaves the buffers, then `_multi_step_decode` on the FULL graph of the smallest size
    that holds the batch (or eager: mode NONE). Returns the drafts of every step and the KV cache."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        r = int(torch.randint(1, MAX_REQS + 1, (1,), generator=g))
        p = next(x for x in SIZES if x >= r)
        b = spec.input_buffers
        spec.idx_mapping[:r] = torch.randperm(MAX_REQS, generator=g)[:r]
        b.positions[:r] = torch.randint(0, BLOCK * BLOCKS - K, (r,), generator=g)
        b.seq_lens[:r], b.seq_lens[r:] = b.positions[:r] + 1, 0
        b.input_ids[:r] = torch.randint(0, VOCAB, (r,), generator=g)
        b.query_start_loc.copy_(torch.arange(MAX_REQS + 1).clamp(max=r))
        spec.draft_max_seq_len = int(b.seq_lens[:r].max()) + K
        spec._multi_step_decode(r, False, Desc(cg, p, p), None)
        out.append(spec.draft_tokens[:r, 1:].clone())
    return out, spec.kv.clone()


def _run(cls, mode, cg, seed=5, **kw):
    spec = cls(mode, **kw)
    spec.capture()
    spec.block_tables.block_table.copy_(spec.block_tables.later)  # requests arrive
    return spec, _engine_steps(spec, cg, seed)


def test_stand_in_graphs_one_replay_gives_0_26s_drafts_and_kv_writes(mode):
    """The loop in one graph: every engine step's drafts 2..K and every KV write equal 0.26's per-step graphs
    (with its host-side builds between replays), over random batches padded to 1, 2, 4 and 8; one replay a step
    where 0.26 makes K-1, and no build or slot-mapping launch on the host at run time."""
    plain = _speculator_class(mode)
    ref_spec, (ref, ref_kv) = _run(plain, mode, mode.FULL)
    assert ref_spec.decode_cudagraph_manager.replays == 12 * (K - 1)
    run_builds = [x for x in ref_spec.builds if not x[3]]
    assert len(run_builds) >= 12 * (K - 1)

    spec, (got, kv) = _run(_patched(mode), mode, mode.FULL)
    assert getattr(spec, DL._MARK) is True
    assert spec.decode_cudagraph_manager.captured_fns == ["kit_draft_loop"]
    assert spec.decode_cudagraph_manager.replays == 12
    assert [len(x) for x in got] == [len(x) for x in ref]
    for a, b in zip(got, ref):
        assert torch.equal(a, b)
    # the same slots written; the capture's warm-up also wrote the null block (0.26's capture writes none)
    assert torch.equal(kv[BLOCK:], ref_kv[BLOCK:]) and int((kv != 0).sum()) > 12
    assert not ref_kv[:BLOCK].any()
    # inside the graph: the padded batch as num_reqs and max_model_len, K-1 builds per size (warm-up and capture)
    captured = [x for x in spec.builds if x[3]]
    assert len(captured) == len(SIZES) * (K - 1)
    assert all(n == p and m == MAX_MODEL_LEN for n, p, m, _ in captured)
    host_at_run = len(spec.builds) - 2 * len(SIZES) * (K - 1)
    assert host_at_run == 0


def test_stand_in_graphs_a_loop_without_the_per_step_build_or_slots_would_be_caught(mode, monkeypatch):
    """The comparison above can fail: a graph that builds the metadata or the slots only once (the first step's, as a
    loop written outside the graph would leave them) gives other drafts or other KV writes."""
    plain = _speculator_class(mode)
    _, (ref, ref_kv) = _run(plain, mode, mode.FULL)
    real = DL.loop_fn

    def once(s, by_layer):  # steps 2..K reuse step 1's metadata and slots
        def draft_loop(num_reqs, n, md, slots, ntad, cg=None):
            sl = s.block_tables.compute_slot_mappings(s.idx_mapping[:num_reqs], s.input_buffers.query_start_loc[
                : num_reqs + 1], s.input_buffers.positions[:num_reqs], n)
            md = s._build_draft_attn_metadata(num_reqs=num_reqs, num_reqs_padded=num_reqs, num_tokens_padded=n)
            for step in range(1, K):
                s.current_draft_step.fill_(step)
                s._generate_draft(num_reqs, n, md, by_layer(sl, s.kv_cache_config), ntad, cg)
        draft_loop.__name__ = "kit_draft_loop"
        return draft_loop
    monkeypatch.setattr(DL, "loop_fn", once)
    _, (got, kv) = _run(_patched(mode), mode, mode.FULL)
    monkeypatch.setattr(DL, "loop_fn", real)
    assert any(not torch.equal(a, b) for a, b in zip(got, ref))  # stale scheduler metadata: other drafts
    assert not torch.equal(kv[BLOCK:], ref_kv[BLOCK:])  # stale slots: KV written where 0.26 does not


def test_batches_that_are_not_full_run_0_26s_loop(mode):
    """Eager (NONE) batches and skip_attn on them go to 0.26's loop: the same drafts as unpatched, no replay."""
    _, (ref, ref_kv) = _run(_speculator_class(mode), mode, mode.NONE)
    spec, (got, kv) = _run(_patched(mode), mode, mode.NONE)
    assert spec.decode_cudagraph_manager.replays == 0
    assert all(torch.equal(a, b) for a, b in zip(got, ref)) and torch.equal(kv[BLOCK:], ref_kv[BLOCK:])


def test_skip_attn_on_a_full_batch_replays_the_loop_once(mode):
    """0.26's loop replays its per-step graph K-1 times even with skip_attn (a dummy run); the loop's graph holds all
    steps, so it must run once."""
    spec = _patched(mode)(mode)
    spec.capture()
    spec._multi_step_decode(2, True, Desc(mode.FULL, 2, 2), None)
    assert spec.decode_cudagraph_manager.replays == 1


@pytest.mark.parametrize("change, why", [
    (lambda s: setattr(s, "advance_draft_positions", False), "do not advance"),
    (lambda s: setattr(s, "num_speculative_steps", 1), "K=1"),
    (lambda s: setattr(s, "dp_size", 2), "data parallel"),
    (lambda s: setattr(s, "eplb_state", object()), "EPLB"),
    (lambda s: setattr(s.block_tables, "cp_size", 2), "context parallel"),
    (lambda s: setattr(s, "attn_groups", [[StandInGroup(object())]]), "FlashAttentionMetadataBuilder only"),
])
def test_drafters_it_does_not_cover_keep_0_26s_graphs_and_say_why(mode, capfd, change, why):
    spec = _patched(mode)(mode)
    change(spec)
    assert DL.static_reason(spec) and why in DL.static_reason(spec)
    if spec.num_speculative_steps == 1:
        return  # 0.26's capture returns before the decode graphs
    spec.capture()
    assert getattr(spec, DL._MARK) is False
    assert spec.decode_cudagraph_manager.captured_fns == ["_generate_draft"]
    assert why in capfd.readouterr().err


def test_a_capture_that_raises_falls_back_to_0_26s_per_step_graphs(mode, capfd):
    """A failure while capturing the loop (here: the stand-in manager raising for it) leaves 0.26's per-step graphs
    captured in its place, the patch off for that speculator, and the same drafts as unpatched."""
    _, (ref, ref_kv) = _run(_speculator_class(mode), mode, mode.FULL)
    spec, (got, kv) = _run(_patched(mode), mode, mode.FULL, fail_on="kit_draft_loop")
    assert "the loop's capture failed" in capfd.readouterr().err
    assert getattr(spec, DL._MARK) is False
    assert spec.decode_cudagraph_manager.captured_fns == ["kit_draft_loop", "_generate_draft"]
    assert spec.decode_cudagraph_manager.replays == 12 * (K - 1)
    assert all(torch.equal(a, b) for a, b in zip(got, ref)) and torch.equal(kv[BLOCK:], ref_kv[BLOCK:])


def test_check_counts_agreement_and_catches_a_wrong_graph(mode, capfd):
    """KIT_DRAFT_LOOP_GRAPH_CHECK: each replay is followed by 0.26's eager loop on the saved inputs; equal drafts
    count as equal, and a graph whose drafts are wrong (here: one op of each graph dropped, the step-1 build) is
    counted as such, while the step goes on with the graph's drafts."""
    check = DL.Check(every=4)
    spec = _patched(mode, check)(mode)
    spec.capture()
    spec.block_tables.block_table.copy_(spec.block_tables.later)
    _engine_steps(spec, mode.FULL, 5, steps=8)
    assert check.steps == 8 and check.rows > 0 and check.equal_rows == check.rows
    assert "check: 8 steps" in capfd.readouterr().err
    check2 = DL.Check(every=100)
    spec = _patched(mode, check2)(mode)
    spec.capture()
    for tape in spec.decode_cudagraph_manager.graphs.values():
        del tape[1]  # the first step's metadata build: its step reads the capture's dummy scheduler metadata
    spec.block_tables.block_table.copy_(spec.block_tables.later)
    _engine_steps(spec, mode.FULL, 5, steps=8)
    assert check2.steps == 8 and check2.equal_rows < check2.rows


def test_the_patch_fits_vllm_026s_real_speculator_source():
    """What the patch relies on in 0.26's file: `_multi_step_decode(self, num_reqs, skip_attn, batch_desc,
    num_tokens_across_dp)`, `_generate_draft`'s arguments (the loop calls it as 0.26's loop does), capture handing
    `self._generate_draft` to the decode graph manager, and no fused loop of its own."""
    m = _methods026()
    args = lambda f: [a.arg for a in m[f].args.args]  # noqa: E731
    assert args("_multi_step_decode") == ["self", "num_reqs", "skip_attn", "batch_desc", "num_tokens_across_dp"]
    assert args("_generate_draft") == ["self", "num_reqs", "num_tokens_padded", "attn_metadata", "slot_mappings",
                                       "num_tokens_across_dp", "cudagraph_runtime_mode"]
    calls = [ast.unparse(c.args[0]) for c in ast.walk(m["capture"]) if isinstance(c, ast.Call)
             and ast.unparse(c.func) == "self.decode_cudagraph_manager.capture"]
    assert calls == ["self._generate_draft"]
    assert "_generate_fused_drafts" not in m


def test_upstream_fused_loop_is_left_alone():
    """Where the class fuses its loop itself (vLLM with vllm-project/vllm#46849: `_generate_fused_drafts`), nothing is
    patched; a second patch of the same class is refused."""
    cls = type("AutoRegressiveSpeculator", (), {"capture": lambda s: None, "_multi_step_decode": lambda *a: None,
                                                 "_generate_fused_drafts": lambda *a: None})
    assert DL.patch_class(cls, build_slot_mappings_by_layer, 1, 0) is False and not hasattr(cls, DL._MARK)
    cls2 = type("AutoRegressiveSpeculator", (), {"capture": lambda s: None, "_multi_step_decode": lambda *a: None})
    assert DL.patch_class(cls2, build_slot_mappings_by_layer, 1, 0) is True
    assert DL.patch_class(cls2, build_slot_mappings_by_layer, 1, 0) is False


def test_install_hooks_the_import_only_when_switched_on(tmp_path, monkeypatch, capfd):
    """The sitecustomize path: install() before the import; the module is patched as it is executed."""
    name = "kit026_ar_speculator_hook_probe"
    (tmp_path / f"{name}.py").write_text(
        "def build_slot_mappings_by_layer(s, c):\n    return {}\n"
        "class AutoRegressiveSpeculator:\n"
        "    def capture(self):\n        pass\n"
        "    def _multi_step_decode(self, num_reqs, skip_attn, batch_desc, num_tokens_across_dp):\n        pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delenv(DL.ENV, raising=False)
    assert DL.install(name) is False and not any(isinstance(f, AfterImport) for f in sys.meta_path)
    monkeypatch.setenv(DL.ENV, "0")
    assert DL.install(name) is False
    bt_name = "kit026_block_table_hook_probe"
    (tmp_path / f"{bt_name}.py").write_text(
        "class BlockTables:\n    def init_block_table_layout_tensors(self):\n        pass\n")
    monkeypatch.setenv(DL.ENV, "1")
    try:
        assert DL.install(name, bt_name)
        mod = __import__(name)
        assert getattr(mod.AutoRegressiveSpeculator, DL._MARK) is True
        assert "V2 drafter patched" in capfd.readouterr().err
        bt = __import__(bt_name)
        assert getattr(bt.BlockTables.init_block_table_layout_tensors, DL._MARK) is True
    finally:
        sys.modules.pop(name, None)
        sys.modules.pop(bt_name, None)


def test_variant_key_sets_the_switch_and_needs_the_v2_runner_and_mtp(tmp_path):
    """SPEC_DRAFT_LOOP_GRAPH=on sets KIT_DRAFT_LOOP_GRAPH=1 for the server; off sets nothing; on a variant without
    the V2 model runner or without MTP K >= 2 it is refused, naming the key."""
    from scripts.kit.variant import KitError, load
    v = load("qwen3.5-4b-fp8-v2", ["SPEC_DRAFT_LOOP_GRAPH=on"])
    assert v.to_env("gpu").get(DL.ENV) == "1"
    assert DL.ENV not in load("qwen3.5-4b-fp8-v2", ["SPEC_DRAFT_LOOP_GRAPH=off"]).to_env("gpu")
    with pytest.raises(KitError, match="SPEC_DRAFT_LOOP_GRAPH"):
        load("qwen3.5-4b-bf16-tuned", ["SPEC_DRAFT_LOOP_GRAPH=on"])
    with pytest.raises(KitError, match="SPEC_DRAFT_LOOP_GRAPH"):
        load("qwen3.5-4b-fp8-v2", ["SPEC_DRAFT_LOOP_GRAPH=on", "SPEC_K=1"])


# A standby's wake (vLLM's sleep mode) against 0.26's own BlockTables layout refresh ---------------------------------
def _block_tables_class_026():
    """A BlockTables holding what 0.26's `init_block_table_layout_tensors` and `_make_ptr_tensor` read, those two
    methods from 0.26's source, and 0.26's slot-mapping kernel stood in (it needs a GPU) reading the block sizes and
    table addresses from the layout tensors, as the Triton kernel does."""
    src = vllm026.src_dir() / "v1/worker/gpu/block_table.py"
    if not src.is_file():
        _require_026()
        pytest.fail(f"no {src}")
    (c,) = [n for n in ast.parse(src.read_text()).body if isinstance(n, ast.ClassDef) and n.name == "BlockTables"]
    body = [n for n in c.body if isinstance(n, ast.FunctionDef)
            and n.name in ("init_block_table_layout_tensors", "_make_ptr_tensor")]
    assert len(body) == 2, "0.26's BlockTables lost a method the test runs"
    ns = {"torch": torch, "Iterable": object}
    exec(compile(ast.Module(body=body, type_ignores=[]), str(src), "exec"), ns)

    class BlockTables:
        def __init__(self):
            self.device = torch.device("cpu")
            self.kernel_block_sizes = [BLOCK]
            self.block_sizes = [BLOCK]
            self.block_tables = [SimpleNamespace(gpu=torch.arange(MAX_REQS * BLOCKS, dtype=torch.int32)
                                                 .reshape(MAX_REQS, BLOCKS))]
            self.input_block_tables = [torch.zeros(MAX_REQS, BLOCKS, dtype=torch.int32)]
            self.init_block_table_layout_tensors()

        def stand_in_slot_kernel(self, out, row, pos):
            """Captured like a kernel launch: the tensors it reads are bound now, their values read at replay."""
            sizes, ptrs, table = self.block_sizes_tensor, self.block_table_ptrs, self.block_tables[0].gpu

            def op():
                assert int(ptrs.view(torch.int64)[0]) == table.data_ptr(), "the graph's block-table address is not the table's"
                bs = int(sizes[0])
                out[0] = int(table[row, pos // bs]) * bs + pos % bs
            DEV.op(op)
    BlockTables.init_block_table_layout_tensors = ns["init_block_table_layout_tensors"]
    BlockTables._make_ptr_tensor = ns["_make_ptr_tensor"]
    return BlockTables


def _sleep_and_wake(bt):
    """/sleep then /wake_up as 0.26 does them for the layout tensors: their memory (the KV cache's CuMem pool) comes
    back with undefined contents (here: garbage), then post_kv_cache_wake_up calls init_block_table_layout_tensors."""
    for t in (bt.block_table_ptrs, bt.block_table_strides, bt.block_sizes_tensor, bt.input_block_table_ptrs):
        t.view(torch.uint8).fill_(0xA5)
    bt.init_block_table_layout_tensors()


def _replay_after_wake(patched: bool):
    cls = _block_tables_class_026()
    if patched:
        assert DL.keep_addresses(cls, "init_block_table_layout_tensors")
        assert not DL.keep_addresses(cls, "init_block_table_layout_tensors")  # once
    bt, out = cls(), torch.zeros(1, dtype=torch.int64)
    DEV.tape = tape = []
    try:
        bt.stand_in_slot_kernel(out, 2, 5)  # captured, as in the loop's graph
    finally:
        DEV.tape = None
    want = int(out[0])
    assert want == int(bt.block_tables[0].gpu[2, 5 // BLOCK]) * BLOCK + 5 % BLOCK
    bt.captured = (bt.block_table_ptrs, bt.block_table_strides, bt.block_sizes_tensor, bt.input_block_table_ptrs)
    _sleep_and_wake(bt)
    out.zero_()
    for fn in tape:
        fn()
    return want, int(out[0]), bt


def test_the_loops_graph_reads_the_refreshed_layout_after_a_wake():
    """With the patch, the wake's refresh writes into the tensors the graph was captured with: a replay after
    /wake_up computes the slot it computed before /sleep. The tensors keep their identity; their values are 0.26's."""
    want, got, bt = _replay_after_wake(patched=True)
    assert got == want
    assert all(a is b for a, b in zip(bt.captured, (bt.block_table_ptrs, bt.block_table_strides,
                                                     bt.block_sizes_tensor, bt.input_block_table_ptrs)))
    assert bt.block_table_ptrs.view(torch.int64).tolist() == [bt.block_tables[0].gpu.data_ptr()]
    assert bt.block_sizes_tensor.tolist() == [BLOCK] and bt.block_table_strides.tolist() == [BLOCKS]
    assert bt.input_block_table_ptrs.view(torch.int64).tolist() == [bt.input_block_tables[0].data_ptr()]


def test_without_the_refresh_in_place_the_graph_reads_the_dropped_memory():
    """0.26 as it is: the refresh makes new tensors, and the graph, holding the old ones, reads the memory sleep
    dropped (on the H200: an illegal memory access at the first step after a wake)."""
    with pytest.raises(AssertionError, match="block-table address"):
        _replay_after_wake(patched=False)


def test_keep_addresses_leaves_a_reshaped_tensor_to_its_new_object(capfd):
    """A refresh that changes a tensor's shape cannot be written into the old one: the new one stays, and stderr
    says a graph captured with the old one reads stale values."""
    class T:
        def __init__(self):
            self.n = 1
            self.init()

        def init(self):
            self.a = torch.full((self.n,), self.n)
            self.b = torch.full((2,), self.n)
    assert DL.keep_addresses(T, "init")
    t = T()
    a0, b0 = t.a, t.b
    t.n = 3
    t.init()
    assert t.b is b0 and t.b.tolist() == [3, 3]
    assert t.a is not a0 and t.a.tolist() == [3, 3, 3]
    assert "T.a changed shape" in capfd.readouterr().err
