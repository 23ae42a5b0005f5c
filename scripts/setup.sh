#!/usr/bin/env bash
# Create .venv and install fgc into it. EXTRAS=test adds the test dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
target="."
[ -n "${EXTRAS:-}" ] && target=".[${EXTRAS}]"
# constraints.txt pins torch to the local CPU wheel
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e "$target"
# byte-compile fgc: an editable install does not, and start-up time is part of `fgc params`
.venv/bin/python -m compileall -q compiler runtime > /dev/null
