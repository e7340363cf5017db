#!/usr/bin/env bash
# Here, on the CPU machine: everything a GPU session carries, in .gpu/ (git-ignored).
#   p00 p01 p02        vLLM 0.26.0 payload (../shared/gpu/build_payload.sh, ~2-5 min, skipped if present)
#   install_payload.sh  copied beside them (../shared does not travel)
#   w.tar.xz            dummy weight folders (config + real Qwen tokenizer, no tensors) of every GPU variant
# Then, on the device, back to back (it is released after 30 s idle): three calls carrying one chunk
# each into /tmp/pl/, the third also carrying w.tar.xz and running
#   bash .gpu/install_payload.sh /tmp/pl && tar -xJf .gpu/w.tar.xz && KIT_GIT_COMMIT=... bash .ci/gpu-session.sh ...
set -euo pipefail
cd "$(dirname "$0")/.."
shared=${SHARED:-../shared}
[ -f .gpu/p02 ] || "$shared/gpu/build_payload.sh" .gpu
cp "$shared/gpu/install_payload.sh" .gpu/
for v in $(.venv/bin/python -m scripts.kit list); do
  [ "$v" = tiny ] && continue
  # A variant whose dummy folder cannot be built here (e.g. a drafter with no offline config) is named, not fatal.
  .venv/bin/python -m scripts.download --variant "$v" --set WEIGHTS=dummy >/dev/null 2>.gpu/download-"$v".log \
    && echo "dummy weights: $v" || echo "dummy weights: $v FAILED: $(tail -n 1 .gpu/download-"$v".log)"
done
tar -cJf .gpu/w.tar.xz weights/*/dummy-*
ls -la .gpu
