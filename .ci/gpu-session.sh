#!/usr/bin/env bash
# How the committed GPU records were made, on the lent GPU machine (H100/H200, vLLM 0.26.0 from the
# offline payload at /tmp/site, no network, dummy weights of the real architectures). Not part of CI.
# Each step is one kit command, so every record's provenance names the command that made it.
#
#   bash .ci/gpu-session.sh spine      # flag check of every variant + serve smoke of the baselines
#   bash .ci/gpu-session.sh smoke V..  # serve smoke of the named variants (dummy weights)
#   bash .ci/gpu-session.sh catalog SECONDS VARIANT [--set K=V ...]
#       one variant within a time budget: bake (cold start into its own cache root, manifest,
#       phase budget) -> serve --smoke --then probe (warm start, smoke + latency records) ->
#       bake --verify (warm start again, proves nothing new was compiled)
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
step() { echo "=== $(date -u +%H:%M:%S) $*"; "$@"; echo "=== rc=$?"; }
case "${1:-}" in
  spine)
    nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv
    python3 -c 'import vllm, torch, transformers; print("vllm", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__)'
    for v in $(python3 -m scripts.kit list); do
      [ "$v" = tiny ] && set -- || set -- --set WEIGHTS=dummy
      step python3 -m scripts.serve --variant "$v" "$@" --dry-run --check-args >/dev/null
    done ;;
  smoke)
    shift
    for v in "$@"; do step python3 -m scripts.serve --variant "$v" --set WEIGHTS=dummy --smoke; done ;;
  catalog)
    end=$((SECONDS + $2)); v=$3; shift 3
    S="--variant $v --set WEIGHTS=dummy $*"
    PROBE="--concurrency 1,8,32 --repeats 3 --requests 8 --output-min 64 --output-max 128 --prefix-requests 4"
    # SIGINT, not TERM: the kit's entry points stop their server group on KeyboardInterrupt.
    left() { echo $(( end - SECONDS > 5 ? end - SECONDS : 5 )); }
    step timeout -s INT -k 30 "$(left)" python3 -m scripts.bake $S
    step timeout -s INT -k 30 "$(left)" python3 -m scripts.serve $S --smoke --then "python3 -m scripts.probe $S --url {url} $PROBE"
    step timeout -s INT -k 30 "$(left)" python3 -m scripts.bake $S --verify ;;
  *) echo "usage: $0 spine | smoke VARIANT... | catalog SECONDS VARIANT [--set K=V ...]" >&2; exit 2 ;;
esac
