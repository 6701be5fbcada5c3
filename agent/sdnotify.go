package agent

import (
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// NotifySocketEnv names the variable a service manager sets for a daemon
// that reports its own readiness (systemd's Type=notify).
const NotifySocketEnv = "NOTIFY_SOCKET"

// notifyWriteTimeout bounds one notification: a service manager whose
// socket is full must never stall the phase machine.
const notifyWriteTimeout = 250 * time.Millisecond

// Notifier tells a service manager how the daemon is doing, in systemd's
// sd_notify(3) protocol: one message of newline-separated VAR=VALUE
// assignments (READY=1, STOPPING=1, STATUS=…). Notify must return quickly;
// its error is logged, never fatal.
type Notifier interface {
	Notify(state string) error
}

// SDNotifier sends sd_notify messages as datagrams to one unix socket.
type SDNotifier struct {
	addr *net.UnixAddr
}

var _ Notifier = (*SDNotifier)(nil)

// NewSDNotifier returns a notifier for socket: a filesystem path, or an
// abstract socket name written with a leading '@'. Other forms (systemd
// also knows vsock: addresses) are an error.
func NewSDNotifier(socket string) (*SDNotifier, error) {
	if !strings.HasPrefix(socket, "/") && !strings.HasPrefix(socket, "@") {
		return nil, fmt.Errorf("%s=%q: want an absolute path or an @abstract name", NotifySocketEnv, socket)
	}
	// Go's unix sockaddr maps a leading '@' to the abstract namespace.
	return &SDNotifier{addr: &net.UnixAddr{Name: socket, Net: "unixgram"}}, nil
}

// Notify sends state as one datagram. It dials afresh each time: messages
// are rare, and a service manager that re-created its socket (systemctl
// daemon-reexec) is reached again without a reconnect path.
func (n *SDNotifier) Notify(state string) error {
	conn, err := net.DialUnix("unixgram", nil, n.addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.SetWriteDeadline(time.Now().Add(notifyWriteTimeout)); err != nil {
		return err
	}
	_, err = conn.Write([]byte(state))
	return err
}

// NotifierFromEnv reports the notifier $NOTIFY_SOCKET asks for: nil when
// it is unset (not run by a service manager that wants to hear from us).
func NotifierFromEnv(getenv func(string) string) (Notifier, error) {
	socket := getenv(NotifySocketEnv)
	if socket == "" {
		return nil, nil
	}
	n, err := NewSDNotifier(socket)
	if err != nil {
		return nil, err
	}
	return n, nil
}

// serviceNotify is what the agent tells its service manager: READY=1 once,
// after the first hello; STOPPING=1 once, when a drain (or termination)
// starts for any reason; STATUS=… on phase changes. Failures are logged
// once at warn, then at debug.
type serviceNotify struct {
	n        Notifier
	log      *slog.Logger
	ready    atomic.Bool
	stopping atomic.Bool
	failed   atomic.Bool
	// extend is how long a drain may take (StopBudget), sent with STOPPING=1
	// so a --grace longer than the unit's TimeoutStopSec is not cut short.
	extend time.Duration
}

func newServiceNotify(cfg Config) *serviceNotify {
	return &serviceNotify{n: cfg.Notifier, log: cfg.Logger, extend: StopBudget(cfg.Grace, cfg.KillAfter)}
}

func (s *serviceNotify) send(state string) {
	if s == nil || s.n == nil {
		return
	}
	err := s.n.Notify(state)
	if err == nil {
		return
	}
	if s.failed.CompareAndSwap(false, true) {
		s.log.Warn("could not notify the service manager; carrying on without it", "error", err.Error())
		return
	}
	s.log.Debug("service manager notification failed", "error", err.Error())
}

// readyAfterHello sends READY=1 the first time a hello is answered; a later
// hello (the control plane let go of this worker) only updates STATUS.
func (s *serviceNotify) readyAfterHello(workerID, queue string) {
	status := fmt.Sprintf("STATUS=registered as %s, queue %s", workerID, queue)
	if s != nil && s.ready.CompareAndSwap(false, true) {
		s.send("READY=1\n" + status)
		return
	}
	s.send(status)
}

// phase reports a phase change; the first draining or terminating phase
// also sends STOPPING=1.
func (s *serviceNotify) phase(phase, reason, workerID string, inflight int) {
	status := fmt.Sprintf("STATUS=phase %s, worker %s, %d in flight", phase, workerID, inflight)
	if reason != "" {
		status = fmt.Sprintf("STATUS=phase %s (%s), worker %s, %d in flight", phase, reason, workerID, inflight)
	}
	stopping := phase == wire.PhaseDraining || phase == wire.PhaseTerminating
	if stopping && s != nil && s.stopping.CompareAndSwap(false, true) {
		s.send(fmt.Sprintf("STOPPING=1\nEXTEND_TIMEOUT_USEC=%d\n%s", s.extend.Microseconds(), status))
		return
	}
	s.send(status)
}

// StartBudget reports the longest nymph takes from start to READY=1 with
// the default hello retries against a control plane that never answers:
// the spooled-ack resend, the IMDS lookup, then every hello attempt timing
// out with the longest jittered backoff between them. A service manager's
// start timeout (systemd TimeoutStartSec) must exceed it, or it kills a
// daemon that was about to give up on its own (exit 1) or succeed.
func StartBudget() time.Duration {
	total := requestTimeout + DefaultIMDSTimeout
	for attempt := 1; attempt <= DefaultHelloAttempts; attempt++ {
		total += requestTimeout
		if attempt < DefaultHelloAttempts {
			total += scaled(helloBackoff(attempt), jitterHigh)
		}
	}
	return total
}

// HelloBackoffTotal reports the least time hello's retries wait in all
// before giving up (each backoff at its shortest jitter): even against a
// control plane that refuses connections at once, a start that ends in
// exit 1 lasts at least this long. A unit's start rate limit uses it to tell
// an outage (keep restarting) from a crash loop (stop); a refused token
// exits 3 at once, which the unit does not restart at all.
func HelloBackoffTotal() time.Duration {
	var total time.Duration
	for attempt := 1; attempt < DefaultHelloAttempts; attempt++ {
		total += scaled(helloBackoff(attempt), jitterLow)
	}
	return total
}
