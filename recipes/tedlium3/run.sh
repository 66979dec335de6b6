#!/usr/bin/env bash
# TED-LIUM 3 (452 h of TED talks, the legacy dev/test talks): an SRU++ (or Conformer) joint CTC/attention model, as
# ESPnet's TED-LIUM 3 recipe, scored on segments and on whole talks (long-form).
#
#   recipes/tedlium3/run.sh [--stage N] [--stop-stage N] [--corpus-dir DIR] [--download-dir DIR] [--data DIR]
#                           [--exp DIR] [--encoder srupp|conformer] [--config YAML] [--decode-config YAML] [--nj N]
#                           [--vocab-size N] [--token-type unigram|bpe|char] [--speed-perturb true|false]
#                           [--cmvn-max-cuts N] [--devices N] [--num-nodes N] [--train-args "..."] [--num-avg N]
#                           [--use-lm true|false] [--lm-text FILE]... [--lm-args "..."]
#                           [--decodings "MODE ..."] [--beam N] [--ctc-weight W] [--lm-weight W]
#                           [--test-sets "SET ..."] [--longform-sets "SET ..."] [--longform-decodings "MODE ..."]
#                           [--longform-max-seconds S] [--device cpu|cuda|auto]
#
# Stages (each skips what it already produced, and says so):
#   0  download TED-LIUM 3 with lhotse into --download-dir (default data/downloads; 51 GB); with --corpus-dir DIR
#      (an existing TEDLIUM_release-3 folder) nothing is downloaded. Offline, it says so and stops.
#   1  cut manifests (srupp-asr corpus prepare): train, dev, test (one cut per STM segment; transcripts cleaned
#      as Kaldi/ESPnet do, <unk> and noise tags removed, ignore_time_segment_in_scoring segments left out,
#      training segments widened by 0.15 s / 0.1 s) and dev_talks, test_talks (one cut per whole talk)
#   2  speed perturbation: train_sp = every training cut at speeds 0.9, 1.0 and 1.1, as ESPnet's three copies.
#      Written as a manifest of lazily perturbed cuts (lhotse resamples when a cut is loaded; no audio is
#      written), not drawn on the fly (--data.speed_perturb), so that an epoch is ESPnet's epoch and the
#      batches are bucketed by the perturbed durations. --speed-perturb false trains on train as it is.
#   3  global CMVN statistics of the training manifest (--cmvn-max-cuts N: of its first N cuts only)
#   4  sentencepiece tokenizer on the training transcripts (500 unigram pieces, as ESPnet)
#   5  train (srupp-asr train fit; resumes from last.ckpt). --devices N --num-nodes M (and anything in
#      --train-args) go to Lightning; on a cluster run this stage under the launcher (srun / torchrun)
#   6  average the --num-avg best checkpoints into the model directory $exp/model
#   7  with --use-lm true: an SRU++ LM (srupp-asr train-lm) on the --lm-text files (default: the training
#      transcripts; ESPnet adds the corpus's LM texts, TEDLIUM_release-3/LM/*.en.gz, unpacked). Each
#      --lm-text names one text file, one sentence a line (a relative path is taken from the directory the
#      script is run in); repeat the option for more files: --lm-text a.txt --lm-text "my texts/b.txt", or
#      for f in LM/*.en; do lm+=(--lm-text "$f"); done; recipes/tedlium3/run.sh "${lm[@]}" ... A value is
#      never split at blanks (the former word list --lm-text "a.txt b.txt" is refused: no such file).
#      An LM training that stopped before its end is resumed by a rerun; a finished one is skipped
#   8  decode and score the segments of each test set with each decoding mode (srupp-asr evaluate); beam and
#      weights from --decode-config (conf/decode_tedlium3.yaml), with the LM too when stage 7 made one
#   9  long-form test: each talk of --longform-sets transcribed whole from its SPHERE file (srupp-asr transcribe;
#      talks longer than --longform-max-seconds, default 1800, are decoded in overlapping chunks) and scored
#      against its STM (srupp-asr corpus score-talks: the words said in ignore_time_segment_in_scoring stretches
#      are left out, as sclite does) into $exp/decode_longform_<mode>/<set>_talks; and the official way: the words
#      as a CTM scored by srupp-asr sclite against the talks' STM files (sclite.sys/.raw/.pra there)
#   10 the summary table $exp/RESULTS.md
# --config defaults to conf/train_<encoder>.yaml (the mid-size models, about 30 M parameters).
# Without the sph2pipe program, lhotse reads the SPHERE files with libsndfile (LHOTSE_AUDIO_BACKEND), which
# handles TED-LIUM's uncompressed PCM.
set -euo pipefail
recipe=tedlium3
# shellcheck source=recipes/common/stages.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common/stages.sh"  # usage, log, runs, find_srupp and the shared stages

stage=0
stop_stage=10
corpus_dir=""
download_dir=data/downloads
data=""
exp=""
encoder=srupp
config=""
decode_config=conf/decode_tedlium3.yaml
nj=$(nproc)
vocab_size=500
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
test_sets="dev test"
longform_sets="test"
longform_decodings="ctc_greedy ctc_prefix_beam"
longform_max_seconds=1800
device=auto

options=(  # option kind (see parse_options in recipes/common/stages.sh)
  --stage stage --stop-stage stage --corpus-dir dir --download-dir dir --data dir --exp dir
  --encoder "srupp|conformer" --config file --decode-config file --nj count --vocab-size count
  --token-type "unigram|bpe|char" --speed-perturb bool --cmvn-max-cuts whole --devices text --num-nodes count
  --train-args args --num-avg count --use-lm bool --lm-text file-list --lm-args args --decodings modes
  --beam count --ctc-weight fraction --lm-weight number --test-sets words --longform-sets words
  --longform-decodings modes --longform-max-seconds positive --device "cpu|cuda|auto"
)
parse_options "$@"

cd "$repo_root"  # the default paths (conf/, data/, exp/) are relative to the repository root
[ -f "$decode_config" ] || die "$decode_config: decode config not found"
find_srupp  # srupp-asr from PATH, else the one `make` installed in .venv

config=${config:-conf/train_$encoder.yaml}
data=${data:-data/tedlium3}
exp=${exp:-exp/tedlium3_$encoder}
manifests=$data/manifests
corpus_given=false
[ -z "$corpus_dir" ] || corpus_given=true
[ -n "$corpus_dir" ] || corpus_dir=$download_dir/TEDLIUM_release-3
if ! command -v sph2pipe >/dev/null 2>&1 && [ -z "${LHOTSE_AUDIO_BACKEND:-}" ]; then
  export LHOTSE_AUDIO_BACKEND=LibsndfileBackend  # lhotse's .sph reader is the sph2pipe program
fi
train_set=train
$speed_perturb && train_set=train_sp
lm_dir=$exp/lm  # the LM of stage 7 (decode_options and system_name of stages.sh read it)

if runs 0; then
  if $corpus_given; then
    log 0 "using the existing copy in $corpus_dir, nothing to download"
  else
    log 0 "downloading TED-LIUM 3 into $download_dir (kept when already there)"
    srupp corpus download tedlium3 "$download_dir"
  fi
fi

if runs 1; then
  stage_manifests 1 "$manifests" "train dev test dev_talks test_talks" \
    srupp corpus prepare tedlium3 "$corpus_dir" "$manifests" --jobs "$nj"
fi

corpus_stages_2_to_8

if runs 9; then
  for set in $longform_sets; do
    for mode in $longform_decodings; do
      out=$exp/decode_longform_$(system_name "$mode")/${set}_talks
      if scored 9 "$out"; then continue; fi
      decode_options "$mode"
      srupp transcribe "$corpus_dir/legacy/$set/sph/"*.sph --model "$exp/model" "${decode_args[@]}" \
        --device "$device" --max-chunk-seconds "$longform_max_seconds" -f json -o "$out/transcripts" -q
      # and the official way (--stm): the words as a CTM, scored by sclite against the corpus' STM files
      srupp corpus score-talks "$manifests/${set}_talks_cuts.jsonl.gz" "$out/transcripts" --out-dir "$out" \
        --name "${set}_talks" --stm "$corpus_dir/legacy/$set/stm"
      mkdir -p "$out" && touch "$out/.scored"
      log 9 "wrote $out (whole-talk transcripts in transcripts/, results.md, results.json, report.html; sclite.sys/.raw/.pra)"
    done
  done
fi

if runs 10; then
  split_words sets "$test_sets"
  for s in $longform_sets; do sets+=("${s}_talks"); done
  stage_summary 10 "$exp" "TED-LIUM 3 results ($exp, $config)" --quiet --sets "${sets[@]}"
fi
