package process

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/process/proctest"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/wire"
)

func TestRunResultFile(t *testing.T) {
	t.Parallel()
	big := `head -c 140000 /dev/zero | tr '\0' a`
	cases := map[string]struct {
		script    string
		stale     bool
		wantState string
		wantType  string
		wantMsg   string
		wantBlob  string
	}{
		"too large": {
			script:    `{ printf '"'; ` + big + `; printf '"'; } > "$NYMPH_RESULT_FILE"`,
			wantState: wire.StateFailed, wantType: ErrorTypeBadResult, wantMsg: "the limit is 131072",
		},
		"invalid JSON turns success into failure": {
			script:    `echo '{"unterminated": ' > "$NYMPH_RESULT_FILE"`,
			wantState: wire.StateFailed, wantType: ErrorTypeBadResult, wantMsg: "not valid JSON",
		},
		"empty file is not JSON": {
			script:    `: > "$NYMPH_RESULT_FILE"`,
			wantState: wire.StateFailed, wantType: ErrorTypeBadResult, wantMsg: "not valid JSON",
		},
		"invalid UTF-8": {
			script:    `printf '"\377"' > "$NYMPH_RESULT_FILE"`,
			wantState: wire.StateFailed, wantType: ErrorTypeBadResult, wantMsg: "not valid UTF-8",
		},
		"not a regular file": {
			script:    `ln -s /dev/zero "$NYMPH_RESULT_FILE"`,
			wantState: wire.StateFailed, wantType: ErrorTypeBadResult, wantMsg: "not a regular file",
		},
		"invalid JSON keeps an earlier failure": {
			script:    `echo nope > "$NYMPH_RESULT_FILE"; exit 3`,
			wantState: wire.StateFailed, wantType: ErrorTypeExitCode, wantMsg: "exited with status 3",
		},
		"failed run keeps a valid result": {
			script:    `echo '[1]' > "$NYMPH_RESULT_FILE"; exit 3`,
			wantState: wire.StateFailed, wantType: ErrorTypeExitCode, wantMsg: "exited with status 3", wantBlob: "[1]",
		},
		"JSON lines appended by the body become one array": {
			script:    `printf '{"v":1}\n' >> "$NYMPH_RESULT_FILE"; printf '{"v":2}\n' >> "$NYMPH_RESULT_FILE"; printf '{"v":3}\n' >> "$NYMPH_RESULT_FILE"`,
			wantState: wire.StateSucceeded, wantBlob: `[{"v":1},{"v":2},{"v":3}]`,
		},
		"a line that is not JSON turns success into failure": {
			script:    `printf '{"v":1}\n{"v":2}\noops\n' > "$NYMPH_RESULT_FILE"`,
			wantState: wire.StateFailed, wantType: ErrorTypeBadResult, wantMsg: "line 3 is not a JSON value",
		},
		"a stale file from an earlier process is not this run's": {
			script: "true", stale: true, wantState: wire.StateSucceeded,
		},
		"no file, no blob": {
			script: "true", wantState: wire.StateSucceeded,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := runnerTestNew(t)
			inv := wire.RunInvocation{InvocationID: "inv_result", Attempt: 1, Argv: runnerTestSh(tc.script)}
			if tc.stale {
				dir := runnerTestDir(r, inv)
				if err := os.MkdirAll(dir, 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, ResultFileName), []byte(`{"stale":true}`), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			o := runnerTestOutcome(t, runnerTestStart(t, r, inv))
			if o.State != tc.wantState {
				t.Fatalf("outcome = %+v, want state %s", o, tc.wantState)
			}
			if tc.wantType != "" {
				runnerTestError(t, o, tc.wantType, tc.wantMsg)
			} else if o.Error != nil {
				t.Errorf("Error = %+v, want none", *o.Error)
			}
			if string(o.ResultBlob) != tc.wantBlob {
				t.Errorf("ResultBlob = %q, want %q", o.ResultBlob, tc.wantBlob)
			}
		})
	}
}

func TestRunBadWorkdir(t *testing.T) {
	t.Parallel()
	cases := map[string]wire.RunInvocation{
		"absolute workdir":            {InvocationID: "inv_wd", RunConfig: wire.RunConfig{Workdir: "/tmp"}},
		"parent workdir":              {InvocationID: "inv_wd", RunConfig: wire.RunConfig{Workdir: "../up"}},
		"workdir escaping on the way": {InvocationID: "inv_wd", RunConfig: wire.RunConfig{Workdir: "a/../../../x"}},
		"invocation id with a slash":  {InvocationID: "../evil"},
		"invocation id dot-dot":       {InvocationID: ".."},
		"empty invocation id":         {InvocationID: ""},
	}
	for name, inv := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := runnerTestNew(t)
			inv.Argv = runnerTestSh("touch ran")
			o := runnerTestOutcome(t, runnerTestStart(t, r, inv))
			if o.State != wire.StateFailed || o.ExitCode != nil {
				t.Fatalf("outcome = %+v, want failed with no exit code", o)
			}
			runnerTestError(t, o, ErrorTypeBadWorkdir, "")
			if entries, _ := os.ReadDir(r.cfg.Workdir); len(entries) != 0 {
				t.Errorf("the runner created %v under its workdir for a rejected run", entries)
			}
		})
	}
}

func TestRunInWorkdirSubdirectory(t *testing.T) {
	t.Parallel()
	r := runnerTestNew(t)
	inv := wire.RunInvocation{InvocationID: "inv_sub", Argv: runnerTestSh(`pwd -P; echo "$NYMPH_WORKDIR"; touch here`),
		RunConfig: wire.RunConfig{Workdir: "sub/dir", RunSetup: []string{"touch setup-here"}}}
	o := runnerTestOutcome(t, runnerTestStart(t, r, inv))
	if o.State != wire.StateSucceeded {
		t.Fatalf("outcome = %+v", o)
	}
	dir := runnerTestDir(r, inv)
	real, err := filepath.EvalSymlinks(filepath.Join(dir, "sub", "dir"))
	if err != nil {
		t.Fatal(err)
	}
	if want := real + "\n" + dir + "\n"; o.StdoutTail != want {
		t.Errorf("StdoutTail = %q, want %q", o.StdoutTail, want)
	}
	for _, f := range []string{"here", "setup-here"} {
		if _, err := os.Stat(filepath.Join(dir, "sub", "dir", f)); err != nil {
			t.Errorf("%s not in the workdir subdirectory: %v", f, err)
		}
	}
}

// TestRunLooksUpArgvInTheBodysPATH: argv[0] is found in the body's PATH,
// not the daemon's.
func TestRunLooksUpArgvInTheBodysPATH(t *testing.T) {
	t.Parallel()
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "runner-test-hello"), []byte("#!/bin/sh\necho hello \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := runnerTestNew(t, func(c *Config) { c.BaseEnv = []string{"PATH=relative:" + bin + ":/usr/bin:/bin"} })
	o := runnerTestOutcome(t, runnerTestStart(t, r, wire.RunInvocation{InvocationID: "inv_path", Argv: []string{"runner-test-hello", "world"}}))
	if o.State != wire.StateSucceeded || o.StdoutTail != "hello world\n" {
		t.Fatalf("outcome = %+v", o)
	}

	// sh is in the daemon's PATH, but not in this body's.
	r = runnerTestNew(t, func(c *Config) { c.BaseEnv = []string{"PATH=" + bin} })
	o = runnerTestOutcome(t, runnerTestStart(t, r, wire.RunInvocation{InvocationID: "inv_path", Argv: []string{"sh", "-c", "true"}}))
	runnerTestError(t, o, ErrorTypeStartFailed, "not found in PATH")
}

func TestExecSetupCommand(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	for i := range 600 {
		fmt.Fprintf(&out, "%09d\n", i)
		fmt.Fprintf(&out, "e%08d\n", i)
	}
	long := out.String()
	cases := map[string]struct {
		argv     []string
		wantCode int
		wantTail string
		wantErr  bool
	}{
		"interleaved output": {argv: runnerTestSh("echo a; echo b >&2; echo c"), wantTail: "a\nb\nc\n"},
		"non-zero exit is not an error": {
			argv: runnerTestSh("echo oops; exit 5"), wantCode: 5, wantTail: "oops\n",
		},
		"signal": {argv: runnerTestSh("kill -TERM $$"), wantCode: 128 + 15},
		"tail is the last 4 KiB": {
			argv:     runnerTestSh(`i=0; while [ $i -lt 600 ]; do printf '%09d\n' $i; printf 'e%08d\n' $i >&2; i=$((i+1)); done`),
			wantTail: long[len(long)-4096:],
		},
		"not found":   {argv: []string{"runner-test-no-such-binary"}, wantCode: -1, wantErr: true},
		"empty argv":  {argv: nil, wantCode: -1, wantErr: true},
		"missing dir": {argv: []string{"/bin/true"}, wantCode: -1, wantErr: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			clk := &runnerTestClock{now: time.Unix(1700000000, 0)}
			r := runnerTestNew(t, func(c *Config) { c.Clock = clock.Of(clk.Now) })
			dir := t.TempDir()
			if name == "missing dir" {
				dir = filepath.Join(dir, "absent")
			}
			code, tail, dur, err := r.Exec(context.Background(), tc.argv, dir)
			if (err != nil) != tc.wantErr || code != tc.wantCode || tail != tc.wantTail {
				t.Errorf("Exec = %d, %q, %v; want %d, %q, error %v", code, tail, err, tc.wantCode, tc.wantTail, tc.wantErr)
			}
			if dur != time.Second {
				t.Errorf("duration = %s, want 1s from the injected clock", dur)
			}
		})
	}
}

func TestExecCancelTerminatesTheGroup(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		script   string
		wantCode int
		wantTail string
		killed   bool
	}{
		"SIGTERM ends it": {
			script:   `trap 'echo bye; exit 4' TERM; sleep 60 & echo $! > child; echo $$ > pid; wait`,
			wantCode: 4, wantTail: "bye\n",
		},
		"SIGTERM ignored, SIGKILL after KillAfter": {
			script:   `trap '' TERM; sleep 60 & echo $! > child; echo $$ > pid; wait`,
			wantCode: 128 + 9, killed: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := runnerTestNew(t)
			dir := t.TempDir()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			type result struct {
				code int
				tail string
				err  error
			}
			done := make(chan result, 1)
			go func() {
				code, tail, _, err := r.Exec(ctx, runnerTestSh(tc.script), dir)
				done <- result{code, tail, err}
			}()
			pid := proctest.Pid(t, filepath.Join(dir, "pid"))
			child := proctest.Pid(t, filepath.Join(dir, "child"))
			cancelled := time.Now()
			cancel()
			var res result
			select {
			case res = <-done:
			case <-time.After(runnerTestWait):
				t.Fatal("Exec did not return after its context was cancelled")
			}
			if tc.killed && time.Since(cancelled) < runnerTestKillAfter {
				t.Errorf("SIGKILL came before KillAfter had passed")
			}
			if res.code != tc.wantCode || res.tail != tc.wantTail || !errors.Is(res.err, context.Canceled) {
				t.Errorf("Exec = %d, %q, %v; want %d, %q, context.Canceled", res.code, res.tail, res.err, tc.wantCode, tc.wantTail)
			}
			proctest.AssertGone(t, "command", pid)
			proctest.AssertGone(t, "child", child)
		})
	}
}

// TestExecBackgroundGrandchildHoldingThePipe: the grandchild keeps the
// output pipe open; Exec must still return, and the grandchild must die.
func TestExecBackgroundGrandchildHoldingThePipe(t *testing.T) {
	t.Parallel()
	r := runnerTestNew(t)
	dir := t.TempDir()
	code, tail, _, err := r.Exec(context.Background(), runnerTestSh(`sleep 100 & echo $! > child; echo hi`), dir)
	if code != 0 || tail != "hi\n" || err != nil {
		t.Fatalf("Exec = %d, %q, %v", code, tail, err)
	}
	proctest.AssertGone(t, "background grandchild", proctest.Pid(t, filepath.Join(dir, "child")))
}

func TestExecWithADoneContextDoesNotStart(t *testing.T) {
	t.Parallel()
	r := runnerTestNew(t)
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	code, _, _, err := r.Exec(ctx, runnerTestSh("touch ran"), dir)
	if code != -1 || !errors.Is(err, context.Canceled) {
		t.Errorf("Exec = %d, %v; want -1, context.Canceled", code, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "ran")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the command ran (err %v)", err)
	}
}

func runnerTestInt(n int) *int { return &n }

// TestRunnerWorkerIDPerRun: each run carries the worker id it was started
// for, so runs started from two goroutines for two workers (the loop after
// a re-hello, a run from the session before) each see their own, and the
// race detector sees no shared field written under a running body.
func TestRunnerWorkerIDPerRun(t *testing.T) {
	r := runnerTestNew(t)
	var wg sync.WaitGroup
	outcomes := make([]Outcome, 2)
	for i, w := range []string{"wrk_first", "wrk_second"} {
		wg.Go(func() {
			inv := wire.RunInvocation{InvocationID: fmt.Sprintf("inv_w%d", i), Attempt: 1,
				Argv: runnerTestSh(`printf '"%s"' "$NYMPH_WORKER_ID" > "$NYMPH_RESULT_FILE"`)}
			run := r.Start(inv, w)
			t.Cleanup(run.Kill)
			select {
			case <-run.Done():
				outcomes[i] = run.Outcome()
			case <-time.After(runnerTestWait):
				t.Errorf("run for %s did not end", w)
			}
		})
	}
	wg.Wait()
	for i, w := range []string{"wrk_first", "wrk_second"} {
		if got := string(outcomes[i].ResultBlob); got != `"`+w+`"` {
			t.Errorf("the body started for %s saw NYMPH_WORKER_ID %s", w, got)
		}
	}
}
