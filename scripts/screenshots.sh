#!/usr/bin/env bash
# The pictures in docs/ui.md: starts `lakeshore dev` and three nymphs,
# submits a small eval-like load (short jobs, two that fail, one long job
# printing coloured progress), SIGKILLs one worker mid-run (its attempts
# move to another lane), and shoots the fleet page, the timeline and the
# long job's page while its output is live. Needs `make build` and
# chromium; writes docs/img/{fleet,timeline,invocation}.png.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=$PWD/bin
OUT=${SHOTS_DIR:-docs/img}
QUEUE=evals
TMP=$(mktemp -d "${TMPDIR:-/tmp}/lakeshore-shots.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  sleep 1
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

"$BIN/lakeshore" dev --addr 127.0.0.1:0 --stale-after 4s >"$TMP/dev.out" 2>"$TMP/dev.log" &
pids+=($!)
for _ in $(seq 100); do grep -q '^LAKESHORE_TOKEN=' "$TMP/dev.out" 2>/dev/null && break; sleep 0.1; done
export LAKESHORE_URL=$(sed -n 's/^LAKESHORE_URL=//p' "$TMP/dev.out")
export LAKESHORE_TOKEN=$(sed -n 's/^LAKESHORE_TOKEN=//p' "$TMP/dev.out")
ENROLL=$(sed -n 's/^LAKESHORE_ENROLL_TOKEN=//p' "$TMP/dev.out")
[ -n "$LAKESHORE_TOKEN" ] || { echo "lakeshore dev did not start:"; cat "$TMP/dev.log"; exit 1; }

declare -A worker_pid
for i in 1 2 3; do
  setsid "$BIN/nymph" --control-plane "$LAKESHORE_URL" --enroll-token "$ENROLL" --queue "$QUEUE" \
    --label "gpu-$i" --machine-id "shots-machine-$i" --capacity 2 \
    --workdir "$TMP/w$i/work" --state-dir "$TMP/w$i/state" --introspect-addr off 2>"$TMP/nymph-$i.log" &
  worker_pid[$i]=$!
  pids+=($!)
  disown $!
done
for _ in $(seq 100); do
  [ "$("$BIN/lakeshore" ls workers 2>/dev/null | grep -c ' active ')" -ge 3 ] && break; sleep 0.2
done

submit() { "$BIN/lakeshore" submit --queue "$QUEUE" "$@" 2>/dev/null; }
for i in $(seq 8); do
  submit -- sh -c "echo 'eval shard $i: loading'; sleep $((i % 4 + 2)); printf '\033[32mshard $i: 0.%d accuracy\033[0m\n' $((80 + i))" >/dev/null
done
submit -- sh -c 'echo "loading checkpoint"; sleep 2; printf "\033[31mcheckpoint missing\033[0m\n" >&2; exit 3' >/dev/null
# The long job: 200 KB of setup log (more than the page shows at once),
# then a coloured progress line every 0.3 s.
LONG=$(submit -- sh -c 'for i in $(seq 2000); do echo "setup: fetching shard $i of 2000 ............................................................................................"; done; for i in $(seq 400); do if [ $((i % 10)) = 0 ]; then printf "\033[33mstep %d: loss %d.%02d (checkpoint)\033[0m\n" $i $((400 / i)) $((i % 100)); else printf "\033[32mstep %d\033[0m: loss %d.%02d\n" $i $((400 / i)) $((i % 100)); fi; sleep 0.3; done')

sleep 3
# gpu-3 vanishes as a spot instance does: its attempts go on another lane.
kill -KILL -- -"${worker_pid[3]}" 2>/dev/null || kill -KILL "${worker_pid[3]}"
sleep 12

shoot() { go run ./scripts/shoot -url "$LAKESHORE_URL" -token "$LAKESHORE_TOKEN" "$@"; }
mkdir -p "$OUT"
shoot -page /ui/ -wait '#timeline' -select main -settle 2s -out "$OUT/fleet.png"
shoot -page /ui/ -wait '#timeline' -select '#timeline' -out "$OUT/timeline.png"
shoot -page "/ui/invocations/$LONG" -wait '#stdout' -select main -settle 5s -out "$OUT/invocation.png"
echo "saved $OUT/fleet.png, $OUT/timeline.png and $OUT/invocation.png (the long job: $LONG)"
