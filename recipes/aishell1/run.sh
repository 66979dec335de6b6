#!/usr/bin/env bash
# AISHELL-1 (178 h of Mandarin): an SRU++ (or Conformer) joint CTC/attention model on characters, as ESPnet's
# AISHELL recipe; scored by character error rate (CER; the WER column counts whole unsegmented sentences).
#
#   recipes/aishell1/run.sh [--stage N] [--stop-stage N] [--corpus-dir DIR] [--download-dir DIR] [--data DIR]
#                           [--exp DIR] [--encoder srupp|conformer] [--config YAML] [--decode-config YAML]
#                           [--vocab-size N] [--token-type char|unigram|bpe] [--speed-perturb true|false]
#                           [--cmvn-max-cuts N] [--devices N] [--num-nodes N] [--train-args "..."] [--num-avg N]
#                           [--use-lm true|false] [--lm-text FILE]... [--lm-args "..."]
#                           [--decodings "MODE ..."] [--beam N] [--ctc-weight W] [--lm-weight W]
#                           [--test-sets "SET ..."] [--device cpu|cuda|auto]
#
# Stages (each skips what it already produced, and says so):
#   0  download AISHELL-1 with lhotse into --download-dir (default data/downloads; 15 GB); with --corpus-dir DIR
#      (an existing copy: the folder holding data_aishell, its wav/*.tar.gz unpacked) nothing is downloaded.
#      Offline, it says so and stops.
#   1  cut manifests (srupp-asr corpus prepare): train, dev, test; the spaces between the transcripts' words
#      removed (character modelling), utterances without a transcript left out
#   2  speed perturbation: train_sp = every training cut at speeds 0.9, 1.0 and 1.1, as ESPnet's three copies.
#      Written as a manifest of lazily perturbed cuts (lhotse resamples when a cut is loaded; no audio is
#      written), not drawn on the fly (--data.speed_perturb), so that an epoch is ESPnet's epoch and the
#      batches are bucketed by the perturbed durations. --speed-perturb false trains on train as it is.
#   3  global CMVN statistics of the training manifest (--cmvn-max-cuts N: of its first N cuts only)
#   4  the tokenizer: one piece per character of the training transcripts (sentencepiece char model; ESPnet's
#      AISHELL vocabulary has 4233 entries); --vocab-size caps it at the most frequent characters
#   5  train (srupp-asr train fit; resumes from last.ckpt). --devices N --num-nodes M (and anything in
#      --train-args) go to Lightning; on a cluster run this stage under the launcher (srun / torchrun)
#   6  average the --num-avg best checkpoints into the model directory $exp/model
#   7  with --use-lm true: an SRU++ LM (srupp-asr train-lm) on the --lm-text files (default: the training
#      transcripts, as ESPnet's AISHELL LM). Each --lm-text names one text file, one sentence a line (a
#      relative path is taken from the directory the script is run in); repeat the option for more files:
#      --lm-text a.txt --lm-text "my texts/b.txt". A value is never split at blanks (the former word list
#      --lm-text "a.txt b.txt" is refused: no such file).
#      An LM training that stopped before its end is resumed by a rerun; a finished one is skipped
#   8  decode and score dev and test with each decoding mode (srupp-asr evaluate); beam and weights from
#      --decode-config (conf/decode_aishell1.yaml), with the LM too when stage 7 made one
#   9  the summary table $exp/RESULTS.md
# --config defaults to conf/train_<encoder>.yaml (the mid-size models; ESPnet's AISHELL Conformer is 12 x 256).
set -euo pipefail
recipe=aishell1
# shellcheck source=recipes/common/stages.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common/stages.sh"  # usage, log, runs, find_srupp and the shared stages

stage=0
stop_stage=9
corpus_dir=""
download_dir=data/downloads
data=""
exp=""
encoder=srupp
config=""
decode_config=conf/decode_aishell1.yaml
vocab_size=10000
token_type=char
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
test_sets="dev test"
device=auto

options=(  # option kind (see parse_options in recipes/common/stages.sh)
  --stage stage --stop-stage stage --corpus-dir dir --download-dir dir --data dir --exp dir
  --encoder "srupp|conformer" --config file --decode-config file --vocab-size count
  --token-type "char|unigram|bpe" --speed-perturb bool --cmvn-max-cuts whole --devices text --num-nodes count
  --train-args args --num-avg count --use-lm bool --lm-text file-list --lm-args args --decodings modes
  --beam count --ctc-weight fraction --lm-weight number --test-sets words --device "cpu|cuda|auto"
)
parse_options "$@"

cd "$repo_root"  # the default paths (conf/, data/, exp/) are relative to the repository root
[ -f "$decode_config" ] || die "$decode_config: decode config not found"
find_srupp  # srupp-asr from PATH, else the one `make` installed in .venv

config=${config:-conf/train_$encoder.yaml}
data=${data:-data/aishell1}
exp=${exp:-exp/aishell1_$encoder}
manifests=$data/manifests
corpus_given=false
[ -z "$corpus_dir" ] || corpus_given=true
[ -n "$corpus_dir" ] || corpus_dir=$download_dir/aishell
train_set=train
$speed_perturb && train_set=train_sp
lm_dir=$exp/lm  # the LM of stage 7 (decode_options and system_name of stages.sh read it)

if runs 0; then
  if $corpus_given; then
    log 0 "using the existing copy in $corpus_dir, nothing to download"
  else
    log 0 "downloading AISHELL-1 into $download_dir (kept when already there)"
    srupp corpus download aishell1 "$download_dir"
  fi
fi

if runs 1; then
  stage_manifests 1 "$manifests" "train dev test" srupp corpus prepare aishell1 "$corpus_dir" "$manifests"
fi

corpus_stages_2_to_8

if runs 9; then
  split_words sets "$test_sets"
  stage_summary 9 "$exp" "AISHELL-1 results ($exp, $config; CER is the measure)" --quiet --sets "${sets[@]}"
fi
