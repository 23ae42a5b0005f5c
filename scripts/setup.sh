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
# the tests run fgc's --genai graphs with onnxruntime-genai. --no-deps: it depends on the CPU
# `onnxruntime` wheel, whose files would overwrite onnxruntime-gpu's; it needs numpy and
# onnxruntime's library, which onnxruntime-gpu has (tests/test_genai.py checks both)
case ",${EXTRAS:-}," in
  *,test,*) .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps \
              --no-warn-conflicts "onnxruntime-genai==0.18.0" ;;
esac
# byte-compile fgc: an editable install does not, and start-up time is part of `fgc params`
.venv/bin/python -m compileall -q compiler runtime > /dev/null
