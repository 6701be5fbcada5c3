package agent

import (
	"syscall"
	"testing"

	"github.com/dreamlake/lakeshore/agent/internal/process"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestHandBackAsked: which outcomes a body's exit status turns into a
// hand-back (the endpoint's request is TestBodiesSeeTheLifecycle's): only
// during a drain, only a listed status, never an operator's cancel or a
// timeout; and a hand-back is neither abandoned nor recorded.
func TestHandBackAsked(t *testing.T) {
	code := func(n int) *int { return &n }
	failed := func(n int, typ string) process.Outcome {
		return process.Outcome{State: wire.StateFailed, ExitCode: code(n), Error: &wire.ErrorInfo{Type: typ}}
	}
	r := &running{requeueExitCodes: []int{75, 143}}
	draining, ready := &state{phase: phaseDraining}, &state{phase: phaseReady}
	for _, c := range []struct {
		name string
		st   *state
		o    process.Outcome
		want bool
	}{
		{"a listed status during the drain", draining, failed(75, process.ErrorTypeExitCode), true},
		{"killed by the drain's SIGTERM, listed", draining, failed(143, process.ErrorTypeSignal), true},
		{"abandoned at the end of the grace, listed", &state{phase: phaseTerminating},
			process.Outcome{State: wire.StateFailed, Abandoned: true, ExitCode: code(143), Error: &wire.ErrorInfo{Type: process.ErrorTypeAbandoned}}, true},
		{"a listed status before any drain", ready, failed(75, process.ErrorTypeExitCode), false},
		{"a status not listed", draining, failed(1, process.ErrorTypeExitCode), false},
		{"success", draining, process.Outcome{State: wire.StateSucceeded, ExitCode: code(0)}, false},
		{"an operator's cancel", draining, process.Outcome{State: wire.StateCancelled, ExitCode: code(143)}, false},
		{"a timeout", draining, failed(143, process.ErrorTypeTimeout), false},
		{"no exit status", draining, process.Outcome{State: wire.StateFailed, Error: &wire.ErrorInfo{Type: process.ErrorTypeStartFailed}}, false},
	} {
		why := handBackAsked(c.st, r, c.o)
		if (why != "") != c.want {
			t.Errorf("%s: handBackAsked %q, want a hand-back %v", c.name, why, c.want)
		}
	}
	o := requeuedOutcome(process.Outcome{State: wire.StateFailed, Abandoned: true, ExitCode: code(143), ResultBlob: []byte(`{}`)}, "why")
	if o.State != wire.AckRequeued || o.Abandoned || o.ResultBlob != nil || o.Error.Message != "why" || *o.ExitCode != 143 {
		t.Errorf("requeuedOutcome: %+v", o)
	}
}

// TestDrainSignalOf: every name a submit accepts maps to its signal; any
// other (SIGKILL, from a newer or confused control plane) sends none.
func TestDrainSignalOf(t *testing.T) {
	want := map[string]syscall.Signal{"SIGHUP": syscall.SIGHUP, "SIGINT": syscall.SIGINT, "SIGQUIT": syscall.SIGQUIT,
		"SIGTERM": syscall.SIGTERM, "SIGUSR1": syscall.SIGUSR1, "SIGUSR2": syscall.SIGUSR2}
	for _, name := range wire.DrainSignals {
		if sig := drainSignalOf(name); sig != want[name] || sig == 0 {
			t.Errorf("drainSignalOf(%q) = %v, want %v", name, sig, want[name])
		}
	}
	for _, name := range []string{"", "SIGKILL", "USR1", "sigterm"} {
		if sig := drainSignalOf(name); sig != 0 {
			t.Errorf("drainSignalOf(%q) = %v, want none", name, sig)
		}
	}
}
