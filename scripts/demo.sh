#!/usr/bin/env bash
# make demo: the main job on the embedded store. Starts `lakeshore dev`,
# three nymphs, submits a run of jobs, shows it run, kills one worker (the daemon
# and every process it started, as when an instance vanishes) while it
# runs two invocations, and ends with proof that the kill landed on running
# work, that it was redelivered, and that every invocation finished exactly
# once (it exits non-zero, saying why, when any of these fails), then the
# attempt history and output of one invocation the killed worker ran, and
# the web view's URL and token; run from a terminal it stays up until
# Ctrl-C (in CI, or with DEMO_EXIT=1, it exits by itself).
set -euo pipefail
cd "$(dirname "$0")/.."

N=${DEMO_INVOCATIONS:-30}
QUEUE=demo
STALE=${DEMO_STALE_AFTER:-4s}
BIN=$PWD/bin
TMP=$(mktemp -d "${TMPDIR:-/tmp}/lakeshore-demo.XXXXXX")
LEDGER=$TMP/ledger
pids=()

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  sleep 1
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "${KEEP_DEMO:-}" = "" ]; then rm -rf "$TMP"; else echo "demo files kept in $TMP"; fi
}
trap cleanup EXIT INT TERM

say "control plane: lakeshore dev on the embedded store (stale after $STALE)"
"$BIN/lakeshore" dev --addr 127.0.0.1:0 --stale-after "$STALE" >"$TMP/dev.out" 2>"$TMP/dev.log" &
pids+=($!)
for _ in $(seq 100); do grep -q '^LAKESHORE_TOKEN=' "$TMP/dev.out" 2>/dev/null && break; sleep 0.1; done
grep -q '^LAKESHORE_TOKEN=' "$TMP/dev.out" || { echo "lakeshore dev did not start:"; cat "$TMP/dev.log"; exit 1; }
head -1 "$TMP/dev.out"
export LAKESHORE_URL=$(sed -n 's/^LAKESHORE_URL=//p' "$TMP/dev.out")
export LAKESHORE_TOKEN=$(sed -n 's/^LAKESHORE_TOKEN=//p' "$TMP/dev.out")
ENROLL=$(sed -n 's/^LAKESHORE_ENROLL_TOKEN=//p' "$TMP/dev.out")

say "three workers (nymph, capacity 2 each)"
declare -A worker_pid
for i in 1 2 3; do
  setsid "$BIN/nymph" --control-plane "$LAKESHORE_URL" --enroll-token "$ENROLL" --queue "$QUEUE" \
    --label "worker-$i" --machine-id "demo-machine-$i" --capacity 2 \
    --workdir "$TMP/w$i/work" --state-dir "$TMP/w$i/state" --introspect-addr off \
    --grace 10s --kill-after 2s 2>"$TMP/nymph-$i.log" &
  worker_pid[$i]=$!
  pids+=($!)
  disown $! # its SIGKILL below is the point, not news for the shell to print
done
for _ in $(seq 100); do
  [ "$("$BIN/lakeshore" ls workers 2>/dev/null | grep -c ' active ')" -ge 3 ] && break; sleep 0.2
done
"$BIN/lakeshore" ls workers

say "submit a run of $N jobs to queue $QUEUE (each sleeps 1-3 s, appends to a ledger, writes a result)"
BODY='echo "attempt $NYMPH_ATTEMPT on $NYMPH_WORKER_ID: working"; echo "start $NYMPH_INVOCATION_ID $NYMPH_ATTEMPT $NYMPH_WORKER_ID" >>"$LEDGER"; sleep $((RANDOM % 3 + 1)); echo "{\"attempt\": $NYMPH_ATTEMPT}" >"$NYMPH_RESULT_FILE"; echo "end $NYMPH_INVOCATION_ID $NYMPH_ATTEMPT $NYMPH_WORKER_ID" >>"$LEDGER"; echo "attempt $NYMPH_ATTEMPT: done"'
RUN=$("$BIN/lakeshore" run submit --queue "$QUEUE" --name demo --env "LEDGER=$LEDGER" --matrix "i=$(seq -s, "$N")" -- sh -c "$BODY" 2>/dev/null)
echo "submitted run $RUN: $N jobs (lakeshore run submit --matrix i=1,...,$N)"

say "running (one line a second) — worker-2 is killed with SIGKILL once 6 have finished and it runs 2"
w2=$("$BIN/lakeshore" ls workers --label worker-2 | awk 'NR > 1 {print $1; exit}')
# The kill waits for worker-2 to run work, not for a clock: the point is
# to kill it mid-run, so it waits for the first few bodies to finish, then
# for two invocations the control plane shows running on worker-2 whose
# bodies have started (they wrote their start to the ledger). It writes
# what worker-2 held to $TMP/killed only when the kill landed; the summary
# fails without it.
(
  held=
  for _ in $(seq 1200); do
    ended=$(grep -c '^end ' "$LEDGER" 2>/dev/null || true)
    if [ "${ended:-0}" -ge 6 ]; then
      held=$("$BIN/lakeshore" ls invocations --queue "$QUEUE" --state running 2>/dev/null |
        awk -v w="$w2" 'NR > 1 && $5 == w {print $1}' || true)
      held=$(for i in $held; do grep -q "^start $i [0-9]* $w2\$" "$LEDGER" && echo "$i"; done || true)
      [ "$(grep -c . <<<"$held")" -ge 2 ] && break
    fi
    held=
    sleep 0.05
  done
  [ -n "$held" ] || exit 0
  victim=${worker_pid[2]}
  echo ">> SIGKILL worker-2 (nymph pid $victim and everything in its session: the instance is gone) while it runs" $held
  pkill -KILL -s "$victim" && echo "$held" >"$TMP/killed"
) &
killer=$!
"$BIN/lakeshore" watch --queue "$QUEUE" --interval 1s --until-done
kill "$killer" 2>/dev/null || true # still waiting: worker-2 never held 2 at once
wait "$killer" 2>/dev/null || true

say "summary"
"$BIN/lakeshore" ls workers
echo
"$BIN/lakeshore" ls invocations --queue "$QUEUE" --all >"$TMP/invocations.txt"
succeeded=$(grep -c ' succeeded ' "$TMP/invocations.txt" || true)
redelivered=$(awk 'NR>1 && $4 !~ /^1\// {n++} END {print n+0}' "$TMP/invocations.txt")
starts=$(grep -c '^start ' "$LEDGER" || true)
ends=$(grep -c '^end ' "$LEDGER" || true)
stats=$("$BIN/lakeshore" watch --queue "$QUEUE" --until-done --interval 1s | tail -1)
done_count=$(echo "$stats" | sed -n 's/.*done=\([0-9]*\).*/\1/p')
# A body worker-2 was running when it was killed appended its start to the
# ledger and never its end.
killed_bodies=0
if [ -s "$TMP/killed" ]; then
  killed_bodies=$(awk -v w="$w2" 'NR == FNR {held[$1] = 1; next}
    $4 == w && ($2 in held) {if ($1 == "start") s[$2 " " $3] = 1; else delete s[$2 " " $3]}
    END {n = 0; for (k in s) n++; print n}' "$TMP/killed" "$LEDGER")
fi
run_line=$("$BIN/lakeshore" run wait "$RUN" 2>/dev/null | tail -1 || true)
run_results=$("$BIN/lakeshore" run results "$RUN" | grep -c '"state":"succeeded"' || true)
echo "submitted:                 $N   (run $RUN)"
echo "succeeded:                 $succeeded"
echo "done_count:                $done_count   (terminal transitions, each counted once)"
echo "bodies started / finished: $starts / $ends   (a body killed with its instance never finishes)"
echo "killed mid-run:            $killed_bodies   (bodies worker-2 was running when it was killed)"
echo "redelivered invocations:   $redelivered   (attempt > 1: they were running on worker-2)"
echo "the run:                   $run_line"
echo "its result lines:          $run_results   (lakeshore run results: one a job, the counted attempt's)"
if [ ! -s "$TMP/killed" ]; then
  echo "RESULT: FAILED — worker-2 was never killed while it ran 2 invocations: this run proves nothing"; exit 1
fi
if [ "$killed_bodies" -lt 1 ] || [ "$redelivered" -lt 1 ]; then
  echo "RESULT: FAILED — the kill landed on no running work ($killed_bodies bodies killed mid-run, $redelivered redelivered)"; exit 1
fi
if [ "$succeeded" = "$N" ] && [ "$done_count" = "$N" ] && [ "$run_results" = "$N" ] &&
  [[ "$run_line" == *" done $N/$N succeeded=$N "* ]]; then
  echo "RESULT: every invocation finished exactly once — none lost, none double-counted."
else
  echo "RESULT: MISMATCH"; exit 1
fi

# One invocation worker-2 was running when it was killed, handed to another.
victim_inv=$(awk 'NR == FNR {held[$1] = 1; next} FNR > 1 && ($1 in held) && $4 !~ /^1\// {print $1; exit}' \
  "$TMP/killed" "$TMP/invocations.txt")
if [ -z "$victim_inv" ]; then
  echo "RESULT: FAILED — none of the invocations worker-2 was running was redelivered"; exit 1
fi
victim_attempt=$(awk -v i="$victim_inv" -v w="$w2" '$1 == "start" && $2 == i && $4 == w {n = $3} END {print n + 0}' "$LEDGER")
say "what an operator sees of $victim_inv, which worker-2 was running"
echo "\$ lakeshore get $victim_inv   (its attempts)"
"$BIN/lakeshore" get "$victim_inv" | sed -n '/^--- attempts ---/,/^--- /p' | sed '1d;/^--- /d'
echo
echo "\$ lakeshore logs $victim_inv --attempt $victim_attempt   (what worker-2 shipped before it was killed)"
"$BIN/lakeshore" logs "$victim_inv" --attempt "$victim_attempt" 2>&1 | tail -n 5
echo
echo "\$ lakeshore logs $victim_inv   (the last lines of its output)"
"$BIN/lakeshore" logs "$victim_inv" 2>&1 | tail -n 5

say "the web view: the fleet, and the timeline of the kill and its hand-off"
echo "open $LAKESHORE_URL/ui/ and log in with the operator token:"
echo "  $LAKESHORE_TOKEN"
if [ -t 0 ] && [ -t 1 ] && [ "${CI:-}" != "true" ] && [ -z "${DEMO_EXIT:-}" ]; then
  echo "lakeshore dev and the two workers left stay up until Ctrl-C (DEMO_EXIT=1 make demo exits here)"
  while :; do sleep 3600; done
fi
