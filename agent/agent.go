package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
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
// out; the process exits 1.
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

	// spot: EC2 spot notices for the loop (spot.go); nil when not watching.
	spotc        <-chan SpotNotice
	spotInterval time.Duration // tests; zero: DefaultSpotInterval
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
	setupBusy    bool
	hostSetupOK  bool
	hostSetupErr bool
	draining     bool
	byeReason    string
	idleSince    time.Time
	pollFailures int
	spotReclaim  time.Time // spot: when EC2 reclaims the instance (zero: no notice)
}

type setupDone struct {
	result wire.SetupResult
	host   bool // a --host-setup command, not a CP command
	index  int
}

// Run runs the daemon until it has drained and said bye (nil), or hello
// failed (ErrHelloFailed), or start-up failed.
func (a *Agent) Run(ctx context.Context) error {
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

	a.runner = NewRunner(RunnerConfig{
		Workdir: cfg.Workdir, KillAfter: cfg.KillAfter,
		BaseEnv: DefaultBaseEnv(os.Getenv, cfg.PassEnv...), Logger: a.log, RunAs: a.runAs,
	})
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
	return a.loop(ctx, st, hello)
}

// hello says hello with bounded, jittered retries.
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
			a.log.Error("hello failed", "attempt", attempt, "error", err.Error())
			return session{}, fmt.Errorf("%w: %v", ErrHelloFailed, err)
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
func (a *Agent) loop(ctx context.Context, st *state, hello wire.HelloRequest) error {
	cfg := a.cfg
	a.setupc = make(chan setupDone, 1)
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
	go a.runHostSetup(ctx)
	st.setupBusy = len(cfg.HostSetup) > 0
	if !st.setupBusy {
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
			a.setupFinished(ctx, st, ev)
			kick()
		case r := <-runDone:
			a.runFinished(ctx, st, r)
			kick()
		case <-tick.C:
			a.health.Tick()
			a.health.SetInflight(len(st.runs))
			if cfg.KeepAlive > 0 && !st.draining && st.phase == wire.PhaseReady && len(st.runs) == 0 &&
				!st.setupBusy && time.Since(st.idleSince) >= cfg.KeepAlive {
				a.log.Info("idle for keep-alive; draining", "keep_alive", cfg.KeepAlive)
				a.startDrain(st, wire.ByeIdle)
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
	}
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
// (SIGTERM to its process group, then SIGKILL after --kill-after) and
// abandoned to the control plane, which hands it out again after bye.
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

// finish waits for killed bodies, flushes acks (bounded) and says bye once.
func (a *Agent) finish(st *state) error {
	abandoned := 0
	deadline := time.After(a.cfg.KillAfter + 5*time.Second)
	for id, r := range st.runs {
		select {
		case <-r.run.Done():
		case <-deadline:
		}
		if o := r.run.Outcome(); o.Abandoned || !isDone(r.run) {
			abandoned++
		} else {
			a.submitAck(context.Background(), r, o)
		}
		delete(st.runs, id)
	}
	flushCtx, cancel := context.WithTimeout(context.Background(), byeTimeout+a.cfg.KillAfter)
	if left := a.acker.Flush(flushCtx); left > 0 {
		a.log.Warn("acks still pending at exit; they stay spooled for the next start", "pending", left)
	}
	cancel()
	a.bye(st, abandoned)
	a.health.PollerRunning(false)
	a.health.Stopped()
	a.log.Info("exit", "reason", st.byeReason, "inflight_abandoned", abandoned)
	if st.byeReason == wire.ByeHelloFailed {
		return ErrHelloFailed
	}
	return nil
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
	req := wire.PollRequest{
		WorkerID:            st.sess.workerID,
		Queue:               a.cfg.Queue,
		Invocations:         a.inflightIDs(st),
		Phase:               st.phase,
		HostKey:             hello.HostKey,
		UpdatedCapabilities: &wire.Capabilities{MaxConcurrency: &a.cfg.Capacity, CurrentInvocations: ptr(len(st.runs))},
		SetupResults:        st.setupResults,
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
		if herr != nil {
			a.health.Failed("failed:registration")
			st.byeReason = wire.ByeHelloFailed
			a.terminate(st)
			return 0
		}
		st.sess = sess
		a.runner.cfg.WorkerID = sess.workerID
		return 0
	case err != nil:
		st.pollFailures++
		a.health.SetRunState(RunBackoff)
		wait := min(st.sess.interval*time.Duration(1<<min(st.pollFailures, 4)), st.sess.staleAfter/3)
		a.log.Warn("poll failed", "error", err.Error(), "retry_in", wait)
		return jitter(max(wait, st.sess.interval))
	}
	st.pollFailures = 0
	st.setupResults = nil
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
				a.log.Info("cancel", "invocation_id", c.InvocationID, "attempt", r.run.Attempt())
				r.run.Cancel()
			}
		case wire.CommandDrain:
			if !st.draining {
				a.log.Info("drain command: draining", "grace", a.cfg.Grace)
				a.startDrain(st, wire.ByeDrain)
			}
		}
	}
	a.nextSetup(ctx, st)
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
	o := r.run.Outcome()
	if o.Abandoned {
		return
	}
	a.submitAck(ctx, r, o)
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

// runHostSetup runs --host-setup commands in order, each with sh -c, and
// reports each on events. A failing command stops the rest: the worker stays
// in setup (heartbeating, never claiming) so an operator sees it.
func (a *Agent) runHostSetup(ctx context.Context) {
	for i, cmd := range a.cfg.HostSetup {
		code, tail, dur, err := a.runner.Exec(ctx, []string{"/bin/sh", "-c", cmd}, a.cfg.Workdir)
		res := wire.SetupResult{Status: wire.SetupSucceeded, ExitCode: code, DurationMS: dur.Milliseconds(), OutputTail: tail}
		if err != nil || code != 0 {
			res.Status = wire.SetupFailed
		}
		last := i == len(a.cfg.HostSetup)-1 || res.Status == wire.SetupFailed
		select {
		case a.setupc <- setupDone{result: res, host: true, index: i}:
		case <-ctx.Done():
			return
		}
		if last {
			return
		}
	}
}

func (a *Agent) setupFinished(ctx context.Context, st *state, ev setupDone) {
	if ev.host {
		a.log.Info("host setup", "index", ev.index, "status", ev.result.Status, "exit_code", ev.result.ExitCode,
			"duration_ms", ev.result.DurationMS)
		switch {
		case ev.result.Status == wire.SetupFailed:
			st.setupBusy = false
			st.hostSetupErr = true
			a.log.Error("host setup failed; staying in setup without claiming", "index", ev.index)
		case ev.index == len(a.cfg.HostSetup)-1:
			st.setupBusy = false
			st.hostSetupOK = true
		}
		return
	}
	st.setupBusy = false
	st.setupResults = append(st.setupResults, ev.result)
	a.log.Info("setup command", "command_id", ev.result.CommandID, "status", ev.result.Status, "exit_code", ev.result.ExitCode)
	a.nextSetup(ctx, st)
}

// nextSetup starts the next control-plane setup command, if one waits and
// none runs, switching the phase to setup (heartbeat yes, claim no).
func (a *Agent) nextSetup(ctx context.Context, st *state) {
	if st.setupBusy || len(st.setupQueue) == 0 || st.draining || !st.hostSetupOK {
		return
	}
	c := st.setupQueue[0]
	st.setupQueue = st.setupQueue[1:]
	st.setupBusy = true
	a.setPhase(st, wire.PhaseSetup)
	go func() {
		code, tail, dur, err := a.runner.Exec(ctx, c.Argv, a.cfg.Workdir)
		res := wire.SetupResult{CommandID: c.CommandID, Status: wire.SetupSucceeded, ExitCode: code, DurationMS: dur.Milliseconds(), OutputTail: tail}
		if err != nil || code != 0 {
			res.Status = wire.SetupFailed
		}
		a.setupc <- setupDone{result: res}
	}()
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
