#!/usr/bin/env bash
# What a GPU lease's call sends, and keeping the committed default model out of it. Run here, in the checkout,
# not on the GPU machine. A call sends the tracked files, the untracked files git does not ignore and the
# carried folders, at most 64 MiB in all. The committed model (srupp_asr/default_model, 31 MB), .whl and
# .debs together are more than that.
#
#   recipes/synth_en/local/lease_tree.sh size [CARRY...]  # MiB that would travel with these carried folders
#   recipes/synth_en/local/lease_tree.sh hide             # leave the model out (untracked and ignored)
#   recipes/synth_en/local/lease_tree.sh restore          # track it again, exactly as committed
#
# `size` exits 1 when the total is over the limit. `hide` keeps the files where they are: only git's index and
# .git/info/exclude change. `restore` undoes both and checks that the files still match the last commit.
set -euo pipefail
cd "$(dirname "$(realpath "${BASH_SOURCE[0]}")")/../../.."

model=srupp_asr/default_model
exclude=$(git rev-parse --git-path info/exclude)
limit=$((64 * 1024 * 1024))

bytes_of_files() {  # bytes_of_files: the total size of the NUL-separated file names on stdin
  xargs -0 -r stat -c %s -- 2>/dev/null | awk '{s += $1} END {print s + 0}'
}

case "${1:-}" in
  size)
    shift
    tree=$(git ls-files -z --cached --others --exclude-standard | bytes_of_files)
    carried=0
    for path in "$@"; do
      if [ -e "$path" ]; then carried=$((carried + $(find "$path" -type f -print0 | bytes_of_files))); fi
    done
    total=$((tree + carried))
    awk -v t="$tree" -v c="$carried" 'BEGIN {
      printf "checkout %.1f MiB + carried %.1f MiB = %.1f MiB (limit 64 MiB)\n", t / 2^20, c / 2^20, (t + c) / 2^20
    }'
    if [ "$total" -gt "$limit" ]; then
      echo "lease_tree.sh: over the limit; '$0 hide' leaves the default model out" >&2
      exit 1
    fi
    ;;
  hide)
    git rm -r -q --cached "$model"
    grep -qxF "/$model/" "$exclude" 2>/dev/null || echo "/$model/" >>"$exclude"
    echo "$model is out of what travels (untracked and ignored); '$0 restore' brings it back"
    ;;
  restore)
    if [ -f "$exclude" ]; then
      grep -vxF "/$model/" "$exclude" >"$exclude.new" || true
      mv "$exclude.new" "$exclude"
    fi
    git add "$model"
    if ! git diff --cached --quiet -- "$model"; then
      echo "lease_tree.sh: $model differs from the last commit (see git diff --cached -- $model)" >&2
      exit 1
    fi
    echo "$model is tracked again, as committed"
    ;;
  *)
    echo "usage: $0 size [CARRY...] | hide | restore" >&2
    exit 2
    ;;
esac
