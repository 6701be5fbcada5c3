package tests

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// readLogs reads every chunk of an attempt stored so far: each stream's
// bytes, the bytes reported left out, and whether the last chunk is in.
func readLogs(t *testing.T, op *client.Client, id string, attempt int) (stdout, stderr []byte, dropped int64, eof bool) {
	t.Helper()
	after := 0
	for range 10000 {
		page, err := op.Logs(context.Background(), id, attempt, after)
		if err != nil {
			t.Fatalf("logs of %s: %v", id, err)
		}
		for _, c := range page.Chunks {
			dropped += c.Dropped
			if c.Stream == "stderr" {
				stderr = append(stderr, c.Data...)
			} else {
				stdout = append(stdout, c.Data...)
			}
		}
		eof = eof || page.EOF
		if len(page.Chunks) == 0 {
			return stdout, stderr, dropped, eof
		}
		after = page.Next
	}
	t.Fatal("logs kept paging")
	return
}

// TestLogs: a body's output reaches `lakeshore logs` while it runs (real
// nymph, real processes), whole once it ends, its two streams apart; past
// the per-stream cap only head and tail are kept, with the bytes left out
// counted; and the CLI prints stdout to stdout and stderr to stderr. In
// process and through the Lambda bootstraps.
func TestLogs(t *testing.T) {
	t.Parallel()
	forEachPlane(t, func(t *testing.T, b backend) {
		d := startDev(t, b)
		op := d.Operator()
		startNymph(t, d, "m-logs", "--capacity", "2")
		gate := filepath.Join(t.TempDir(), "gate")
		live := submitSh(t, op, `echo "line 1"; i=0; while [ ! -e "`+gate+`" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; echo "line 2"; echo "err 1" >&2`, 0)

		waittest.Until(t, 30*time.Second, "the first line shipped while the body runs", func() bool {
			out, _, _, eof := readLogs(t, op, live.InvocationID, 0)
			return string(out) == "line 1\n" && !eof
		})
		if inv, err := op.GetInvocation(context.Background(), live.InvocationID); err != nil || inv.State != wire.StateRunning {
			t.Fatalf("the body was to be still running: %+v %v", inv, err)
		}
		cli := func(args ...string) (string, string, error) {
			cmd := exec.Command(lakeshoreBin(t), args...)
			cmd.Env = append(os.Environ(), "LAKESHORE_URL="+d.URL, "LAKESHORE_TOKEN="+d.OperatorToken)
			var so, se bytes.Buffer
			cmd.Stdout, cmd.Stderr = &so, &se
			err := runWithin(cmd, 30*time.Second)
			return so.String(), se.String(), err
		}
		if so, se, err := cli("logs", live.InvocationID); err != nil || so != "line 1\n" || !strings.Contains(se, "attempt 1 is still running") {
			t.Fatalf("lakeshore logs of a running body: %v; stdout %q, stderr %q", err, so, se)
		}
		if err := os.WriteFile(gate, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		waitTerminal(t, op, live.InvocationID, 30*time.Second)
		waittest.Until(t, 30*time.Second, "the whole output, eof last", func() bool {
			out, errs, dropped, eof := readLogs(t, op, live.InvocationID, 1)
			return string(out) == "line 1\nline 2\n" && string(errs) == "err 1\n" && dropped == 0 && eof
		})

		// The CLI: stdout to stdout, stderr to stderr; --follow of a
		// finished attempt returns at once.
		if so, se, err := cli("logs", live.InvocationID, "--follow"); err != nil || so != "line 1\nline 2\n" || se != "err 1\n" {
			t.Fatalf("lakeshore logs --follow: %v; stdout %q, stderr %q", err, so, se)
		}

		// 6 MiB on stdout: the first 4 MiB and the last 1 MiB are kept.
		big := submitSh(t, op, `i=0; while [ $i -lt 6144 ]; do printf '%01023d\n' $i; i=$((i+1)); done`, 0)
		if got := waitTerminal(t, op, big.InvocationID, 2*time.Minute); got.State != wire.StateSucceeded {
			t.Fatalf("big output: %+v", got)
		}
		var out []byte
		var dropped int64
		waittest.Until(t, time.Minute, "the capped output shipped", func() bool {
			var eof bool
			out, _, dropped, eof = readLogs(t, op, big.InvocationID, 1)
			return eof
		})
		lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
		if len(out) != 5<<20 || dropped != 1<<20 || len(lines) != 5120 ||
			!strings.HasSuffix(lines[4095], "4095") || !strings.HasSuffix(lines[4096], "5120") || !strings.HasSuffix(lines[5119], "6143") {
			t.Fatalf("capped output: %d bytes kept, %d dropped, %d lines (want 5 MiB kept, 1 MiB dropped: lines 0-4095 and 5120-6143)",
				len(out), dropped, len(lines))
		}
	})
}

// runWithin runs cmd, killing it if it takes longer than limit.
func runWithin(cmd *exec.Cmd, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		return <-done
	}
}
