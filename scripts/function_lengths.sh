#!/usr/bin/env bash
# The product code's function lengths (lines from a definition's first line to its last, as
# Universal Ctags finds them): the longest function of each folder, then every function over the
# limit (80 lines; a `main` 120, for the flags it declares). Tests and benches are not product
# code. Exits 1 when a function is over its limit, so it can gate a change.
#
#   scripts/function_lengths.sh            # per folder, then what is over
#   scripts/function_lengths.sh --all      # every function, longest first
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
command -v ctags >/dev/null || { echo "function_lengths: needs universal-ctags (scripts/setup.sh)" >&2; exit 2; }

# lines name file, longest first
lengths() {
  git ls-files '*.cc' '*.h' ':!:tests/**' ':!:bench/**' |
    xargs ctags --fields=+ne --kinds-C++=f -x --_xformat='%{end}	%n	%N	%F' |
    awk -F'\t' -v OFS='\t' '$1 != "" && $1 >= $2 { gsub(/ /, "", $3); print $1 - $2 + 1, $3, $4 }' |
    sort -t$'\t' -k1,1nr -k3
}

table="$(lengths)"
if [[ "${1:-}" == "--all" ]]; then
  echo "$table"
  exit 0
fi
echo "longest function per folder (lines, function, file):"
# A folder's headers (its include/ tree) count with the folder.
echo "$table" | awk -F'\t' '{ folder = $3; if (!sub(/\/include\/.*$/, "", folder)) sub(/\/[^\/]*$/, "", folder)
                             if (!(folder in seen)) { seen[folder] = 1; printf "  %-16s %4d  %s  %s\n", folder, $1, $2, $3 } }'
over="$(echo "$table" | awk -F'\t' '($2 == "main" && $1 > 120) || ($2 != "main" && $1 > 80)')"
if [[ -n "$over" ]]; then
  echo "over the limit (80 lines; main 120): $(echo "$over" | wc -l)"
  echo "$over" | awk -F'\t' '{ printf "  %4d  %s  %s\n", $1, $2, $3 }'
  exit 1
fi
echo "no function over the limit"
