# The kit's menu: every recipe is one `python -m scripts.<verb>` line; the logic lives in scripts/.
# `make` alone prints the targets (their `## ` text), then the variables (the `#:` lines below, as written).
#: Variables, given on the command line (make TARGET VAR=value ...); a target's own line names the rest:
#:   VARIANT=name        the variant, experiments/<name>/ (default: tiny)
#:   SET="K=V K2=V2"     per-run overrides of config.env keys (docs/config.md), quoted, space-separated,
#:                       e.g. SET="PORT=8001 WEIGHTS=dummy". A bare PORT=8001 is a make variable the kit
#:                       never reads, and of several SET= make keeps only the last.
#:   the port            SET=PORT=8001 (default 8000). compare: A takes it, B keeps its own PORT or takes
#:                       the next free port above A's (printed); SET_B=PORT=N chooses B's.
#:   A= B=               compare: the reference and the candidate variant (both required); profile-compare: two
#:                       profile records (results/VARIANT/*-profile.json)
#:   SET_A= SET_B=       compare: overrides for A only / B only, as SET (SET applies to both)
#:   PROBE="--flag ..."  eval-latency, compare, failover: the probe's workload flags (`python -m scripts.probe --help`),
#:                       e.g. PROBE="--concurrency 1 --requests 4 --warmup-waves 1" for a short run
#:   URL=                eval-latency, eval-quality: use the server already running there (URL_A= URL_B=: compare)
#:   BASELINE=           eval-latency: the variant whose figures are shown beside (default: its BASELINE key)
#:   BASE=               tune: the variant to search from; new: the parent to inherit
#:   SLO=ttft=MS,tpot=MS tune: the p99 latency objective each candidate must hold
#:   DRY_RUN=1           serve, serve-fleet, build, verify-image, gemm: print the command and env (gemm: the plan), start nothing
#:   KERNELS= M=         gemm: which kernels (bf16,fp8,fp8_online,w4a16_g32,...) and batch sizes (1,2,4,5,8)
#:   TOP=N               profile-compare: also the N kernels whose time a step moved most, by name
#:   PYTEST_ARGS=        test, test-all: more pytest arguments, e.g. PYTEST_ARGS="-k compare -x"
#:   TEST_JOBS=2         test-all: tests run side by side (pytest-xdist); most of a slow test is one process's
#:                       imports and start, so two run in little more than one's time on two cores. 1: one at a time
#:                       (never more tiny vLLM servers at once than memory holds, ~2.7 GB each:
#:                       KIT_SERVER_SLOTS=N sets the count, tests/server_slots.py)
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
# Keep what the caller had (the GPU machine puts vLLM on PYTHONPATH); the repo root first, so
# sitecustomize.py (it loads the kit's patches, scripts/patches/) runs in every Python process, vLLM's workers too.
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))
VARIANT ?= tiny
SET ?=
PROBE ?=
TEST_JOBS ?= 2
PY := $(if $(wildcard .venv/bin/python),.venv/bin/python,python3)
QPY := $(if $(wildcard .venv-quant/bin/python),.venv-quant/bin/python,python3)
V := --variant $(VARIANT) $(foreach s,$(SET),--set $(s))
# Image targets: ENGINE=docker|podman (default: the one on PATH), TARGET=gpu|cpu (default: this host's), IMAGE=tag.
IMG := $(if $(ENGINE),--engine $(ENGINE)) $(if $(DRY_RUN),--dry-run)
.PHONY: help install wheelhouse download serve standby serve-fleet failover eval-latency profile profile-compare gemm compare variance sweep eval-quality eval-quality-full quantize bake verify-cache start-pair build-base build build-import verify-image k8s tune check-schemas test test-all vllm026-src golden report new

help: ## list targets, then the variables they read
	@awk '/^[a-z0-9-]+:.*## /{split($$0, t, /:.*## /); printf "  make %-18s %s\n", t[1], t[2]} /^#:/{v = v substr($$0, 4) "\n"} END{printf "\n%s", v}' $(MAKEFILE_LIST)
install: ## create .venv (vLLM, lm-eval) and .venv-quant (llm-compressor), fetch the tiny model [WHEELHOUSE=DIR] [HOST_TORCH=auto|yes|no]
	python3 -m scripts.install$(if $(WHEELHOUSE), --wheelhouse $(WHEELHOUSE))$(if $(HOST_TORCH), --host-torch $(HOST_TORCH))
wheelhouse: ## on a connected host, all `make install` needs offline into OUT (+ manifest.json); then there: make install WHEELHOUSE=OUT [TARGET=gpu|cpu] [PYTHON=3.12] [PLATFORM=manylinux_2_35_x86_64] [OUT=wheelhouse] [HOST_TORCH=1: no torch, the host has it] [HOST_FREEZE=FILE: the host's pip freeze, checked against]
	python3 -m scripts.wheelhouse $(if $(TARGET),--target $(TARGET)) $(if $(PYTHON),--python $(PYTHON)) $(if $(PLATFORM),--platform $(PLATFORM)) $(if $(OUT),--out $(OUT)) $(if $(HOST_TORCH),--host-torch) $(if $(HOST_FREEZE),--host-freeze $(HOST_FREEZE))
download: ## fetch/build weights for VARIANT (SET=WEIGHTS=dummy: architecture only)
	$(PY) -m scripts.download $(V)
serve: ## run VARIANT's vLLM server until Ctrl-C (DRY_RUN=1: print command and env; STANDBY=1: start it asleep; its first request or POST /wake_up wakes it)
	$(PY) -m scripts.serve $(V) $(if $(STANDBY),--set STANDBY=$(STANDBY)) $(if $(DRY_RUN),--dry-run)
standby: ## VARIANT as a standby: start, sleep, then wake -> first token CYCLES times by a call and CYCLES times by the request itself: record (CUDA GPU) [CYCLES=3]
	$(PY) -m scripts.standby $(V) $(if $(CYCLES),--cycles $(CYCLES))
serve-fleet: ## REPLICAS=N servers of VARIANT (one GPU each) behind vllm-router until Ctrl-C [POLICY=cache_aware|round_robin|...] [DRY_RUN=1]
	$(PY) -m scripts.fleet $(V) $(if $(REPLICAS),--replicas $(REPLICAS)) $(if $(POLICY),--policy $(POLICY)) $(if $(DRY_RUN),--dry-run)
eval-latency: ## latency probe of VARIANT (URL= to probe a running server; PROBE="--concurrency 1,2 --repeats 3 ...": probe flags, see `python -m scripts.probe --help`)
	$(PY) -m scripts.probe $(V) $(if $(URL),--url $(URL)) $(if $(BASELINE),--baseline $(BASELINE)) $(PROBE)
profile: ## one decode step by phase (target, draft, sampler, bookkeeping, gaps) from vLLM's torch profiler: record, results/profiles/ trace, experiments/VARIANT/profile.png (PROFILE="--host ...": the engine's host time by phase, py-spy; see `python -m scripts.profile --help`)
	$(PY) -m scripts.profile $(V) $(PROFILE)
profile-compare: ## two profile records side by side, A=RECORD B=RECORD: ms a step by phase and kind of kernel, host gaps by phase and frame, B - A, the config keys that differ [TOP=N: the N kernels that moved most, from the kept traces]
	$(PY) -m scripts.profile --compare $(or $(A),$(error profile-compare: set A=RECORD, a profile record (results/VARIANT/*-profile.json))) $(or $(B),$(error profile-compare: set B=RECORD, a profile record (results/VARIANT/*-profile.json))) $(if $(TOP),--kernels $(TOP))
gemm: ## each linear layer of VARIANT's architecture timed per kernel and batch size against its byte floor: record (CUDA GPU) [KERNELS=bf16,fp8,w4a16_g32,...] [M=1,2,4,5,8] [DRY_RUN=1]
	$(PY) -m scripts.gemm $(V) $(if $(KERNELS),--kernels $(KERNELS)) $(if $(M),--m $(M)) $(if $(DRY_RUN),--dry-run)
failover: ## a replica of a REPLICAS=N fleet of VARIANT SIGKILLed under load and restarted: what failed, when the router noticed, TTFT before/down/after: record [POLICY=] [PROBE="--concurrency 8 --kill-after-s 30 ..."]
	$(PY) -m scripts.failover $(V) $(if $(REPLICAS),--replicas $(REPLICAS)) $(if $(POLICY),--policy $(POLICY)) $(PROBE)
compare: ## is B faster than A? both served on one GPU, timed interleaved: A=VARIANT B=VARIANT [ROUNDS=5] [SET_A= SET_B=] [URL_A= URL_B=] [PROBE=]
	$(PY) -m scripts.compare $(if $(A),--a $(A)) $(if $(B),--b $(B)) $(foreach s,$(SET),--set $(s)) $(foreach s,$(SET_A),--set-a $(s)) $(foreach s,$(SET_B),--set-b $(s)) $(if $(ROUNDS),--rounds $(ROUNDS)) $(if $(URL_A),--url-a $(URL_A)) $(if $(URL_B),--url-b $(URL_B)) $(PROBE)
variance: ## how much levels moved within one session, and with what: RECORDS="results/.../x-comparison.json ..."
	$(PY) -m scripts.variance $(RECORDS)
sweep: ## one lever over values, served and probed per value: OVER=SPEC_K=0,1,2,4 [RATES=0.98,0.82,...] [JOBS=N] [RESUME=1]
	$(PY) -m scripts.sweep $(V) --over $(OVER) $(if $(RATES),--rates $(RATES)) $(if $(JOBS),--jobs $(JOBS)) $(if $(RESUME),--resume)
eval-quality: ## quality gates on the served VARIANT, the gates file's fixed sample (10% by default)
	$(PY) -m scripts.evaluate $(V) --sample $(if $(URL),--url $(URL))
eval-quality-full: ## quality gates on the served VARIANT, every item
	$(PY) -m scripts.evaluate $(V) --full $(if $(URL),--url $(URL))
quantize: ## VARIANT's QUANT checkpoint (AWQ W4A16 or FP8 dynamic) with llm-compressor (in .venv-quant)
	$(QPY) -m scripts.quantize $(V)
bake: ## pre-compile VARIANT's torch.compile cache and write its manifest
	$(PY) -m scripts.bake $(V)
verify-cache: ## cold-start offline and prove the baked cache was hit
	$(PY) -m scripts.bake $(V) --verify
start-pair: ## is B readier than A? their warm starts of one machine boot (make verify-cache, alternately), phase by phase and round by round, the paired difference to ready with its 95% interval: A=VARIANT B=VARIANT [BOOT=boot_id]
	$(PY) -m scripts.startpair --a $(or $(A),$(error start-pair: set A=VARIANT, the variant before)) --b $(or $(B),$(error start-pair: set B=VARIANT, the variant after)) $(if $(BOOT),--boot $(BOOT))
build-base: ## the CPU image's base (Debian 12 minbase + python3, mmdebstrap), skipped when made from the same inputs [ENGINE=]
	$(PY) -m scripts.image base $(IMG)
build: ## image for VARIANT: GPU host: vLLM base, cache baked natively; CPU host: the local base, wheelhouse, eager [ENGINE= TARGET=gpu|cpu IMAGE=]
	$(PY) -m scripts.image build $(V) $(IMG) $(if $(TARGET),--target $(TARGET)) $(if $(IMAGE),--tag $(IMAGE))
build-import: ## docker image for VARIANT from CACHE=cache_import.tar.gz
	$(PY) -m scripts.image build $(V) --cache $(CACHE) $(IMG) $(if $(IMAGE),--tag $(IMAGE))
verify-image: ## run the built image, wait for health, one chat completion, prove the cache hit, write the record [ENGINE= IMAGE=]
	$(PY) -m scripts.image verify $(V) $(IMG) $(if $(IMAGE),--tag $(IMAGE))
k8s: ## render Kubernetes manifests for VARIANT: replicas behind vllm-router [POLICY=...] [IMAGE=the pushed tag] [STANDBY=N: a warm pool]
	$(PY) -m scripts.image k8s $(V) $(if $(POLICY),--policy $(POLICY)) $(if $(IMAGE),--image $(IMAGE)) $(if $(STANDBY),--standby $(STANDBY))
tune: ## search the levers of BASE= under SLO= and the quality gate; write the winner as a variant [BUDGET=N candidates and/or time, e.g. 6,20m] [JOBS=N]
	$(PY) -m scripts.tune --base $(BASE) $(foreach s,$(SET),--set $(s)) $(if $(SLO),--slo $(SLO)) $(if $(BUDGET),--budget $(BUDGET)) $(if $(JOBS),--jobs $(JOBS))
check-schemas: ## validate schemas, every config.env, every record, freshness of derived files
	$(PY) -m scripts.check
test: ## the fast suite (CPU; real vLLM on the tiny model, one shared server): skips and names the slow e2e tests
	$(PY) -m pytest -m "not gpu and not slow" --durations=10 $(PYTEST_ARGS)
test-all: ## every CPU test, the slow e2e ones too (bake, tune, quantize, gates, sweep, profile): what CI runs
	$(PY) -m pytest -m "not gpu" --durations=10 $(if $(filter-out 1,$(TEST_JOBS)),-n $(TEST_JOBS) --dist worksteal) $(PYTEST_ARGS)
vllm026-src: ## fetch a few of vLLM 0.26's own files (GDN layers, multimodal registry, tokenizer, V2 drafter, AsyncLLM) into .cache/ (git-ignored) once: the tests that need them skip without them
	$(PY) -m scripts.kit vllm026-src
golden: ## regenerate tests/golden/argv from every variant (review the diff)
	$(PY) -m scripts.kit golden
report: ## regenerate measurements.json and README tables from results/
	$(PY) -m scripts.report
new: ## new variant NAME= (BASE= to inherit)
	$(PY) -m scripts.kit new $(NAME) $(if $(BASE),--base $(BASE))
