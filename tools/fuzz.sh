#!/bin/bash
# Runs the libFuzzer targets of fuzz/ (built by `make fuzz`): seeds from
# fuzz/seed_<name>.c, then each target for SECONDS, one at a time, and a
# line per target: executions, coverage (cov: edges, ft: features, from
# libFuzzer's final status line), corpus size and crashes. Exit status 1
# if any target crashed (its input is under BUILD/crashes/<name>/).
#
#   tools/fuzz.sh BUILD SECONDS "name1 name2 ..."
#
# fuzz/fuzz_<name>.options, if present, holds extra libFuzzer flags.
set -uo pipefail
build=${1:?build dir}
secs=${2:?seconds}
names=${3//,/ }
status=0
summary=()
for n in $names; do
	bin="$build/bin/fuzz_$n"
	if [[ ! -x "$bin" ]]; then
		echo "fuzz: no target $n (fuzz/fuzz_$n.c)" >&2
		status=2
		continue
	fi
	corpus="$build/corpus/$n"
	seeds="$build/seeds/$n"
	crashes="$build/crashes/$n"
	log="$build/logs/$n.log"
	mkdir -p "$corpus" "$crashes" "$(dirname "$log")"
	rm -rf "$seeds"
	mkdir -p "$seeds"
	if [[ -x "$build/bin/seed_$n" ]]; then
		"$build/bin/seed_$n" "$seeds" || { echo "fuzz: seed_$n failed" >&2; status=2; }
	fi
	extra=()
	if [[ -f "fuzz/fuzz_$n.options" ]]; then
		read -r -a extra < "fuzz/fuzz_$n.options"
	fi
	before=$(find "$crashes" -type f | wc -l)
	echo "fuzz: $n for ${secs} s (log $log)"
	start=$(date +%s)
	"$bin" -max_total_time="$secs" -print_final_stats=1 -timeout=20 \
		-rss_limit_mb=2048 -artifact_prefix="$crashes/" "${extra[@]}" \
		"$corpus" "$seeds" > "$log" 2>&1
	rc=$?
	took=$(( $(date +%s) - start ))
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
	last=$(grep -E '^#[0-9]+' "$log" | grep -E 'cov: [0-9]+' | tail -1)
	cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<< "$last")
	ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<< "$last")
	after=$(find "$crashes" -type f | wc -l)
	ncrash=$(( after - before ))
	if (( rc != 0 && ncrash == 0 )); then
		ncrash=1 # died without an artifact (e.g. an abort in init)
	fi
	corp=$(find "$corpus" -type f | wc -l)
	line=$(printf 'fuzz %-12s %10s execs in %4d s, cov %6s, ft %6s, corpus %5d, crashes %d' \
		"$n" "${execs:-?}" "$took" "${cov:-?}" "${ft:-?}" "$corp" "$ncrash")
	echo "$line"
	summary+=("$line")
	if (( ncrash > 0 )); then
		status=1
		echo "fuzz: $n crashed; the end of $log:" >&2
		grep -E 'ERROR|SUMMARY|Test unit written|==[0-9]+==' "$log" | tail -15 >&2
	fi
done
echo "fuzz summary (${secs} s per target):"
printf '  %s\n' "${summary[@]}"
exit $status
