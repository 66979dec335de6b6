#!/usr/bin/env bash
# Train the built-in default model on a rented GPU machine that has no package registry and no network, within
# one lease of about 30 minutes whose commands may each run 10 minutes. The work runs in the background
# (setsid) and each call of this script is one short command:
#
#   recipes/synth_en/local/device_default_model.sh start [HOURS]   # set up, start the pipeline, watch 9 minutes
#   recipes/synth_en/local/device_default_model.sh wait SECONDS    # watch until done, failed or SECONDS passed
#   recipes/synth_en/local/device_default_model.sh collect DIR     # copy the model and the results into DIR
#
# What has to travel with the working tree (ignored folders, carried): .whl (the Python wheels the machine
# lacks: lhotse, jiwer, soundfile, ...) and .debs (the TTS engines and texts: local/fetch_debs.sh). The pipeline:
# wheels -> TTS engines (local/install_debs.sh) -> run.sh stages 1-5 (synthesise HOURS hours on all cores,
# CMVN, tokenizer, train conf/synth_en_gpu.yaml for its 12-minute budget, average into a float16 model in
# shards of at most 15 MiB) -> stages 6-7 (decode both test sets on the GPU, RESULTS.md) -> the decoding speed
# benchmark on the GPU (benchmarks/decoding_speed.py, 20 test_seen files). Each phase's start
# and end go to exp/synth_en_gpu/pipeline.log with a time stamp; exp/synth_en_gpu/{DONE,FAILED} mark the end.
#
# Environment (for a dry run on a CPU: PYTHON=.venv/bin/python NO_WHEELS=1 DEVICE=cpu TRAIN_ARGS="..."):
# PYTHON (default python3), NO_WHEELS (set: do not install .whl), DEVICE (default cuda), TRAIN_ARGS (appended
# to `srupp-asr train fit`), DATA and EXP (default data/synth_en_gpu, exp/synth_en_gpu).
set -euo pipefail
script=$(realpath "$0")
cd "$(dirname "$script")/../../.."

py=${PYTHON:-python3}
device=${DEVICE:-cuda}
data=${DATA:-data/synth_en_gpu}
exp=${EXP:-exp/synth_en_gpu}
log=$exp/pipeline.log
hours_default=30

say() { echo "[$(date -u +%H:%M:%S)] $*"; }

pipeline() {
  local hours=$1
  SECONDS=0  # the lease's clock, as far as this pipeline knows it
  say "pipeline: $hours h of audio, $(nproc) cores, device $device"
  if [ -d .whl ] && [ -z "${NO_WHEELS:-}" ]; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  local installed
  installed=$("$py" -c 'import pathlib, srupp_asr; print(pathlib.Path(srupp_asr.__file__).resolve().parents[1])' \
    2>/dev/null || true)
  if [ "$installed" != "$(pwd -P)" ]; then
    "$py" -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null
  fi
  local bin
  bin=$("$py" -c 'import os, sys; print(os.path.dirname(sys.executable))')
  export PATH=$bin:$PATH  # srupp-asr, installed beside the Python that runs it
  say "python packages ready: $(command -v srupp-asr)"
  if [ "$device" = cuda ]; then "$py" -c 'import torch; print(torch.cuda.get_device_name())'; fi
  # A failed engine check is not fatal: synth-corpus reports and skips the voices that do not work.
  bash recipes/synth_en/local/install_debs.sh .debs || say "an engine check failed (above); going on without it"
  say "TTS engines ready"
  recipes/synth_en/run.sh --stage 1 --stop-stage 3 --hours "$hours" --data "$data" --exp "$exp" --nj "$(nproc)" \
    --config conf/synth_en_gpu.yaml --device "$device" --lm false --pocketsphinx false
  # Training gets what the lease has left: LEASE_MINUTES (default 24: the lease's 30 minutes less the machine's
  # start and the collect call) from the pipeline's start, less 4 minutes for averaging, decoding and the speed
  # benchmark; at most the config's 12 minutes, at least 3.
  local left budget
  left=$((${LEASE_MINUTES:-24} * 60 - SECONDS - 240))
  budget=$((left > 720 ? 720 : (left < 180 ? 180 : left)))
  say "training for $((budget / 60)) min $((budget % 60)) s"
  recipes/synth_en/run.sh --stage 4 --stop-stage 5 --data "$data" --exp "$exp" --config conf/synth_en_gpu.yaml \
    --device "$device" --lm false --pocketsphinx false --average-args "--dtype float16 --max-shard-size 15MiB" \
    --train-args "--trainer.max_time 00:00:$(printf '%02d:%02d' $((budget / 60)) $((budget % 60))) ${TRAIN_ARGS:-}"
  say "model exported: $(du -sh "$exp/model" | cut -f1)"
  recipes/synth_en/run.sh --stage 6 --stop-stage 7 --data "$data" --exp "$exp" --device "$device" --lm false \
    --pocketsphinx false --decodings "ctc_greedy joint" --beam 10
  say "decoding speed on the device (20 test_seen files, beam 10)"
  find "$data/corpus/audio/test_seen" -name '*.flac' | sort | head -n 20 >"$exp/rtf_files.txt"
  # shellcheck disable=SC2046  # one argument per file name (no spaces in corpus names)
  "$py" benchmarks/decoding_speed.py --model "$exp/model" --device "$device" --beam 10 \
    --audio $(cat "$exp/rtf_files.txt") | tee "$exp/decoding_speed_$device.md"
  say "pipeline done"
}

watch_log() {  # watch_log SECONDS: print the log's new lines until DONE/FAILED or SECONDS passed
  local limit=$1 shown=0 n
  while :; do
    if [ -f "$log" ]; then
      n=$(wc -l <"$log")
      if [ "$n" -gt "$shown" ]; then
        # long tqdm-style lines are cut: the log of the whole run comes back with `collect`
        sed -n "$((shown + 1)),${n}p" "$log" | grep -v '^\s*$' | cut -c1-200 | tail -n 40
        shown=$n
      fi
    fi
    if [ -f "$exp/DONE" ] || [ -f "$exp/FAILED" ]; then break; fi
    if [ "$SECONDS" -ge "$limit" ]; then say "still running after ${limit}s"; return 0; fi
    sleep 15
  done
  if [ -f "$exp/FAILED" ]; then say "FAILED (see the log above)"; return 1; fi
  say "DONE"
  [ -f "$exp/RESULTS.md" ] && cat "$exp/RESULTS.md"
  return 0
}

case "${1:-}" in
  start)
    hours=${2:-$hours_default}
    mkdir -p "$exp"
    rm -f "$exp/DONE" "$exp/FAILED"
    # The pipeline outlives this command (a new session is not killed when the command returns).
    setsid bash -c "if bash '$script' pipeline '$hours' >>'$log' 2>&1; then touch '$exp/DONE'; \
else touch '$exp/FAILED'; fi" </dev/null >/dev/null 2>&1 &
    watch_log 540
    ;;
  pipeline)
    pipeline "${2:-$hours_default}"
    ;;
  wait)
    watch_log "${2:-540}"
    ;;
  collect)
    out=${2:?collect needs a destination folder}
    mkdir -p "$out/model"
    cp "$exp"/model/* "$out/model/"
    tar -czf "$out/results.tar.gz" --exclude='*.ckpt' --exclude='model' --exclude='*.pt' "$exp" \
      "$data/corpus/corpus.json" "$data/corpus/SPLITS.txt" 2>/dev/null || true
    ls -l "$out" "$out/model"
    ;;
  *)
    echo "usage: $0 start [HOURS] | wait SECONDS | collect DIR" >&2
    exit 2
    ;;
esac
