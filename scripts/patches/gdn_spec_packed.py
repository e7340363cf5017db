"""GDN_SPEC_PACKED=on: a Gated DeltaNet layer's verify step runs the recurrence on its packed conv output and writes
into its output buffer, with no copy kernels (issue 29 item 3; the kernel: gdn_spec_kernel.py).

What it changes (vLLM 0.26, vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py): the layer's
`_forward_core`, for a step in which every request verifies drafts (spec_sequence_masks set, no prefills, no plain
decodes: every step of an MTP server at c >= 1 once prompts are in). vLLM runs there
  1. causal_conv1d_update over the spec tokens, from each request's last accepted conv state;
  2. rearrange_mixed_qkv: q, k and v split out into contiguous tensors (four eager copy kernels);
  3. fused_sigmoid_gating_delta_rule_update into a new tensor;
  4. a copy of that into the layer's output buffer.
Patched, for that step: 1 as vLLM calls it, then the kit's kernel reading q, k and v where the conv left them and
writing the output buffer. Steps 2 and 4 are gone: five copy kernels a layer, ~120 a Qwen3.5-4B step (24 GDN
layers). Every other step (prefill, mixed batches, no speculation) and every non-CUDA tensor take vLLM's path.
vLLM 0.32 does the same with a CUDA kernel that also fuses the gated RMSNorm (`fused_gdn_decode_post_conv_mtp`,
vllm-project/vllm#51674); on a class that has it (`_can_use_fused_gdn_mtp_decode`) the patch steps aside.

Read at every interpreter's start (sitecustomize.py): torch and vLLM are imported only in the hook. Tested
(tests/test_gdn_spec_packed_patch.py): routing on each kind of step, the patched step against vLLM's own split,
kernel and copy on CPU under Triton's interpreter (one stand-in conv on both sides: vLLM's does not run there),
and 0.26's `_forward_core` read for the calls it replaces.
"""
from __future__ import annotations

import os
import sys

ENV = "KIT_GDN_SPEC_PACKED"
TARGET = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"
_MARK = "_kit_gdn_spec_packed"
_SEEN: list[int] = []  # the first patched step's token count, once a process
_REFUSED: list[str] = []  # layouts the kernel does not take, each said once
_LEAN = "_kit_lean_core"  # set on a layer by gdn_in_proj.py (GDN_IN_PROJ=fused_lean): its forward made b, a and the
# output buffer without kernels, so this step makes good what vLLM's path and the buffer's spare rows expect


def all_spec(md) -> bool:
    """A step in which every request verifies drafts: the one the patch takes."""
    return (getattr(md, "spec_sequence_masks", None) is not None and md.num_prefills == 0 and md.num_decodes == 0
            and md.spec_state_indices_tensor is not None)


def layout_ok(layer) -> str | None:
    """None when the kit's kernel can take this layer's state pool as vLLM's kernel does (each slot a contiguous
    [HV, V, K]), else why not: the step then stays vLLM's rather than stopping the server."""
    from .gdn_spec_kernel import state_layout_error
    bad = state_layout_error(layer.kv_cache[1], layer.num_v_heads // layer.tp_size, layer.head_v_dim, layer.head_k_dim)
    return f"SSM state not {bad}" if bad else None


def spec_step(layer, md, mixed_qkv, b, a, core_attn_out, *, conv_update, dim_first: bool, lean: bool = False) -> None:
    """vLLM 0.26's spec-only branch of `_forward_core`: its conv update as it calls it, then the kit's kernel into
    core_attn_out. Nothing is allocated but the conv's output. lean: core_attn_out was not zero-filled, so the kernel
    writes zeros where it computes nothing (a skipped sequence's rows, and a graph's padding rows up to the step's
    tokens)."""
    from .gdn_spec_kernel import gdn_spec_packed
    n = md.num_spec_decodes
    t = md.num_actual_tokens
    idx = md.spec_state_indices_tensor
    conv_state = layer.kv_cache[0] if dim_first else layer.kv_cache[0].transpose(-1, -2)
    w = layer.conv1d.weight.view(layer.conv1d.weight.size(0), layer.conv1d.weight.size(2))
    x = conv_update(mixed_qkv[:t], conv_state, w, layer.conv1d.bias, layer.activation,
                    conv_state_indices=idx[:, 0][:n], num_accepted_tokens=md.num_accepted_tokens,
                    query_start_loc=md.spec_query_start_loc, max_query_len=idx.size(-1), validate_data=False)
    gdn_spec_packed(x, a[:t], b[:t], layer.A_log, layer.dt_bias, layer.kv_cache[1], idx, md.num_accepted_tokens,
                    md.spec_query_start_loc, core_attn_out[:t].view(t, -1, layer.head_v_dim),
                    num_k_heads=layer.num_k_heads // layer.tp_size, head_k_dim=layer.head_k_dim,
                    head_v_dim=layer.head_v_dim, scale=layer.head_k_dim ** -0.5, num_seqs=n, zero_skipped=lean)


def patch_class(cls) -> bool:
    orig = cls.__dict__.get("_forward_core")
    if orig is None or getattr(orig, _MARK, False):
        return False
    if "_can_use_fused_gdn_mtp_decode" in cls.__dict__:  # vLLM 0.32+: upstream's fused MTP path
        print(f"kit: GDN packed spec step not installed: {cls.__name__} has vLLM's own "
              "(_can_use_fused_gdn_mtp_decode)", file=sys.stderr, flush=True)
        return False
    mod = sys.modules[cls.__module__]
    interpret = os.environ.get("TRITON_INTERPRET") == "1"  # the tests: the kernel runs on CPU tensors

    def _forward_core(self, mixed_qkv, b, a, core_attn_out):
        raw = mod.get_forward_context().attn_metadata
        md = raw.get(self.prefix) if isinstance(raw, dict) else None
        lean = getattr(self, _LEAN, False)
        if md is None or not all_spec(md) or not (mixed_qkv.is_cuda or interpret) or mixed_qkv.stride(-1) != 1:
            return vllms(self, lean, mixed_qkv, b, a, core_attn_out)
        why = layout_ok(self)
        if why:
            if why not in _REFUSED:  # once a reason a process
                _REFUSED.append(why)
                print(f"kit: GDN packed spec step NOT taken ({why}): vLLM's path", file=sys.stderr, flush=True)
            return vllms(self, lean, mixed_qkv, b, a, core_attn_out)
        if not _SEEN:  # once a process: the server log then shows the patched step ran, not only that it was installed
            _SEEN.append(md.num_actual_tokens)
            print(f"kit: GDN packed spec step ran (first call: {md.num_actual_tokens} tokens)", file=sys.stderr,
                  flush=True)
        spec_step(self, md, mixed_qkv, b, a, core_attn_out, conv_update=mod.causal_conv1d_update,
                  dim_first=bool(mod.is_conv_state_dim_first()), lean=lean)
        t = md.num_actual_tokens
        if lean and core_attn_out.shape[0] > t:  # the rows vLLM's zeros gave past the step's tokens
            core_attn_out[t:].zero_()

    def vllms(self, lean, mixed_qkv, b, a, core_attn_out):
        """vLLM's own path; under GDN_IN_PROJ=fused_lean with what vLLM's forward would have given it: b and a
        contiguous, the output buffer zeroed (gdn_in_proj.py)."""
        if lean:
            core_attn_out.zero_()
            b, a = b.contiguous(), a.contiguous()
        return orig(self, mixed_qkv, b, a, core_attn_out)

    setattr(_forward_core, _MARK, True)
    cls._forward_core = _forward_core
    return True


def install(target: str = TARGET) -> bool:
    """Patch the GDN layer class of `target` when it is imported, if $KIT_GDN_SPEC_PACKED is "1"."""
    from scripts.patches.on_import import install_switched
    return install_switched(ENV, target, patch_class, "GDN packed spec step", "_forward_core")
