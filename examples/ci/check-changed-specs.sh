#!/usr/bin/env bash
# Check the .fgpt specs changed since BASE (a commit), printing GitHub workflow annotations
# so that errors appear on the pull request's lines. Without BASE, or when BASE is unknown
# (a new branch's first push), every tracked spec is checked.
#
#   examples/ci/check-changed-specs.sh [BASE] [-- extra fgc check options]
set -euo pipefail
base="${1:-}"
shift || true
[ "${1:-}" = "--" ] && shift
FGC="${FGC:-fgc}"

specs=()
if [ -n "$base" ] && [ "$base" != "0000000000000000000000000000000000000000" ] &&
   git rev-parse --quiet --verify "$base^{commit}" > /dev/null; then
  while IFS= read -r -d '' f; do specs+=("$f"); done < <(
    git diff -z --name-only --diff-filter=ACMR "$base" HEAD -- '*.fgpt')
  what="changed since ${base:0:12}"
else
  while IFS= read -r -d '' f; do specs+=("$f"); done < <(git ls-files -z -- '*.fgpt')
  what="tracked"
fi

if [ "${#specs[@]}" -eq 0 ]; then
  echo "no .fgpt specs $what"
  exit 0
fi
echo "checking ${#specs[@]} spec(s) $what"
exec $FGC check --format github "$@" "${specs[@]}"
