#!/usr/bin/env bash
# Set up fgc with its test dependencies in .venv and run the whole test suite.
set -uo pipefail
cd "$(dirname "$0")/.."
EXTRAS=test bash scripts/setup.sh || exit 1
export HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-ci}
# one worker per CPU (pytest-xdist), each test file whole in one worker, so that the
# reference models a file builds once are built once; FGC_TEST_WORKERS=0 runs in this
# process alone, and a -n given on the command line wins
.venv/bin/python -m pytest -n "${FGC_TEST_WORKERS:-auto}" --dist loadscope "$@"
code=$?
if [ "$code" -eq 5 ]; then
  echo "pytest collected no tests: the suite is misconfigured" >&2
  exit 1
fi
exit "$code"
