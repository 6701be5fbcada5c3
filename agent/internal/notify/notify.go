// Package notify tells a service manager how the daemon is doing, in
// systemd's sd_notify(3) protocol: READY=1 once the daemon is registered,
// STOPPING=1 (with how long the stop may take) once a drain starts, and
// STATUS=… on every phase change. docs/agent.md says what nymph sends when.
package notify

import (
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"time"
)

// SocketEnv names the variable a service manager sets for a daemon that
// reports its own readiness (systemd's Type=notify).
const SocketEnv = "NOTIFY_SOCKET"

// WriteTimeout bounds one notification: a service manager whose socket is
// full must never stall the phase machine.
const WriteTimeout = 250 * time.Millisecond

// Notifier sends one sd_notify message: newline-separated VAR=VALUE
// assignments (READY=1, STOPPING=1, STATUS=…). Notify must return quickly;
// its error is logged, never fatal.
type Notifier interface {
	Notify(state string) error
}

// SD sends sd_notify messages as datagrams to one unix socket.
type SD struct {
	addr *net.UnixAddr
}

var _ Notifier = (*SD)(nil)

// NewSD returns a notifier for socket: a filesystem path, or an abstract
// socket name written with a leading '@'. Other forms (systemd also knows
// vsock: addresses) are an error.
func NewSD(socket string) (*SD, error) {
	if !strings.HasPrefix(socket, "/") && !strings.HasPrefix(socket, "@") {
		return nil, fmt.Errorf("%s=%q: want an absolute path or an @abstract name", SocketEnv, socket)
	}
	// Go's unix sockaddr maps a leading '@' to the abstract namespace.
	return &SD{addr: &net.UnixAddr{Name: socket, Net: "unixgram"}}, nil
}

// Notify sends state as one datagram. It dials afresh each time: messages
// are rare, and a service manager that re-created its socket (systemctl
// daemon-reexec) is reached again without a reconnect path.
func (n *SD) Notify(state string) error {
	conn, err := net.DialUnix("unixgram", nil, n.addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	// A socket deadline: real time, whatever clock the daemon reads.
	if err := conn.SetWriteDeadline(time.Now().Add(WriteTimeout)); err != nil {
		return err
	}
	_, err = conn.Write([]byte(state))
	return err
}

// FromEnv reports the notifier $NOTIFY_SOCKET asks for: nil when it is
// unset (not run by a service manager that wants to hear from us).
func FromEnv(getenv func(string) string) (Notifier, error) {
	socket := getenv(SocketEnv)
	if socket == "" {
		return nil, nil
	}
	n, err := NewSD(socket)
	if err != nil {
		return nil, err
	}
	return n, nil
}

// Service is what the daemon tells its service manager: READY=1 once,
// after the first hello; STOPPING=1 once, when a drain (or termination)
// starts for any reason; STATUS=… on phase changes. Failures are logged
// once at warn, then at debug. Its methods are safe for concurrent use and
// do nothing on a nil Service or one without a Notifier.
type Service struct {
	n        Notifier
	log      *slog.Logger
	ready    atomic.Bool
	stopping atomic.Bool
	failed   atomic.Bool
	// extend is how long a drain may take, sent with STOPPING=1 so a
	// --grace longer than the unit's TimeoutStopSec is not cut short.
	extend time.Duration
}

// New returns a Service that sends through n (nil: nowhere) and tells the
// service manager a stop may take up to stopBudget.
func New(n Notifier, log *slog.Logger, stopBudget time.Duration) *Service {
	return &Service{n: n, log: log, extend: stopBudget}
}

func (s *Service) send(state string) {
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

// Registered sends READY=1 the first time a hello is answered; a later
// hello (the control plane let go of this worker) only updates STATUS.
func (s *Service) Registered(workerID, queue string) {
	status := fmt.Sprintf("STATUS=registered as %s, queue %s", workerID, queue)
	if s != nil && s.ready.CompareAndSwap(false, true) {
		s.send("READY=1\n" + status)
		return
	}
	s.send(status)
}

// PhaseChange is a phase change as the daemon's phase machine reports it
// (agent/phase.go).
type PhaseChange struct {
	Phase    string // the phase's wire name
	Stopping bool   // the daemon has begun to leave (draining, terminating)
	Reason   string // why it stops, once it does ("": none yet)
	WorkerID string
	Inflight int
}

// Phase reports a phase change; the first stopping one also sends
// STOPPING=1.
func (s *Service) Phase(c PhaseChange) {
	status := fmt.Sprintf("STATUS=phase %s, worker %s, %d in flight", c.Phase, c.WorkerID, c.Inflight)
	if c.Reason != "" {
		status = fmt.Sprintf("STATUS=phase %s (%s), worker %s, %d in flight", c.Phase, c.Reason, c.WorkerID, c.Inflight)
	}
	if c.Stopping && s != nil && s.stopping.CompareAndSwap(false, true) {
		s.send(fmt.Sprintf("STOPPING=1\nEXTEND_TIMEOUT_USEC=%d\n%s", s.extend.Microseconds(), status))
		return
	}
	s.send(status)
}
