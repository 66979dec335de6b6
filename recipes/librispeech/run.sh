#!/usr/bin/env bash
# LibriSpeech (100 h or 960 h): an SRU++ (or Conformer) joint CTC/attention model, as ESPnet's LibriSpeech recipe.
#
#   recipes/librispeech/run.sh [--stage N] [--stop-stage N] [--subset 100|960] [--corpus-dir DIR]
#                              [--download-dir DIR] [--data DIR] [--exp DIR] [--encoder srupp|conformer]
#                              [--config YAML] [--decode-config YAML] [--nj N] [--vocab-size N]
#                              [--token-type unigram|bpe|char] [--speed-perturb true|false] [--cmvn-max-cuts N]
#                              [--devices N] [--num-nodes N] [--train-args "..."] [--num-avg N]
#                              [--use-lm true|false] [--lm-text "FILE ..."] [--lm-args "..."]
#                              [--decodings "MODE ..."] [--beam N] [--ctc-weight W] [--lm-weight W]
#                              [--test-sets "SET ..."] [--device cpu|cuda|auto]
#
# Stages (each skips what it already produced, and says so):
#   0  download the corpus with lhotse into --download-dir (default data/downloads); with --corpus-dir DIR (an
#      existing LibriSpeech folder) nothing is downloaded. Offline, it says so and stops.
#   1  cut manifests (srupp-asr corpus prepare): train (train-clean-100, or all 960 h), dev (dev-clean +
#      dev-other, for validation), dev_clean, dev_other, test_clean, test_other
#   2  speed perturbation: train_sp = every training cut at speeds 0.9, 1.0 and 1.1, as ESPnet's three copies.
#      Written as a manifest of lazily perturbed cuts (lhotse resamples when a cut is loaded; no audio is
#      written), not drawn on the fly (--data.speed_perturb), so that an epoch is ESPnet's epoch and the
#      batches are bucketed by the perturbed durations. --speed-perturb false trains on train as it is.
#   3  global CMVN statistics of the training manifest (--cmvn-max-cuts N: of its first N cuts only)
#   4  sentencepiece tokenizer on the training transcripts (5000 pieces, unigram: ESPnet's "bpe" token type
#      is sentencepiece's unigram model; --token-type bpe for byte-pair encoding)
#   5  train (srupp-asr train fit; resumes from last.ckpt). --devices N --num-nodes M (and anything in
#      --train-args, e.g. "--trainer.strategy ddp") go to Lightning; on a cluster run this stage under the
#      launcher (srun / torchrun), the other stages on one machine
#   6  average the --num-avg best checkpoints (by validation accuracy) into the model directory $exp/model
#   7  with --use-lm true: an SRU++ LM (srupp-asr train-lm) on --lm-text (default: the training transcripts;
#      ESPnet uses LibriSpeech's 800 M-word LM corpus, openslr.org/11, pass its librispeech-lm-norm.txt)
#   8  decode and score each test set with each decoding mode (srupp-asr evaluate: results.md, results.json,
#      report.html); beam and weights from --decode-config (conf/decode_librispeech.yaml), with the LM too
#      when stage 7 made one (beam modes only)
#   9  the summary table $exp/RESULTS.md
# --config defaults: 960 -> conf/librispeech_<encoder>.yaml (about 115 M parameters, ESPnet's Conformer size),
# 100 -> conf/train_<encoder>.yaml (about 30 M).
set -euo pipefail

stage=0
stop_stage=9
subset=960
corpus_dir=""
corpus_given=false
download_dir=data/downloads
data=""
exp=""
encoder=srupp
config=""
decode_config=conf/decode_librispeech.yaml
nj=$(nproc)
vocab_size=5000
token_type=unigram
speed_perturb=true
cmvn_max_cuts=0
devices=""
num_nodes=""
train_args=""
num_avg=10
use_lm=false
lm_text=""
lm_args=""
decodings="ctc_greedy joint"
beam=""
ctc_weight=""
lm_weight=""
test_sets="dev_clean dev_other test_clean test_other"
device=auto

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --stage) stage=$2; shift 2 ;;
    --stop-stage) stop_stage=$2; shift 2 ;;
    --subset) subset=$2; shift 2 ;;
    --corpus-dir) corpus_dir=$2; corpus_given=true; shift 2 ;;
    --download-dir) download_dir=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --exp) exp=$2; shift 2 ;;
    --encoder) encoder=$2; shift 2 ;;
    --config) config=$2; shift 2 ;;
    --decode-config) decode_config=$2; shift 2 ;;
    --nj) nj=$2; shift 2 ;;
    --vocab-size) vocab_size=$2; shift 2 ;;
    --token-type) token_type=$2; shift 2 ;;
    --speed-perturb) speed_perturb=$2; shift 2 ;;
    --cmvn-max-cuts) cmvn_max_cuts=$2; shift 2 ;;
    --devices) devices=$2; shift 2 ;;
    --num-nodes) num_nodes=$2; shift 2 ;;
    --train-args) train_args=$2; shift 2 ;;
    --num-avg) num_avg=$2; shift 2 ;;
    --use-lm) use_lm=$2; shift 2 ;;
    --lm-text) lm_text=$2; shift 2 ;;
    --lm-args) lm_args=$2; shift 2 ;;
    --decodings) decodings=$2; shift 2 ;;
    --beam) beam=$2; shift 2 ;;
    --ctc-weight) ctc_weight=$2; shift 2 ;;
    --lm-weight) lm_weight=$2; shift 2 ;;
    --test-sets) test_sets=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

log() { echo "$(date '+%F %T') (librispeech stage $1) $2"; }
runs() { [ "$stage" -le "$1" ] && [ "$stop_stage" -ge "$1" ]; }
# A value of the flat "key: value" decode config (empty when absent).
conf_value() { sed -n "s/^$1:[[:space:]]*\([^[:space:]#]*\).*/\1/p" "$decode_config" | head -n 1; }
cd "$(dirname "$0")/../.."  # paths (conf/, data/, exp/) are relative to the repository root
[ -f "$decode_config" ] || { echo "run.sh: $decode_config: decode config not found" >&2; exit 2; }

# srupp-asr from PATH, else the one `make` installed in .venv (and the Python beside it)
if command -v srupp-asr >/dev/null 2>&1; then
  srupp() { srupp-asr "$@"; }
  py=$(dirname "$(command -v srupp-asr)")/python
  [ -x "$py" ] || py=python3
elif [ -x .venv/bin/srupp-asr ]; then
  srupp() { .venv/bin/srupp-asr "$@"; }
  py=.venv/bin/python
else
  echo "run.sh: srupp-asr not found: run 'make setup' (or pip install -e .) first" >&2
  exit 2
fi

for flag in "$speed_perturb" "$use_lm"; do
  case "$flag" in true|false) ;; *) echo "run.sh: --speed-perturb and --use-lm take true or false" >&2; exit 2 ;; esac
done
case "$subset" in 100|960) ;; *) echo "run.sh: --subset must be 100 or 960, got $subset" >&2; exit 2 ;; esac
case "$encoder" in srupp|conformer) ;; *) echo "run.sh: --encoder must be srupp or conformer" >&2; exit 2 ;; esac
if [ -z "$config" ]; then
  if [ "$subset" = 960 ]; then config=conf/librispeech_$encoder.yaml; else config=conf/train_$encoder.yaml; fi
fi
data=${data:-data/librispeech_$subset}
exp=${exp:-exp/librispeech_${subset}_$encoder}
manifests=$data/manifests
[ -n "$corpus_dir" ] || corpus_dir=$download_dir/LibriSpeech
train_set=train
$speed_perturb && train_set=train_sp
lm_dir=$exp/lm

# The decoding options of MODE: beam and weights from the decode config unless given on the command line, the LM
# (stage 7) in the beam modes when --use-lm true. system_name: the results folder's name, decode_<system>.
decode_options() {
  local opts
  opts="--decoding $1 --beam ${beam:-$(conf_value beam)} --ctc-weight ${ctc_weight:-$(conf_value ctc_weight)}"
  opts="$opts --length-penalty $(conf_value length_penalty)"
  if $use_lm && [ "$1" != ctc_greedy ]; then
    opts="$opts --lm $lm_dir --lm-weight ${lm_weight:-$(conf_value lm_weight)}"
  fi
  echo "$opts"
}
system_name() { if $use_lm && [ "$1" != ctc_greedy ]; then echo "${1}_lm"; else echo "$1"; fi; }
# The last training run's metrics (Lightning numbers the runs version_N): the training curves of each report.
train_log_option() {
  local csv
  csv=$(find "$exp/csv" -name metrics.csv 2>/dev/null | sort -V | tail -n 1)
  [ -z "$csv" ] || echo "--train-log $csv"
}

if runs 0; then
  if $corpus_given; then
    log 0 "using the existing copy in $corpus_dir, nothing to download"
  else
    log 0 "downloading LibriSpeech ($subset h and the dev/test sets) into $download_dir (parts already there are kept)"
    srupp corpus download librispeech "$download_dir" --subset "$subset"
  fi
fi

if runs 1; then
  missing=""
  for set in train dev dev_clean dev_other test_clean test_other; do
    [ -f "$manifests/${set}_cuts.jsonl.gz" ] || missing="$missing $set"
  done
  if [ -z "$missing" ]; then
    log 1 "$manifests/*_cuts.jsonl.gz exist, skipping"
  else
    srupp corpus prepare librispeech "$corpus_dir" "$manifests" --subset "$subset" --jobs "$nj"
    log 1 "wrote $manifests/{train,dev,dev_clean,dev_other,test_clean,test_other}_cuts.jsonl.gz"
  fi
fi

if runs 2; then
  if ! $speed_perturb; then
    log 2 "--speed-perturb false: training on $manifests/train_cuts.jsonl.gz as it is"
  elif [ -f "$manifests/train_sp_cuts.jsonl.gz" ]; then
    log 2 "$manifests/train_sp_cuts.jsonl.gz exists, skipping"
  else
    srupp corpus speed-perturb "$manifests/train_cuts.jsonl.gz" "$manifests/train_sp_cuts.jsonl.gz" \
      --factors 0.9 1.0 1.1
    log 2 "wrote $manifests/train_sp_cuts.jsonl.gz"
  fi
fi

if runs 3; then
  if [ -f "$data/cmvn.json" ]; then
    log 3 "$data/cmvn.json exists, skipping"
  else
    max_cuts=""
    [ "$cmvn_max_cuts" -gt 0 ] && max_cuts="--max-cuts $cmvn_max_cuts"
    # shellcheck disable=SC2086  # max_cuts is a word list
    srupp cmvn "$manifests/${train_set}_cuts.jsonl.gz" --out "$data/cmvn.json" $max_cuts
    log 3 "wrote $data/cmvn.json"
  fi
fi

if runs 4; then
  if [ -f "$data/tokenizer.model" ]; then
    log 4 "$data/tokenizer.model exists, skipping"
  else
    srupp tokenizer --cuts "$manifests/train_cuts.jsonl.gz" --out "$data/tokenizer.model" \
      --vocab-size "$vocab_size" --model-type "$token_type"
    log 4 "wrote $data/tokenizer.model"
  fi
fi

if runs 5; then
  resume=""
  if [ -f "$exp/checkpoints/last.ckpt" ]; then
    resume="--ckpt_path last"
    log 5 "resuming from $exp/checkpoints/last.ckpt"
  fi
  scale=""
  [ -n "$devices" ] && scale="--trainer.devices $devices"
  [ -n "$num_nodes" ] && scale="$scale --trainer.num_nodes $num_nodes"
  log 5 "training with $config into $exp"
  # shellcheck disable=SC2086  # scale, train_args and resume are word lists
  srupp train fit --config "$config" \
    --data.train_cuts "$manifests/${train_set}_cuts.jsonl.gz" --data.valid_cuts "$manifests/dev_cuts.jsonl.gz" \
    --data.speed_perturb null --data.tokenizer "$data/tokenizer.model" --model.cmvn "$data/cmvn.json" \
    --trainer.default_root_dir "$exp" $scale $train_args $resume
  log 5 "checkpoints in $exp/checkpoints, logs in $exp/csv and $exp/tensorboard"
fi

if runs 6; then
  srupp average --exp-dir "$exp" --num "$num_avg" --out "$exp/model"
  log 6 "wrote the model directory $exp/model"
fi

if runs 7; then
  if ! $use_lm; then
    log 7 "no LM (--use-lm false)"
  elif [ -d "$lm_dir" ]; then
    log 7 "$lm_dir exists, skipping"
  else
    if [ -n "$lm_text" ]; then
      # shellcheck disable=SC2086  # lm_text is a list of files
      text_args="--train-text $lm_text"
    else
      text_args="--train-cuts $manifests/train_cuts.jsonl.gz"
    fi
    lm_device=cpu
    command -v nvidia-smi >/dev/null 2>&1 && lm_device=cuda
    log 7 "training an SRU++ LM into $lm_dir"
    # shellcheck disable=SC2086  # text_args and lm_args are word lists
    srupp train-lm --tokenizer "$data/tokenizer.model" $text_args --valid-cuts "$manifests/dev_cuts.jsonl.gz" \
      --out-dir "$lm_dir" --device "$lm_device" $lm_args
    log 7 "wrote $lm_dir"
  fi
fi

if runs 8; then
  for set in $test_sets; do
    for mode in $decodings; do
      out=$exp/decode_$(system_name "$mode")/$set
      if [ -f "$out/results.json" ]; then
        log 8 "$out/results.json exists, skipping"
        continue
      fi
      # shellcheck disable=SC2046  # decode_options prints a word list
      srupp evaluate --model "$exp/model" --cuts "$manifests/${set}_cuts.jsonl.gz" $(decode_options "$mode") \
        --device "$device" --name "$set" --out-dir "$out" $(train_log_option)
      log 8 "wrote $out (results.md, results.json, report.html)"
    done
  done
fi

if runs 9; then
  # shellcheck disable=SC2086  # test_sets is a word list
  table=$("$py" recipes/synth_en/local/summarize.py "$exp" --sets $test_sets)
  printf '# LibriSpeech %s h results (%s, %s)\n\n%s\n' "$subset" "$exp" "$config" "$table" > "$exp/RESULTS.md.tmp"
  mv "$exp/RESULTS.md.tmp" "$exp/RESULTS.md"
  log 9 "wrote $exp/RESULTS.md"
fi
