#!/bin/sh
# fetch-digits.sh - obtains scikit-learn's "digits" data set (1797 samples
# of 8x8 pixels, values 0..16, plus a label 0..9) without installing
# scikit-learn: downloads the Debian package python3-sklearn with apt-get,
# extracts only sklearn/datasets/data/digits.csv.gz from it and writes the
# uncompressed CSV.
#
#   tools/fetch-digits.sh [OUTPUT]      default OUTPUT: build/data/digits.csv
#
# Idempotent: does nothing if OUTPUT already holds 1797 rows. Needs apt-get,
# dpkg-deb, tar and gzip (all on Debian); network access the first time.
set -eu

out=${1:-build/data/digits.csv}
pkg=python3-sklearn
member=sklearn/datasets/data/digits.csv.gz
want_rows=1797

die() {
	echo "fetch-digits: error: $*" >&2
	exit 1
}

if [ -f "$out" ] && [ "$(wc -l < "$out")" -eq "$want_rows" ]; then
	exit 0
fi

for tool in apt-get dpkg-deb tar gzip; do
	command -v "$tool" > /dev/null 2>&1 ||
	    die "'$tool' not found (this script needs a Debian-like system);" \
		"put the digits CSV at $out by hand"
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/fetch-digits.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

download() {
	(cd "$tmp" && apt-get -q -o DPkg::Lock::Timeout=600 download "$pkg") \
	    > "$tmp/apt.log" 2>&1
}

echo "fetch-digits: downloading $pkg (for its digits.csv.gz)" >&2
if ! download; then
	# The package lists may be missing (fresh container): refresh once.
	if [ "$(id -u)" -eq 0 ]; then
		echo "fetch-digits: apt-get update" >&2
		apt-get -q -o DPkg::Lock::Timeout=600 update \
		    > "$tmp/update.log" 2>&1 ||
		    { cat "$tmp/update.log" >&2; die "apt-get update failed"; }
	else
		cat "$tmp/apt.log" >&2
		die "apt-get download $pkg failed (run 'apt-get update'" \
		    "as root, then retry)"
	fi
	download || { cat "$tmp/apt.log" >&2; die "apt-get download $pkg" \
	    "failed (no network or no such package?)"; }
fi

deb=
for f in "$tmp"/"$pkg"_*.deb; do
	[ -f "$f" ] && deb=$f
done
[ -n "$deb" ] || die "apt-get download produced no .deb"

# The member's directory differs between releases (dist-packages, python3.x);
# find it in the listing instead of guessing.
path=$(dpkg-deb --fsys-tarfile "$deb" | tar -t | grep "/$member\$" |
    head -n 1) || true
[ -n "$path" ] || die "$member not found in $(basename "$deb")"

dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$tmp" "$path" ||
    die "cannot extract $path from $(basename "$deb")"

mkdir -p "$(dirname "$out")"
gzip -dc "$tmp/$path" > "$tmp/digits.csv" ||
    die "cannot decompress $path"
rows=$(wc -l < "$tmp/digits.csv")
[ "$rows" -eq "$want_rows" ] ||
    die "$path has $rows rows, expected $want_rows"
mv "$tmp/digits.csv" "$out"
echo "fetch-digits: wrote $out ($rows samples)" >&2
