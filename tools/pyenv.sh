#!/bin/bash
# pyenv.sh - the project-local Python environment of the test suite:
# .venv/ with the real torch and pytorch-lightning from PyPI (the versions
# in python/requirements-test.txt). Idempotent: a stamp records what was
# installed, so a second run costs nothing; a changed requirements file
# installs again. Needs python3 with venv (deps.sh installs python3-venv
# where the system Python lacks it) and access to PyPI the first time.
#
#   tools/pyenv.sh [VENV]        default VENV: .venv
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv}
req=python/requirements-test.txt
stamp=$venv/.cohort-requirements

if [[ -x $venv/bin/python ]] && cmp -s "$req" "$stamp"; then
	echo "pyenv: $venv up to date ($(tr '\n' ' ' < "$req" | sed 's/#[^ ]* //g; s/  */ /g' | grep -o '[a-z-]*==[^ ]*' | tr '\n' ' '))"
	exit 0
fi
py=${COHORT_PYTHON:-python3}
command -v "$py" > /dev/null || { echo "pyenv: $py not found" >&2; exit 1; }
if [[ ! -x $venv/bin/python ]]; then
	echo "pyenv: creating $venv with $($py --version 2>&1)"
	"$py" -m venv "$venv"
fi
start=$(date +%s)
echo "pyenv: installing $(grep -v '^#' "$req" | tr '\n' ' ')(about 5 GB the first time)"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --retries 5 --timeout 60 -r "$req"
cp "$req" "$stamp"
echo "pyenv: ready in $(( $(date +%s) - start )) s"
