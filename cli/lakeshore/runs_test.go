package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/client/clienttest"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestRunSubmitLostAnswerMakesOneRun: a run submit whose POST reached the
// control plane but whose answer was lost (the connection dropped, or a
// 502 from a proxy) is sent again with the same idempotency key, and there
// is exactly one run afterwards, the one the command printed.
func TestRunSubmitLostAnswerMakesOneRun(t *testing.T) {
	defer func(d time.Duration) { runSubmitMinBackoff = d }(runSubmitMinBackoff)
	runSubmitMinBackoff = 10 * time.Millisecond
	for _, tc := range []struct {
		name   string
		lost   int
		status int
	}{
		{"connection dropped", 1, 0},
		{"502 twice", 2, http.StatusBadGateway},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPlane(t)
			target, err := url.Parse(p.url)
			if err != nil {
				t.Fatal(err)
			}
			lose := clienttest.NewLosingProxy(target, "/v1/runs", tc.lost, tc.status)
			proxy := httptest.NewServer(lose)
			t.Cleanup(proxy.Close)

			out, errOut, err := runCLI(t.Context(), "run", "submit", "--url", proxy.URL, "--token", testOperatorToken,
				"--matrix", "x=1,2", "--", "echo", "{x}")
			if err != nil {
				t.Fatalf("run submit: %v\nstderr: %s", err, errOut)
			}
			id := strings.TrimSpace(out)
			keys := lose.IdempotencyKeys()
			if len(keys) != tc.lost+1 || keys[0] == "" {
				t.Fatalf("POSTs carried keys %q, want %d POSTs with a key", keys, tc.lost+1)
			}
			for _, k := range keys[1:] {
				if k != keys[0] {
					t.Fatalf("the retries carried keys %q, want the first POST's each time", keys)
				}
			}
			list, err := p.op.Runs(t.Context(), "")
			if err != nil {
				t.Fatal(err)
			}
			if len(list.Runs) != 1 || list.Runs[0].RunID != id || list.Runs[0].Total != 2 {
				t.Fatalf("runs after a lost answer: %+v; want exactly one, %s, of 2 jobs", list.Runs, id)
			}
			if !strings.Contains(errOut, "same idempotency key") {
				t.Errorf("stderr %q does not say the POST was sent again", errOut)
			}
		})
	}
}

// TestRunSubmitRetriesAreBounded: a control plane that never answers is
// given up on after runSubmitAttempts POSTs, the error naming the key.
func TestRunSubmitRetriesAreBounded(t *testing.T) {
	defer func(d time.Duration) { runSubmitMinBackoff = d }(runSubmitMinBackoff)
	runSubmitMinBackoff = time.Millisecond
	var mu sync.Mutex
	posts := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		posts++
		mu.Unlock()
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	_, _, err := runCLI(t.Context(), "run", "submit", "--url", srv.URL, "--token", testOperatorToken, "--matrix", "x=1", "--", "true")
	mu.Lock()
	defer mu.Unlock()
	if err == nil || !strings.Contains(err.Error(), "idempotency key cli-") || posts != runSubmitAttempts {
		t.Fatalf("err %v after %d POSTs; want an error naming the key after %d", err, posts, runSubmitAttempts)
	}
}

// TestRunSubmitBadInput: a run is a matrix or a job list, and a bad flag
// or job file is named before anything is sent.
func TestRunSubmitBadInput(t *testing.T) {
	p := newTestPlane(t)
	dir := t.TempDir()
	jobs := filepath.Join(dir, "jobs.jsonl")
	if err := os.WriteFile(jobs, []byte("{\"argv\":[\"true\"]}\n\n{\"argv\":[\"false\"],\"nope\":1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--matrix", "x=1", "--jobs", jobs, "--", "true"}, "--matrix and --jobs exclude each other"},
		{[]string{"--", "true"}, "a run needs --matrix"},
		{[]string{"--matrix", "x", "--", "true"}, "--matrix wants NAME=V1,V2"},
		{[]string{"--matrix", "x=1,", "--", "true"}, "empty value"},
		{[]string{"--matrix", "x=1", "--matrix", "x=2", "--", "true"}, "given twice"},
		{[]string{"--matrix", "x=1"}, "needs ARGV"},
		{[]string{"--jobs", jobs}, `line 3: json: unknown field "nope"`},
		{[]string{"--jobs", filepath.Join(dir, "missing")}, "no such file"},
	} {
		_, _, err := p.run(t, append([]string{"run", "submit"}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run submit %s: err %v, want one holding %q", strings.Join(tc.args, " "), err, tc.want)
		}
	}
	if list, err := p.op.Runs(t.Context(), ""); err != nil || len(list.Runs) != 0 {
		t.Fatalf("after refusals: %+v %v; want no run", list.Runs, err)
	}
}

// TestRunSubmitJobsFromStdin: --jobs - reads the job list from stdin, the
// flags filling in what a job leaves out.
func TestRunSubmitJobsFromStdin(t *testing.T) {
	p := newTestPlane(t)
	root := newRootCmd()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetIn(strings.NewReader("{\"argv\":[\"echo\",\"a\"]}\n{\"env\":{\"K\":\"v\"}}\n{}\n"))
	root.SetArgs([]string{"run", "submit", "--url", p.url, "--token", testOperatorToken, "--output", "json",
		"--jobs", "-", "--name", "three", "--timeout", "30s", "--", "echo", "default"})
	if err := root.ExecuteContext(t.Context()); err != nil {
		t.Fatalf("run submit --jobs -: %v\n%s", err, errOut.String())
	}
	var created wire.RunCreated
	if err := json.Unmarshal(out.Bytes(), &created); err != nil || created.Total != 3 {
		t.Fatalf("run submit --output json printed %q (%v); want a RunCreated of 3 jobs", out.String(), err)
	}
	r, err := p.op.Run(t.Context(), created.RunID)
	if err != nil || r.Name != "three" || r.Total != 3 {
		t.Fatalf("run %+v %v", r, err)
	}
}

// TestRunProgressPlain: off a terminal the progress is a line at the first
// read and at each tenth of the run, the last at 100%, with the rate and
// the time left from the jobs seen finishing.
func TestRunProgressPlain(t *testing.T) {
	var buf bytes.Buffer
	fake := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	p := newRunProgress(&buf, false, fake.Clock())
	r := wire.Run{RunID: "run_x", Total: 20, State: wire.RunRunning, Counts: map[string]int{}}
	for done := 0; done <= 20; done++ {
		r.DoneCount, r.Counts[wire.StateSucceeded] = done, done
		if done == 20 {
			r.State = wire.RunDone
		}
		p.show(r)
		p.show(r) // a second read of the same count prints nothing
		fake.Advance(time.Second)
	}
	p.end()
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 11 {
		t.Fatalf("%d lines, want 11 (0%%, each tenth):\n%s", len(lines), buf.String())
	}
	for i, l := range lines {
		if want := fmt.Sprintf("run_x %d/20 %d%% ", i*2, i*10); !strings.HasPrefix(l, want) {
			t.Errorf("line %d = %q, want it to start %q", i, l, want)
		}
		if strings.ContainsAny(l, "\r\x1b") {
			t.Errorf("line %d = %q: a plain line has no terminal controls", i, l)
		}
	}
	if lines[0] != "run_x 0/20 0% succeeded=0 failed=0 rate=- eta=-" {
		t.Errorf("first line %q", lines[0])
	}
	// 10 jobs in 10 s: 1/s, 10 left.
	if lines[5] != "run_x 10/20 50% succeeded=10 failed=0 rate=1.00/s eta=10s" {
		t.Errorf("half-way line %q", lines[5])
	}
}

// TestRunProgressTerminal: on a terminal one line is redrawn in place
// (carriage return, erase line) with a bar, and ended with a newline.
func TestRunProgressTerminal(t *testing.T) {
	var buf bytes.Buffer
	fake := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	p := newRunProgress(&buf, true, fake.Clock())
	r := wire.Run{RunID: "run_x", Total: 8, Counts: map[string]int{}}
	p.show(r)
	fake.Advance(4 * time.Second)
	r.DoneCount, r.Counts[wire.StateSucceeded], r.Counts[wire.StateFailed] = 2, 1, 1
	p.show(r)
	p.end()
	want := "\r\x1b[Krun_x 0/8 [....................] 0% succeeded=0 failed=0 rate=- eta=-" +
		"\r\x1b[Krun_x 2/8 [#####...............] 25% succeeded=1 failed=1 rate=0.50/s eta=12s\n"
	if buf.String() != want {
		t.Fatalf("terminal progress\n got %q\nwant %q", buf.String(), want)
	}
}

// TestRunCommandsOnAPlane: run get, ls, results and cancel against a real
// router; the jobs stay queued (no worker), so cancel ends them all, and
// wait then exits non-zero.
func TestRunCommandsOnAPlane(t *testing.T) {
	p := newTestPlane(t)
	id := strings.TrimSpace(p.mustRun(t, "run", "submit", "--name", "n1", "--matrix", "a=1,2,3", "--", "echo", "{a}"))
	var r wire.Run
	if err := json.Unmarshal([]byte(p.mustRun(t, "run", "get", "--output", "json", id)), &r); err != nil ||
		r.RunID != id || r.Total != 3 || r.Counts[wire.StateQueued] != 3 {
		t.Fatalf("run get --output json: %+v %v", r, err)
	}
	if out := p.mustRun(t, "run", "get", id); !strings.Contains(out, "queued=3") || !strings.Contains(out, "0/3") {
		t.Errorf("run get:\n%s", out)
	}
	ls := p.mustRun(t, "run", "ls", "--queue", "default")
	if !strings.HasPrefix(ls, "ID") || !strings.Contains(ls, id) || !strings.Contains(ls, "n1") || !strings.Contains(ls, "0/3") {
		t.Errorf("run ls:\n%s", ls)
	}
	if ls := p.mustRun(t, "run", "ls", "--queue", "other"); strings.Contains(ls, id) {
		t.Errorf("run ls --queue other lists %s:\n%s", id, ls)
	}
	res := strings.Split(strings.TrimSuffix(p.mustRun(t, "run", "results", id), "\n"), "\n")
	if len(res) != 3 {
		t.Fatalf("run results: %q", res)
	}
	for i, l := range res {
		var line wire.RunResult
		if err := json.Unmarshal([]byte(l), &line); err != nil || line.Index != i || line.State != wire.StateQueued {
			t.Errorf("results line %d = %q (%v)", i, l, err)
		}
	}
	var c wire.RunCancelled
	if err := json.Unmarshal([]byte(p.mustRun(t, "run", "cancel", "-o", "json", id)), &c); err != nil || c.Cancelled != 3 || c.Remaining != 0 {
		t.Fatalf("run cancel: %+v %v", c, err)
	}
	out, errOut, err := p.run(t, "run", "wait", id)
	if err == nil || !strings.Contains(err.Error(), "3 of 3 jobs did not succeed") || !strings.Contains(out, "cancelled=3") {
		t.Fatalf("run wait of a cancelled run: err %v, stdout %q, stderr %q", err, out, errOut)
	}
}
