#!/usr/bin/env bash
# Set up fgc with its test dependencies in .venv and run the whole test suite.
set -uo pipefail
cd "$(dirname "$0")/.."
EXTRAS=test bash scripts/setup.sh || exit 1
export HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-ci}
.venv/bin/python -m pytest "$@"
code=$?
if [ "$code" -eq 5 ]; then
  echo "pytest collected no tests: the suite is misconfigured" >&2
  exit 1
fi
exit "$code"
