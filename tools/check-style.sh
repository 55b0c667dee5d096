#!/bin/bash
# make check-style (CI runs it): the project's C sources are formatted by
# .clang-format (79 columns, tabs, one pointer style), use no banned
# function (curl checksrc style), and keep their layering
# (tools/check-layers.sh), call one way inside each folder
# (tools/check-calls.py) and spell the release once
# (tools/check-version.sh). Generated code under build/ and the peers'
# benchmark programs (bench/peers) are not checked.
#
#   tools/check-style.sh          check
#   tools/check-style.sh --fix    reformat in place with clang-format
set -uo pipefail
cd "$(dirname "$0")/.."
rc=0
files=$(git ls-files '*.c' '*.h' '*.cu' | grep -v '^bench/peers/')
cf=$(command -v clang-format clang-format-14 2>/dev/null | head -n 1)
if [[ -z $cf ]]; then
	echo "check-style: clang-format not found (apt-get install clang-format)" >&2
	exit 1
fi
if [[ ${1:-} == --fix ]]; then
	"$cf" -i $files
	echo "check-style: formatted $(echo $files | wc -w) files"
	exit 0
fi
unformatted=()
for f in $files; do
	"$cf" "$f" | cmp -s - "$f" || unformatted+=("$f")
done
if ((${#unformatted[@]})); then
	printf '%s\n' "${unformatted[@]}" | head -20
	echo "check-style: ${#unformatted[@]} files differ from .clang-format (tools/check-style.sh --fix)" >&2
	rc=1
fi
if grep -nE '\b(sprintf|vsprintf|strcpy|strcat|strtok|atoi|atol|gets)\s*\(' $files; then
	echo "check-style: banned function used (use snprintf, cohort__strlcpy, strtok_r, cohort__parse_i64)" >&2
	rc=1
fi
if grep -nP '[ \t]+$' $files | head; then
	echo "check-style: trailing whitespace" >&2
	rc=1
fi
tools/check-layers.sh || rc=1
# no circle of calls or includes inside a folder; backends see only
# backend.h (docs/architecture.md)
python3 tools/check-calls.py || rc=1
tools/check-version.sh || rc=1
[[ $rc == 0 ]] && echo "check-style: ok ($(echo $files | wc -w) files, $("$cf" --version | grep -o 'version [0-9.]*'))"
exit $rc
