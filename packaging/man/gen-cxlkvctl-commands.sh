#!/bin/sh
# usage: gen-cxlkvctl-commands.sh CXLKVCTL OUT.h2m
# A help2man include with a COMMANDS section: for every command listed by
# `cxlkvctl --help`, its summary, its `cxlkvctl CMD --help` text and options.
set -eu
ctl=$1 out=$2
# roff-escape a line of text: backslashes, leading . and ', hyphens of options.
esc() { sed -e 's/\\/\\e/g' -e "s/^\\([.']\\)/\\\\\\&\\1/" -e 's/-/\\-/g'; }
{
	echo "[COMMANDS]"
	"$ctl" --help | awk '/^Commands:/ { on = 1; next } on && /^  [a-z]/ { print }' |
	while IFS= read -r line; do
		cmd=$(printf '%s\n' "$line" | sed -E 's/^  ([a-z0-9-]+( [a-z0-9-]+)*)  +.*/\1/')
		summary=$(printf '%s\n' "$line" | sed -E 's/^  [a-z0-9-]+( [a-z0-9-]+)*  +//')
		# shellcheck disable=SC2086
		help=$("$ctl" $cmd --help)
		echo ".SS \"$(printf '%s' "$cmd" | esc)\""
		printf '%s\n' "$summary" | esc
		# The text between the usage line and "Options:", as written.
		text=$(printf '%s\n' "$help" | awk 'NR > 2 && /^Options:/ { exit } NR > 2 { print }' | sed -e '/./,$!d')
		if [ -n "$text" ]; then
			echo ".PP"
			echo ".nf"
			printf '%s\n' "$text" | esc
			echo ".fi"
		fi
		printf '%s\n' "$help" | awk '/^Options:/ { on = 1; next } on && /^  --/ { print }' |
		while IFS= read -r opt; do
			name=$(printf '%s\n' "$opt" | sed -E 's/^  (--[a-z0-9-]+( [A-Z]+)?) +.*/\1/')
			desc=$(printf '%s\n' "$opt" | sed -E 's/^  --[a-z0-9-]+( [A-Z]+)? +//')
			echo ".TP"
			printf '\\fB%s\\fR\n' "$(printf '%s' "$name" | esc | sed 's/ \([A-Z][A-Z]*\)$/\\fR \\fI\1/')"
			printf '%s\n' "$desc" | esc
		done
	done
} > "$out"
