# shellcheck shell=bash disable=SC2154  # $recipe, $stage, ... are set by the recipe that sources this file
# The command line and the stages the recipes share, as bash functions: sourced (not run) by recipes/*/run.sh,
# right after their `set -euo pipefail`, with
#
#   recipe=NAME  # the name in the log lines
#   # shellcheck source=recipes/common/stages.sh
#   source "$(dirname "${BASH_SOURCE[0]}")/../common/stages.sh"
#
# then the defaults of their options, the table of their options (see parse_options), `parse_options "$@"` and
# `cd "$repo_root"`: the stages run in the repository root.
#
# Each recipe keeps its options and its own stages (download, prepare, synthesis, ...) and calls these for the
# rest. A stage function skips what is already there and says so, as the recipes always did.
#
# The functions take what they need as arguments, except that
#   log, runs       read the recipe's $recipe, $stage and $stop_stage;
#   usage           prints the header comment of the running script ($0);
#   parse_options   reads the recipe's table $options and sets its option variables;
#   decode_options, system_name, stage_decode (the corpus recipes' decoding) read the corpus recipes'
#                   decoding options $decode_config, $beam, $ctc_weight, $lm_weight, $use_lm and $lm_dir.
# Call a stage inside `if runs N; then ... fi`, never as `runs N && stage_...`: bash ignores `set -e` in a function
# called from a && list, and a failing command would not stop the recipe.
# An argument described as a word list (SETS, MODES) is one string that the function splits on blanks; trailing
# OPTION ... arguments are passed on as they are (a recipe splits its --train-args into them with split_words).
# Paths are passed quoted everywhere, one argument each, so that paths with spaces in their names work.

# The repository root (conf/ and the default data/ and exp/ folders; the stages run there).
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# The decoding modes of srupp-asr evaluate and transcribe (MODES in srupp_asr/decoding/options.py), checked on the
# command line so that a misspelt mode stops the recipe before its training, not after it.
decoding_modes="ctc_greedy ctc_prefix_beam joint rescoring"

# The recipe's --help: the script's header comment (the lines after the #! line up to the first line of code),
# without the leading "# ", then what holds for the options of every recipe.
usage() {
  awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"
  echo
  cat <<'EOF'
Every option is checked before anything runs: a wrong one is one line on stderr and exit status 2. A true|false
option takes exactly true or false; N is a whole number >= 1 (--stage and --stop-stage: a stage listed above;
--cmvn-max-cuts and --seed: >= 0; --devices: whatever Lightning takes); W, H and S are numbers (--ctc-weight:
from 0 to 1). A relative path given to an option (--data, --exp, --corpus-dir, --download-dir, --lm-text) is
taken from the directory the script is run in; --config and --decode-config are looked up there first, then in
the repository root (so conf/NAME.yaml works from anywhere). The default folders (data/..., exp/...) and any path
inside --train-args, --lm-args or --average-args are taken from the repository root, where the stages run.
An option given twice keeps its last value, except --lm-text FILE (of the corpus recipes): each adds one file,
which must exist; the value is one path, never split at blanks.
EOF
}

# die MESSAGE: "run.sh: MESSAGE" on stderr, and exit 2 (a usage error).
die() {
  echo "run.sh: $*" >&2
  exit 2
}

# log STAGE MESSAGE: print "<date> <time> (<recipe> stage STAGE) MESSAGE".
log() { echo "$(date '+%F %T') ($recipe stage $1) $2"; }

# runs STAGE: true when STAGE is within --stage .. --stop-stage.
runs() { [ "$stage" -le "$1" ] && [ "$stop_stage" -ge "$1" ]; }

# split_words ARRAY STRING: set the array variable named ARRAY to the words of STRING (split on blanks, without
# wildcard expansion): the word-list options (--train-args "...", --test-sets "...") as arguments.
split_words() { read -r -a "$1" <<<"$2"; }

# ---- the command line --------------------------------------------------------------------------------------------

# parse_options ARG ...: set the recipe's option variables from its command line. The recipe defines the array
# `options`: pairs of an option and its kind; the option --foo-bar sets the variable foo_bar, set to its default
# beforehand (the default of --stop-stage is the recipe's last stage). -h/--help prints usage and exits 0; an unknown
# option, a missing value or a value not of its kind is one line on stderr (die) and exit 2. An option given twice
# keeps its last value, except one of kind file-list. The kinds:
#   stage     a stage number, 0 to the last stage          bool      true or false
#   count     a whole number >= 1                          whole     a whole number >= 0
#   number    a number >= 0 (digits and a point)           positive  a number > 0
#   fraction  a number from 0 to 1                         A|B|...   one of these words
#   dir       a path, made absolute from the directory the script is run in
#   file      an existing file, looked up there, else in the repository root; made absolute
#   file-list repeatable: each occurrence adds one existing, readable file (looked up in the directory the script
#             is run in only; made absolute, never split at blanks) to the array variable (default: the empty array)
#   modes     a word list of decoding modes; fusion-modes: each MODE or MODE+lm (a beam mode fused with an LM)
#   words     a non-empty word list                        text      any non-empty value
#   args      options passed on as they are (may be empty, or start with --)
#   flag      takes no value: sets the variable to true
# Lastly --stage must not come after --stop-stage.
parse_options() {
  local -A kinds=()
  local i opt kind var value
  for ((i = 0; i < ${#options[@]}; i += 2)); do kinds[${options[i]}]=${options[i + 1]}; done
  last_stage=$stop_stage
  while [ $# -gt 0 ]; do
    opt=$1
    shift
    case "$opt" in
      -h|--help) usage; exit 0 ;;
      --?*) [ -n "${kinds[$opt]+set}" ] || die "unknown option $opt (see --help)" ;;
      *) die "unexpected argument '$opt' (see --help)" ;;
    esac
    kind=${kinds[$opt]}
    var=${opt#--}
    var=${var//-/_}
    if [ "$kind" = flag ]; then
      printf -v "$var" true
      continue
    fi
    # missing, empty, or the next option (a value of --train-args may start with --: "--trainer.max_epochs 1")
    if [ $# -eq 0 ] || { [ "$kind" != args ] && [[ -z $1 || $1 == --* ]]; }; then
      die "option $opt needs a value"
    fi
    value=$1
    shift
    check_value "$opt" "$kind"
    if [ "$kind" = file-list ]; then
      append_to "$var" "$value"
    else
      printf -v "$var" '%s' "$value"
    fi
  done
  if [ "$stage" -gt "$stop_stage" ]; then
    die "--stage $stage is after --stop-stage $stop_stage: no stage would run"
  fi
}

# check_value OPTION KIND: check parse_options' $value against KIND (see there) and die naming OPTION and the value
# unless it is one; numbers lose their leading zeros, paths are made absolute.
check_value() {
  local opt=$1 kind=$2 word mode words=()
  case "$kind" in
    stage)
      if ! is_whole "$value" || [ "$((10#$value))" -gt "$last_stage" ]; then
        die "$opt takes a stage number from 0 to $last_stage (see --help), got '$value'"
      fi
      value=$((10#$value)) ;;
    count)
      if ! is_whole "$value" || [ "$((10#$value))" -lt 1 ]; then die "$opt takes a whole number >= 1, got '$value'"; fi
      value=$((10#$value)) ;;
    whole)
      is_whole "$value" || die "$opt takes a whole number >= 0, got '$value'"
      value=$((10#$value)) ;;
    number) in_range "$value" 0 inf || die "$opt takes a number >= 0, got '$value'" ;;
    positive)
      if ! in_range "$value" 0 inf || in_range "$value" 0 0; then die "$opt takes a number > 0, got '$value'"; fi ;;
    fraction) in_range "$value" 0 1 || die "$opt takes a number from 0 to 1, got '$value'" ;;
    bool) case "$value" in true|false) ;; *) die "$opt takes true or false, got '$value'" ;; esac ;;
    dir) value=$(absolute "$value") ;;
    file)
      if [[ $value != /* && ! -f $value && -f $repo_root/$value ]]; then value=$repo_root/$value; fi
      [ -f "$value" ] || die "$opt: no such file '$value' (a relative path is looked up in $PWD, then in $repo_root)"
      value=$(absolute "$value") ;;
    file-list)
      if [ -d "$value" ]; then
        die "$opt: '$value' is a directory, not a text file"
      elif [ ! -e "$value" ]; then
        word="a relative path is taken from $PWD"
        if [[ $value == *[[:space:]]* ]]; then  # perhaps the word list the option took before: say what it is now
          word="$word; for several files give $opt once per file"
        fi
        die "$opt: no such file '$value' ($word)"
      elif [ ! -r "$value" ]; then
        die "$opt: cannot read '$value' (permission denied)"
      fi
      value=$(absolute "$value") ;;
    modes|fusion-modes)
      split_words words "$value"
      [ "${#words[@]}" -gt 0 ] || die "option $opt needs a value"
      for word in "${words[@]}"; do
        mode=$word
        if [ "$kind" = fusion-modes ]; then mode=${word%+lm}; fi
        [[ " $decoding_modes " == *" $mode "* ]] || die "$opt: unknown decoding mode '$word' (modes: $decoding_modes)"
        if [ "$mode" != "$word" ] && [ "$mode" = ctc_greedy ]; then
          die "$opt: '$word': only the beam modes fuse an LM (ctc_prefix_beam, joint, rescoring)"
        fi
      done ;;
    words)
      split_words words "$value"
      [ "${#words[@]}" -gt 0 ] || die "option $opt needs a value" ;;
    text|args) ;;
    *\|*)
      IFS='|' read -r -a words <<<"$kind"
      for word in "${words[@]}"; do [ "$value" != "$word" ] || return 0; done
      word=${kind%|*}
      die "$opt takes ${word//|/, } or ${kind##*|}, got '$value'" ;;
    *) echo "run.sh: the recipe gives $opt the unknown kind '$kind'" >&2; exit 70 ;;  # a bug in the recipe
  esac
}

# is_whole VALUE: true when VALUE is a whole number of at most 18 digits (bash's arithmetic is 64-bit).
is_whole() { [[ $1 =~ ^[0-9]{1,18}$ ]]; }

# in_range VALUE LOW HIGH: true when VALUE is a plain decimal number (digits and at most one point) from LOW to
# HIGH (inf: no upper bound).
in_range() {
  [[ $1 =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)$ ]] &&
    awk -v v="$1" -v lo="$2" -v hi="$3" 'BEGIN { exit !(v + 0 >= lo + 0 && (hi == "inf" || v + 0 <= hi + 0)) }'
}

# append_to ARRAY VALUE: add VALUE as one more element to the array variable named ARRAY.
append_to() { local -n append_to_array=$1; append_to_array+=("$2"); }

# absolute PATH: PATH made absolute from the current directory when it is relative (a leading ./ dropped).
absolute() { if [[ $1 == /* ]]; then echo "$1"; else echo "$PWD/${1#./}"; fi; }

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
    die "srupp-asr not found: run 'make setup' (or pip install -e .) first"
  fi
}

# ---- stages every recipe has -------------------------------------------------------------------------------------

# stage_cmvn STAGE CUTS OUT MAX_CUTS: the global CMVN statistics of the cut manifest CUTS into OUT (a JSON file),
# from its first MAX_CUTS cuts only when MAX_CUTS > 0 (0: all of them).
stage_cmvn() {
  local n=$1 cuts=$2 out=$3 max_cuts=$4 limit=()
  if [ -f "$out" ]; then
    log "$n" "$out exists, skipping"
    return 0
  fi
  if [ "$max_cuts" -gt 0 ]; then limit=(--max-cuts "$max_cuts"); fi
  srupp cmvn "$cuts" --out "$out" "${limit[@]}"
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
# to LightningCLI after those. Resumes from EXP/checkpoints/last.ckpt when it is there, else from the newest
# checkpoint there.
stage_train() {
  local n=$1 config=$2 train_cuts=$3 valid_cuts=$4 tokenizer=$5 cmvn=$6 exp_dir=$7 resume=()
  shift 7
  local newest
  if [ -f "$exp_dir/checkpoints/last.ckpt" ]; then
    resume=(--ckpt_path last)
    log "$n" "resuming from $exp_dir/checkpoints/last.ckpt"
  elif newest=$(ls -t "$exp_dir"/checkpoints/*.ckpt 2>/dev/null | head -n 1) && [ -n "$newest" ]; then
    # killed between a step's top-k save and its last.ckpt: go on from the newest checkpoint (a fresh fit into a
    # folder holding checkpoints is refused, since the two runs' checkpoints would mix)
    resume=(--ckpt_path "$newest")
    log "$n" "resuming from $newest (no last.ckpt)"
  fi
  log "$n" "training with $config into $exp_dir"
  srupp train fit --config "$config" --data.train_cuts "$train_cuts" --data.valid_cuts "$valid_cuts" \
    --data.tokenizer "$tokenizer" --model.cmvn "$cmvn" --trainer.default_root_dir "$exp_dir" "$@" "${resume[@]}"
  log "$n" "checkpoints in $exp_dir/checkpoints, logs in $exp_dir/csv and $exp_dir/tensorboard"
}

# stage_average STAGE EXP NUM [OPTION ...]: average the NUM best checkpoints of the experiment folder EXP into the
# model directory EXP/model (the OPTIONs go to `srupp-asr average`, e.g. --dtype float16 --max-shard-size 15MiB;
# --lm LM_DIR --lm-weight W ships a trained LM in EXP/model/lm, which evaluate and transcribe then fuse by default:
# decode the systems meant without it with --no-lm).
stage_average() {
  local n=$1 exp=$2 num=$3
  shift 3
  srupp average --exp-dir "$exp" --num "$num" --out "$exp/model" "$@"
  log "$n" "wrote the model directory $exp/model"
}

# scored STAGE OUT: true (and a log line) when the scoring into OUT finished without a fault in an earlier run:
# OUT/.scored is written only after the scoring command exits 0 (one that left cuts or talks out exits 1 and
# still writes results.json, which must not make a rerun skip it).
scored() {
  if [ -f "$2/.scored" ] && [ -f "$2/results.json" ]; then
    log "$1" "$2/results.json exists, skipping"
    return 0
  fi
  return 1
}

# evaluate_into STAGE OUT WROTE [OPTION ...]: decode and score a test set with `srupp-asr evaluate OPTION ...
# --out-dir OUT` (the OPTIONs: --model, --cuts, --decoding, --name, ...), unless an earlier run did (see scored);
# WROTE lists the files written, for the log line.
evaluate_into() {
  local n=$1 out=$2 wrote=$3
  shift 3
  if scored "$n" "$out"; then return 0; fi
  srupp evaluate "$@" --out-dir "$out"
  mkdir -p "$out" && touch "$out/.scored"
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

# decode_options MODE: set the array decode_args to the srupp-asr evaluate / transcribe options of the decoding mode
# MODE: beam and weights from the decode config $decode_config (read and checked by Python: srupp_asr.configs; a bad
# config stops the recipe with its one-line error) unless given on the command line ($beam, $ctc_weight,
# $lm_weight), and the LM $lm_dir in the beam modes when $use_lm is true.
decode_options() {
  local values conf_beam conf_ctc_weight conf_length_penalty conf_lm_weight
  values=$("$py" -m srupp_asr.configs decode "$decode_config") || exit 2
  read -r conf_beam conf_ctc_weight conf_length_penalty conf_lm_weight <<<"$values"
  decode_args=(--decoding "$1" --beam "${beam:-$conf_beam}"
    --ctc-weight "${ctc_weight:-$conf_ctc_weight}" --length-penalty "$conf_length_penalty")
  if $use_lm && [ "$1" != ctc_greedy ]; then
    decode_args+=(--lm "$lm_dir" --lm-weight "${lm_weight:-$conf_lm_weight}")
  fi
}

# system_name MODE: the name of the results of decoding mode MODE (their folder is decode_<name>): MODE, or
# MODE_lm when it is decoded with the LM (see decode_options).
system_name() { if $use_lm && [ "$1" != ctc_greedy ]; then echo "${1}_lm"; else echo "$1"; fi; }

# train_log_option EXP: set the array train_log_args to "--train-log FILE" with the metrics.csv of the last training
# run in EXP/csv (Lightning numbers the runs version_N: the training curves of each report), to nothing when there
# is none.
train_log_option() {
  local csv
  csv=$(find "$1/csv" -name metrics.csv 2>/dev/null | sort -V | tail -n 1) || csv=""  # no EXP/csv: no training log
  train_log_args=()
  [ -z "$csv" ] || train_log_args=(--train-log "$csv")
}

# json_path_list PATH: the JSON list holding the string PATH (LightningCLI's --data.audio_roots), quotes and
# backslashes escaped.
json_path_list() {
  local path=${1//\\/\\\\}
  echo "[\"${path//\"/\\\"}\"]"
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

# stage_lm STAGE ENABLED LM_DIR TOKENIZER TRAIN_CUTS VALID_CUTS NUM_TEXT [TEXT ...] [OPTION ...]: with ENABLED
# true, an SRU++ language model (srupp-asr train-lm; on CUDA when nvidia-smi finds a GPU) into LM_DIR, with the
# tokenizer model TOKENIZER, on the NUM_TEXT text files TEXT that follow (each one argument of --train-text; when
# NUM_TEXT is 0: on the transcripts of the cut manifest TRAIN_CUTS), validated on VALID_CUTS; the OPTIONs after the
# text files go to train-lm after those. A run that train-lm finished (LM_DIR.train.done) is skipped; one that stopped
# before its end (LM_DIR.train.pt without .train.done: killed, Ctrl-C, a full disk) is resumed with --resume; an
# LM_DIR with neither (an LM trained elsewhere) is skipped.
stage_lm() {
  local n=$1 enabled=$2 lm_out=$3 tokenizer=$4 train_cuts=$5 valid_cuts=$6 num_text=$7 text_args=() lm_device=cpu
  local base=${3%/} resume=()
  shift 7
  if [ "$num_text" -gt 0 ]; then
    text_args=(--train-text "${@:1:num_text}")
  else
    text_args=(--train-cuts "$train_cuts")
  fi
  shift "$num_text"
  if ! $enabled; then
    log "$n" "no LM (--use-lm false)"
    return 0
  fi
  if [ -f "$base.train.done" ]; then
    log "$n" "$lm_out exists (its training finished), skipping"
    return 0
  elif [ -f "$base.train.pt" ]; then
    resume=(--resume)
    log "$n" "resuming the unfinished LM training of $base.train.pt (delete it to start afresh)"
  elif [ -d "$lm_out" ]; then
    log "$n" "$lm_out exists, skipping"
    return 0
  else
    log "$n" "training an SRU++ LM into $lm_out"
  fi
  if command -v nvidia-smi >/dev/null 2>&1; then lm_device=cuda; fi
  srupp train-lm --tokenizer "$tokenizer" "${text_args[@]}" --valid-cuts "$valid_cuts" --out-dir "$lm_out" \
    --device "$lm_device" "$@" "${resume[@]}"
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
      decode_options "$mode"
      train_log_option "$exp_dir"
      evaluate_into "$n" "$exp_dir/decode_$(system_name "$mode")/$name" "results.md, results.json, report.html" \
        --model "$exp_dir/model" --cuts "$manifests_dir/${name}_cuts.jsonl.gz" "${decode_args[@]}" \
        --device "$device_name" --name "$name" "${train_log_args[@]}"
    done
  done
}

# corpus_stages_2_to_8 (no arguments): stages 2 to 8 of a corpus recipe, each within --stage .. --stop-stage:
# speed perturbation, CMVN, tokenizer, training (audio confined to the corpus directory), averaging, the optional
# LM and decoding + scoring. Reads the corpus recipes' options: $manifests, $train_set, $speed_perturb, $data,
# $cmvn_max_cuts, $vocab_size, $token_type, $config, $exp, $corpus_dir, $devices, $num_nodes, $train_args,
# $num_avg, $use_lm, $lm_dir, $lm_text (an array), $lm_args, $device, $test_sets, $decodings.
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
    local scale=() extra=()
    if [ -n "$devices" ]; then scale+=(--trainer.devices "$devices"); fi
    if [ -n "$num_nodes" ]; then scale+=(--trainer.num_nodes "$num_nodes"); fi
    split_words extra "$train_args"
    stage_train 5 "$config" "$manifests/${train_set}_cuts.jsonl.gz" "$manifests/dev_cuts.jsonl.gz" \
      "$data/tokenizer.model" "$data/cmvn.json" "$exp" --data.speed_perturb null \
      --data.audio_roots "$(json_path_list "$corpus_dir")" "${scale[@]}" "${extra[@]}"
  fi

  if runs 6; then
    stage_average 6 "$exp" "$num_avg"
  fi

  if runs 7; then
    local extra=()
    split_words extra "$lm_args"
    stage_lm 7 "$use_lm" "$lm_dir" "$data/tokenizer.model" "$manifests/train_cuts.jsonl.gz" \
      "$manifests/dev_cuts.jsonl.gz" "${#lm_text[@]}" "${lm_text[@]}" "${extra[@]}"
  fi

  if runs 8; then
    stage_decode 8 "$exp" "$manifests" "$device" "$test_sets" "$decodings"
  fi
}
