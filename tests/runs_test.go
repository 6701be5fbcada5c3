package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// runStaleAfter is the stale window of the run capstone's control planes:
// short, so a lost worker's job comes back soon, and long enough for a
// busy machine's polls.
const runStaleAfter = 5 * time.Second

// vignetteBody is each job of the capstone's run: it checks that "{model}"
// and "{epoch}" in its argv were expanded to its matrix values, writes a
// ledger line, then one JSON-lines record per vignette to its result file.
// The first body to take $MARKS/hold (an atomic rename) blocks after its
// first record until the test ends it, so exactly one job is mid-body on
// the first worker; a redelivered attempt (2 or more) waits while
// $MARKS/gate2 exists, so a test can hold it running. Every wait is
// bounded (60 s).
const vignetteBody = `[ "$1" = "$LAKESHORE_MATRIX_MODEL" ] && [ "$2" = "$LAKESHORE_MATRIX_EPOCH" ] || exit 3
echo "$LAKESHORE_RUN_INDEX $NYMPH_ATTEMPT $NYMPH_WORKER_ID" >> "$MARKS/ledger"
rec() { printf '{"model":"%s","epoch":"%s","vignette":"%s"}\n' "$LAKESHORE_MATRIX_MODEL" "$LAKESHORE_MATRIX_EPOCH" "$1" >> "$NYMPH_RESULT_FILE"; }
rec v1
held="$MARKS/held.$LAKESHORE_RUN_INDEX.$NYMPH_ATTEMPT"
if mv "$MARKS/hold" "$held" 2>/dev/null; then
  echo $$ > "$MARKS/pid"
  i=0; while [ -e "$held" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
fi
if [ "$NYMPH_ATTEMPT" -gt 1 ]; then
  i=0; while [ -e "$MARKS/gate2" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
fi
rec v2
rec v3`

// loseWorker is how the capstone's first worker is lost mid-job.
type loseWorker int

const (
	// killed: SIGKILL to nymph and to its body's process group, as when
	// the host dies.
	killed loseWorker = iota
	// frozen: SIGSTOP past stale_after, then SIGCONT while its job's
	// redelivered attempt runs; its late ack must not count.
	frozen
)

// TestRunCapstoneSurvivesALostWorker is the seed's capstone end to end:
// real `lakeshore dev` and two real nymph processes of capacity 1 on one
// queue. A run from the matrix model=[claude,gpt] × epoch=[1,2] makes 4
// jobs, each writing 3 vignette records as JSON lines. The first worker
// takes exactly one job and is lost mid-body (SIGKILLed with its body's
// process group, or frozen past the stale window and woken while the
// redelivered attempt runs); the survivor runs everything. The run ends
// done with done_count 4, all succeeded; its results page through as
// exactly 12 records, each (model, epoch, vignette) once, and 4 result
// lines in index order whose lost job counts attempt 2; the lost attempt
// ended as a lost worker's, not counted. The killed variant runs in
// process and through the real Lambda bootstraps.
func TestRunCapstoneSurvivesALostWorker(t *testing.T) {
	for _, c := range []struct {
		name string
		b    backend
		lose loseWorker
	}{
		{"killed/embedded", backends[0], killed},
		{"frozen/embedded", backends[0], frozen},
		{"killed/lambdas", lambdasBackend, killed},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			runCapstone(t, c.b, c.lose)
		})
	}
}

func runCapstone(t *testing.T, b backend, lose loseWorker) {
	d := startDev(t, b, "--stale-after", runStaleAfter.String())
	op := d.Operator()
	ctx := context.Background()
	marks := t.TempDir()
	touch(t, filepath.Join(marks, "hold"))
	if lose == frozen {
		touch(t, filepath.Join(marks, "gate2"))
	}
	dying := startNymph(t, d, "run-dying", "--capacity", "1")

	req := wire.RunRequest{Queue: "q", Name: "capstone",
		Argv:   []string{"/bin/sh", "-c", vignetteBody, "sh", "{model}", "{epoch}"},
		Env:    map[string]string{"MARKS": marks},
		Matrix: map[string][]string{"model": {"claude", "gpt"}, "epoch": {"1", "2"}}, IdempotencyKey: "capstone"}
	var created wire.RunCreated
	if status, err := op.Do(ctx, "submit run", http.MethodPost, "/v1/runs", nil, req, &created); err != nil || status != http.StatusCreated {
		t.Fatalf("submit run: %d %v", status, err)
	}
	if created.Total != 4 {
		t.Fatalf("run %+v, want 4 jobs", created)
	}

	// The dying worker alone is up: it claims one job (capacity 1), whose
	// body takes the hold and blocks mid-body.
	var held []string
	waittest.Until(t, 2*time.Minute, "a body on the dying worker holding its job", func() bool {
		held, _ = filepath.Glob(filepath.Join(marks, "held.*"))
		return len(held) > 0
	})
	if len(held) != 1 {
		t.Fatalf("held tokens %v, want one", held)
	}
	pgid := readPid(t, filepath.Join(marks, "pid"))
	lost, err := strconv.Atoi(strings.Split(filepath.Base(held[0]), ".")[1])
	if err != nil {
		t.Fatalf("held token %s: %v", held[0], err)
	}
	jobID := runResults(t, d, created.RunID)[lost].InvocationID
	first := waitInvocation(t, op, jobID, "running as attempt 1", func(inv wire.Invocation) bool {
		return inv.State == wire.StateRunning && inv.Attempt == 1
	})

	switch lose {
	case killed:
		_ = dying.cmd.Process.Signal(syscall.SIGKILL)
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		dying.wait(t, 10*time.Second)
		startNymph(t, d, "run-survivor", "--capacity", "1")
	case frozen:
		if err := dying.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = dying.cmd.Process.Signal(syscall.SIGCONT) })
		startNymph(t, d, "run-survivor", "--capacity", "1")
		waitInvocation(t, op, jobID, "redelivered and running as attempt 2", func(inv wire.Invocation) bool {
			return inv.State == wire.StateRunning && inv.Attempt == 2 && inv.WorkerID != first.WorkerID
		})
		if err := dying.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		// The woken worker is told its attempt was superseded; it stops its
		// body and acks it cancelled while attempt 2 still runs (gate2).
		dying.waitLog(t, 30*time.Second, `"reason":"superseded"`)
		dying.waitLog(t, 30*time.Second, `"msg":"ack answered"`)
		if err := os.Remove(filepath.Join(marks, "gate2")); err != nil {
			t.Fatal(err)
		}
	}

	var run wire.Run
	waittest.UntilState(t, 90*time.Second, "the run done", func() (bool, string) {
		if _, err := op.Do(ctx, "get run", http.MethodGet, "/v1/runs/"+created.RunID, nil, nil, &run); err != nil {
			return false, err.Error()
		}
		return run.State == wire.RunDone, fmt.Sprintf("%+v", run)
	})
	if run.DoneCount != 4 || run.Total != 4 || run.Counts[wire.StateSucceeded] != 4 ||
		run.Counts[wire.StateFailed] != 0 || run.Counts[wire.StateCancelled] != 0 {
		t.Fatalf("run %+v; want done_count 4, all 4 succeeded", run)
	}

	lines := runResults(t, d, created.RunID)
	for i, l := range lines {
		want := 1
		if i == lost {
			want = 2
		}
		if l.Index != i || l.State != wire.StateSucceeded || l.Attempt != want || l.ExitCode == nil || *l.ExitCode != 0 {
			t.Errorf("result line %d: index %d state %s attempt %d exit %s; want index %d succeeded at attempt %d, exit 0",
				i, l.Index, l.State, l.Attempt, exitText(l.ExitCode), i, want)
		}
	}
	if len(lines) != 4 {
		t.Fatalf("%d result lines, want 4", len(lines))
	}

	// Axes in name order, the first slowest: index = 2·epoch + model.
	models, epochs := []string{"claude", "gpt"}, []string{"1", "2"}
	seen := map[string]int{}
	records := runRecords(t, d, created.RunID)
	for _, r := range records {
		var v struct{ Model, Epoch, Vignette string }
		if err := json.Unmarshal(r.Record, &v); err != nil {
			t.Fatalf("record %s: %v", r.Record, err)
		}
		if r.Index < 0 || r.Index > 3 || v.Model != models[r.Index%2] || v.Epoch != epochs[r.Index/2] {
			t.Errorf("record %s at index %d is not that job's", r.Record, r.Index)
		}
		seen[v.Model+"/"+v.Epoch+"/"+v.Vignette]++
	}
	for _, m := range models {
		for _, e := range epochs {
			for _, vg := range []string{"v1", "v2", "v3"} {
				if n := seen[m+"/"+e+"/"+vg]; n != 1 {
					t.Errorf("record %s/%s/%s seen %d times, want once", m, e, vg, n)
				}
			}
		}
	}
	if len(records) != 12 {
		t.Fatalf("%d records, want 12: %v", len(records), seen)
	}

	inv, err := op.GetInvocation(ctx, jobID)
	if err != nil {
		t.Fatal(err)
	}
	h := inv.Attempts
	if inv.State != wire.StateSucceeded || inv.Attempt != 2 || len(h) != 2 ||
		!slices.Contains([]string{"stale", "gone"}, h[0].Outcome) || h[0].Recorded || h[0].WorkerID != first.WorkerID ||
		h[1].Outcome != wire.StateSucceeded || !h[1].Recorded {
		t.Fatalf("lost job %s: state %s attempt %d history %+v; want attempt 1 lost (stale or gone, not recorded), attempt 2 succeeded and recorded",
			jobID, inv.State, inv.Attempt, h)
	}

	// Each job's body ran once as attempt 1, and the lost job's again as
	// attempt 2 on another worker: 5 bodies in all. (A frozen worker that
	// wakes may take a job still queued; it runs it as any worker would.)
	ledger, err := os.ReadFile(filepath.Join(marks, "ledger"))
	if err != nil {
		t.Fatal(err)
	}
	entries := strings.Split(strings.TrimSpace(string(ledger)), "\n")
	want := []string{fmt.Sprintf("%d 1 %s", lost, first.WorkerID), fmt.Sprintf("%d 2 %s", lost, h[1].WorkerID)}
	for i := range 4 {
		if i != lost {
			want = append(want, fmt.Sprintf("%d 1 ", i))
		}
	}
	for _, w := range want {
		n := 0
		for _, e := range entries {
			if strings.HasPrefix(e, w) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("bodies run %q: %d start with %q, want 1", entries, n, w)
		}
	}
	if len(entries) != 5 || h[1].WorkerID == first.WorkerID {
		t.Fatalf("bodies run %q; want 5, the lost job's attempt 2 on another worker than %s", entries, first.WorkerID)
	}
}

// exitText shows an exit code that may be absent.
func exitText(code *int) string {
	if code == nil {
		return "none"
	}
	return strconv.Itoa(*code)
}

// touch creates an empty file.
func touch(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// waitInvocation waits until invocation id satisfies cond and returns it.
func waitInvocation(t *testing.T, op *client.Client, id, what string, cond func(wire.Invocation) bool) wire.Invocation {
	t.Helper()
	var inv wire.Invocation
	waittest.UntilState(t, time.Minute, id+" "+what, func() (bool, string) {
		var err error
		if inv, err = op.GetInvocation(context.Background(), id); err != nil {
			return false, err.Error()
		}
		return cond(inv), fmt.Sprintf("state %s attempt %d worker %s", inv.State, inv.Attempt, inv.WorkerID)
	})
	return inv
}

// runResults reads every page of run id's result lines.
func runResults(t *testing.T, d *devServer, id string) []wire.RunResult {
	t.Helper()
	return runPages[wire.RunResult](t, d, id, false)
}

// runRecords reads every page of run id's records.
func runRecords(t *testing.T, d *devServer, id string) []wire.RunRecord {
	t.Helper()
	return runPages[wire.RunRecord](t, d, id, true)
}

// runPages reads GET /v1/runs/{id}/results three jobs a page, following
// wire.NextIndexHeader, each JSON line decoded as a T.
func runPages[T any](t *testing.T, d *devServer, id string, records bool) []T {
	t.Helper()
	var out []T
	next := "0"
	for pages := 0; next != ""; pages++ {
		if pages > wire.MaxRunJobs/3+1 {
			t.Fatalf("results of %s never ended", id)
		}
		u := fmt.Sprintf("%s/v1/runs/%s/results?from=%s&limit=3&records=%v", d.URL, id, next, records)
		req, err := http.NewRequest(http.MethodGet, u, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+d.OperatorToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("results of %s: %v", id, err)
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var v T
			if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
				t.Fatalf("results line %q: %v", sc.Text(), err)
			}
			out = append(out, v)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK || sc.Err() != nil {
			t.Fatalf("results of %s from %s: HTTP %d, %v", id, next, resp.StatusCode, sc.Err())
		}
		next = resp.Header.Get(wire.NextIndexHeader)
	}
	return out
}
