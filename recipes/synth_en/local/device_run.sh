#!/usr/bin/env bash
# GPU jobs on a rented machine that has no package registry and no network, each within one lease of about
# 30 minutes whose commands may each run 10 minutes. A job runs in the background (setsid); each call of this
# script is one short command:
#
#   recipes/synth_en/local/device_run.sh start default-model [HOURS]    # the built-in default model (issue 10)
#   recipes/synth_en/local/device_run.sh start compare [MINUTES] [HOURS] # SRU++ vs Conformer vs BLSTM (issue 8)
#   recipes/synth_en/local/device_run.sh start read-mix [MINUTES]        # the built-in model on real read speech
#   recipes/synth_en/local/device_run.sh wait SECONDS                   # watch until done, failed or SECONDS
#   recipes/synth_en/local/device_run.sh collect DIR                    # copy the job's results into DIR
#
# `start` prints the job's log for 9 minutes (WATCH_SECONDS), `wait` goes on printing it. What has to travel with the working
# tree (ignored folders, carried): .whl (the Python wheels the machine lacks: lhotse, jiwer, soundfile, ...) and
# .debs (the TTS engines and texts). local/prepare_lease.sh makes them here, with .espeak_debs and exp/real_en_pack. Both jobs first install those (local/install_debs.sh)
# and synthesise a corpus of HOURS hours on all cores with its CMVN and tokenizer (run.sh stages 1-3), then:
#
# - default-model (HOURS 30): train conf/synth_en_gpu.yaml for what the lease has left (3-12 minutes), average
#   into a float16 model in shards of at most 15 MiB (stages 4-5), decode both test sets on the GPU (stages 6-7:
#   RESULTS.md), and run the decoding speed benchmark on the GPU (benchmarks/decoding_speed.py, 20 files);
#   `collect` brings the model directory (then committed as srupp_asr/default_model) and a tarball of the logs;
# - compare (MINUTES 5, HOURS 20): benchmarks/compare_encoders.py at the GPU size (conf/synth_en_gpu.yaml,
#   --presets gpu): each encoder trained MINUTES minutes, evaluated and decoded long-form on the GPU;
#   `collect` brings its RESULTS.md, plots and logs.
#
# Each phase's start and end go to EXP/pipeline.log with a time stamp; EXP/{DONE,FAILED} mark the end.
#
# Training the shipped model further (INIT=srupp_asr/default_model: `train fit --model.init_from`, same corpus
# seed, so the same tokenizer). The checkout with that model (31 MB), .whl and .debs is more than the 64 MiB
# one call may send (local/lease_tree.sh size .whl .debs), so the model comes in the second call:
#   here:  recipes/synth_en/local/lease_tree.sh hide
#   call 1 (carry .whl .debs): INIT=srupp_asr/default_model TRAIN_ARGS="--model.lr 0.001" \
#          recipes/synth_en/local/device_run.sh start default-model 30
#   here:  recipes/synth_en/local/lease_tree.sh restore
#   call 2 (carry .whl only; .debs stays there): recipes/synth_en/local/device_run.sh wait 560
# The compare job needs no model: hide it for the whole lease.
#
# read-mix (MINUTES 6): the built-in model fine-tuned on the CPU rounds' read+real+long+synth mix
# (benchmarks/real_speech.py --ablation --rows +read --train-only, with the GPU's batch and precision), then the 3
# best checkpoints averaged into a float16 model with the built-in LM (`collect` brings it; gate it on the CPU as a
# CPU-trained candidate: docs/recipes.md). The synthetic half is synthesised there (synth-corpus --hours 30
# --max-utts 814, as on the CPU); the real half travels as exp/real_en_pack (local/pack_real_en.py: Opus, 27 MiB),
# in a later call; the model comes with any call's tree once it is no longer hidden:
#   here:  recipes/synth_en/local/prepare_lease.sh          (.whl, .debs, .espeak_debs, exp/real_en_pack)
#          recipes/synth_en/local/lease_tree.sh hide
#   call 1 (carry .whl .debs): WATCH_SECONDS=60 recipes/synth_en/local/device_run.sh start read-mix 6
#   here:  recipes/synth_en/local/lease_tree.sh restore
#   call 2 (carry .whl .espeak_debs: 37 + 18 MiB), while the job synthesises on the CPU and the GPU is idle:
#          PARTS="graphs decode tests" benchmarks/gpu_session.sh
#   call 3 (carry exp/real_en_pack only: 37 + 27 MiB; the job installed the wheels in call 1):
#          recipes/synth_en/local/device_run.sh wait 560
#   call 4: recipes/synth_en/local/device_run.sh collect $OUT/read_mix
# Calls follow each other at once (an idle machine goes back after 30 s, and the job with it). Before training the
# job waits up to 15 minutes for INIT/config.yaml and the pack. Once call 2 has shown the CUDA graphs of the
# training step to work (srupp_asr/graphs.py, new 2026-11-30, not yet run on a GPU), TRAIN_ARGS='--model.cuda_graphs
# {}' in call 1 of a later lease trains with them.
#
# Environment (for a dry run on a CPU: PYTHON=.venv/bin/python NO_WHEELS=1 DEVICE=cpu TRAIN_ARGS="..."):
# PYTHON (default python3), NO_WHEELS (set: do not install .whl), DEVICE (default cuda), WATCH_SECONDS (how long
# `start` prints the log, default 540), TRAIN_ARGS (appended to
# `srupp-asr train fit` by default-model), INIT (default-model: a model directory to start training from),
# INIT_WAIT (seconds to wait for INIT, default 900), LEASE_MINUTES (default 24), DATA and EXP (default
# data/synth_en_gpu_<HOURS>h and exp/synth_en_gpu or exp/compare_gpu); for compare, CONFIG (default
# conf/synth_en_gpu.yaml) and LENGTHS (long-form minutes, default "1 5 20").
set -euo pipefail
script=$(realpath "${BASH_SOURCE[0]}")

py=${PYTHON:-python3}
device=${DEVICE:-cuda}
current=exp/device_job.txt  # the running (or last) job's EXP folder, for wait and collect

say() { echo "[$(date -u +%H:%M:%S)] $*"; }

# setup: the Python packages (wheels carried in .whl; this checkout, editable) and the TTS engines (.debs).
setup() {
  if [ -d .whl ] && [ -z "${NO_WHEELS:-}" ]; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  local installed bin
  installed=$("$py" -c 'import pathlib, srupp_asr; print(pathlib.Path(srupp_asr.__file__).resolve().parents[1])' \
    2>/dev/null || true)
  bin=$("$py" -c 'import os, sys; print(os.path.dirname(sys.executable))')
  export PATH=$bin:$PATH  # srupp-asr, installed beside the Python that runs it
  # (run from the checkout, `import srupp_asr` finds it without an install: the console script says whether one
  # was made)
  if [ "$installed" != "$(pwd -P)" ] || ! command -v srupp-asr >/dev/null; then
    "$py" -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null
  fi
  command -v srupp-asr >/dev/null || { say "srupp-asr was not installed"; return 1; }
  say "python packages ready: $(command -v srupp-asr)"
  if [ "$device" = cuda ]; then "$py" -c 'import torch; print(torch.cuda.get_device_name())'; fi
  # A failed engine check is not fatal: synth-corpus reports and skips the voices that do not work.
  bash recipes/synth_en/local/install_debs.sh .debs || say "an engine check failed (above); going on without it"
  say "TTS engines ready"
}

# corpus HOURS DATA EXP: synthesise, CMVN, tokenizer (run.sh stages 1-3).
corpus() {
  recipes/synth_en/run.sh --stage 1 --stop-stage 3 --hours "$1" --data "$2" --exp "$3" --nj "$(nproc)" \
    --config conf/synth_en_gpu.yaml --device "$device" --lm false --pocketsphinx false
}

job_default_model() {
  local hours=${1:-30} data exp left budget
  data=${DATA:-data/synth_en_gpu_${hours}h}
  exp=$(job_exp default-model)
  say "default-model: $hours h of audio, $(nproc) cores, device $device"
  setup
  corpus "$hours" "$data" "$exp"
  local train_args=${TRAIN_ARGS:-}
  if [ -n "${INIT:-}" ]; then
    wait_for "$INIT/config.yaml" "${INIT_WAIT:-900}"
    train_args="--model.init_from $INIT $train_args"
  fi
  # Training gets what the lease has left: LEASE_MINUTES (default 24: the lease's 30 minutes less the machine's
  # start and the collect call) from the job's start, less 4 minutes for averaging, decoding and the speed
  # benchmark; at most the config's 12 minutes, at least 3.
  left=$((${LEASE_MINUTES:-24} * 60 - SECONDS - 240))
  budget=$((left > 720 ? 720 : (left < 180 ? 180 : left)))
  say "training for $((budget / 60)) min $((budget % 60)) s"
  recipes/synth_en/run.sh --stage 4 --stop-stage 5 --data "$data" --exp "$exp" --config conf/synth_en_gpu.yaml \
    --device "$device" --lm false --pocketsphinx false --average-args "--dtype float16 --max-shard-size 15MiB" \
    --train-args "--trainer.max_time 00:00:$(printf '%02d:%02d' $((budget / 60)) $((budget % 60))) $train_args"
  say "model exported: $(du -sh "$exp/model" | cut -f1)"
  recipes/synth_en/run.sh --stage 6 --stop-stage 7 --data "$data" --exp "$exp" --device "$device" --lm false \
    --pocketsphinx false --decodings "ctc_greedy joint" --beam 10
  say "decoding speed on the device (20 test_seen files, beam 10)"
  # sed, not head: head would stop reading, and sort, killed by SIGPIPE, would fail the pipeline (pipefail)
  find "$data/corpus/audio/test_seen" -name '*.flac' | sort | sed -n '1,20p' >"$exp/rtf_files.txt"
  # shellcheck disable=SC2046  # one argument per file name (no spaces in corpus names)
  "$py" benchmarks/decoding_speed.py --model "$exp/model" --device "$device" --beam 10 \
    --audio $(cat "$exp/rtf_files.txt") | tee "$exp/decoding_speed_$device.md"
}

job_compare() {
  local minutes=${1:-5} hours=${2:-20} data exp
  data=${DATA:-data/synth_en_gpu_${hours}h}
  exp=$(job_exp compare)
  say "compare: $minutes min of training per encoder on $hours h of audio, $(nproc) cores, device $device"
  setup
  corpus "$hours" "$data" "$exp"
  # shellcheck disable=SC2086  # LENGTHS is a word list
  "$py" benchmarks/compare_encoders.py --config "${CONFIG:-conf/synth_en_gpu.yaml}" --presets gpu \
    --device "$device" --minutes "$minutes" --data "$data" --exp "$exp" --lengths ${LENGTHS:-1 5 20} \
    --out "$exp/RESULTS.md"
}

# What read-mix adds to every row's `train fit` (after benchmarks/real_speech.py's CPU settings: the last wins):
# the GPU config's batch and precision, validation every 100 steps, a fine-tune's peak learning rate, and what the
# CPU rounds found better on the real dev sets (benchmarks/RESULTS.md rounds 11 and 14): no SpecAugment, and no
# dropout in the attention decoder (the built-in model's decoder shape).
READ_MIX_GPU_ARGS="--trainer.accelerator gpu --trainer.precision bf16-mixed --data.max_duration 400 \
--data.num_workers 8 --trainer.val_check_interval 100 --trainer.log_every_n_steps 20 --model.lr 0.0005 \
--model.warmup_steps 100 --model.specaugment null \
--model.decoder_conf '{\"d_model\": 256, \"num_layers\": 3, \"num_heads\": 4, \"ffn_dim\": 1024, \"dropout\": 0.0}'"

job_read_mix() {
  local minutes=${1:-6} data exp real init rows
  data=${DATA:-data/synth_en_read_mix}
  exp=$(job_exp read-mix)
  real=${REAL:-exp/real_en_pack}
  init=${INIT:-srupp_asr/default_model}
  mkdir -p "$exp"
  say "read-mix: $init fine-tuned $minutes min on the read+real+long+synth mix, $(nproc) cores, device $device"
  setup
  srupp-asr synth-corpus "$data" --hours 30 --max-utts 814 --jobs "$(nproc)"  # a rerun completes it
  wait_for "$real/PACKED" "${INIT_WAIT:-900}"
  wait_for "$init/config.yaml" "${INIT_WAIT:-900}"
  local gpu_args=""
  if [ "$device" = cuda ]; then gpu_args=$READ_MIX_GPU_ARGS; fi
  "$py" benchmarks/real_speech.py --ablation --train-only --rows +read --real-dev "$real" --synth "$data" \
    --base "$init" --steps 1000000 --max-minutes "$minutes" --sets vctk_dev arctic_cathy arctic_axb \
    --exp "$exp" --train-args "$gpu_args ${TRAIN_ARGS:-}" | tee "$exp/RESULTS.md"
  rows=$(find "$exp/ablation" -maxdepth 1 -name 'steps*_read*' -type d | head -n 1)
  srupp-asr average --exp-dir "$rows" --num "${NUM:-3}" --out "$exp/model" --dtype float16 \
    --max-shard-size 15MiB --lm "$init/lm"
  say "model exported: $(du -sh "$exp/model" | cut -f1)"
}

wait_for() {  # wait_for FILE SECONDS: until FILE exists (a later call brings it); fail after SECONDS
  local waited=0
  while [ ! -f "$1" ]; do
    if [ "$waited" -ge "$2" ]; then say "$1 did not arrive within $2 s"; return 1; fi
    if [ $((waited % 60)) -eq 0 ]; then say "waiting for $1 (sent by a later call)"; fi
    sleep 5
    waited=$((waited + 5))
  done
  say "$1 is here"
}

job_exp() {  # job_exp JOB: the EXP folder of a job
  case "$1" in
    default-model) echo "${EXP:-exp/synth_en_gpu}" ;;
    compare) echo "${EXP:-exp/compare_gpu}" ;;
    read-mix) echo "${EXP:-exp/read_mix_gpu}" ;;
    *) echo "device_run.sh: unknown job '$1' (default-model, compare or read-mix)" >&2; return 2 ;;
  esac
}

watch_log() {  # watch_log SECONDS: print the job log's new lines until DONE/FAILED or SECONDS passed
  local limit=$1 shown=0 n exp log
  exp=$(cat "$current")
  log=$exp/pipeline.log
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
  if [ -f "$exp/RESULTS.md" ]; then cat "$exp/RESULTS.md"; fi
  return 0
}

# Sourced (the tests call its functions), the script stops here.
if [ "${BASH_SOURCE[0]}" != "$0" ]; then return 0; fi
cd "$(dirname "$script")/../../.."
case "${1:-}" in
  start)
    job=${2:?start needs a job: default-model, compare or read-mix}
    exp=$(job_exp "$job")
    mkdir -p "$exp" "$(dirname "$current")"
    rm -f "$exp/DONE" "$exp/FAILED"
    echo "$exp" >"$current"
    # The job outlives this command (a new session is not killed when the command returns).
    setsid bash -c "if bash '$script' run ${*:2} >>'$exp/pipeline.log' 2>&1; then touch '$exp/DONE'; \
else touch '$exp/FAILED'; fi" </dev/null >/dev/null 2>&1 &
    watch_log "${WATCH_SECONDS:-540}"
    ;;
  run)  # run JOB ARGS...: the job itself, in the foreground (what `start` runs in the background)
    SECONDS=0  # the lease's clock, as far as the job knows it
    job=${2:?}
    shift 2
    "job_${job//-/_}" "$@"
    say "job $job done"
    ;;
  wait)
    watch_log "${2:-540}"
    ;;
  collect)
    out=${2:?collect needs a destination folder}
    exp=$(cat "$current")
    mkdir -p "$out"
    if [ -d "$exp/model" ]; then mkdir -p "$out/model" && cp "$exp"/model/* "$out/model/"; fi
    for f in "$exp"/RESULTS.md "$exp"/*.png; do if [ -f "$f" ]; then cp "$f" "$out/"; fi; done
    tar -czf "$out/logs.tar.gz" --exclude='*.ckpt' --exclude='model' --exclude='*.pt' --exclude='*.flac' \
      --exclude='*.safetensors' "$exp" 2>/dev/null || true
    ls -l "$out" "$out"/model 2>/dev/null || true
    ;;
  *)
    echo "usage: $0 start default-model [HOURS] | start compare [MINUTES] [HOURS] | start read-mix [MINUTES] |" \
      "wait SECONDS | collect DIR" >&2
    exit 2
    ;;
esac
