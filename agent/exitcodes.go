package agent

import "errors"

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
	// ExitHostSetupFailed: --host-setup failed, nobody repaired the host
	// within --keep-alive, and the daemon left (bye idle).
	ExitHostSetupFailed = 4
)

// ErrHelloRefused is matched by Run's error when the control plane refused
// hello (401/403: a wrong or revoked enrollment token), at start or when it
// says hello again after a 410/401 on poll. That error matches
// ErrHelloFailed too.
var ErrHelloRefused = errors.New("hello refused")

// ErrHostSetupFailed is returned by Run when the daemon left by keep-alive
// while its --host-setup had failed and was never repaired.
var ErrHostSetupFailed = errors.New("host setup failed and was not repaired")

// ExitCode maps what Run returned to the process's exit code.
func ExitCode(err error) int {
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, ErrHelloRefused):
		return ExitHelloRefused
	case errors.Is(err, ErrHostSetupFailed):
		return ExitHostSetupFailed
	default:
		return ExitFailure
	}
}
