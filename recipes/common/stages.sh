# shellcheck shell=bash disable=SC2154  # $recipe, $stage, ... are set by the recipe that sources this file
# The stages the recipes share, as bash functions: sourced (not run) by recipes/*/run.sh, right after their
# `set -euo pipefail`, with
#
#   recipe=NAME  # the name in the log lines
#   # shellcheck source=recipes/common/stages.sh
#   source "$(dirname "${BASH_SOURCE[0]}")/../common/stages.sh"
#
# Each recipe keeps its options and its own stages (download, prepare, synthesis, ...) and calls these for the
# rest. A stage function skips what is already there and says so, as the recipes always did.
#
# The functions take what they need as arguments, except that
#   log, runs       read the recipe's $recipe, $stage and $stop_stage;
#   usage           prints the header comment of the running script ($0);
#   conf_value, decode_options, system_name, stage_decode (the corpus recipes' decoding) read the corpus recipes'
#                   decoding options $decode_config, $beam, $ctc_weight, $lm_weight, $use_lm and $lm_dir.
# Call a stage inside `if runs N; then ... fi`, never as `runs N && stage_...`: bash ignores `set -e` in a function
# called from a && list, and a failing command would not stop the recipe.
# An argument described as a word list (SETS, MODES, LM_TEXT) is one string that the function splits on spaces;
# trailing OPTION ... arguments are passed on as they are (a recipe splits its --train-args into them).

# The recipe's --help: the script's header comment (the lines after the #! line up to the first line of code),
# without the leading "# ".
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }

# log STAGE MESSAGE: print "<date> <time> (<recipe> stage STAGE) MESSAGE".
log() { echo "$(date '+%F %T') ($recipe stage $1) $2"; }

# runs STAGE: true when STAGE is within --stage .. --stop-stage.
runs() { [ "$stage" -le "$1" ] && [ "$stop_stage" -ge "$1" ]; }

# find_srupp (no arguments; call it in the repository root): define the function `srupp` that runs srupp-asr from
# PATH, else the one `make` installed in .venv, and set $py to the Python beside it. Exits 2 when there is none.
# shellcheck disable=SC2034,SC2317  # py is for the recipes (synth_en's local/*.py); srupp is called by them
find_srupp() {
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
}

# ---- stages every recipe has -------------------------------------------------------------------------------------

# stage_cmvn STAGE CUTS OUT MAX_CUTS: the global CMVN statistics of the cut manifest CUTS into OUT (a JSON file),
# from its first MAX_CUTS cuts only when MAX_CUTS > 0 (0: all of them).
stage_cmvn() {
  local n=$1 cuts=$2 out=$3 max_cuts=$4 limit=""
  if [ -f "$out" ]; then
    log "$n" "$out exists, skipping"
    return 0
  fi
  if [ "$max_cuts" -gt 0 ]; then limit="--max-cuts $max_cuts"; fi
  # shellcheck disable=SC2086  # limit is a word list
  srupp cmvn "$cuts" --out "$out" $limit
  log "$n" "wrote $out"
}

# stage_tokenizer STAGE CUTS OUT VOCAB_SIZE MODEL_TYPE: a sentencepiece tokenizer (MODEL_TYPE: unigram, bpe or char;
# at most VOCAB_SIZE pieces) on the transcripts of the cut manifest CUTS, into OUT (the .model file).
stage_tokenizer() {
  local n=$1 cuts=$2 out=$3 vocab_size=$4 model_type=$5
  if [ -f "$out" ]; then
    log "$n" "$out exists, skipping"
    return 0
  fi
  srupp tokenizer --cuts "$cuts" --out "$out" --vocab-size "$vocab_size" --model-type "$model_type"
  log "$n" "wrote $out"
}

# stage_train STAGE CONFIG TRAIN_CUTS VALID_CUTS TOKENIZER CMVN EXP [OPTION ...]: train a model (srupp-asr train fit
# with the YAML CONFIG) on the cut manifest TRAIN_CUTS, validated on VALID_CUTS, with the tokenizer model TOKENIZER
# and the CMVN statistics CMVN, into the experiment folder EXP (checkpoints/, csv/, tensorboard/); the OPTIONs go
# to LightningCLI after those. Resumes from EXP/checkpoints/last.ckpt when it is there.
stage_train() {
  local n=$1 config=$2 train_cuts=$3 valid_cuts=$4 tokenizer=$5 cmvn=$6 exp_dir=$7 resume=""
  shift 7
  if [ -f "$exp_dir/checkpoints/last.ckpt" ]; then
    resume="--ckpt_path last"
    log "$n" "resuming from $exp_dir/checkpoints/last.ckpt"
  fi
  log "$n" "training with $config into $exp_dir"
  # shellcheck disable=SC2086  # resume is a word list
  srupp train fit --config "$config" --data.train_cuts "$train_cuts" --data.valid_cuts "$valid_cuts" \
    --data.tokenizer "$tokenizer" --model.cmvn "$cmvn" --trainer.default_root_dir "$exp_dir" "$@" $resume
  log "$n" "checkpoints in $exp_dir/checkpoints, logs in $exp_dir/csv and $exp_dir/tensorboard"
}

# trainer_scale_options DEVICES NUM_NODES: the LightningCLI options "--trainer.devices DEVICES --trainer.num_nodes
# NUM_NODES" (for stage_train), each left out when its value is empty.
trainer_scale_options() {
  local opts=""
  if [ -n "$1" ]; then opts="--trainer.devices $1"; fi
  if [ -n "$2" ]; then opts="$opts --trainer.num_nodes $2"; fi
  echo "$opts"
}

# stage_average STAGE EXP NUM [OPTION ...]: average the NUM best checkpoints of the experiment folder EXP into the
# model directory EXP/model (the OPTIONs go to `srupp-asr average`, e.g. --dtype float16 --max-shard-size 15MiB).
stage_average() {
  local n=$1 exp=$2 num=$3
  shift 3
  srupp average --exp-dir "$exp" --num "$num" --out "$exp/model" "$@"
  log "$n" "wrote the model directory $exp/model"
}

# evaluate_into STAGE OUT WROTE [OPTION ...]: decode and score a test set with `srupp-asr evaluate OPTION ...
# --out-dir OUT` (the OPTIONs: --model, --cuts, --decoding, --name, ...), unless OUT/results.json is there already;
# WROTE lists the files written, for the log line.
evaluate_into() {
  local n=$1 out=$2 wrote=$3
  shift 3
  if [ -f "$out/results.json" ]; then
    log "$n" "$out/results.json exists, skipping"
    return 0
  fi
  srupp evaluate "$@" --out-dir "$out"
  log "$n" "wrote $out ($wrote)"
}

# stage_summary STAGE EXP TITLE [OPTION ...]: the summary table of the scored test sets of the experiment folder EXP
# (srupp-asr summarize) into EXP/RESULTS.md under the heading "# TITLE". The OPTIONs go to srupp-asr summarize:
# --sets SET ... (the test sets, in the table's order; required) and --quiet (not printing the table).
stage_summary() {
  local n=$1 exp_dir=$2 title=$3
  shift 3
  srupp summarize "$exp_dir" --out "$exp_dir/RESULTS.md" --title "$title" "$@"
  log "$n" "wrote $exp_dir/RESULTS.md"
}

# ---- stages of the corpus recipes (librispeech, tedlium3, aishell1) ----------------------------------------------

# check_corpus_options SPEED_PERTURB USE_LM ENCODER: exit 2 with a message unless the first two are true or false
# and ENCODER is srupp or conformer.
check_corpus_options() {
  local flag
  for flag in "$1" "$2"; do
    case "$flag" in true|false) ;; *) echo "run.sh: --speed-perturb and --use-lm take true or false" >&2; exit 2 ;; esac
  done
  case "$3" in srupp|conformer) ;; *) echo "run.sh: --encoder must be srupp or conformer" >&2; exit 2 ;; esac
}

# conf_value KEY: the value of KEY in the flat "key: value" decode config $decode_config (empty when absent).
conf_value() { sed -n "s/^$1:[[:space:]]*\([^[:space:]#]*\).*/\1/p" "$decode_config" | head -n 1; }

# decode_options MODE: the srupp-asr evaluate / transcribe options of the decoding mode MODE: beam and weights
# from the decode config unless given on the command line ($beam, $ctc_weight, $lm_weight), and the LM $lm_dir in
# the beam modes when $use_lm is true.
decode_options() {
  local opts
  opts="--decoding $1 --beam ${beam:-$(conf_value beam)} --ctc-weight ${ctc_weight:-$(conf_value ctc_weight)}"
  opts="$opts --length-penalty $(conf_value length_penalty)"
  if $use_lm && [ "$1" != ctc_greedy ]; then
    opts="$opts --lm $lm_dir --lm-weight ${lm_weight:-$(conf_value lm_weight)}"
  fi
  echo "$opts"
}

# system_name MODE: the name of the results of decoding mode MODE (their folder is decode_<name>): MODE, or
# MODE_lm when it is decoded with the LM (see decode_options).
system_name() { if $use_lm && [ "$1" != ctc_greedy ]; then echo "${1}_lm"; else echo "$1"; fi; }

# train_log_option EXP: "--train-log FILE" with the metrics.csv of the last training run in EXP/csv (Lightning
# numbers the runs version_N: the training curves of each report), nothing when there is none.
train_log_option() {
  local csv
  csv=$(find "$1/csv" -name metrics.csv 2>/dev/null | sort -V | tail -n 1)
  [ -z "$csv" ] || echo "--train-log $csv"
}

# stage_manifests STAGE MANIFESTS SETS COMMAND [ARG ...]: run COMMAND (the corpus's `srupp corpus prepare ...`)
# unless the folder MANIFESTS holds <set>_cuts.jsonl.gz for each set of the word list SETS.
stage_manifests() {
  local n=$1 manifests_dir=$2 sets=$3 name missing=""
  shift 3
  for name in $sets; do
    [ -f "$manifests_dir/${name}_cuts.jsonl.gz" ] || missing="$missing $name"
  done
  if [ -z "$missing" ]; then
    log "$n" "$manifests_dir/*_cuts.jsonl.gz exist, skipping"
    return 0
  fi
  "$@"
  log "$n" "wrote $manifests_dir/{${sets// /,}}_cuts.jsonl.gz"
}

# stage_speed_perturb STAGE MANIFESTS ENABLED: with ENABLED true, MANIFESTS/train_sp_cuts.jsonl.gz: every cut of
# MANIFESTS/train_cuts.jsonl.gz at speeds 0.9, 1.0 and 1.1 (lazily perturbed: no audio is written).
stage_speed_perturb() {
  local n=$1 manifests_dir=$2 enabled=$3
  if ! $enabled; then
    log "$n" "--speed-perturb false: training on $manifests_dir/train_cuts.jsonl.gz as it is"
  elif [ -f "$manifests_dir/train_sp_cuts.jsonl.gz" ]; then
    log "$n" "$manifests_dir/train_sp_cuts.jsonl.gz exists, skipping"
  else
    srupp corpus speed-perturb "$manifests_dir/train_cuts.jsonl.gz" "$manifests_dir/train_sp_cuts.jsonl.gz" \
      --factors 0.9 1.0 1.1
    log "$n" "wrote $manifests_dir/train_sp_cuts.jsonl.gz"
  fi
}

# stage_lm STAGE ENABLED LM_DIR TOKENIZER TRAIN_CUTS VALID_CUTS LM_TEXT [OPTION ...]: with ENABLED true, an SRU++
# language model (srupp-asr train-lm; on CUDA when nvidia-smi finds a GPU) into LM_DIR, with the tokenizer model
# TOKENIZER, on the text files of the word list LM_TEXT (when empty: the transcripts of the cut manifest
# TRAIN_CUTS), validated on VALID_CUTS; the OPTIONs go to train-lm after those.
stage_lm() {
  local n=$1 enabled=$2 lm_out=$3 tokenizer=$4 train_cuts=$5 valid_cuts=$6 text=$7 text_args lm_device=cpu
  shift 7
  if ! $enabled; then
    log "$n" "no LM (--use-lm false)"
    return 0
  fi
  if [ -d "$lm_out" ]; then
    log "$n" "$lm_out exists, skipping"
    return 0
  fi
  text_args="--train-cuts $train_cuts"
  if [ -n "$text" ]; then text_args="--train-text $text"; fi
  if command -v nvidia-smi >/dev/null 2>&1; then lm_device=cuda; fi
  log "$n" "training an SRU++ LM into $lm_out"
  # shellcheck disable=SC2086  # text_args is a word list
  srupp train-lm --tokenizer "$tokenizer" $text_args --valid-cuts "$valid_cuts" --out-dir "$lm_out" \
    --device "$lm_device" "$@"
  log "$n" "wrote $lm_out"
}

# stage_decode STAGE EXP MANIFESTS DEVICE SETS MODES: decode and score each test set of the word list SETS (the cut
# manifests MANIFESTS/<set>_cuts.jsonl.gz) with the model EXP/model in each decoding mode of the word list MODES
# (options from decode_options) on DEVICE, into EXP/decode_<system>/<set> (see system_name); sets already scored
# are skipped.
stage_decode() {
  local n=$1 exp_dir=$2 manifests_dir=$3 device_name=$4 sets=$5 modes=$6 name mode
  for name in $sets; do
    for mode in $modes; do
      # shellcheck disable=SC2046  # decode_options and train_log_option print word lists
      evaluate_into "$n" "$exp_dir/decode_$(system_name "$mode")/$name" "results.md, results.json, report.html" \
        --model "$exp_dir/model" --cuts "$manifests_dir/${name}_cuts.jsonl.gz" $(decode_options "$mode") \
        --device "$device_name" --name "$name" $(train_log_option "$exp_dir")
    done
  done
}

# corpus_stages_2_to_8 (no arguments): stages 2 to 8 of a corpus recipe, each within --stage .. --stop-stage:
# speed perturbation, CMVN, tokenizer, training (audio confined to the corpus directory), averaging, the optional
# LM and decoding + scoring. Reads the corpus recipes' options: $manifests, $train_set, $speed_perturb, $data,
# $cmvn_max_cuts, $vocab_size, $token_type, $config, $exp, $corpus_dir, $devices, $num_nodes, $train_args,
# $num_avg, $use_lm, $lm_dir, $lm_text, $lm_args, $device, $test_sets, $decodings.
corpus_stages_2_to_8() {
  if runs 2; then
    stage_speed_perturb 2 "$manifests" "$speed_perturb"
  fi

  if runs 3; then
    stage_cmvn 3 "$manifests/${train_set}_cuts.jsonl.gz" "$data/cmvn.json" "$cmvn_max_cuts"
  fi

  if runs 4; then
    stage_tokenizer 4 "$manifests/train_cuts.jsonl.gz" "$data/tokenizer.model" "$vocab_size" "$token_type"
  fi

  if runs 5; then
    # shellcheck disable=SC2046,SC2086  # trainer_scale_options prints a word list, train_args is one
    stage_train 5 "$config" "$manifests/${train_set}_cuts.jsonl.gz" "$manifests/dev_cuts.jsonl.gz" \
      "$data/tokenizer.model" "$data/cmvn.json" "$exp" --data.speed_perturb null --data.audio_roots "[\"$corpus_dir\"]" \
      $(trainer_scale_options "$devices" "$num_nodes") $train_args
  fi

  if runs 6; then
    stage_average 6 "$exp" "$num_avg"
  fi

  if runs 7; then
    # shellcheck disable=SC2086  # lm_args is a word list
    stage_lm 7 "$use_lm" "$lm_dir" "$data/tokenizer.model" "$manifests/train_cuts.jsonl.gz" \
      "$manifests/dev_cuts.jsonl.gz" "$lm_text" $lm_args
  fi

  if runs 8; then
    stage_decode 8 "$exp" "$manifests" "$device" "$test_sets" "$decodings"
  fi
}
