package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/hostkey"
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

// ErrHelloFailed is returned by Run when hello was refused or its retries ran
// out: exit 1, or exit 3 when the error also matches ErrHelloRefused
// (ExitCode).
var ErrHelloFailed = errors.New("hello failed")

// Agent is one nymph process.
type Agent struct {
	cfg    Config
	log    *slog.Logger
	health *Health
	runner *Runner
	acker  *Acker

	notify *serviceNotify // READY/STOPPING/STATUS to a service manager (sdnotify.go)
	runAs  *RunAs         // --run-as, resolved at New; nil: the daemon's account

	stopc  chan struct{} // closed by the first Stop: drain
	hurryc chan struct{} // closed by the second Stop: skip the grace
	stops  int
	mu     sync.Mutex

	setupc chan setupDone // setup results to the loop

	ackMu   sync.Mutex
	ackDone map[string]func(ok bool) // health bookkeeping of acks in flight

	// testHookRunStarted, when set, is called on the loop's goroutine as
	// each body starts (tests synchronise on it instead of sleeping).
	testHookRunStarted func(invocationID string)
	// testHookPolled, when set, is called on the loop's goroutine after
	// each poll the control plane answered, with what it carried.
	testHookPolled func(req wire.PollRequest)
	// testHookFlushing, when set, is called as the final ack flush starts,
	// before it waits (tests release a held ack there).
	testHookFlushing func()

	// spot: EC2 spot notices for the loop (spot.go); nil when not watching.
	spotc        <-chan SpotNotice
	spotInterval time.Duration // tests; zero: DefaultSpotInterval

	// testRunnerConfig, when set, adjusts the runner's config before Run
	// makes the runner (tests: hooks, the group liveness check).
	testRunnerConfig func(*RunnerConfig)
	// finishSlack is how much longer than --kill-after finish waits for
	// killed bodies (zero: defaultFinishSlack; tests shorten it).
	finishSlack time.Duration
}

// New returns an agent for cfg; Run starts it.
func New(cfg Config) (*Agent, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	var runAs *RunAs
	if cfg.RunAs != "" {
		if runAs, err = LookupRunAs(cfg.RunAs, os.Geteuid()); err != nil {
			return nil, err
		}
		if err := runAs.reachable(cfg.Workdir); err != nil {
			return nil, err
		}
	}
	return &Agent{
		runAs:  runAs,
		cfg:    cfg,
		log:    cfg.Logger,
		health: NewHealth(time.Now, HealthOptions{RequestOverdue: requestTimeout, RequestStall: 4 * requestTimeout}),
		notify: newServiceNotify(cfg),
		stopc:  make(chan struct{}),
		hurryc: make(chan struct{}),
	}, nil
}

// Health reports the agent's health record (for tests and introspection).
func (a *Agent) Health() *Health { return a.health }

// Stop asks the agent to drain (the first call: a signal) and then to skip
// the grace period (a second call: a second signal).
func (a *Agent) Stop() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stops++
	switch a.stops {
	case 1:
		close(a.stopc)
	case 2:
		close(a.hurryc)
	}
}

// session is what one hello answered.
type session struct {
	workerID   string
	token      string
	staleAfter time.Duration
	interval   time.Duration
	api        *client.Client
}

// running is one invocation in flight.
type running struct {
	run     *Run
	session session // the worker (and token) that claimed it
}

// loop state, owned by Run's goroutine.
type state struct {
	phase        string
	sess         session
	runs         map[string]*running // by invocation id
	setupQueue   []wire.Command      // CP setup commands not yet run, in order
	setupSeen    map[string]bool
	setupResults []wire.SetupResult // finished, not yet reported
	setupBusy    bool               // a setup command (host or CP) runs
	hostSetupOK  bool               // every --host-setup command succeeded
	// hostSetupErr: a --host-setup command failed and is not being rerun.
	// The daemon stays in setup (never claims) but runs control-plane setup
	// commands, so an operator can repair the host; after one succeeds the
	// host setup reruns from hostSetupNext, the command that failed.
	hostSetupErr     bool
	hostSetupNext    int
	hostSetupFailure wire.SetupResult // what failed, reported again to a new worker after a re-hello
	hostSetupRerun   bool             // a CP setup command succeeded since the failure
	setupRunning     string           // the setup command running, as the log names it (while setupBusy)
	notReady         string           // why keep-alive found the daemon not ready (empty: it was ready)
	// setupCtx bounds every setup command: cancelled when the daemon
	// terminates, so a hung one is killed (SIGTERM, --kill-after, SIGKILL)
	// instead of outliving the process; setupWG counts their goroutines.
	setupCtx  context.Context
	stopSetup context.CancelFunc
	setupWG   sync.WaitGroup
	loopDone  chan struct{} // closed as the loop returns: no one reads setupc any more

	draining     bool
	byeReason    string
	helloErr     error // why the hello after a 410/401 failed: what Run returns
	idleSince    time.Time
	pollFailures int
	spotReclaim  time.Time // spot: when EC2 reclaims the instance (zero: no notice)
	abandoned    int       // runs whose outcome is not known, for bye's inflight_abandoned
}

type setupDone struct {
	result wire.SetupResult
	host   bool // a --host-setup command, not a CP command
	index  int
}

// Run runs the daemon until it has drained and said bye (nil), or hello
// failed (ErrHelloFailed), or start-up failed. Any other error — start-up,
// or the loop's panic (ErrLoopPanicked) — reads failed:runtime in health.
func (a *Agent) Run(ctx context.Context) (err error) {
	defer func() {
		if err != nil && !errors.Is(err, ErrHelloFailed) && !errors.Is(err, ErrNotReady) {
			a.health.Failed(FailedRuntime)
		}
	}()
	cfg := a.cfg
	// A stop before the loop runs (during boot or hello's retries) cancels
	// what is under way; inside the loop it starts the drain.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-a.stopc:
			cancel()
		case <-ctx.Done():
		}
	}()
	a.health.SetPhase(wire.PhaseBooting)
	a.health.SetRunState(RunStarting)

	stopIntrospect, bound, err := ServeIntrospect(cfg.IntrospectAddr, a.health, a.log)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = stopIntrospect(sctx)
	}()
	if bound != "" {
		a.log.Info("introspection listening", "addr", bound)
	}
	if err := os.MkdirAll(cfg.Workdir, 0o700); err != nil {
		return fmt.Errorf("workdir: %w", err)
	}
	spool, err := OpenSpool(cfg.StateDir)
	if err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	a.ackDone = map[string]func(bool){}
	a.acker = NewAcker(spool, AckerOptions{Logger: a.log, HTTP: cfg.HTTP, OnAnswered: a.ackAnswered})
	machineID, source, err := MachineID(ctx, cfg.MachineID, MachineIDOptions{IMDSEndpoint: cfg.IMDSEndpoint})
	if err != nil {
		return fmt.Errorf("machine id: %w", err)
	}
	bootID := BootID()
	hk := hostkey.Of(cfg.HostSetup)
	a.log.Info("booting", "machine_id", machineID, "machine_id_source", source, "host_key", hk, "queue", cfg.Queue)
	// spot: watch for interruption notices on EC2 or at an explicit endpoint,
	// until Run returns (a signal's drain must still see a reclaim coming).
	if endpoint, ok := spotEndpoint(cfg.IMDSEndpoint, source, os.Getenv); ok {
		spotCtx, stopSpot := context.WithCancel(context.WithoutCancel(ctx))
		defer stopSpot()
		a.spotc = WatchSpot(spotCtx, SpotOptions{Endpoint: endpoint, Interval: a.spotInterval, Logger: a.log})
		a.log.Info("watching for spot interruption notices", "imds", endpoint)
	}

	// Acks a previous process spooled go first: its outcomes must land before
	// this hello retires that process's worker and hands its work out again.
	resendCtx, cancelResend := context.WithTimeout(ctx, requestTimeout)
	if err := a.acker.Resend(resendCtx); err != nil {
		a.log.Warn("spooled acks not all delivered before hello; still retrying", "error", err.Error())
		go func() { _ = a.acker.Resend(ctx) }()
	}
	cancelResend()

	rcfg := RunnerConfig{
		Workdir: cfg.Workdir, KillAfter: cfg.KillAfter,
		BaseEnv: DefaultBaseEnv(os.Getenv, cfg.PassEnv...), Logger: a.log, RunAs: a.runAs,
	}
	if a.testRunnerConfig != nil {
		a.testRunnerConfig(&rcfg)
	}
	a.runner = NewRunner(rcfg)
	hello := wire.HelloRequest{
		MachineID: machineID, BootID: bootID, Label: cfg.Label, Tags: cfg.Tags,
		Lanes:        []string{cfg.Queue},
		Capabilities: wire.Capabilities{MaxConcurrency: &cfg.Capacity},
		Versions:     map[string]string{"nymph": cfg.Version},
		HostKey:      hk,
	}
	st := &state{runs: map[string]*running{}, setupSeen: map[string]bool{}, idleSince: time.Now()}
	st.sess, err = a.hello(ctx, hello)
	if err != nil {
		if ctx.Err() != nil {
			a.log.Info("stopped before hello was answered; no worker to say bye for")
			a.health.Stopped()
			return nil
		}
		a.health.Failed("failed:registration")
		return err
	}
	a.runner.cfg.WorkerID = st.sess.workerID
	return a.runLoop(ctx, st, hello)
}

// hello says hello with bounded, jittered retries. Its error matches
// ErrHelloFailed, and ErrHelloRefused too when the answer was 401 or 403
// (never retried).
func (a *Agent) hello(ctx context.Context, req wire.HelloRequest) (session, error) {
	enroll := client.New(a.cfg.ControlPlane, a.cfg.EnrollToken, client.WithHTTPClient(a.cfg.HTTP))
	backoff := helloBackoffMin
	for attempt := 1; ; attempt++ {
		done := a.health.RequestStarted("hello")
		res, err := enroll.Hello(ctx, req)
		done(err == nil)
		if err == nil {
			s, err := a.newSession(res)
			if err == nil {
				a.health.Registered(s.workerID, req.HostKey, a.cfg.Queue)
				a.log.Info("hello", "worker_id", s.workerID, "poll_interval", s.interval, "stale_after", s.staleAfter)
				a.notify.readyAfterHello(s.workerID, a.cfg.Queue)
			}
			return s, err
		}
		if !client.Retryable(err) || attempt >= a.cfg.HelloAttempts || ctx.Err() != nil {
			// 401/403: the enrollment token is wrong or revoked; the same
			// token gets the same answer however often it asks.
			refused := errors.Is(err, wire.ErrUnauthorized) || errors.Is(err, wire.ErrForbidden)
			a.log.Error("hello failed", "attempt", attempt, "refused", refused, "error", err.Error())
			if refused {
				return session{}, fmt.Errorf("%w: %w: %w", ErrHelloFailed, ErrHelloRefused, err)
			}
			return session{}, fmt.Errorf("%w: %w", ErrHelloFailed, err)
		}
		a.log.Warn("hello failed; retrying", "attempt", attempt, "error", err.Error())
		if !sleep(ctx, jitter(backoff)) {
			return session{}, fmt.Errorf("%w: %v", ErrHelloFailed, ctx.Err())
		}
		backoff = min(backoff*2, helloBackoffMax)
	}
}

func (a *Agent) newSession(res wire.HelloResponse) (session, error) {
	s := session{
		workerID:   res.WorkerID,
		token:      res.Token,
		staleAfter: time.Duration(res.StaleAfterS * float64(time.Second)),
		interval:   time.Duration(res.PollIntervalS * float64(time.Second)),
		api:        client.New(a.cfg.ControlPlane, res.Token, client.WithHTTPClient(a.cfg.HTTP)),
	}
	if a.cfg.PollInterval > 0 {
		s.interval = a.cfg.PollInterval
	}
	if s.interval <= 0 {
		s.interval = 5 * time.Second
	}
	// The heartbeat ratio is the correctness argument: several polls must
	// fit in the stale window, or a live worker reads stale.
	if s.staleAfter > 0 && s.interval*3 > s.staleAfter {
		return s, fmt.Errorf("poll interval %s is not several times shorter than the control plane's stale_after %s; use at most %s",
			s.interval, s.staleAfter, s.staleAfter/3)
	}
	return s, nil
}

// loop is the phase machine: setup → ready → draining → terminating.
func (a *Agent) loop(ctx context.Context, st *state, hello wire.HelloRequest) (err error) {
	cfg := a.cfg
	a.setupc = make(chan setupDone, 1)
	st.setupCtx, st.stopSetup = context.WithCancel(ctx)
	st.loopDone = make(chan struct{})
	defer func() {
		a.endSetups(st)
		// Leaving by keep-alive without being ready is not a clean exit:
		// the service manager and the operator must see it (exit 4).
		if err == nil && st.byeReason == wire.ByeIdle && st.notReady != "" {
			if !st.hostSetupOK {
				err = fmt.Errorf("%w: %s", ErrHostSetupFailed, st.notReady)
			} else {
				err = fmt.Errorf("%w: %s", ErrNotReady, st.notReady)
			}
		}
	}()
	runDone := make(chan *running, cfg.Capacity+1)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	pollNow := make(chan struct{}, 1)
	kick := func() {
		select {
		case pollNow <- struct{}{}:
		default:
		}
	}
	a.setPhase(st, wire.PhaseSetup)
	a.health.PollerRunning(true)
	if len(cfg.HostSetup) > 0 {
		a.startHostSetup(st, 0)
	} else {
		st.hostSetupOK = true
	}

	timer := time.NewTimer(0)
	defer timer.Stop()
	var graceTimer <-chan time.Time
	var graceEnd time.Time
	graceStarted := false
	stopc, hurryc, ctxDone, spotc := a.stopc, a.hurryc, ctx.Done(), a.spotc
	for {
		select {
		case <-timer.C:
			wait := a.poll(ctx, st, hello, runDone)
			if st.phase == wire.PhaseTerminating {
				return a.finish(st)
			}
			timer.Reset(wait)
		case <-pollNow:
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
			timer.Reset(0)
		case ev := <-a.setupc:
			a.setupFinished(st, ev)
			kick()
		case r := <-runDone:
			a.runFinished(ctx, st, r)
			kick()
		case <-tick.C:
			a.health.Tick()
			a.health.SetInflight(len(st.runs))
			// Keep-alive counts whenever no invocation runs, whatever the
			// phase: a worker that cannot become ready (a failed or hung
			// setup, a workdir it cannot write) must not burn its instance
			// for ever. Each setup command's start and end restart the count.
			if cfg.KeepAlive > 0 && !st.draining && len(st.runs) == 0 && time.Since(st.idleSince) >= cfg.KeepAlive {
				a.keepAliveExpired(st)
				kick()
			}
		case <-stopc:
			stopc = nil
			if !st.draining {
				a.log.Info("signal: draining", "grace", cfg.Grace, "inflight", len(st.runs))
				a.startDrain(st, wire.ByeSignal)
				kick()
			}
		case <-ctxDone:
			ctxDone = nil
			if !st.draining {
				a.startDrain(st, wire.ByeSignal)
			}
			kick()
		case <-hurryc:
			hurryc = nil
			a.log.Info("second signal: skipping the grace period")
			a.terminate(st)
			kick()
		case n, ok := <-spotc: // spot
			if !ok {
				spotc = nil
				break
			}
			a.spotNotice(st, n)
			kick()
		case <-graceTimer:
			graceTimer = nil
			a.log.Warn("grace expired with work still running; terminating", "inflight", len(st.runs))
			a.terminate(st)
			kick()
		}
		// One grace period, whatever started the drain (signal, idle, command,
		// spot notice); a spot reclaim sooner than its end shortens it.
		if st.draining && !graceStarted {
			graceStarted = true
			grace := spotGrace(cfg.Grace, cfg.KillAfter, st.spotReclaim, time.Now())
			graceEnd, graceTimer = time.Now().Add(grace), time.After(grace)
		} else if graceStarted && st.phase == wire.PhaseDraining && !st.spotReclaim.IsZero() {
			if grace := spotGrace(cfg.Grace, cfg.KillAfter, st.spotReclaim, time.Now()); time.Now().Add(grace).Before(graceEnd) {
				graceEnd, graceTimer = time.Now().Add(grace), time.After(grace)
			}
		}
		if st.draining && st.phase == wire.PhaseDraining && len(st.runs) == 0 {
			a.terminate(st)
			kick()
		}
		if st.phase == wire.PhaseTerminating {
			st.stopSetup() // a setup command still running is killed with the bodies
		}
	}
}

// keepAliveExpired drains a daemon that ran no invocation for --keep-alive.
// Ready, that is idleness (exit 0). In setup it could not become ready: a
// host setup that failed and was not repaired, a setup command still
// running after --keep-alive (taken for hung: terminate kills it, SIGTERM
// to its process group, --kill-after, SIGKILL), or a workdir it cannot
// write; st.notReady says which, and Run answers ErrNotReady (exit 4).
func (a *Agent) keepAliveExpired(st *state) {
	ka := a.cfg.KeepAlive
	switch {
	case st.phase != wire.PhaseSetup:
		a.log.Info("idle for keep-alive; draining", "keep_alive", ka)
	case st.hostSetupErr:
		st.notReady = "the host setup failed and was not repaired"
		a.log.Error("host setup failed and was not repaired within keep-alive; draining", "keep_alive", ka)
	case st.setupBusy:
		st.notReady = "a setup command was still running after keep-alive (" + st.setupRunning + ")"
		a.log.Error("a setup command has run for longer than keep-alive: taking it for hung; draining, which kills it",
			"command", st.setupRunning, "keep_alive", ka)
	default:
		st.notReady = "the workdir is not writable"
		a.log.Error("not ready within keep-alive: the workdir is not writable; draining", "workdir", a.cfg.Workdir, "keep_alive", ka)
	}
	a.startDrain(st, wire.ByeIdle)
}

// startDrain enters draining: no more claims, heartbeats go on, in-flight
// work has the grace period to finish (the loop starts its timer).
func (a *Agent) startDrain(st *state, reason string) {
	st.draining = true
	st.byeReason = reason
	a.setPhase(st, wire.PhaseDraining)
	a.health.SetRunState(RunDraining)
}

// terminate ends the drain: every body still running is killed
// (SIGTERM to its process group, then SIGKILL after --kill-after) and,
// unless it had ended on its own first, abandoned to the control plane,
// which hands it out again after bye (finish).
func (a *Agent) terminate(st *state) {
	if st.phase == wire.PhaseTerminating {
		return
	}
	st.draining = true
	if st.byeReason == "" {
		st.byeReason = wire.ByeSignal
	}
	a.setPhase(st, wire.PhaseTerminating)
	for _, r := range st.runs {
		r.run.Kill()
	}
}

// defaultFinishSlack is how much longer than --kill-after finish waits for
// the bodies terminate killed: the runner's killConfirmWait, and margin.
const defaultFinishSlack = 5 * time.Second

// finish waits for the bodies terminate killed (bounded), acks every
// outcome that is known, flushes the acks within the bye budget and then
// says bye once, with inflight_abandoned counting only the runs whose
// outcome is not known.
func (a *Agent) finish(st *state) error {
	a.reap(st)
	a.flushAcks()
	a.bye(st, st.abandoned)
	a.health.PollerRunning(false)
	a.health.Stopped()
	a.log.Info("exit", "reason", st.byeReason, "inflight_abandoned", st.abandoned)
	if st.byeReason == wire.ByeHelloFailed {
		if st.helloErr != nil {
			return st.helloErr // a refusal matches ErrHelloRefused too (exit 3)
		}
		return ErrHelloFailed
	}
	return nil
}

// reap settles every run still in st.runs: first those already over (their
// acks go out at once), then each of the others once it is over, until
// --kill-after plus the finish slack has passed. A body still running then
// could not be confirmed dead: that fails the shutdown (failed:shutdown)
// and it is handed back, counted in inflight_abandoned.
func (a *Agent) reap(st *state) {
	slack := a.finishSlack
	if slack <= 0 {
		slack = defaultFinishSlack
	}
	wait := a.cfg.KillAfter + slack
	deadline, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	ids := slices.Sorted(maps.Keys(st.runs))
	for _, id := range ids {
		if r := st.runs[id]; isDone(r.run) {
			delete(st.runs, id)
			a.settle(context.Background(), st, r)
		}
	}
	for _, id := range ids {
		r, ok := st.runs[id]
		if !ok {
			continue
		}
		delete(st.runs, id)
		select {
		case <-r.run.Done():
			a.settle(context.Background(), st, r)
			continue
		case <-deadline.Done():
		}
		st.abandoned++
		if st.phase == wire.PhaseTerminating {
			a.health.Failed(FailedShutdown)
		}
		pid := r.run.Pid()
		a.log.Error("cleanup not confirmed: the run was still going at the shutdown deadline; handing it back (counted in inflight_abandoned) although its processes may still be running",
			"invocation_id", id, "attempt", r.run.Attempt(), "pid", pid, "pgid", pid, "waited", wait)
	}
	a.health.SetInflight(0)
}

// settle closes the books on a run whose outcome is final. A known outcome
// is acked, even one that came in while the daemon terminated: it is never
// handed back as abandoned work. An abandoned one (killed before it ended)
// is counted for bye, which hands it back. A process group of the run that
// outlived its SIGKILL is logged as an error and, at shutdown, fails it
// (failed:shutdown).
func (a *Agent) settle(ctx context.Context, st *state, r *running) {
	o := r.run.Outcome()
	id, attempt := r.run.InvocationID(), r.run.Attempt()
	if pgid, pids := r.run.Unconfirmed(); pgid != 0 {
		if st.phase == wire.PhaseTerminating {
			a.health.Failed(FailedShutdown)
		}
		msg := "cleanup not confirmed: processes of a finished run outlived SIGKILL; its outcome is acked"
		if o.Abandoned {
			msg = "cleanup not confirmed: processes of the run outlived SIGKILL; handing it back (counted in inflight_abandoned) although they may still be running"
		}
		a.log.Error(msg, "invocation_id", id, "attempt", attempt, "pid", r.run.Pid(), "pgid", pgid, "pids", pids)
	}
	if o.Abandoned {
		st.abandoned++
		a.log.Info("abandoned: killed before it ended; bye hands it back to the queue (counted in inflight_abandoned)",
			"invocation_id", id, "attempt", attempt)
		return
	}
	a.submitAck(ctx, r, o)
}

// flushAcks waits, within the bye budget, for every ack in flight to be
// answered, so an outcome that is known reaches the control plane before
// bye hands the worker's work back.
func (a *Agent) flushAcks() {
	ctx, cancel := context.WithTimeout(context.Background(), byeTimeout)
	defer cancel()
	if a.testHookFlushing != nil {
		a.testHookFlushing()
	}
	if left := a.acker.Flush(ctx); left > 0 {
		a.log.Warn("acks still unanswered at bye; they stay spooled and the next start sends them again (the first outcome counts), but bye may hand their invocations out again meanwhile",
			"pending", left, "invocation_ids", a.acker.Pending())
	}
}

// ErrLoopPanicked is returned by Run when its loop panicked (failed:runtime).
var ErrLoopPanicked = errors.New("the agent's loop panicked")

// runLoop runs the loop. A panic in it is a runtime failure: it is logged
// with its stack, health reads failed:runtime, and salvage stops what runs.
func (a *Agent) runLoop(ctx context.Context, st *state, hello wire.HelloRequest) (err error) {
	defer func() {
		p := recover()
		if p == nil {
			return
		}
		a.health.Failed(FailedRuntime)
		a.log.Error("the agent's loop panicked; stopping every body and exiting", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		err = fmt.Errorf("%w: %v", ErrLoopPanicked, p)
		a.salvage(st)
	}()
	return a.loop(ctx, st, hello)
}

// salvage ends a daemon whose loop panicked, without trusting the loop's
// state machine: every body is killed and waited for (bounded), known
// outcomes are acked and flushed. There is no bye — none of its reasons
// says "crashed" — so the control plane treats the worker as any crashed
// one and hands its work back once it is stale (or as soon as the
// restarted daemon says hello, from a new boot id). A panic here is logged
// and ends it.
func (a *Agent) salvage(st *state) {
	defer func() {
		if p := recover(); p != nil {
			a.log.Error("panicked again while stopping after a panic; bodies may outlive the daemon", "panic", fmt.Sprint(p))
		}
		a.health.PollerRunning(false)
		a.health.Stopped()
	}()
	for _, r := range st.runs {
		r.run.Kill()
	}
	a.reap(st)
	a.flushAcks()
	a.log.Error("exit after a panic, without bye", "inflight_abandoned", st.abandoned)
}

func isDone(r *Run) bool {
	select {
	case <-r.Done():
		return true
	default:
		return false
	}
}

// bye is sent once, after the drain, with a 2 s timeout; a failure is logged
// and ignored: bye is a latency mechanism, never a reliability one.
func (a *Agent) bye(st *state, abandoned int) {
	ctx, cancel := context.WithTimeout(context.Background(), byeTimeout)
	defer cancel()
	done := a.health.RequestStarted("bye")
	err := st.sess.api.Bye(ctx, wire.ByeRequest{WorkerID: st.sess.workerID, Reason: st.byeReason, InflightAbandoned: abandoned})
	done(err == nil)
	if err != nil {
		a.log.Debug("bye failed", "error", err.Error())
	}
}

func (a *Agent) setPhase(st *state, phase string) {
	if st.phase != phase {
		a.log.Info("phase", "phase", phase, "worker_id", st.sess.workerID)
		a.notify.phase(phase, st.byeReason, st.sess.workerID, len(st.runs))
	}
	st.phase = phase
	a.health.SetPhase(phase)
}

// poll sends one heartbeat, handles its commands and reports how long to
// wait before the next.
func (a *Agent) poll(ctx context.Context, st *state, hello wire.HelloRequest, runDone chan<- *running) time.Duration {
	a.maybeReady(st)
	// At most a poll's worth of setup results; the rest go with the next.
	sent := st.setupResults[:min(len(st.setupResults), wire.MaxSetupResults)]
	req := wire.PollRequest{
		WorkerID:            st.sess.workerID,
		Queue:               a.cfg.Queue,
		Invocations:         a.inflightIDs(st),
		Phase:               st.phase,
		HostKey:             hello.HostKey,
		UpdatedCapabilities: &wire.Capabilities{MaxConcurrency: &a.cfg.Capacity, CurrentInvocations: ptr(len(st.runs))},
		SetupResults:        sent,
	}
	pctx, cancel := context.WithTimeout(ctx, requestTimeout)
	if ctx.Err() != nil { // shutting down: the last polls must still go out
		pctx, cancel = context.WithTimeout(context.Background(), requestTimeout)
	}
	done := a.health.RequestStarted("poll")
	resp, err := st.sess.api.Poll(pctx, req)
	cancel()
	done(err == nil)
	switch {
	case errors.Is(err, wire.ErrWorkerGone) || errors.Is(err, wire.ErrUnauthorized):
		// 410: the control plane retired this worker (its work is already
		// handed out again). 401: it no longer knows this worker's token (a
		// newer hello, or a control plane that lost its state). Either way
		// this worker is over: a draining daemon just finishes; any other
		// says hello again and carries on as a new worker.
		if st.draining {
			a.log.Warn("the control plane let go of this worker while it drained", "worker_id", st.sess.workerID, "error", err.Error())
			a.terminate(st)
			return 0
		}
		a.log.Warn("the control plane let go of this worker; saying hello again", "worker_id", st.sess.workerID, "error", err.Error())
		a.health.Unregistered()
		sess, herr := a.hello(ctx, hello)
		if herr != nil && ctx.Err() != nil {
			// Stopped while saying hello again: a clean end, as a stop
			// before the first hello was answered is. No worker is left
			// to say bye for.
			a.log.Info("stopped before the new hello was answered; no worker to say bye for")
			a.terminate(st)
			return 0
		}
		if herr != nil {
			a.health.Failed("failed:registration")
			st.byeReason = wire.ByeHelloFailed
			st.helloErr = herr // a refusal exits 3, not 1
			a.terminate(st)
			return 0
		}
		st.sess = sess
		a.runner.cfg.WorkerID = sess.workerID
		if st.hostSetupErr {
			// The new worker must show why it claims nothing, too.
			st.setupResults = append(st.setupResults, st.hostSetupFailure)
		}
		return 0
	case errors.Is(err, wire.ErrInvalid) && slices.ContainsFunc(sent, isHostSetupResult):
		// A control plane older than host-setup reports refuses a result
		// without a command id, and would refuse every heartbeat carrying
		// it: drop those reports (the log has them) rather than go stale.
		a.log.Warn("the control plane refused host-setup results; not reporting them", "error", err.Error())
		st.setupResults = slices.DeleteFunc(st.setupResults, isHostSetupResult)
		return 0
	case err != nil:
		st.pollFailures++
		a.health.SetRunState(RunBackoff)
		wait := min(st.sess.interval*time.Duration(1<<min(st.pollFailures, 4)), st.sess.staleAfter/3)
		a.log.Warn("poll failed", "error", err.Error(), "retry_in", wait)
		return jitter(max(wait, st.sess.interval))
	}
	st.pollFailures = 0
	st.setupResults = st.setupResults[len(sent):]
	if a.testHookPolled != nil {
		a.testHookPolled(req)
	}
	gotWork := false
	for _, c := range resp.Commands {
		switch c.Type {
		case wire.CommandRun:
			gotWork = a.startRun(ctx, st, c, runDone) || gotWork
		case wire.CommandSetup:
			if !st.setupSeen[c.CommandID] {
				st.setupSeen[c.CommandID] = true
				st.setupQueue = append(st.setupQueue, c)
			}
		case wire.CommandCancel:
			if r, ok := st.runs[c.InvocationID]; ok {
				// reason "superseded": this attempt no longer counts (its work
				// was handed out again, or an outcome won); its cancelled ack
				// is a no-op. "operator": somebody cancelled the invocation.
				// An old control plane sends none.
				a.log.Info("cancel", "invocation_id", c.InvocationID, "attempt", r.run.Attempt(), "reason", c.Reason)
				r.run.Cancel()
			}
		case wire.CommandDrain:
			if !st.draining {
				a.log.Info("drain command: draining", "grace", a.cfg.Grace)
				a.startDrain(st, wire.ByeDrain)
			}
		}
	}
	a.nextSetup(st)
	switch {
	case st.draining:
		a.health.SetRunState(RunDraining)
	case len(st.runs) == 0 && time.Since(st.idleSince) > st.sess.interval:
		a.health.SetRunState(RunHibernating)
	default:
		a.health.SetRunState(RunPolling)
	}
	if gotWork && len(st.runs) < a.cfg.Capacity {
		return 0 // room for more: ask again at once
	}
	return jitter(st.sess.interval)
}

// maybeReady moves setup → ready once host setup succeeded, the setup FIFO
// is empty and the workdir is writable.
func (a *Agent) maybeReady(st *state) {
	if st.phase != wire.PhaseSetup || !st.hostSetupOK || st.setupBusy || len(st.setupQueue) > 0 {
		return
	}
	if err := writable(a.cfg.Workdir); err != nil {
		a.log.Error("workdir not writable; staying in setup", "workdir", a.cfg.Workdir, "error", err.Error())
		return
	}
	a.setPhase(st, wire.PhaseReady)
}

func writable(dir string) error {
	f, err := os.CreateTemp(dir, ".nymph-probe-*")
	if err != nil {
		return err
	}
	name := f.Name()
	f.Close()
	return os.Remove(name)
}

// inflightIDs lists what the poll must report: bodies running, and
// outcomes whose ack the control plane has not answered yet (so it does not
// hand them out again meanwhile). Never nil: an empty list is authoritative.
func (a *Agent) inflightIDs(st *state) []string {
	out := []string{}
	for id := range st.runs {
		out = append(out, id)
	}
	for _, id := range a.acker.Pending() {
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

func (a *Agent) startRun(ctx context.Context, st *state, c wire.Command, runDone chan<- *running) bool {
	inv := c.Invocation
	if inv == nil {
		return false
	}
	if _, ok := st.runs[inv.InvocationID]; ok {
		return false
	}
	if st.draining || st.phase != wire.PhaseReady || len(st.runs) >= a.cfg.Capacity {
		// Not ours to run now. Leaving it out of the next poll's list hands it
		// straight back to the queue.
		a.log.Warn("refusing a run command", "invocation_id", inv.InvocationID, "phase", st.phase, "inflight", len(st.runs))
		return false
	}
	r := &running{run: a.runner.Start(*inv), session: st.sess}
	st.runs[inv.InvocationID] = r
	a.health.SetInflight(len(st.runs))
	a.log.Info("run", "invocation_id", inv.InvocationID, "attempt", inv.Attempt, "worker_id", st.sess.workerID)
	if a.testHookRunStarted != nil {
		a.testHookRunStarted(inv.InvocationID)
	}
	go func() {
		<-r.run.Done()
		runDone <- r
	}()
	return true
}

func (a *Agent) runFinished(ctx context.Context, st *state, r *running) {
	id := r.run.InvocationID()
	if st.runs[id] != r {
		return // already handled at termination
	}
	delete(st.runs, id)
	a.health.SetInflight(len(st.runs))
	if len(st.runs) == 0 {
		st.idleSince = time.Now()
	}
	a.settle(ctx, st, r)
}

// ackAnswered records an ack's final answer in the health record: any
// answer, even a refusal, shows the control plane reachable.
func (a *Agent) ackAnswered(sa SpooledAck, _ wire.AckResponse, err error) {
	key := fmt.Sprintf("%s/%d", sa.Ack.InvocationID, sa.Ack.Attempt)
	a.ackMu.Lock()
	done := a.ackDone[key]
	delete(a.ackDone, key)
	a.ackMu.Unlock()
	if done != nil {
		done(err == nil || !client.Retryable(err))
	}
}

func (a *Agent) submitAck(ctx context.Context, r *running, o Outcome) {
	ack := SpooledAck{
		ControlPlane: a.cfg.ControlPlane,
		WorkerID:     r.session.workerID,
		Token:        r.session.token,
		Ack:          o.Ack(r.session.workerID, r.run.InvocationID(), r.run.Attempt()),
		SpooledAt:    time.Now().UTC(),
	}
	a.ackMu.Lock()
	a.ackDone[fmt.Sprintf("%s/%d", ack.Ack.InvocationID, ack.Ack.Attempt)] = a.health.RequestStarted("ack")
	a.ackMu.Unlock()
	if err := a.acker.Submit(context.WithoutCancel(ctx), ack); err != nil {
		a.log.Error("could not spool an ack; sending it unspooled", "invocation_id", ack.Ack.InvocationID, "error", err.Error())
	}
	a.log.Info("finished", "invocation_id", ack.Ack.InvocationID, "attempt", ack.Ack.Attempt, "state", o.State, "duration", o.Duration)
}

// startHostSetup runs the --host-setup commands from index from on (0 at
// start; the one that failed on a rerun), off the loop's goroutine.
func (a *Agent) startHostSetup(st *state, from int) {
	st.setupBusy, st.idleSince = true, time.Now()
	st.setupRunning = hostSetupText(a.cfg.HostSetup[from])
	st.hostSetupErr, st.hostSetupRerun = false, false
	a.goSetup(st, func(ctx context.Context, report func(setupDone) bool) {
		a.runHostSetup(ctx, from, report)
	})
}

// runHostSetup runs --host-setup commands in order from index from, each
// with sh -c, and reports each. A failing command stops the rest: the worker
// stays in setup (heartbeating, never claiming) until a control-plane setup
// command repairs the host, or its keep-alive runs out.
func (a *Agent) runHostSetup(ctx context.Context, from int, report func(setupDone) bool) {
	for i := from; i < len(a.cfg.HostSetup); i++ {
		cmd := a.cfg.HostSetup[i]
		res := setupResult(a.runner.Exec(ctx, []string{"/bin/sh", "-c", cmd}, a.cfg.Workdir))
		res.Command = hostSetupText(cmd)
		if !report(setupDone{result: res, host: true, index: i}) || res.Status == wire.SetupFailed {
			return
		}
	}
}

// goSetup runs one setup job under st.setupCtx on its own goroutine; report
// hands a result to the loop, or answers false once the loop has returned.
func (a *Agent) goSetup(st *state, job func(ctx context.Context, report func(setupDone) bool)) {
	ctx, setupc, loopDone := st.setupCtx, a.setupc, st.loopDone
	st.setupWG.Add(1)
	go func() {
		defer st.setupWG.Done()
		job(ctx, func(ev setupDone) bool {
			select {
			case setupc <- ev:
				return true
			case <-loopDone:
				return false
			}
		})
	}()
}

// endSetups kills any setup command still running and waits (bounded) until
// it is gone, so none outlives the daemon in its own process group.
func (a *Agent) endSetups(st *state) {
	st.stopSetup()
	close(st.loopDone)
	ended := make(chan struct{})
	go func() {
		st.setupWG.Wait()
		close(ended)
	}()
	t := time.NewTimer(a.cfg.KillAfter + execDrainWait + 5*time.Second)
	defer t.Stop()
	select {
	case <-ended:
	case <-t.C:
		a.log.Warn("a setup command did not end after it was killed")
	}
}

// setupResult is what one setup command's Exec came to. A command that
// could not start has no output of its own: the reason goes in its place.
func setupResult(code int, tail string, dur time.Duration, err error) wire.SetupResult {
	res := wire.SetupResult{Status: wire.SetupSucceeded, ExitCode: code, DurationMS: dur.Milliseconds(), OutputTail: tail}
	if err != nil || code != 0 {
		res.Status = wire.SetupFailed
	}
	if err != nil && tail == "" {
		res.OutputTail = clipString(strings.ToValidUTF8(err.Error(), "\uFFFD"), wire.MaxTailBytes-len("…"))
	}
	return res
}

// hostSetupText is a --host-setup command as a setup result names it:
// valid UTF-8 within wire.MaxSetupTextBytes.
func hostSetupText(cmd string) string {
	cmd = strings.ToValidUTF8(cmd, "\uFFFD")
	if len(cmd) <= wire.MaxSetupTextBytes {
		return cmd
	}
	return clipString(cmd, wire.MaxSetupTextBytes-len("…"))
}

// isHostSetupResult reports whether r is a --host-setup command's result
// (the control plane never queued it, so it has no command id).
func isHostSetupResult(r wire.SetupResult) bool { return r.CommandID == "" }

func (a *Agent) setupFinished(st *state, ev setupDone) {
	// Keep-alive counts from each setup command's start and end: one that
	// runs longer than --keep-alive is taken for hung.
	st.idleSince = time.Now()
	st.setupResults = append(st.setupResults, ev.result)
	if ev.host {
		a.log.Info("host setup", "index", ev.index, "status", ev.result.Status, "exit_code", ev.result.ExitCode,
			"duration_ms", ev.result.DurationMS)
		switch {
		case ev.result.Status == wire.SetupFailed:
			st.setupBusy = false
			st.hostSetupErr, st.hostSetupNext, st.hostSetupFailure = true, ev.index, ev.result
			a.log.Error("host setup failed; staying in setup without claiming until a setup command repairs the host",
				"index", ev.index, "command", clipString(ev.result.Command, 200), "exit_code", ev.result.ExitCode,
				"keep_alive", a.cfg.KeepAlive)
		case ev.index == len(a.cfg.HostSetup)-1:
			st.setupBusy = false
			st.hostSetupOK = true
		default:
			st.setupRunning = hostSetupText(a.cfg.HostSetup[ev.index+1])
		}
	} else {
		st.setupBusy = false
		if st.hostSetupErr && ev.result.Status == wire.SetupSucceeded {
			st.hostSetupRerun = true
		}
		a.log.Info("setup command", "command_id", ev.result.CommandID, "status", ev.result.Status, "exit_code", ev.result.ExitCode)
	}
	a.nextSetup(st)
}

// nextSetup starts the next control-plane setup command, if one waits and
// none runs, switching the phase to setup (heartbeat yes, claim no). They
// run after the host setup, and also after it failed: they are how an
// operator repairs the host. Once the queue is empty and one of them
// succeeded since the failure, the host setup reruns from the command that
// failed.
func (a *Agent) nextSetup(st *state) {
	if st.setupBusy || st.draining {
		return
	}
	if len(st.setupQueue) == 0 {
		if st.hostSetupErr && st.hostSetupRerun {
			a.log.Info("a setup command succeeded; rerunning the host setup", "from_index", st.hostSetupNext)
			a.startHostSetup(st, st.hostSetupNext)
		}
		return
	}
	c := st.setupQueue[0]
	st.setupQueue = st.setupQueue[1:]
	st.setupBusy, st.idleSince = true, time.Now()
	st.setupRunning = "command_id " + c.CommandID
	a.setPhase(st, wire.PhaseSetup)
	a.goSetup(st, func(ctx context.Context, report func(setupDone) bool) {
		res := setupResult(a.runner.Exec(ctx, c.Argv, a.cfg.Workdir))
		res.CommandID = c.CommandID
		report(setupDone{result: res})
	})
}

func ptr[T any](v T) *T { return &v }

// jitter spreads d by ±10% so a fleet does not poll in lockstep.
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return time.Duration(float64(d) * (0.9 + 0.2*rand.Float64()))
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
