#!/usr/bin/env bash
# LibriSpeech (100 h or 960 h): an SRU++ (or Conformer) joint CTC/attention model, as ESPnet's LibriSpeech recipe.
#
#   recipes/librispeech/run.sh [--stage N] [--stop-stage N] [--subset 100|960] [--corpus-dir DIR]
#                              [--download-dir DIR] [--data DIR] [--exp DIR] [--encoder srupp|conformer]
#                              [--config YAML] [--decode-config YAML] [--nj N] [--vocab-size N]
#                              [--token-type unigram|bpe|char] [--speed-perturb true|false] [--cmvn-max-cuts N]
#                              [--devices N] [--num-nodes N] [--train-args "..."] [--num-avg N]
#                              [--use-lm true|false] [--lm-text FILE]... [--lm-args "..."]
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
#   7  with --use-lm true: an SRU++ LM (srupp-asr train-lm) on the --lm-text files (default: the training
#      transcripts; ESPnet uses LibriSpeech's 800 M-word LM corpus, openslr.org/11: pass its
#      librispeech-lm-norm.txt, unpacked). Each --lm-text names one text file, one sentence a line (a relative
#      path is taken from the directory the script is run in); repeat the option for more files:
#      --lm-text a.txt --lm-text "my texts/b.txt". A value is never split at blanks (the former word list
#      --lm-text "a.txt b.txt" is refused: no such file).
#      An LM training that stopped before its end is resumed by a rerun; a finished one is skipped
#   8  decode and score each test set with each decoding mode (srupp-asr evaluate: results.md, results.json,
#      report.html); beam and weights from --decode-config (conf/decode_librispeech.yaml), with the LM too
#      when stage 7 made one (beam modes only)
#   9  the summary table $exp/RESULTS.md
# --config defaults: 960 -> conf/librispeech_<encoder>.yaml (about 115 M parameters, ESPnet's Conformer size),
# 100 -> conf/train_<encoder>.yaml (about 30 M).
set -euo pipefail
recipe=librispeech
# shellcheck source=recipes/common/stages.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common/stages.sh"  # usage, log, runs, find_srupp and the shared stages

stage=0
stop_stage=9
subset=960
corpus_dir=""
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
lm_text=()  # --lm-text, one element per occurrence
lm_args=""
decodings="ctc_greedy joint"
beam=""
ctc_weight=""
lm_weight=""
test_sets="dev_clean dev_other test_clean test_other"
device=auto

options=(  # option kind (see parse_options in recipes/common/stages.sh)
  --stage stage --stop-stage stage --subset "100|960" --corpus-dir dir --download-dir dir --data dir --exp dir
  --encoder "srupp|conformer" --config file --decode-config file --nj count --vocab-size count
  --token-type "unigram|bpe|char" --speed-perturb bool --cmvn-max-cuts whole --devices text --num-nodes count
  --train-args args --num-avg count --use-lm bool --lm-text file-list --lm-args args --decodings modes
  --beam count --ctc-weight fraction --lm-weight number --test-sets words --device "cpu|cuda|auto"
)
parse_options "$@"

cd "$repo_root"  # the default paths (conf/, data/, exp/) are relative to the repository root
[ -f "$decode_config" ] || die "$decode_config: decode config not found"
find_srupp  # srupp-asr from PATH, else the one `make` installed in .venv

if [ -z "$config" ]; then
  if [ "$subset" = 960 ]; then config=conf/librispeech_$encoder.yaml; else config=conf/train_$encoder.yaml; fi
fi
data=${data:-data/librispeech_$subset}
exp=${exp:-exp/librispeech_${subset}_$encoder}
manifests=$data/manifests
corpus_given=false
[ -z "$corpus_dir" ] || corpus_given=true
[ -n "$corpus_dir" ] || corpus_dir=$download_dir/LibriSpeech
train_set=train
$speed_perturb && train_set=train_sp
lm_dir=$exp/lm  # the LM of stage 7 (decode_options and system_name of stages.sh read it)

if runs 0; then
  if $corpus_given; then
    log 0 "using the existing copy in $corpus_dir, nothing to download"
  else
    log 0 "downloading LibriSpeech ($subset h and the dev/test sets) into $download_dir (parts already there are kept)"
    srupp corpus download librispeech "$download_dir" --subset "$subset"
  fi
fi

if runs 1; then
  stage_manifests 1 "$manifests" "train dev dev_clean dev_other test_clean test_other" \
    srupp corpus prepare librispeech "$corpus_dir" "$manifests" --subset "$subset" --jobs "$nj"
fi

corpus_stages_2_to_8

if runs 9; then
  split_words sets "$test_sets"
  stage_summary 9 "$exp" "LibriSpeech $subset h results ($exp, $config)" --quiet --sets "${sets[@]}"
fi
