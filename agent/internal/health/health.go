// Package health is nymph's record of how it is doing — phase, run state,
// the requests in flight by role, the loop's pulse — and the ready and live
// rules read from it (docs/agent.md, after the readiness seed), served on
// the introspection address as /status, /readyz and /livez. It does no
// work of its own: the daemon reports to it, and it answers.
package health

import (
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// Run states: the daemon's local view, never sent over the wire.
const (
	RunStarting    = "Starting"
	RunPolling     = "Polling"
	RunBackoff     = "Backoff"
	RunHibernating = "Hibernating"
	RunDraining    = "Draining"
)

// Default bounds of the ready and live rules (docs/design.md §6).
const (
	// DefaultRequestOverdue is one HTTP attempt deadline: a request the
	// control plane has not answered by then makes the daemon unready
	// (server_unavailable) even while the client is still retrying it.
	DefaultRequestOverdue = 30 * time.Second
	// DefaultRequestStall is twice a complete retry budget: only a request
	// stuck beyond any legitimate retry window makes the daemon not live, so
	// a control-plane outage alone never triggers a liveness restart.
	DefaultRequestStall = 120 * time.Second
	// DefaultLoopStall is how old the main loop's progress tick may get
	// before the daemon reports event_loop_stalled.
	DefaultLoopStall = 30 * time.Second
)

// The roles of the control-plane exchanges Health tracks.
const (
	RoleHello = "hello"
	RolePoll  = "poll"
	RoleAck   = "ack"
	RoleBye   = "bye"
)

// The failure reasons of docs/design.md §6.
const (
	FailedRegistration = "failed:registration" // hello refused, or its retries spent
	FailedRuntime      = "failed:runtime"      // the loop panicked, or another error ended Run
	FailedShutdown     = "failed:shutdown"     // shutdown could not confirm a body's cleanup
)

// Ready and live reasons that are not parameterised by a role or a failure.
const (
	ReasonReady            = "ready"
	ReasonLive             = "live"
	ReasonNotStarted       = "not_started"
	ReasonRegistering      = "registering"
	ReasonSetup            = "setup"
	ReasonDraining         = "draining"
	ReasonPollerStopped    = "poller_stopped"
	ReasonEventLoopStalled = "event_loop_stalled"
	ReasonStopped          = "stopped"

	// Prefixes: the role follows the colon. server_unavailable (ready) is
	// a failed exchange or one unanswered past RequestOverdue;
	// request_stalled (live) is one unanswered past RequestStall.
	ReasonServerUnavailable = "server_unavailable:"
	ReasonRequestStalled    = "request_stalled:"
)

// Options bounds the ready and live rules. Zero fields take the
// defaults above.
type Options struct {
	// RequestOverdue is the readiness bound for an outstanding request. Set
	// it to at least the longest single HTTP attempt, a long poll included:
	// an idle long poll is healthy.
	RequestOverdue time.Duration
	// RequestStall is the liveness bound for an outstanding request.
	RequestStall time.Duration
	// LoopStall is the liveness bound for the age of the main loop's tick.
	LoopStall time.Duration
}

func (o Options) withDefaults() Options {
	if o.RequestOverdue <= 0 {
		o.RequestOverdue = DefaultRequestOverdue
	}
	if o.RequestStall <= 0 {
		o.RequestStall = DefaultRequestStall
	}
	if o.LoopStall <= 0 {
		o.LoopStall = DefaultLoopStall
	}
	return o
}

// Tracker is the daemon's health record: the agent records what happens, and
// Snapshot projects ready and live from it as a pure function of the time.
// It performs no I/O and holds its lock only briefly, so a probe served from
// another goroutine answers even while the main loop is stuck. It is safe for
// concurrent use.
type Tracker struct {
	clock clock.Clock
	opts  Options

	mu            sync.Mutex
	created       time.Time
	started       time.Time // zero until the main loop shows a sign of life
	lastTick      time.Time
	phase         Phase
	runState      string
	registered    bool
	workerID      string
	hostKey       string
	queue         string
	inflight      int
	warm          int
	pollerRunning bool
	failed        string
	stopped       bool
	roles         map[string]*roleRecord
	nextRequest   uint64
	finished      map[string]int // runs ended, by outcome state
}

type roleRecord struct {
	lastOK      time.Time
	lastResult  string               // "", "ok" or "error"
	outstanding map[uint64]time.Time // request → start
}

// New returns a record in phase booting, before the main loop. clk is read
// once per recording and per snapshot (zero: real time).
func New(clk clock.Clock, opts Options) *Tracker {
	return &Tracker{
		clock:   clk,
		opts:    opts.withDefaults(),
		created: clk.Now(),
		phase:   Phase{Name: wire.PhaseBooting},
		roles:   map[string]*roleRecord{},
	}
}

// markStarted records the first sign of life of the main loop; before it the
// daemon is neither ready nor live (not_started).
func (h *Tracker) markStarted(now time.Time) {
	if h.started.IsZero() {
		h.started = now
	}
}

// Phase is the daemon's phase as its phase machine reports it
// (agent/phase.go): the record does not judge phases itself.
type Phase struct {
	// Name is the phase's wire name: booting or one of the wire.Phase
	// values.
	Name string
	// NotReady is why the daemon does not count as ready in this phase
	// (ReasonSetup, ReasonDraining): it claims nothing. "" when the phase
	// leaves readiness to the other rules.
	NotReady string
}

// SetPhase records the daemon's phase.
func (h *Tracker) SetPhase(phase Phase) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.phase = phase
}

// SetRunState records the local run state (RunStarting … RunDraining). It
// marks the main loop as started.
func (h *Tracker) SetRunState(s string) {
	now := h.clock.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.markStarted(now)
	h.runState = s
}

// Registered records the control plane's answer to hello.
func (h *Tracker) Registered(workerID, hostKey, queue string) {
	now := h.clock.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.markStarted(now)
	h.registered = true
	h.workerID, h.hostKey, h.queue = workerID, hostKey, queue
}

// Unregistered records that the registration is gone (the control plane
// answered 410) and the daemon must say hello again.
func (h *Tracker) Unregistered() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.registered = false
	h.workerID = ""
}

// RequestStarted records the start of one control-plane request of role
// (RoleHello, RolePoll, RoleAck or RoleBye). The request is outstanding until
// done is called with whether the control plane answered it; the answer
// becomes the role's latest result. Calls of done after the first are ignored.
func (h *Tracker) RequestStarted(role string) (done func(ok bool)) {
	now := h.clock.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.markStarted(now)
	r := h.role(role)
	h.nextRequest++
	id := h.nextRequest
	r.outstanding[id] = now
	var once sync.Once
	return func(ok bool) {
		once.Do(func() {
			end := h.clock.Now()
			h.mu.Lock()
			defer h.mu.Unlock()
			delete(r.outstanding, id)
			if ok {
				r.lastResult = "ok"
				r.lastOK = end
			} else {
				r.lastResult = "error"
			}
		})
	}
}

func (h *Tracker) role(role string) *roleRecord {
	r, ok := h.roles[role]
	if !ok {
		r = &roleRecord{outstanding: map[uint64]time.Time{}}
		h.roles[role] = r
	}
	return r
}

// Tick records progress of the main loop. The agent ticks about once a
// second from the loop itself, so a blocked loop stops ticking.
func (h *Tracker) Tick() {
	now := h.clock.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.markStarted(now)
	h.lastTick = now
}

// RunFinished counts a run that ended with outcome state.
func (h *Tracker) RunFinished(state string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.finished == nil {
		h.finished = map[string]int{}
	}
	h.finished[state]++
}

// SetInflight records the number of invocations running now.
func (h *Tracker) SetInflight(n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.inflight = n
}

// SetWarm records the number of warm processes of resident bodies up now
// (docs/warm.md), busy or idle.
func (h *Tracker) SetWarm(n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.warm = n
}

// PollerRunning records whether the poll loop is running.
func (h *Tracker) PollerRunning(running bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pollerRunning = running
}

// Failed records that the daemon failed, with a reason such as
// FailedRegistration, FailedRuntime or FailedShutdown ("registration" alone
// is accepted too). A reason must be a short token of lower-case letters,
// digits and underscores after "failed:"; anything else is recorded as
// FailedRuntime, so free text — an error message — never reaches the
// snapshot. The first failure is kept: it is the cause, later ones are
// consequences.
func (h *Tracker) Failed(reason string) {
	if !strings.HasPrefix(reason, "failed:") {
		reason = "failed:" + reason
	}
	if !isReasonToken(strings.TrimPrefix(reason, "failed:")) {
		reason = FailedRuntime
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.failed == "" {
		h.failed = reason
	}
}

// Stopped records that shutdown finished.
func (h *Tracker) Stopped() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopped = true
	h.pollerRunning = false
}

// isReasonToken reports whether s is 1–32 of [a-z0-9_].
func isReasonToken(s string) bool {
	if len(s) == 0 || len(s) > 32 {
		return false
	}
	for _, c := range []byte(s) {
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// Snapshot is a read-only view of the daemon's health for /status, /readyz and
// /livez. It carries identity, states, reasons, counts and ages only — never
// payloads, tokens, argv, env or error messages. Ages are seconds; an age of
// something that has not happened yet is null.
type Snapshot struct {
	WorkerID    string `json:"worker_id"`
	Queue       string `json:"queue"`
	HostKey     string `json:"host_key"`
	Phase       string `json:"phase"`
	RunState    string `json:"run_state"`
	Ready       bool   `json:"ready"`
	ReadyReason string `json:"ready_reason"`
	Live        bool   `json:"live"`
	LiveReason  string `json:"live_reason"`
	Inflight    int    `json:"inflight"`
	// WarmProcesses counts the warm processes of resident bodies up now.
	WarmProcesses int  `json:"warm_processes"`
	PollerRunning bool `json:"poller_running"`

	UptimeS          float64  `json:"uptime_s"`
	SinceLastTickS   *float64 `json:"since_last_tick_s"`
	SinceLastPollOKS *float64 `json:"since_last_poll_ok_s"`

	// Roles holds each role that has made a request.
	Roles map[string]RoleStatus `json:"roles"`
	// Finished counts the runs that ended, by outcome state.
	Finished map[string]int `json:"finished,omitempty"`
}

// RoleStatus is the progress of one role of control-plane exchange.
type RoleStatus struct {
	// LastResult is "ok" or "error" for the latest answered request, "" if
	// none has been answered yet.
	LastResult string `json:"last_result"`
	// LastOKAgeS is the age of the latest successful exchange.
	LastOKAgeS *float64 `json:"last_ok_age_s"`
	// Outstanding counts the requests of the role in flight.
	Outstanding int `json:"outstanding"`
	// OutstandingAgeS is the age of the oldest outstanding request.
	OutstandingAgeS *float64 `json:"outstanding_age_s"`
}

// healthRoleOrder fixes the order roles are judged in, so a reason is stable when
// several roles are unhealthy at once.
var healthRoleOrder = []string{RoleHello, RolePoll, RoleAck, RoleBye}

func (h *Tracker) orderedRoles() []string {
	names := make([]string, 0, len(h.roles))
	for name := range h.roles {
		names = append(names, name)
	}
	slices.SortFunc(names, func(a, b string) int {
		ia, ib := slices.Index(healthRoleOrder, a), slices.Index(healthRoleOrder, b)
		if ia < 0 {
			ia = len(healthRoleOrder)
		}
		if ib < 0 {
			ib = len(healthRoleOrder)
		}
		if ia != ib {
			return ia - ib
		}
		return strings.Compare(a, b)
	})
	return names
}

func (r *roleRecord) oldestOutstanding() (time.Time, bool) {
	var oldest time.Time
	for _, t := range r.outstanding {
		if oldest.IsZero() || t.Before(oldest) {
			oldest = t
		}
	}
	return oldest, !oldest.IsZero()
}

// Snapshot reports the daemon's health now.
func (h *Tracker) Snapshot() Snapshot {
	now := h.clock.Now()
	h.mu.Lock()
	defer h.mu.Unlock()

	s := Snapshot{
		WorkerID:      h.workerID,
		Queue:         h.queue,
		HostKey:       h.hostKey,
		Phase:         h.phase.Name,
		RunState:      h.runState,
		Inflight:      h.inflight,
		WarmProcesses: h.warm,
		PollerRunning: h.pollerRunning,
		UptimeS:       now.Sub(h.created).Seconds(),
		Roles:         make(map[string]RoleStatus, len(h.roles)),
		Finished:      maps.Clone(h.finished),
	}
	if !h.lastTick.IsZero() {
		s.SinceLastTickS = new(now.Sub(h.lastTick).Seconds())
	}
	if p, ok := h.roles[RolePoll]; ok && !p.lastOK.IsZero() {
		s.SinceLastPollOKS = new(now.Sub(p.lastOK).Seconds())
	}
	for name, r := range h.roles {
		rs := RoleStatus{LastResult: r.lastResult, Outstanding: len(r.outstanding)}
		if !r.lastOK.IsZero() {
			rs.LastOKAgeS = new(now.Sub(r.lastOK).Seconds())
		}
		if t, ok := r.oldestOutstanding(); ok {
			rs.OutstandingAgeS = new(now.Sub(t).Seconds())
		}
		s.Roles[name] = rs
	}
	s.Ready, s.ReadyReason = h.readiness(now)
	s.Live, s.LiveReason = h.liveness(now)
	return s
}

// readiness answers "should this daemon count as serving its queue?". The
// first rule that fails names the reason. h.mu is held.
func (h *Tracker) readiness(now time.Time) (bool, string) {
	// A daemon that is not live is not ready either — failed, stopped, not
	// started, or a stalled loop that claims nothing whatever its last poll
	// said — and the live reason says why.
	if live, reason := h.liveness(now); !live {
		return false, reason
	}
	switch {
	case !h.registered:
		return false, ReasonRegistering
	case h.phase.NotReady != "":
		return false, h.phase.NotReady
	case h.runState == RunDraining:
		return false, ReasonDraining
	}
	// The control plane is unavailable to a role whose latest exchange
	// failed, or whose oldest request has gone unanswered for longer than
	// RequestOverdue even though the client may still be retrying it.
	for _, name := range h.orderedRoles() {
		r := h.roles[name]
		t, outstanding := r.oldestOutstanding()
		if r.lastResult == "error" || outstanding && now.Sub(t) > h.opts.RequestOverdue {
			return false, ReasonServerUnavailable + name
		}
	}
	if !h.pollerRunning {
		return false, ReasonPollerStopped
	}
	return true, ReasonReady
}

// liveness answers "is this daemon's local machinery progressing?". A
// control-plane outage alone never makes it false: only a request stuck past
// any retry window does. h.mu is held.
func (h *Tracker) liveness(now time.Time) (bool, string) {
	switch {
	case h.failed != "":
		return false, h.failed
	case h.stopped:
		return false, ReasonStopped
	case h.started.IsZero():
		return false, ReasonNotStarted
	}
	// The stall clock starts at the first tick: before it the daemon is in
	// bounded start-up work (spooled acks, hello retries), whose hung
	// requests request_stalled catches.
	if !h.lastTick.IsZero() && now.Sub(h.lastTick) > h.opts.LoopStall {
		return false, ReasonEventLoopStalled
	}
	for _, name := range h.orderedRoles() {
		if t, ok := h.roles[name].oldestOutstanding(); ok && now.Sub(t) > h.opts.RequestStall {
			return false, ReasonRequestStalled + name
		}
	}
	return true, ReasonLive
}
