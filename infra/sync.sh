#!/usr/bin/env bash
# Copies infra/nymph.service into infra/user-data.sh (its unit heredoc) and
# infra/user-data.sh into infra/fleet.yaml (the launch template's user data,
# between the BEGIN and END marker comments). Run it after editing either
# source; tests/infra_test.go fails while the copies differ.
set -euo pipefail
cd "$(dirname "$0")"

tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT

awk -v unit=nymph.service '
	skip && $0 == "UNIT" { skip = 0 }
	skip { next }
	{ print }
	$0 == "cat >\"$work/nymph.service\" <<'"'"'UNIT'"'"'" {
		while ((getline line < unit) > 0) print line
		skip = 1
	}
' user-data.sh >"$tmp"
cat "$tmp" >user-data.sh

awk -v script=user-data.sh '
	skip && $0 ~ /^ *# END infra\/user-data.sh/ { skip = 0 }
	skip { next }
	{ print }
	$0 ~ /^ *# BEGIN infra\/user-data.sh/ {
		match($0, /^ */)
		ind = substr($0, 1, RLENGTH)
		print ind "- |"
		while ((getline line < script) > 0) print (line == "" ? "" : ind "  " line)
		skip = 1
	}
' fleet.yaml >"$tmp"
cat "$tmp" >fleet.yaml
