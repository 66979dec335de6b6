#!/usr/bin/env bash
# Offline English: a corpus synthesised from Debian's TTS voices, an SRU++ model trained on it, on a CPU.
#
#   recipes/synth_en/run.sh [--stage N] [--stop-stage N] [--size walkthrough|tiny|small|large] [--seed S] [--nj N]
#                           [--hours H] [--non-free] [--data DIR] [--exp DIR] [--config YAML] [--vocab-size N]
#                           [--num-avg N] [--train-args "..."] [--average-args "..."] [--decodings "MODE ..."] [--beam N]
#                           [--device cpu|cuda] [--pocketsphinx true|false] [--lm true|false]
#                           [--lm-args "..."] [--lm-weight W] [--real-dev DIR]
#
# Stages (each skips what it already produced, and says so):
#   0  install the TTS engines and texts if missing (apt-get; Debian main only)
#   1  synthesise the corpus (srupp-asr synth-corpus: 16 kHz FLAC + lhotse manifests; resumable)
#   2  global CMVN statistics of the training set
#   3  sentencepiece tokenizer on the training transcripts, then (--lm true) an SRU++ language model
#      (srupp-asr train-lm) on the training side of the corpus' sentence pool (text/lm_train.txt: every sentence
#      that is not a dev or test sentence, spoken in the corpus or not) into $exp/lm (resumes one that stopped)
#   4  train (srupp-asr train fit; resumes from last.ckpt)
#   5  average the best checkpoints into a model directory ($exp/model; with --lm true it carries the LM of stage 3
#      as lm/, fused by default at --lm-weight)
#   6  decode and score the test sets (seen and held-out voices) with each decoding mode of --decodings (default
#      "ctc_greedy joint joint+lm", without joint+lm under --lm false; srupp-asr evaluate; a mode written MODE+lm
#      fuses the LM of stage 3 with --lm-weight), and with pocketsphinx (a pretrained recogniser, for comparison)
#      unless --pocketsphinx false; then the same on the real human speech dev sets of --real-dev (default
#      ../shared/data/real_en beside the repository when present, skipped with a note when not; "none" skips
#      them), imported with `srupp-asr prepare table` into $data/real_en and named real_<set> in the results
#   7  score pocketsphinx's transcripts and write the summary table $exp/RESULTS.md
# --config defaults by size: walkthrough -> conf/walkthrough_cpu.yaml, tiny -> conf/tiny_cpu.yaml,
# small -> conf/synth_en_cpu.yaml, large -> conf/train_srupp.yaml
#
# --size walkthrough (under 10 minutes on 2 CPU cores): the tiny corpus, then one epoch of fine-tuning of the built-in
# model (srupp_asr/default_model, train fit --model.init_from): stage 2 writes that model's CMVN statistics, stage 3
# copies its tokenizer (--vocab-size does not apply), and its defaults are --data data/synth_en_walkthrough,
# --exp exp/synth_en_walkthrough, --num-avg 1, --lm false, --pocketsphinx false and --real-dev none.
set -euo pipefail
recipe=synth_en
# shellcheck source=recipes/common/stages.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common/stages.sh"  # usage, log, runs, find_srupp and the shared stages

stage=0
stop_stage=7
size=small
hours=""
seed=0
nj=$(nproc)
non_free=false
data=""  # data/synth_en (walkthrough: data/synth_en_walkthrough)
exp=""  # exp/synth_en (walkthrough: exp/synth_en_walkthrough)
config=""
vocab_size=256
num_avg=""  # 5 (walkthrough: 1)
train_args=""
average_args=""
decodings=""  # ctc_greedy joint joint+lm, without joint+lm under --lm false
beam=10
device=cpu
pocketsphinx=""  # true (walkthrough: false)
lm=""  # true (walkthrough: false)
lm_args=""
lm_weight=0.3
test_sets="test_seen test_unseen"
real_dev=""  # ../shared/data/real_en when present (walkthrough: none)
real_sets="ljspeech32 pocketsphinx_testdata vctk_dev arctic_cathy arctic_axb fsdd speech_commands"

options=(  # option kind (see parse_options in recipes/common/stages.sh)
  --stage stage --stop-stage stage --size "walkthrough|tiny|small|large" --hours positive --seed whole --nj count
  --non-free flag --data dir --exp dir --config file --vocab-size count --num-avg count --train-args args
  --average-args args --decodings fusion-modes --beam count --device "cpu|cuda" --pocketsphinx bool --lm bool
  --lm-args args --lm-weight number --real-dev text
)
parse_options "$@"

# The defaults that depend on --size (an option given on the command line keeps its value).
if [ "$size" = walkthrough ]; then
  : "${data:=data/synth_en_walkthrough}" "${exp:=exp/synth_en_walkthrough}" "${num_avg:=1}" "${lm:=false}"
  : "${pocketsphinx:=false}" "${real_dev:=none}"
else
  : "${data:=data/synth_en}" "${exp:=exp/synth_en}" "${num_avg:=5}" "${lm:=true}" "${pocketsphinx:=true}"
fi

if [ -z "$real_dev" ]; then
  if [ -d "$repo_root/../shared/data/real_en" ]; then real_dev=$(cd "$repo_root/../shared/data/real_en" && pwd); fi
elif [ "$real_dev" = none ]; then
  real_dev=""
else
  real_dev=$(absolute "$real_dev")
  [ -d "$real_dev" ] || die "--real-dev: no such folder '$real_dev' (real_en, see its README; none: no real speech)"
fi

if [ -z "$decodings" ]; then
  decodings="ctc_greedy joint"
  if $lm; then decodings="$decodings joint+lm"; fi
fi

cd "$repo_root"  # the default paths (conf/, data/, exp/) are relative to the repository root
find_srupp  # srupp-asr from PATH, else the one `make` installed in .venv (and $py, the Python beside it)

if [ -z "$config" ]; then
  case "$size" in
    walkthrough) config=conf/walkthrough_cpu.yaml ;;
    tiny) config=conf/tiny_cpu.yaml ;;
    small) config=conf/synth_en_cpu.yaml ;;
    *) config=conf/train_srupp.yaml ;;
  esac
fi
corpus=$data/corpus
manifests=$corpus/manifests
free_flag=()
if $non_free; then free_flag=(--non-free); fi
builtin=""  # the walkthrough's starting point: the built-in model shipped in the package
init_args=()
if [ "$size" = walkthrough ]; then
  builtin=$("$py" -c 'import pathlib, srupp_asr; print(pathlib.Path(srupp_asr.__file__).parent / "default_model")')
  [ -f "$builtin/config.yaml" ] || die "--size walkthrough fine-tunes the built-in model, and $builtin has none"
  init_args=(--model.init_from "$builtin")
fi

if runs 0; then
  packages=$(awk '!/^#/ && NF { print $2 }' recipes/synth_en/local/packages.txt)
  missing=""
  offline=/var/lib/srupp-asr/offline-debs/packages.txt  # what local/install_debs.sh installed from .debs
  for p in $packages; do
    dpkg -s "$p" >/dev/null 2>&1 || grep -qx "$p" "$offline" 2>/dev/null || missing="$missing $p"
  done
  if [ -n "$missing" ]; then
    log 0 "installing:$missing"
    sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq
    # shellcheck disable=SC2086  # missing is a word list
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing
  else
    log 0 "TTS engines and texts already installed"
  fi
  if $pocketsphinx && ! "$py" -c "import pocketsphinx" 2>/dev/null; then
    log 0 "installing pocketsphinx (the comparison recogniser of stage 6) with pip"
    "$py" -m pip install -q pocketsphinx
  fi
  if $non_free; then
    log 0 "--non-free: MBROLA and pico are contrib/non-free (not free software); install them yourself after" \
      "enabling those sections: mbrola mbrola-us1 mbrola-us2 mbrola-us3 mbrola-en1 festvox-us1 festvox-us2" \
      "festvox-us3 festvox-en1 libttspico-utils"
  fi
fi

if runs 1; then
  amount=(--size "$size")
  if [ "$size" = walkthrough ]; then amount=(--size tiny); fi
  if [ -n "$hours" ]; then amount=(--hours "$hours"); fi
  log 1 "synthesising the corpus (${amount[*]}) into $corpus (seed $seed, $nj jobs; a rerun completes it)"
  srupp synth-corpus "$corpus" "${amount[@]}" --seed "$seed" --jobs "$nj" "${free_flag[@]}"
  log 1 "wrote $manifests/{train,dev,test_seen,test_unseen}_cuts.jsonl.gz"
fi

if runs 2; then
  if [ -z "$builtin" ]; then
    stage_cmvn 2 "$manifests/train_cuts.jsonl.gz" "$data/cmvn.json" 0
  elif [ -f "$data/cmvn.json" ]; then
    log 2 "$data/cmvn.json exists, skipping"
  else  # fine-tuning keeps the features the built-in model was trained on
    "$py" recipes/synth_en/local/model_cmvn.py "$builtin" "$data/cmvn.json"
    log 2 "wrote $data/cmvn.json (the built-in model's CMVN statistics)"
  fi
fi

if runs 3; then
  if [ -z "$builtin" ]; then
    stage_tokenizer 3 "$manifests/train_cuts.jsonl.gz" "$data/tokenizer.model" "$vocab_size" unigram
  elif [ -f "$data/tokenizer.model" ]; then
    log 3 "$data/tokenizer.model exists, skipping"
  else  # the same ids must mean the same pieces as in the weights fine-tuned
    mkdir -p "$data"
    cp "$builtin/tokenizer.model" "$data/tokenizer.model"
    log 3 "wrote $data/tokenizer.model (the built-in model's tokenizer)"
  fi
  if ! $lm; then
    log 3 "--lm false: no language model"
  else
    case "$size" in  # the LM's share of the time budget: minutes of CPU, not epochs
      tiny) lm_size=(--d-model 64 --num-layers 1 --attn-dim 32 --num-heads 2 --max-epochs 2) ;;
      small) lm_size=(--d-model 256 --num-layers 3 --attn-dim 128 --num-heads 4 --max-time 5) ;;
      *) lm_size=(--d-model 512 --num-layers 4 --attn-dim 256 --num-heads 4 --max-epochs 20) ;;
    esac
    split_words extra "$lm_args"
    stage_lm 3 true "$exp/lm" "$data/tokenizer.model" "" "$manifests/dev_cuts.jsonl.gz" 1 \
      "$corpus/text/lm_train.txt" --device "$device" --batch-tokens 6000 --lr 0.003 --warmup-steps 300 \
      "${lm_size[@]}" "${extra[@]}"
  fi
fi

if runs 4; then
  split_words extra "$train_args"
  if [ -n "$builtin" ]; then log 4 "fine-tuning the built-in model $builtin (--model.init_from)"; fi
  stage_train 4 "$config" "$manifests/train_cuts.jsonl.gz" "$manifests/dev_cuts.jsonl.gz" "$data/tokenizer.model" \
    "$data/cmvn.json" "$exp" --data.audio_roots "$(json_path_list "$corpus")" "${init_args[@]}" "${extra[@]}"
fi

if runs 5; then
  split_words extra "$average_args"
  if $lm; then extra+=(--lm "$exp/lm" --lm-weight "$lm_weight"); fi
  stage_average 5 "$exp" "$num_avg" "${extra[@]}"
fi

# The sets stages 6 and 7 score, each NAME=CUTS: the synthetic test sets, then the real dev sets when there are any.
scored_sets=()
for set in $test_sets; do scored_sets+=("$set=$manifests/${set}_cuts.jsonl.gz"); done
if [ -n "$real_dev" ]; then
  for set in $real_sets; do scored_sets+=("real_$set=$data/real_en/$set/dev_cuts.jsonl.gz"); done
fi

if runs 6; then
  if [ -z "$real_dev" ]; then
    log 6 "no real speech (--real-dev; default ../shared/data/real_en when present): scoring the synthetic sets only"
  fi
  for set in $real_sets; do
    if [ -z "$real_dev" ]; then break; fi
    if [ -f "$data/real_en/$set/dev_cuts.jsonl.gz" ]; then
      log 6 "$data/real_en/$set/dev_cuts.jsonl.gz exists, skipping"
    else
      srupp prepare table "$real_dev/$set/manifest.tsv" "$data/real_en/$set"
    fi
  done
  for pair in "${scored_sets[@]}"; do
    set=${pair%%=*}
    cuts=${pair#*=}
    for system in $decodings; do
      mode=${system%+lm}
      fusion=(--no-lm)  # the model carries the LM (stage 5): a system without +lm decodes without it
      if [ "$mode" != "$system" ]; then fusion=(--lm "$exp/lm" --lm-weight "$lm_weight"); fi
      evaluate_into 6 "$exp/decode_${system}/$set" "results.md, report.html, hyp.trn" --model "$exp/model" \
        --cuts "$cuts" --decoding "$mode" --beam "$beam" --device "$device" \
        --name "$set" "${fusion[@]}"
    done
    if $pocketsphinx; then
      out=$exp/decode_pocketsphinx/$set
      if [ -f "$out/pocketsphinx.hyp.trn" ]; then
        log 6 "$out/pocketsphinx.hyp.trn exists, skipping"
      else
        "$py" recipes/synth_en/local/pocketsphinx_decode.py "$cuts" "$out" --jobs "$nj"
        log 6 "wrote $out/pocketsphinx.hyp.trn"
      fi
    fi
  done
fi

if runs 7; then
  sets=("${scored_sets[@]%%=*}")
  if $pocketsphinx; then
    for set in "${sets[@]}"; do
      out=$exp/decode_pocketsphinx/$set
      srupp score --ref "$out/pocketsphinx.ref.trn" --hyp "$out/pocketsphinx.hyp.trn" --format trn \
        --name "$set" --out-dir "$out"
    done
  fi
  stage_summary 7 "$exp" "synth_en results ($exp)" --sets "${sets[@]}"
fi
