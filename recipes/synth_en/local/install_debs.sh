#!/usr/bin/env bash
# Install the TTS engines, voices, sox and texts of recipes/synth_en from .deb files on a machine with no package
# registry (the .debs come from recipes/synth_en/local/fetch_debs.sh, run where apt can download), then check them.
#
#   recipes/synth_en/local/install_debs.sh [--root DIR] [--no-check] [DEBS_DIR]   (as root; DEBS_DIR: default
#                                                                                  .debs at the repo root)
#
# How, without dpkg's database and without touching what the system has:
#   1. every .deb is unpacked (dpkg-deb -x) into a staging folder;
#   2. each file (or symbolic link) of the staging folder that does not exist on the system is copied there;
#      a file that exists is never overwritten (the system keeps its own, newer, libraries), and directory
#      symlinks (/lib -> usr/lib on merged-/usr systems) are kept;
#   3. ldconfig (what the libraries' triggers would do). The rest of what the packages' maintainer scripts do is
#      not needed by the engines (checked for the packages fetch_debs.sh fetches: no alternatives or diversions;
#      festival's postinst only adds the user of its server mode, fortune-mod's clears /usr/local/share/games/
#      fortunes, libpulse0's removes an old conffile, dict-gcide's registers the dictionary with dictd; festival's
#      /etc/festival.scm comes with the files); the script warns about a package that calls update-alternatives;
#   4. a self-check: espeak-ng, flite (slt) and festival (kal_diphone, ked_diphone, cmu_us_slt_arctic_hts, called
#      as srupp_asr/synth/voices.py calls it) each say a sentence into a WAV file, sox changes its rate and pitch
#      as srupp_asr/synth/variation.py does, and the text files are looked for; one line per check, ok or FAILED.
# The files it added are listed in /var/lib/srupp-asr/offline-debs/files.txt (remove them with
# `xargs -d '\n' rm -f < /var/lib/srupp-asr/offline-debs/files.txt`). Running it again adds nothing and checks again.
# The .debs are Debian 12's: they need glibc 2.34 or newer (Debian 12, Ubuntu 22.04 and 24.04 have it).
# Options: --root DIR installs into DIR instead of / (a chroot; no ldconfig unless DIR/etc/ld.so.conf exists, and
# no self-check); --no-check skips the self-check.
# Exit status: 0 installed and every check passed, 1 a check or a step failed, 2 bad usage (not root, no DEBS_DIR).
set -euo pipefail

me=install_debs.sh
die() { echo "$me: $1" >&2; exit "${2:-1}"; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
target=/
check=true
dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --root) [ $# -ge 2 ] || die "--root needs a folder" 2; target=$2; shift 2 ;;
    --no-check) check=false; shift ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    -*) die "unknown option $1 (see --help)" 2 ;;
    *) [ -z "$dir" ] || die "one DEBS_DIR only (see --help)" 2; dir=$1; shift ;;
  esac
done
[ "$(id -u)" = 0 ] || die "must run as root: it copies files into $target (sudo $0 ...)" 2
dir=${dir:-$repo/.debs}
[ -d "$dir" ] || die "$dir: no such folder (make it with recipes/synth_en/local/fetch_debs.sh and carry it here)" 2
[ -d "$target" ] || die "$target: no such folder" 2
target=$(cd "$target" && pwd)
[ "$target" = / ] || check=false
shopt -s nullglob
debs=("$dir"/*.deb)
shopt -u nullglob
[ ${#debs[@]} -gt 0 ] || die "$dir: no .deb files in it (make them with recipes/synth_en/local/fetch_debs.sh)" 2
for tool in dpkg-deb tar find; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool not found (this needs a Debian or Ubuntu system)"
done
host=$(dpkg --print-architecture 2>/dev/null || true)
[ -n "$host" ] || case "$(uname -m)" in x86_64) host=amd64 ;; aarch64) host=arm64 ;; *) host=$(uname -m) ;; esac

if [ "$target" = / ] && command -v getconf >/dev/null 2>&1; then
  glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')
  if [ -n "$glibc" ] && [ "$(printf '%s\n' 2.34 "$glibc" | sort -V | head -n1)" != 2.34 ]; then
    die "this system's glibc is $glibc; the engines of these .debs need 2.34 or newer (nothing was installed)"
  fi
fi

umask 022
staging=$(mktemp -d "${TMPDIR:-/tmp}/install_debs.XXXXXX")
trap 'rm -rf "$staging"' EXIT
mkdir "$staging/root"

# 1. unpack
packages=()
for deb in "${debs[@]}"; do
  pkg=$(dpkg-deb -f "$deb" Package 2>/dev/null) || die "$(basename "$deb"): not a valid .deb"
  arch=$(dpkg-deb -f "$deb" Architecture)
  [ "$arch" = all ] || [ "$arch" = "$host" ] || die "$(basename "$deb") is for $arch, this machine is $host"
  dpkg-deb -x "$deb" "$staging/root" || die "$(basename "$deb"): cannot unpack"
  scripts=$(dpkg-deb --ctrl-tarfile "$deb" | tar -xOf - --wildcards './p*' 2>/dev/null || true)
  if [[ $scripts == *update-alternatives* ]]; then
    echo "$me: warning: $pkg's maintainer scripts call update-alternatives, which is not run here" >&2
  fi
  packages+=("$pkg")
done

# 2. copy what is missing, never overwriting
new="$staging/new.list"
: >"$new"
added=0
kept=0
while IFS= read -r -d '' path; do
  dest="$target/${path#./}"
  if [ -e "$dest" ] || [ -L "$dest" ]; then
    kept=$((kept + 1))
  else
    printf '%s\0' "$path" >>"$new"
    added=$((added + 1))
  fi
done < <(cd "$staging/root" && find . -mindepth 1 ! -type d -print0 | sort -z)
if [ "$added" -gt 0 ]; then
  tar -C "$staging/root" --null --no-recursion -T "$new" -cf - \
    | tar -C "$target" -xpf - --skip-old-files --keep-directory-symlink \
    || die "copying the new files into $target failed"
  log="$target/var/lib/srupp-asr/offline-debs"
  mkdir -p "$log"
  { [ ! -f "$log/files.txt" ] || cat "$log/files.txt"; tr '\0' '\n' <"$new" | sed "s|^\./|/|"; } \
    | sort -u >"$log/files.txt.new"
  mv -f "$log/files.txt.new" "$log/files.txt"
  printf '%s\n' "${packages[@]}" | sort -u >"$log/packages.txt"
fi
echo "$me: ${#debs[@]} packages from $dir: $added files added to $target, $kept already there (kept as they are)"

# 3. the dynamic linker's cache
if [ "$target" = / ]; then
  ldconfig || die "ldconfig failed"
elif [ -f "$target/etc/ld.so.conf" ]; then
  ldconfig -r "$target" || die "ldconfig -r $target failed"
fi

$check || exit 0

# 4. self-check
tmp="$staging/check"
mkdir "$tmp"
echo "The quick brown fox jumps over the lazy dog." >"$tmp/text.txt"
failed=0
rows=()

# row NAME RESULT: one line of the table (an empty RESULT is "ok"); a FAILED result counts as a failure.
row() {
  rows+=("$(printf '%-34s %s' "$1" "${2:-ok}")")
  case "$2" in FAILED*) failed=$((failed + 1)) ;; esac
}

# wav_problem FILE: why FILE is not a usable WAV file (nothing when it is).
wav_problem() {
  if [ ! -s "$1" ]; then echo "no WAV file written"
  elif [ "$(head -c 4 "$1")" != RIFF ]; then echo "not a WAV file"
  elif [ "$(stat -c %s "$1")" -lt 2000 ]; then echo "WAV file too short ($(stat -c %s "$1") bytes)"
  fi
}

# last_message: the last line a command wrote to $tmp/out.log, without a leading program path, shortened.
last_message() {
  local line
  line=$(sed -n '/[^[:space:]]/h; ${ x; s|^/[^ :]*: ||; p; }' "$tmp/out.log" 2>/dev/null || true)
  echo "${line:-no message}" | cut -c1-110
}

# say NAME WAV COMMAND...: run a synthesis command (60 s at most) and record whether it wrote a WAV file.
say() {
  local name=$1 wav=$2 problem="" status=0
  shift 2
  if ! command -v "$1" >/dev/null 2>&1; then
    problem="$1 not found"
  else
    timeout 60 "$@" >"$tmp/out.log" 2>&1 || status=$?
    if [ "$status" -ne 0 ]; then
      problem="exit status $status: $(last_message)"
    else
      problem=$(wav_problem "$wav")
      # text2wave exits 0 when festival fails: its last message says why
      [ -z "$problem" ] || [ ! -s "$tmp/out.log" ] || problem="$problem: $(last_message)"
    fi
  fi
  row "$name" "${problem:+FAILED ($problem)}"
}

say "espeak-ng (en-us)" "$tmp/espeak.wav" espeak-ng -v en-us -w "$tmp/espeak.wav" -f "$tmp/text.txt"
say "flite (slt)" "$tmp/flite.wav" flite -voice slt -f "$tmp/text.txt" -o "$tmp/flite.wav"
for voice in kal_diphone ked_diphone cmu_us_slt_arctic_hts; do
  say "festival ($voice)" "$tmp/$voice.wav" text2wave -eval "(voice_$voice)" -o "$tmp/$voice.wav" "$tmp/text.txt"
done
# sox as synth/variation.py runs it: tempo, pitch, 16 kHz (on a tone it makes itself, so it does not depend on the above)
if ! command -v sox >/dev/null 2>&1; then
  row "sox (tempo, pitch, rate)" "FAILED (sox not found)"
elif ! timeout 60 sox -R -D -V1 -n -r 22050 -c 1 "$tmp/tone.wav" synth 1 sine 300 >"$tmp/out.log" 2>&1 \
    || ! timeout 60 sox -R -D -V1 "$tmp/tone.wav" -r 16000 -t wav "$tmp/sox.wav" tempo -s 1.1 pitch 100 \
      rate -v 16000 >"$tmp/out.log" 2>&1; then
  row "sox (tempo, pitch, rate)" "FAILED ($(last_message))"
else
  problem=$(wav_problem "$tmp/sox.wav")
  row "sox (tempo, pitch, rate)" "${problem:+FAILED ($problem)}"
fi

# text PACKAGE NAME GLOB: the sentence source NAME is there (files matching GLOB), or PACKAGE was not fetched.
text() {
  local package=$1 name=$2 n
  n=$(compgen -G "$3" | wc -l || true)
  if [ "$n" -gt 0 ]; then
    row "text: $name" "ok ($n file$([ "$n" = 1 ] || echo s))"
  elif [[ " ${packages[*]} " != *" $package "* ]]; then
    row "text: $name" "not fetched ($package is optional; see fetch_debs.sh --help)"
  else
    row "text: $name" "FAILED (no $3)"
  fi
}
text fortunes-min fortunes "/usr/share/games/fortunes/*.dat"
text wordnet-base wordnet "/usr/share/wordnet/data.*"
text dict-gcide gcide "/usr/share/dictd/gcide.dict.dz"
text base-files licenses "/usr/share/common-licenses/*"

printf '%-34s %s\n' check result
printf '%s\n' "${rows[@]}"
if [ "$failed" -gt 0 ]; then
  echo "$me: $failed check(s) FAILED" >&2
  exit 1
fi
echo "$me: every check passed; the full list: srupp-asr synth-corpus --list-voices"
