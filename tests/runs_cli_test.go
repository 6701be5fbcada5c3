package tests

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/client/clienttest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// cliRun runs bin/lakeshore against d and reports what it printed and its
// exit status (-1 when it did not exit within the limit).
func cliRun(t *testing.T, d *devServer, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(lakeshoreBin(t), args...)
	cmd.Env = append(os.Environ(), "LAKESHORE_URL="+d.URL, "LAKESHORE_TOKEN="+d.OperatorToken)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	err := runWithin(cmd, 2*time.Minute)
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("lakeshore %s: %v", strings.Join(args, " "), err)
	}
	return so.String(), se.String(), code
}

// cliOK is cliRun that fails the test unless the command exits 0.
func cliOK(t *testing.T, d *devServer, args ...string) string {
	t.Helper()
	out, errOut, code := cliRun(t, d, args...)
	if code != 0 {
		t.Fatalf("lakeshore %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// TestRunCLI: the run commands of the real CLI against a real `lakeshore
// dev` with a real nymph running the jobs. A 2×2 matrix run submitted with
// --wait exits 0 with its progress on stderr; its results come back one
// line a job in index order, each job's values in its argv; a body that
// writes JSON lines to its result file gives one record a line; run ls and
// run get show the run; a run with a failing job makes run submit --wait
// and run wait exit 1; run cancel of a run nothing serves cancels every
// job and run get then reads it done with cancelled = total. In process
// and through the Lambda bootstraps.
func TestRunCLI(t *testing.T) {
	t.Parallel()
	forEachPlane(t, testRunCLI)
}

func testRunCLI(t *testing.T, b backend) {
	d := startDev(t, b)
	startNymph(t, d, "m-runs", "--capacity", "2")

	out, errOut, code := cliRun(t, d, "run", "submit", "--queue", "q", "--name", "grid", "--matrix", "model=a,b", "--matrix", "epoch=1,2", "--wait",
		"--", "sh", "-c", `echo {model} {epoch}; printf '%s\n' '{"model":"{model}","epoch":{epoch},"env":"'"$LAKESHORE_MATRIX_MODEL"'"}' > "$NYMPH_RESULT_FILE"`)
	if code != 0 {
		t.Fatalf("run submit --wait: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	outLines := strings.Split(strings.TrimSpace(out), "\n")
	id := outLines[0]
	if !strings.HasPrefix(id, "run_") || len(outLines) != 2 || !strings.Contains(outLines[1], "done 4/4 succeeded=4 failed=0") {
		t.Fatalf("run submit --wait printed %q; want the run id, then its summary", out)
	}
	if !strings.Contains(errOut, id+" 4/4 100% succeeded=4 failed=0") {
		t.Errorf("run submit --wait: stderr has no 100%% progress line:\n%s", errOut)
	}

	// Job i: epoch slowest, model fastest (axes in name order).
	want := [][2]string{{"a", "1"}, {"b", "1"}, {"a", "2"}, {"b", "2"}}
	results := strings.Split(strings.TrimSuffix(cliOK(t, d, "run", "results", id), "\n"), "\n")
	if len(results) != 4 {
		t.Fatalf("run results: %d lines, want 4:\n%s", len(results), strings.Join(results, "\n"))
	}
	for i, l := range results {
		var r wire.RunResult
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("results line %d %q: %v", i, l, err)
		}
		wantResult := fmt.Sprintf(`{"model":"%s","epoch":%s,"env":"%s"}`, want[i][0], want[i][1], want[i][0])
		if r.Index != i || r.State != wire.StateSucceeded || r.ExitCode == nil || *r.ExitCode != 0 || string(r.Result) != wantResult {
			t.Errorf("results line %d = %s; want index %d succeeded, exit 0, result %s", i, l, i, wantResult)
		}
	}

	var got wire.Run
	if err := json.Unmarshal([]byte(cliOK(t, d, "run", "get", "--output", "json", id)), &got); err != nil {
		t.Fatalf("run get --output json: %v", err)
	}
	if got.RunID != id || got.Queue != "q" || got.Name != "grid" || got.State != wire.RunDone || got.Total != 4 ||
		got.DoneCount != 4 || got.Counts[wire.StateSucceeded] != 4 {
		t.Fatalf("run get --output json = %+v", got)
	}
	ls := cliOK(t, d, "run", "ls", "--queue", "q")
	if !strings.HasPrefix(ls, "ID") || !strings.Contains(ls, id) || !strings.Contains(ls, "grid") || !strings.Contains(ls, "4/4") {
		t.Errorf("run ls --queue q:\n%s", ls)
	}

	// JSON lines in the result file: one record a line, in index order.
	rec := strings.TrimSpace(cliOK(t, d, "run", "submit", "--queue", "q", "--matrix", "i=0,1", "--",
		"sh", "-c", `printf '{"i":{i},"n":1}\n' >> "$NYMPH_RESULT_FILE"; printf '{"i":{i},"n":2}\n' >> "$NYMPH_RESULT_FILE"`))
	cliOK(t, d, "run", "wait", rec)
	records := strings.TrimSuffix(cliOK(t, d, "run", "results", "--records", rec), "\n")
	wantRecords := `{"index":0,"record":{"i":0,"n":1}}` + "\n" + `{"index":0,"record":{"i":0,"n":2}}` + "\n" +
		`{"index":1,"record":{"i":1,"n":1}}` + "\n" + `{"index":1,"record":{"i":1,"n":2}}`
	if records != wantRecords {
		t.Errorf("run results --records:\n got %s\nwant %s", records, wantRecords)
	}

	// A failing job: --wait and wait exit 1, naming what did not succeed.
	out, errOut, code = cliRun(t, d, "run", "submit", "--queue", "q", "--matrix", "x=0,3", "--wait", "--", "sh", "-c", "exit {x}")
	if code != 1 || !strings.Contains(errOut, "1 of 2 jobs did not succeed (failed 1, cancelled 0)") {
		t.Fatalf("run submit --wait with a failing job: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	failing := strings.Split(out, "\n")[0]
	if _, errOut, code := cliRun(t, d, "run", "wait", failing); code != 1 || !strings.Contains(errOut, "did not succeed") {
		t.Fatalf("run wait of a run with a failed job: exit %d, stderr %s", code, errOut)
	}

	// run retry --failed: a job that fails once and then succeeds (a
	// marker file says it has failed) is queued again, and the run ends
	// with every job succeeded; a second retry queues nothing.
	marker := filepath.Join(t.TempDir(), "failed-once")
	flaky := strings.TrimSpace(cliOK(t, d, "run", "submit", "--queue", "q", "--matrix", "x=a,b", "--", "sh", "-c",
		`[ {x} = a ] || exit 0; [ -e `+marker+` ] && exit 0; touch `+marker+`; exit 1`))
	if _, _, code := cliRun(t, d, "run", "wait", flaky); code != 1 {
		t.Fatalf("run wait of the flaky run: exit %d, want 1 (its job a failed once)", code)
	}
	if _, _, code := cliRun(t, d, "run", "retry", flaky); code == 0 {
		t.Fatal("run retry without --failed exited 0")
	}
	if out := cliOK(t, d, "run", "retry", "--failed", flaky); !strings.Contains(out, "1 failed jobs queued again") {
		t.Fatalf("run retry --failed: %q", out)
	}
	if _, errOut, code := cliRun(t, d, "run", "wait", flaky); code != 0 {
		t.Fatalf("run wait after the retry: exit %d, stderr %s", code, errOut)
	}
	if out := cliOK(t, d, "run", "retry", "--failed", flaky); !strings.Contains(out, "0 failed jobs queued again") {
		t.Fatalf("a second run retry --failed: %q", out)
	}
	got = wire.Run{}
	if err := json.Unmarshal([]byte(cliOK(t, d, "run", "get", "-o", "json", flaky)), &got); err != nil ||
		got.State != wire.RunDone || got.Counts[wire.StateSucceeded] != 2 || got.Counts[wire.StateFailed] != 0 || got.DoneCount != 2 {
		t.Fatalf("run get after the retry: %+v %v; want done, 2 succeeded, none failed", got, err)
	}

	// Nothing serves queue idle: cancel ends every job.
	idle := strings.TrimSpace(cliOK(t, d, "run", "submit", "--queue", "idle", "--matrix", "k=1,2,3,4,5", "--", "true"))
	var c wire.RunCancelled
	if err := json.Unmarshal([]byte(cliOK(t, d, "run", "cancel", "-o", "json", idle)), &c); err != nil || c.Cancelled != 5 || c.Remaining != 0 {
		t.Fatalf("run cancel: %+v %v; want 5 cancelled, none remaining", c, err)
	}
	got = wire.Run{}
	if err := json.Unmarshal([]byte(cliOK(t, d, "run", "get", "-o", "json", idle)), &got); err != nil ||
		got.State != wire.RunDone || got.Counts[wire.StateCancelled] != got.Total || got.Total != 5 {
		t.Fatalf("run get after cancel: %+v %v; want done with cancelled = total", got, err)
	}
	if _, _, code := cliRun(t, d, "run", "wait", idle); code != 1 {
		t.Errorf("run wait of a cancelled run: exit %d, want 1", code)
	}
}

// TestRunSubmitLostAnswer: the real CLI submits a run through a proxy
// that drops the connection after the real `lakeshore dev` made the run;
// the CLI sends the POST again with the same idempotency key, and the
// control plane holds exactly one run, the one the CLI printed.
func TestRunSubmitLostAnswer(t *testing.T) {
	d := startDev(t, backends[0])
	target, err := url.Parse(d.URL)
	if err != nil {
		t.Fatal(err)
	}
	lose := clienttest.NewLosingProxy(target, "/v1/runs", 1, 0)
	proxy := httptest.NewServer(lose)
	t.Cleanup(proxy.Close)

	out, errOut, code := cliRun(t, d, "run", "submit", "--url", proxy.URL, "--queue", "idle", "--matrix", "k=1,2", "--", "true")
	if code != 0 {
		t.Fatalf("run submit through a lossy proxy: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	keys := lose.IdempotencyKeys()
	if len(keys) != 2 || keys[0] == "" || keys[1] != keys[0] {
		t.Fatalf("POSTs carried keys %q; want two with the same key", keys)
	}
	list, err := d.Operator().Runs(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Runs) != 1 || list.Runs[0].RunID != strings.TrimSpace(out) || list.Runs[0].Total != 2 {
		t.Fatalf("runs: %+v; want exactly one, %s", list.Runs, strings.TrimSpace(out))
	}
}
