#!/bin/bash
# make check-style: banned functions (curl checksrc style) and formatting of
# the project's C sources. Generated code under build/ is not checked.
set -uo pipefail
cd "$(dirname "$0")/.."
rc=0
files=$(git ls-files '*.c' '*.h' '*.cu' | grep -v '^bench/peers/')
if grep -nE '\b(sprintf|vsprintf|strcpy|strcat|strtok|atoi|atol|gets)\s*\(' $files; then
	echo "check-style: banned function used (use snprintf, cohort__strlcpy, strtok_r, cohort__parse_i64)" >&2
	rc=1
fi
if grep -nP '[ \t]+$' $files | head; then
	echo "check-style: trailing whitespace" >&2
	rc=1
fi
long=$(awk '{ gsub(/\t/, "        "); if (length($0) > 100) print FILENAME ":" FNR }' $files | head)
if [[ -n "$long" ]]; then
	echo "$long"; echo "check-style: lines over 100 columns" >&2; rc=1
fi
tools/check-layers.sh || rc=1
[[ $rc == 0 ]] && echo "check-style: ok ($(echo $files | wc -w) files)"
exit $rc
