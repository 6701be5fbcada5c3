#!/usr/bin/env bash
# The daemon's footprint (issue 3 targets): static binary size (≤ 15 MB),
# idle RSS after a minute (≤ 20 MB) and idle CPU, measured on a real nymph
# polling a real `lakeshore dev`. FOOTPRINT_SECONDS shortens the idle minute.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${FOOTPRINT_SECONDS:-60}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/lakeshore-footprint.XXXXXX")
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT

bin/lakeshore dev --addr 127.0.0.1:0 --stale-after 30s >"$TMP/dev.out" 2>"$TMP/dev.log" &
pids+=($!)
for _ in $(seq 100); do grep -q '^LAKESHORE_TOKEN=' "$TMP/dev.out" 2>/dev/null && break; sleep 0.1; done
URL=$(sed -n 's/^LAKESHORE_URL=//p' "$TMP/dev.out")
ENROLL=$(sed -n 's/^LAKESHORE_ENROLL_TOKEN=//p' "$TMP/dev.out")
bin/nymph --control-plane "$URL" --enroll-token "$ENROLL" --queue idle --workdir "$TMP/work" \
  --state-dir "$TMP/state" --introspect-addr 127.0.0.1:0 2>"$TMP/nymph.log" &
NYMPH=$!
pids+=($NYMPH)
HZ=$(getconf CLK_TCK)
sleep 1
ticks() { awk '{print $14 + $15}' "/proc/$NYMPH/stat"; }
t0=$(ticks)
sleep "$SECS"
t1=$(ticks)
rss_kb=$(awk '/^VmRSS:/ {print $2}' "/proc/$NYMPH/status")
hwm_kb=$(awk '/^VmHWM:/ {print $2}' "/proc/$NYMPH/status")
size_mb() { awk -v b="$(stat -c %s "$1")" 'BEGIN {printf "%6.1f", b / 1e6}'; }
echo "nymph footprint (idle ${SECS}s against lakeshore dev, polling at hello's interval)"
echo "  binary bin/nymph:      $(size_mb bin/nymph) MB   (target <= 15 MB)"
echo "  binary bin/lakeshore:  $(size_mb bin/lakeshore) MB"
awk -v r="$rss_kb" -v h="$hwm_kb" 'BEGIN {printf "  idle RSS:              %6.1f MB   (peak %.1f MB; target <= 20 MB)\n", r / 1000, h / 1000}'
awk -v t="$((t1 - t0))" -v hz="$HZ" -v s="$SECS" 'BEGIN {printf "  idle CPU:              %6.3f %%   (%d ticks of %d/s over %ds)\n", 100 * t / hz / s, t, hz, s}'
