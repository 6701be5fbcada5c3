package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestWorkerViewsShowFailedSetup: a worker whose last setup failed says so
// in `ls workers` (NOTE) and in `get` (Last setup, Note, the output tail);
// a host-setup result is named by its command's text, a control-plane one
// by its id.
func TestWorkerViewsShowFailedSetup(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	host := wire.Worker{WorkerID: "wrk_HOST", State: "setting_up", Phase: wire.PhaseSetup, MaxConcurrency: 1, CreatedAt: now,
		LastSetupResult: &wire.SetupResult{Command: "exit 3", Status: wire.SetupFailed, ExitCode: 3, DurationMS: 5, OutputTail: "no disk\n"}}
	cp := wire.Worker{WorkerID: "wrk_CP", State: "active", Phase: wire.PhaseReady, MaxConcurrency: 1, CreatedAt: now,
		LastSetupResult: &wire.SetupResult{CommandID: "cmd_X", Status: wire.SetupFailed, ExitCode: 1}}
	long := wire.Worker{WorkerID: "wrk_LONG", State: "setting_up", Phase: wire.PhaseSetup, MaxConcurrency: 1, CreatedAt: now,
		LastSetupResult: &wire.SetupResult{Command: "apt-get install -y\n" + strings.Repeat("pkg ", 40), Status: wire.SetupFailed, ExitCode: 100}}
	fine := wire.Worker{WorkerID: "wrk_OK", State: "active", Phase: wire.PhaseReady, MaxConcurrency: 1, CreatedAt: now,
		LastSetupResult: &wire.SetupResult{Command: "exit 3", Status: wire.SetupSucceeded}}

	var b bytes.Buffer
	if err := workerTable(&b, []wire.Worker{host, cp, long, fine}, now); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 5 || !strings.HasSuffix(strings.TrimSpace(lines[0]), "NOTE") {
		t.Fatalf("ls workers:\n%s", b.String())
	}
	for i, want := range []string{"setup failed: `exit 3` exit 3", "setup failed: cmd_X exit 1", "setup failed: `apt-get install -y pkg pkg", ""} {
		row := lines[i+1]
		if want == "" && strings.Contains(row, "setup failed") || !strings.Contains(row, want) {
			t.Errorf("row %d = %q, want it to hold %q", i+1, row, want)
		}
	}
	if !strings.Contains(lines[3], "…") || strings.Count(lines[3], "pkg") > 40 {
		t.Errorf("a long command is not clipped in the table: %q", lines[3])
	}

	b.Reset()
	if err := describeWorker(&b, host, now); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Last setup:", "`exit 3` failed exit 3 in 5ms", "Note:", "setup failed: `exit 3` exit 3",
		"claims nothing", "--- setup output (tail) ---\nno disk\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("get worker lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	if err := describeWorker(&b, fine, now); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "Note:") || !strings.Contains(b.String(), "`exit 3` succeeded exit 0") {
		t.Errorf("get worker after a successful setup:\n%s", b.String())
	}
}

// TestWorkerViewsShowAdoption: a worker asked to adopt a host key says so
// in `ls workers` (NOTE) and `get`; one whose adopted host setup failed
// says that, and that it stays generic.
func TestWorkerViewsShowAdoption(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	key := "hk1_" + strings.Repeat("ab", 32)
	asked := wire.Worker{WorkerID: "wrk_ASKED", State: "setting_up", Phase: wire.PhaseSetup, MaxConcurrency: 2, CreatedAt: now,
		AdoptHostSetup: true, Adoption: &wire.Adoption{HostKey: key, Queue: "q", AskedAt: now.Add(-time.Minute)}}
	failed := wire.Worker{WorkerID: "wrk_FAILED", State: "active", Phase: wire.PhaseReady, MaxConcurrency: 2, CreatedAt: now,
		AdoptHostSetup: true, Adoption: &wire.Adoption{HostKey: key, Queue: "q", AskedAt: now, Failed: "its host setup failed"},
		LastSetupResult: &wire.SetupResult{Command: "exit 3", Status: wire.SetupFailed, ExitCode: 3}}
	var b bytes.Buffer
	if err := workerTable(&b, []wire.Worker{asked, failed}, now); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[1], "adopting host key hk1_abababababab…") ||
		!strings.Contains(lines[2], "adoption setup failed: `exit 3` exit 3") {
		t.Fatalf("ls workers:\n%s", b.String())
	}
	b.Reset()
	if err := describeWorker(&b, failed, now); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Adoption:", "host key " + key + " for queue q", "failed: its host setup failed", "it stays generic"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("get worker lacks %q:\n%s", want, b.String())
		}
	}
	if strings.Contains(b.String(), "claims nothing until") {
		t.Errorf("get worker says a failed adoption blocks claims:\n%s", b.String())
	}
}

// TestVersionFlag: `lakeshore --version` prints the build's version.
func TestVersionFlag(t *testing.T) {
	root := newRootCmd()
	var out strings.Builder
	root.SetOut(&out)
	root.SetArgs([]string{"--version"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != "lakeshore "+version+"\n" {
		t.Fatalf("--version printed %q", got)
	}
}

// TestWorkerTextIsShownEscaped: a label, a command or output a worker or
// body supplied is printed with its control characters escaped: no escape
// sequence reaches the operator's terminal, and a table keeps its rows.
func TestWorkerTextIsShownEscaped(t *testing.T) {
	now := time.Now()
	evil := "w\x1b]0;owned\x07\x1b[2J\r\n\u009b31m"
	var out strings.Builder
	if err := workerTable(&out, []wire.Worker{{WorkerID: "wrk_1", Label: evil, State: "active", MaxConcurrency: 1}}, now); err != nil {
		t.Fatal(err)
	}
	inv := wire.Invocation{InvocationID: "inv_1", Queue: "q", State: wire.StateFailed, Argv: []string{"echo", evil},
		StdoutTail: "line 1\n\x1b[31mred\x1b[0m\tend\n", Error: &wire.ErrorInfo{Type: "x", Message: evil},
		Attempts: []wire.Attempt{{Attempt: 1, WorkerID: "wrk_1", Outcome: wire.StateFailed, Reason: evil, Recorded: true}}}
	if err := describeInvocation(&out, inv, now); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, c := range []string{"\x1b", "\x07", "\r", "\u009b"} {
		if strings.Contains(got, c) {
			t.Fatalf("output holds control character %q:\n%s", c, got)
		}
	}
	for _, want := range []string{`w\x1b]0;owned\x07\x1b[2J\x0d\x0a\x9b31m`, "line 1\n\\x1b[31mred\\x1b[0m\tend\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if lines := strings.Count(strings.SplitN(got, "ID:", 2)[0], "\n"); lines != 2 {
		t.Errorf("the worker table has %d lines, want a header and one row:\n%s", lines, got)
	}
}
