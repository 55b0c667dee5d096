#!/bin/sh
# gen-token.sh - writes the job token that the kustomize overlays put in
# the Secret cohort-job-token (base/kustomization.yaml, secretGenerator):
# 32 random bytes as 64 hex digits, mode 0600, in deploy/k8s/base/job-token
# (git-ignored and kept out of the image by .dockerignore).
#
#   deploy/k8s/gen-token.sh            keep an existing token
#   deploy/k8s/gen-token.sh --rotate   write a new one (the coordinator
#                                      rolls; running Jobs keep the old
#                                      token and fail: rotate between runs)
set -eu
dir=$(cd "$(dirname "$0")" && pwd)
out=$dir/base/job-token
if [ -s "$out" ] && [ "${1:-}" != --rotate ]; then
	echo "gen-token: $out exists (--rotate for a new one)" >&2
	exit 0
fi
umask 077
tmp=$(mktemp "$dir/base/.job-token.XXXXXX")
trap 'rm -f "$tmp"' EXIT
# od is in every base system; no openssl needed.
od -An -N32 -tx1 /dev/urandom | tr -d ' \n' > "$tmp"
[ "$(wc -c < "$tmp")" -eq 64 ] || { echo "gen-token: reading /dev/urandom failed" >&2; exit 1; }
mv "$tmp" "$out"
trap - EXIT
echo "gen-token: wrote $out" >&2
