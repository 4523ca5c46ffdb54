#!/usr/bin/env bash
# Installs the project into .venv and runs the main job on the embedded default (SQLite,
# in-process workers, no services): a port of gemm_mma to sm_90a. Without a GPU it is a
# compile-only port and says so. Extra arguments go to `porter port`.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e .
exec .venv/bin/porter port gemm_mma --arch sm_90a --trials 40 "$@"
