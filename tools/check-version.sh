#!/bin/bash
# check-version.sh - the release is spelled once, in the public header
# (COHORT_VERSION_MAJOR/MINOR/PATCH of include/cohort/cohort.h; the
# Makefile reads it for cohort.pc). Every other place that must say it
# is checked here (make check-style), each named with file:line when it
# says something else:
#
#   python/pyproject.toml        version = "X"
#   python/cohort/__init__.py    __version__ = "X"
#   deploy/ and docs/            the image tag cohort:X (cohort:X-cuda),
#                                newTag: X, app.kubernetes.io/version: "X"
#
# A tracked file of those folders that names another cohort release in
# one of those forms fails the check; bumping the release is editing the
# header, running this, and fixing the lines it names.
set -uo pipefail
cd "$(dirname "$0")/.."

hdr=include/cohort/cohort.h
v=$(sed -nE 's/^#define COHORT_VERSION_(MAJOR|MINOR|PATCH) ([0-9]+).*/\2/p' \
	"$hdr" | paste -sd.)
if ! [[ $v =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
	echo "check-version: cannot read MAJOR.MINOR.PATCH from $hdr (got '$v')" >&2
	exit 1
fi
bad=0
# file, extended regex, the group of it that is the version (default 1)
check() {
	local file=$1 re=$2 g=${3:-1} n line got
	[[ -f $file ]] || { echo "check-version: $file is missing" >&2; bad=1; return; }
	while IFS=: read -r n line; do
		[[ $line =~ $re ]] && got=${BASH_REMATCH[$g]} || got="?"
		if [[ $got != "$v" ]]; then
			echo "$file:$n: says $got, the header says $v"
			bad=1
		fi
	done < <(grep -nE "$re" "$file")
}
check python/pyproject.toml '^version = "([^"]*)"'
check python/cohort/__init__.py '^__version__ = "([^"]*)"'
n_py=$(grep -cE '^(version|__version__) = ' python/pyproject.toml \
	python/cohort/__init__.py | awk -F: '{s += $2} END {print s}')
if ((n_py != 2)); then
	echo "check-version: expected one version line in python/pyproject.toml and one in python/cohort/__init__.py" >&2
	bad=1
fi
for f in $(git ls-files deploy docs); do
	case $f in *.png | *.svg | *.json) continue ;; esac
	check "$f" '(^|[^A-Za-z0-9_.-])cohort:([0-9][0-9A-Za-z.]*[0-9])(-cuda)?([^0-9A-Za-z.]|$)' 2
	check "$f" 'newTag: ([0-9][0-9A-Za-z.]*[0-9])(-cuda)?'
	check "$f" 'app\.kubernetes\.io/version: "([^"]*)"'
done
if ((bad)); then
	echo "check-version: the release is spelled differently from $hdr" >&2
	exit 1
fi
echo "check-version: ok ($v)"
