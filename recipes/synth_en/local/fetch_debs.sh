#!/usr/bin/env bash
# Download the .deb files that recipes/synth_en needs on a machine with no package registry: the TTS engines
# and voices, sox and the text packages, with every runtime dependency that a base system may lack.
#
#   recipes/synth_en/local/fetch_debs.sh [--with-gcide] [--no-text] [DIR]     (DIR: default .debs at the repo root)
#   recipes/synth_en/local/fetch_debs.sh --only espeak-ng .espeak_debs          (one engine and what it needs)
#
# Run it here (Debian/Ubuntu amd64, with apt and a reachable registry; `apt-get update` done; root not needed),
# carry DIR to the other machine and run recipes/synth_en/local/install_debs.sh DIR there, as root.
#
# Packages: those of local/packages.txt: the engines and voices (group engine), and the sentence sources (text).
# dict-gcide (text-large: 14 MiB for ~9 % of the sentences) is left out unless --with-gcide; --no-text leaves out every text package (the synthesis then needs
# a sentence pool made elsewhere: OUT_DIR/text/sentences.tsv, or --text FILE). --only PACKAGE (repeatable) takes
# those packages instead of the list: `--only espeak-ng` is what benchmarks/gpu_session.sh's decoding parts need.
#
# Dependencies: what `apt-get install --no-install-recommends` would install on a system that has only the BASE
# packages below (apt resolves alternatives and virtual packages), minus the NOT_NEEDED ones and theirs:
#   BASE        present on every Debian and Ubuntu system (Essential or required, in the minimal Docker images
#               too, under the same library sonames): the C and C++ runtimes, compression and PAM/SELinux/audit
#               libraries, dpkg, debconf, perl-base, tar, passwd, ... (list: BASE= below). install_debs.sh never
#               overwrites a file, so a newer system keeps its own copies of these.
#   NOT_NEEDED  dependencies of the packages that the synthesis never uses: dictd (dict-gcide's DICT server;
#               the toolkit reads gcide.dict.dz itself; with it perl and update-inetd), alsa-utils (festival's
#               sound-card playback; text2wave writes files; with it kmod and libssl3), adduser, lsb-base and
#               sgml-base (festival's server account, init script and SABLE catalog).
# Writes DIR/*.deb (exactly this set: other .debs in DIR are removed) and DIR/MANIFEST.txt (package, version,
# size), and prints the total size. Exit status: 0 done, 1 apt failed (one line says why), 2 bad usage.
set -euo pipefail

group() { awk -v g="$1" '$1 == g { print $2 }' "$(dirname "${BASH_SOURCE[0]}")/packages.txt" | tr '\n' ' '; }
ENGINES=$(group engine)
TEXTS=$(group text)
GCIDE=$(group text-large)
BASE="base-files base-passwd bash bsdutils coreutils dash debconf debianutils diffutils dpkg findutils gcc-12-base
grep gzip hostname init-system-helpers libacl1 libattr1 libaudit-common libaudit1 libblkid1 libbz2-1.0 libc-bin
libc6 libcap-ng0 libcap2 libcrypt1 libdb5.3 libgcc-s1 libgcrypt20 libgmp10 libgpg-error0 liblz4-1 liblzma5 libmd0
libmount1 libncursesw6 libpam-modules libpam-modules-bin libpam-runtime libpam0g libpcre2-8-0 libselinux1
libsemanage-common libsemanage2 libsepol2 libsmartcols1 libstdc++6 libsystemd0 libtinfo6 libudev1 libuuid1
libzstd1 login mawk mount ncurses-base ncurses-bin passwd perl-base sed sensible-utils sysvinit-utils tar
usr-is-merged usrmerge util-linux zlib1g"
NOT_NEEDED="dictd alsa-utils adduser lsb-base sgml-base"

me=fetch_debs.sh
die() { echo "$me: $1" >&2; exit "${2:-1}"; }

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
dir=""
texts="$TEXTS"
gcide=""
only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --with-gcide) gcide=$GCIDE; shift ;;
    --no-text) texts=""; shift ;;
    --only) [ $# -ge 2 ] || die "--only needs a package name (see --help)" 2; only="${only:+$only }$2"; shift 2 ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    -*) die "unknown option $1 (see --help)" 2 ;;
    *) [ -z "$dir" ] || die "one DIR only (see --help)" 2; dir=$1; shift ;;
  esac
done
wanted="$ENGINES${texts:+ $texts}${gcide:+ $gcide}"
[ -z "$only" ] || wanted=$only
dir=${dir:-$root/.debs}

for tool in apt-get apt-cache dpkg dpkg-deb; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool not found: this needs a Debian or Ubuntu system with apt"
done
arch=$(dpkg --print-architecture)
[ "$arch" = amd64 ] || die "this machine is $arch; the .debs must be amd64 (x86-64) like the GPU machine"

work=$(mktemp -d "${TMPDIR:-/tmp}/fetch_debs.XXXXXX")
trap 'rm -rf "$work"' EXIT

# candidates PACKAGE...: "PACKAGE VERSION" for each package apt knows a candidate version of (one apt-cache call).
candidates() {
  apt-cache policy "$@" 2>/dev/null | awk '/^[^ ].*:$/ { pkg = substr($0, 1, length($0) - 1) }
    /^  Candidate:/ { if ($2 != "(none)") print pkg, $2 }'
}

# A dpkg status file that says the BASE and NOT_NEEDED packages are installed (at their candidate versions, with
# what they provide and no dependencies of their own): apt then plans what is missing beside them.
# shellcheck disable=SC2086  # word lists
candidates $BASE $NOT_NEEDED >"$work/present"
# shellcheck disable=SC2046  # PACKAGE=VERSION words
apt-cache show $(awk '{ print $1 "=" $2 }' "$work/present") 2>/dev/null | awk -v RS= '
  { n = split($0, f, "\n"); pkg = ""; for (i = 1; i <= n; i++) if (f[i] ~ /^Package: /) pkg = substr(f[i], 10) }
  pkg == "" || seen[pkg]++ { next }  # the first record of each package
  { for (i = 1; i <= n; i++) if (f[i] ~ /^(Package|Version|Architecture|Multi-Arch|Provides|Essential):/) print f[i]
    print "Status: install ok installed\n" }' >"$work/status"

# shellcheck disable=SC2086  # word list
candidates $wanted >"$work/wanted"
for pkg in $wanted; do
  grep -q "^$pkg " "$work/wanted" \
    || die "apt knows no $pkg: run apt-get update (as root) first, with Debian/Ubuntu main in the sources"
done

# Plan on that status; "Inst PKG (VERSION ...)" or "Inst PKG [OLD] (VERSION ...)" per package.
# shellcheck disable=SC2086  # word lists
if ! apt-get -s -q -o Dir::State::status="$work/status" -o Debug::NoLocking=1 -o APT::Install-Recommends=false \
    -o APT::Install-Suggests=false install $wanted >"$work/plan.log" 2>&1; then
  die "apt cannot plan the installation ($(grep -m1 '^E:' "$work/plan.log" || tail -n1 "$work/plan.log"))"
fi
# A BASE package can show up as an "upgrade" to its own version (the status above lists no dependencies, so apt
# sees another version): dropped, like anything BASE or NOT_NEEDED.
sed -n 's/^Inst \([^ ]*\) \(\[[^]]*\] \)\{0,1\}(\([^ ]*\) .*/\1 \3/p' "$work/plan.log" \
  | awk -v skip="$BASE $NOT_NEEDED" 'BEGIN { n = split(skip, s, /[ \n]+/); for (i = 1; i <= n; i++) drop[s[i]] = 1 }
      !($1 in drop)' | sort >"$work/plan"
[ -s "$work/plan" ] || die "apt planned nothing to install (see apt-get -s install $wanted)"

# Download what DIR lacks; drop the .debs that are not in the plan.
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
mkdir -p "$work/download"
chmod 755 "$work" "$work/download"  # apt's download sandbox user must be able to write there
keep="$work/keep"
: >"$keep"
missing=()
while read -r pkg version; do
  file="${pkg}_${version//:/%3a}_"
  found=$(find "$dir" -maxdepth 1 -name "$file*.deb" -print -quit)
  if [ -n "$found" ] && dpkg-deb --info "$found" >/dev/null 2>&1; then
    basename "$found" >>"$keep"
  else
    missing+=("$pkg=$version")
  fi
done <"$work/plan"
if [ ${#missing[@]} -gt 0 ]; then
  sandbox=()
  [ "$(id -u)" != 0 ] || sandbox=(-o APT::Sandbox::User=root)  # root: no _apt user switch, no warning
  if ! (cd "$work/download" && apt-get download -q "${sandbox[@]}" "${missing[@]}") >"$work/download.log" 2>&1; then
    reason=$(grep -m1 '^E: ' "$work/download.log" | sed 's/^E: //; s/  */ /g' || true)
    [ -n "$reason" ] || reason="apt-get download failed ($(tail -n1 "$work/download.log"))"
    die "cannot download from the package registry: $reason"
  fi
  for deb in "$work/download"/*.deb; do
    dpkg-deb --info "$deb" >/dev/null 2>&1 || die "$(basename "$deb"): downloaded file is not a valid .deb"
    mv -f "$deb" "$dir/"
    basename "$deb" >>"$keep"
  done
fi
find "$dir" -maxdepth 1 -name '*.deb' -print0 | while IFS= read -r -d '' deb; do
  grep -qxF "$(basename "$deb")" "$keep" || rm -f "$deb"
done

# MANIFEST.txt: what is here and why.
total=0
system=$(sed -n 's/^PRETTY_NAME=//p' /etc/os-release 2>/dev/null | tr -d '"')
{
  echo "# .debs for recipes/synth_en on a machine without a package registry: install with"
  echo "#   recipes/synth_en/local/install_debs.sh DIR   (as root)"
  echo "# fetched $(date -u '+%F %T') UTC from ${system:-an unknown system} ($arch) for: $wanted"
  echo "# left out (BASE, on every system): ${BASE//$'\n'/ }"
  echo "# left out (NOT_NEEDED by the synthesis): $NOT_NEEDED"
  echo "# package version size_bytes"
  while read -r pkg version; do
    deb=$(find "$dir" -maxdepth 1 -name "${pkg}_${version//:/%3a}_*.deb" -print -quit)
    size=$(stat -c %s "$deb")
    total=$((total + size))
    echo "$pkg $version $size"
  done <"$work/plan"
  echo "# total $total bytes"
} >"$dir/MANIFEST.txt"
mib=$(awk -v b="$total" 'BEGIN { printf "%.1f MiB", b / 1048576 }')
echo "$me: $(wc -l <"$work/plan") packages, $mib in $dir (list: $dir/MANIFEST.txt)"
