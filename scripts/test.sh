#!/usr/bin/env bash
# Installs the project with its test extras into .venv and runs the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test]"
set +e
.venv/bin/python -m pytest -ra "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then echo "no tests ran: that is a failure"; exit 1; fi
exit "$rc"
