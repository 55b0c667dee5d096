#!/bin/bash
# check-layers.sh - the layering rule of docs/architecture.md, checked on
# the sources (the Makefile's per-part include paths enforce it at build
# time; this names the offending line):
#
#   common/                  the public header and itself
#   proto/                   + common/ (and the generated protobuf code)
#   client/ server/          + proto/; never each other
#   strategies/              the public header and itself
#   examples/                + strategies/ and examples/lib/
#   tools/, bench/, tests/, fuzz/   may look inside the parts below them
#   server/'s folders        front -> observe -> state -> core, the
#                            journal's writer below core, its replay above
#
# A quoted include must name a header of the part itself or of a part it
# may use. Exits 1 on the first violation list.
set -uo pipefail
cd "$(dirname "$0")/.."

# part -> directories whose headers it may include ("pub" = cohort/*.h)
declare -A allowed=(
	[common]="pub common"
	[proto]="pub common proto gen"
	[client]="pub common proto gen client"
	[server]="pub common proto gen server"
	[strategies]="pub strategies"
	[examples]="pub strategies examples/lib"
	[examples/lib]="pub examples/lib"
)

# Where a quoted header lives: the first directory that has it.
locate() {
	local h=$1 d
	case $h in
	cohort/*) echo pub; return ;;
	cohort.pb-c.h) echo gen; return ;;
	esac
	for d in common proto client client/backend server strategies \
		examples/lib; do
		if [[ -f $d/$h ]]; then
			case $d in client/*) echo client ;; *) echo "$d" ;; esac
			return
		fi
	done
	# relative to the including file's directory (backend/tcp/x.h)
	echo "?"
}

bad=0
for part in common proto client server strategies examples/lib examples; do
	files=$(git ls-files "$part/*.c" "$part/*.h" "$part/*.cu" 2>/dev/null)
	[[ $part == examples ]] && files=$(git ls-files 'examples/*.c')
	for f in $files; do
		while IFS= read -r line; do
			h=$(sed -E 's/^[^"]*"([^"]+)".*/\1/' <<<"$line")
			where=$(locate "$h")
			if [[ $where == "?" ]]; then
				# a header next to the file (tcp_impl.h in backend/tcp)
				[[ -f $(dirname "$f")/$h ]] && continue
				echo "$f: includes \"$h\", which no part provides"
				bad=1
				continue
			fi
			ok=0
			for a in ${allowed[$part]}; do
				[[ $where == "$a" ]] && ok=1
			done
			if ((!ok)); then
				echo "$f: \"$h\" belongs to $where/, which $part/ may not use"
				bad=1
			fi
		done < <(grep -E '^#include "' "$f")
	done
done
# Inside server/, the folders call one way (docs/coordinator.md,
# Structure): front/ -> observe/ -> state/ -> core/; the journal's writer
# (journal/log.h, record.h) below core/ and state/, its replay and snapshot
# above state/. A cross-folder include names its folder ("core/call.h").
declare -A srv_allowed=(
	[core]="core journal-writer"
	[state]="core journal-writer state"
	[observe]="core journal-writer state observe"
	[journal]="core journal-writer journal state"
	[front]="core journal-writer journal state observe front"
)
for f in $(git ls-files 'server/*/*.c' 'server/*/*.h'); do
	folder=$(cut -d/ -f2 <<<"$f")
	stem=$(basename "$f" | sed -E 's/\.[ch]$//')
	allow=${srv_allowed[$folder]:-}
	# the journal's writer stands on the floor and itself only
	[[ $folder == journal && ($stem == log || $stem == record) ]] &&
		allow="journal-writer"
	while IFS= read -r h; do
		dir=${h%%/*}
		[[ -n ${srv_allowed[$dir]:-} ]] || continue
		kind=$dir
		[[ $h == journal/log.h || $h == journal/record.h ]] &&
			kind=journal-writer
		[[ $dir == "$folder" && $kind != journal-writer ]] && continue
		ok=0
		for a in $allow; do
			[[ $a == "$kind" ]] && ok=1
		done
		if ((!ok)); then
			echo "$f: \"$h\": server/$folder/ may not use server/$dir/ (docs/coordinator.md, Structure)"
			bad=1
		fi
	done < <(grep -E '^#include "[a-z]+/[a-z_]+\.h"' "$f" | sed -E 's/^[^"]*"([^"]+)".*/\1/')
done
if ((bad)); then
	echo "check-layers: the tree breaks its layering (docs/architecture.md)" >&2
	exit 1
fi
echo "check-layers: ok"
