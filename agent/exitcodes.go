package agent

import (
	"errors"
	"fmt"
)

// Exit codes of the nymph process (docs/agent.md lists them). A service
// manager restarts on the retryable ones and stops on the others
// (infra/nymph.service, RestartPreventExitStatus).
const (
	// ExitOK: the daemon drained and said bye (a signal, an idle
	// --keep-alive, a drain command, a spot notice).
	ExitOK = 0
	// ExitFailure: a runtime failure, or the control plane stayed
	// unreachable through every hello retry. A restart may help.
	ExitFailure = 1
	// ExitUsage: bad flags or configuration at start. A restart cannot help.
	ExitUsage = 2
	// ExitHelloRefused: the control plane refused hello (a wrong or revoked
	// enrollment token). Retrying with the same token cannot help.
	ExitHelloRefused = 3
	// ExitHostSetupFailed: the daemon left by --keep-alive (bye idle)
	// while not ready (in setup): --host-setup failed and nobody repaired
	// the host, or a setup command hung (it is killed), or the workdir is
	// not writable. A restart would meet the same host.
	ExitHostSetupFailed = 4
	// ExitMachineConflict: another nymph said hello with this machine id
	// from another boot and replaced this worker while it ran: two hosts
	// share a machine id. A restart would replace the other in turn.
	ExitMachineConflict = 5
)

// ErrMachineConflict is matched by Run's error when another process
// replaced this worker (exit 5): it said hello with the same machine id
// from another boot while this one still ran.
var ErrMachineConflict = errors.New("machine id conflict: another process replaced this worker")

// ErrHelloRefused is matched by Run's error when the control plane refused
// hello (401/403: a wrong or revoked enrollment token), at start or when it
// says hello again after a 410/401 on poll. That error matches
// ErrHelloFailed too.
var ErrHelloRefused = errors.New("hello refused")

// ErrNotReady is matched by Run's error when the daemon left by keep-alive
// while it was not ready (exit 4): in setup, claiming nothing, because its
// host setup failed or hung, a setup command hung, or its workdir is not
// writable.
var ErrNotReady = errors.New("not ready within keep-alive")

// ErrHostSetupFailed is matched by Run's error when the daemon left by
// keep-alive while its --host-setup had not succeeded: a command failed and
// was never repaired, or one was still running (hung). It matches
// ErrNotReady too.
var ErrHostSetupFailed = fmt.Errorf("%w: host setup did not succeed", ErrNotReady)

// ExitCode maps what Run returned to the process's exit code.
func ExitCode(err error) int {
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, ErrHelloRefused):
		return ExitHelloRefused
	case errors.Is(err, ErrNotReady):
		return ExitHostSetupFailed
	case errors.Is(err, ErrMachineConflict):
		return ExitMachineConflict
	default:
		return ExitFailure
	}
}
