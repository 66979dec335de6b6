#!/usr/bin/env bash
# Fetch the English word list of the built-in model's LM (lm/words.txt.gz): Debian's wamerican-huge (SCOWL up to
# size 80, American English; Kevin Atkinson and others; its notice is lm/words.COPYRIGHT), then make the
# normalised list:
#
#   recipes/synth_en/local/fetch_word_list.sh [DIR]   (DIR: default data/word_list at the repo root, git-ignored)
#
# The package comes from the Debian archive (`apt-get download`, no root needed), checked against its SHA-256;
# DIR gets american-english-huge, its copyright file and words.txt.gz (word_list.py). Exit status: 0 done,
# 1 the download or the check failed (one line says why), 2 bad usage.
set -euo pipefail

PACKAGE=wamerican-huge
VERSION=2020.12.07-2
SHA256=e7084d641d1de29699ad47d7467f921659d1ca57a6ad64a18f8b068aef0a56bc

[ $# -le 1 ] || { echo "usage: $0 [DIR]" >&2; exit 2; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
dir=${1:-$root/data/word_list}
command -v apt-get >/dev/null || { echo "fetch_word_list.sh: apt-get is needed (a Debian or Ubuntu machine)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download "$PACKAGE=$VERSION" >/dev/null 2>"$tmp/err") \
  || { echo "fetch_word_list.sh: apt-get download $PACKAGE=$VERSION failed (offline? apt-get update?): $(tail -n 1 "$tmp/err")" >&2; exit 1; }
deb=$(echo "$tmp"/"$PACKAGE"_*.deb)
got=$(sha256sum "$deb" | cut -d' ' -f1)
[ "$got" = "$SHA256" ] || { echo "fetch_word_list.sh: $deb: SHA-256 $got, expected $SHA256" >&2; exit 1; }
dpkg-deb -x "$deb" "$tmp/x"
mkdir -p "$dir"
cp "$tmp/x/usr/share/dict/american-english-huge" "$dir/"
cp "$tmp/x/usr/share/doc/$PACKAGE/copyright" "$dir/copyright"
python=${PYTHON:-$root/.venv/bin/python}
[ -x "$python" ] || python=python3
"$python" "$root/recipes/synth_en/local/word_list.py" "$dir/words.txt.gz" "$dir/american-english-huge"
echo "fetch_word_list.sh: $dir/words.txt.gz (copy it, with $dir/copyright, into an LM directory)"
