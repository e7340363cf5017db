set -uo pipefail
export PYTHONPATH=/tmp/site:/tmp/kit HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 KIT_GIT_COMMIT=8208d1b6bc493edff1e321c34dfb63bd94eb4c90 KIT_LOG_DIR=/tmp/kit/jobs PYTHONUNBUFFERED=1
step() { echo "=== $(date -u +%H:%M:%S) $*"; "$@"; echo "=== rc=$?"; }
S35="--variant qwen3.5-4b-bf16-tuned-dvg --set WEIGHTS=dummy"; C="--max-concurrency 8"
FORK="--set VLLM_WORKER_MULTIPROC_METHOD=fork"; PLAN="--set VLLM_ENABLE_STARTUP_PLAN=1"
step python3 -m scripts.bake $S35 $C
step python3 -m scripts.bake $S35 $C --verify
step python3 -m scripts.bake $S35 $C --verify $FORK
step python3 -m scripts.bake $S35 $C --verify $FORK $PLAN
step python3 -m scripts.bake $S35 $C --verify $FORK $PLAN
for v in qwen3.5-4b-bf16-tuned-dvg; do
  rm -rf weights/cache/$v-standby; cp -a weights/cache/$v weights/cache/$v-standby; rm -f weights/cache/$v-standby/kit-cache-manifest.json
  step python3 -m scripts.standby --variant $v --set WEIGHTS=dummy $FORK --cycles 5
done
