#!/usr/bin/env bash
# Set up fgc in .venv and run the main job on a shipped spec: check, then count.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/fgc check specs/
.venv/bin/fgc params specs/formal/gpt.fgpt --by-module
.venv/bin/fgc params specs/formal/gpt3.fgpt --preset 175b
