#!/bin/sh
# gen-token.sh - writes the secrets that the kustomize overlays put in
# Secrets at deploy time (base/kustomization.yaml, secretGenerator), each
# 32 random bytes as 64 hex digits, mode 0600, git-ignored and kept out of
# the image by .dockerignore:
#
#   base/job-token     the token of the shipped Job's job (cohortd --job
#                      NAME:@FILE; the workers' COHORT_TOKEN)
#   base/admin-secret  cohortd's admin secret (--admin-token-file): other
#                      jobs' tokens are minted from it (cohort token JOB),
#                      and tenants' keys (cohort token --tenant T), and it
#                      authorises `cohort status` for all jobs
#
#   deploy/k8s/gen-token.sh                  keep what exists, write what is missing
#   deploy/k8s/gen-token.sh --rotate job     a new job token (the coordinator
#                                            rolls; rotate between runs: a
#                                            running Job keeps the old one)
#   deploy/k8s/gen-token.sh --rotate admin   a new admin secret (tokens minted
#                                            from the old one create no new job)
set -eu
dir=$(cd "$(dirname "$0")" && pwd)/base
rotate=
case "${1:-}" in
"") ;;
--rotate) rotate=${2:?"--rotate job|admin"} ;;
*) echo "usage: $0 [--rotate job|admin]" >&2; exit 2 ;;
esac
case "$rotate" in
"" | job | admin) ;;
*) echo "gen-token: --rotate job or --rotate admin" >&2; exit 2 ;;
esac

write() { # FILE: 64 hex digits from /dev/urandom (od: no openssl needed)
	umask 077
	tmp=$(mktemp "$dir/.secret.XXXXXX")
	od -An -N32 -tx1 /dev/urandom | tr -d ' \n' > "$tmp"
	if [ "$(wc -c < "$tmp")" -ne 64 ]; then
		rm -f "$tmp"
		echo "gen-token: reading /dev/urandom failed" >&2
		exit 1
	fi
	mv "$tmp" "$1"
	echo "gen-token: wrote $1" >&2
}

for name in job admin; do
	case $name in
	job) f=$dir/job-token ;;
	admin) f=$dir/admin-secret ;;
	esac
	if [ -s "$f" ] && [ "$rotate" != "$name" ]; then
		echo "gen-token: $f exists" >&2
	else
		write "$f"
	fi
done
