#!/usr/bin/env bash
# Everything a GPU lease's calls carry, made here in one go. All of it is git-ignored, so a new checkout has none
# of it; run this before the first call (the lease's minutes start with that call, not before):
#
#   .whl              the Python wheels the image lacks (local/fetch_wheels.py; about 9 MiB)
#   .debs             the TTS engines and sentence sources (local/fetch_debs.sh; about 41 MiB): device_run.sh jobs
#   .espeak_debs      espeak-ng alone (fetch_debs.sh --only espeak-ng; about 8 MiB): benchmarks/gpu_session.sh
#   exp/real_en_pack  the real speech as Opus (local/pack_real_en.py; about 27 MiB, 12 minutes on one core): the
#                     read-mix job's second call. Left out with --no-pack, or when REAL (default
#                     ../shared/data/real_en beside the checkout) is absent.
#
#   recipes/synth_en/local/prepare_lease.sh [--no-pack]
#
# Each is made again only when missing (delete one to renew it). Then it prints what each call of the plans in
# device_run.sh's header would send (local/lease_tree.sh size; the limit is 64 MiB a call). Exit status: 0 done,
# 1 a step failed (its own one-line message first).
set -euo pipefail
cd "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../../.."

py=${PYTHON:-python3}
[ -x .venv/bin/python ] && py=${PYTHON:-.venv/bin/python}
real=${REAL:-../shared/data/real_en}
pack=1
case "${1:-}" in
  --no-pack) pack="" ;;
  "") ;;
  *) echo "prepare_lease.sh: unknown option $1 (usage: prepare_lease.sh [--no-pack])" >&2; exit 2 ;;
esac
say() { echo "[$(date -u +%H:%M:%S)] $*"; }
local=recipes/synth_en/local

[ -s .whl/MANIFEST.txt ] || { say "wheels"; "$py" $local/fetch_wheels.py .whl; }
[ -s .debs/MANIFEST.txt ] || { say "TTS engines and texts"; bash $local/fetch_debs.sh .debs; }
[ -s .espeak_debs/MANIFEST.txt ] || { say "espeak-ng"; bash $local/fetch_debs.sh --only espeak-ng .espeak_debs; }
if [ -n "$pack" ] && [ ! -d exp/real_en_pack ]; then
  if [ -d "$real" ]; then
    say "the real speech as Opus (about 12 minutes)"
    "$py" $local/pack_real_en.py "$real" exp/real_en_pack
  else
    say "no $real: exp/real_en_pack not made (the read-mix job needs it)"
  fi
fi

say "what the calls would send (the checkout as it is now, the default model included):"
for carry in ".whl .espeak_debs" ".whl .debs" "exp/real_en_pack"; do
  # shellcheck disable=SC2086  # a list of folders
  printf '  carry %-18s ' "$carry:" && bash $local/lease_tree.sh size $carry 2>&1 | head -n1 || true
done
echo "  (over the limit: 'lease_tree.sh hide' leaves the default model out of a call; see device_run.sh's header)"
