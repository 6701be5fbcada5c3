package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/cadence"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/hostkey"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// The fleet simulator's virtual daemons (docs/scale.md): many workers in
// this one process, each speaking nymph's wire (hello, the wake socket, the
// long poll, ack, bye) with nymph's cadence rules, but "running" a body by
// sleeping its duration. A worker is a goroutine and a timer; its wake
// socket one more goroutine blocked in a read, so a thousand idle workers
// cost next to nothing.

// Timing rules taken from nymph (agent/config.go, agent/backoff.go,
// agent/internal/wakeclient).
const (
	simRequestTimeout = 15 * time.Second
	simPingEvery      = 4 * time.Minute
	simBackoffMin     = time.Second
	simBackoffMax     = time.Minute
	simStableAfter    = 30 * time.Second
)

// simJitter spreads d over [0.9·d, 1.1·d), as nymph's jitter does.
func simJitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return time.Duration(float64(d) * (0.9 + 0.2*rand.Float64()))
}

// reqKind is a kind of request a virtual daemon makes.
type reqKind int

const (
	reqHello reqKind = iota
	reqPoll
	reqAck
	reqBye
	reqWakeConnect
	reqWakePing
	reqKinds
)

var reqKindNames = [reqKinds]string{"hello", "poll", "ack", "bye", "wake-connect", "wake-ping"}

// daemonRequests counts the requests the virtual daemons made, by kind.
type daemonRequests [reqKinds]atomic.Int64

func (r *daemonRequests) snapshot() [reqKinds]int64 {
	var out [reqKinds]int64
	for i := range r {
		out[i] = r[i].Load()
	}
	return out
}

// bodyDist draws how long a body runs.
type bodyDist struct {
	kind string // fixed, uniform (on [0, 2·mean]) or exp
	mean time.Duration
}

// parseBodyDist reads "fixed:1s", "uniform:500ms" or "exp:1s".
func parseBodyDist(s string) (bodyDist, error) {
	kind, mean, ok := strings.Cut(s, ":")
	d, err := time.ParseDuration(mean)
	if !ok || err != nil || d < 0 {
		return bodyDist{}, fmt.Errorf("body duration %q: want fixed:D, uniform:D or exp:D (D the mean)", s)
	}
	switch kind {
	case "fixed", "uniform", "exp":
		return bodyDist{kind: kind, mean: d}, nil
	}
	return bodyDist{}, fmt.Errorf("body duration %q: unknown distribution %q", s, kind)
}

func (b bodyDist) String() string { return b.kind + ":" + b.mean.String() }

func (b bodyDist) draw() time.Duration {
	switch b.kind {
	case "uniform":
		return time.Duration(rand.Float64() * 2 * float64(b.mean))
	case "exp":
		return time.Duration(rand.ExpFloat64() * float64(b.mean))
	}
	return b.mean
}

// dynamoCounts counts the DynamoDB requests that reach the store's endpoint,
// from every process of the control plane, by operation; and the
// conditional writes the store refused (ConditionalCheckFailed, or a
// transaction cancelled), by operation.
type dynamoCounts struct {
	requests, failedWrites storetest.Counter
	// failedByTable counts the refused single-item writes by operation and
	// table ("PutItem invocations"), to tell a claim's lost race from
	// another refused write.
	failedByTable storetest.Counter
	// byTarget counts every request by operation, table and index
	// ("Query invocations/claim"; a transaction names each table it
	// writes), to tell which path makes the requests.
	byTarget storetest.Counter
	// busyMS and bytesOut: the milliseconds the store spent serving each
	// operation and the bytes it answered, to tell where its time goes.
	mu               sync.Mutex
	busyMS, bytesOut map[string]int
	// conns counts the connections the store accepted: a client that
	// closes connections it could keep pays a dial per request.
	conns atomic.Int64
}

// storeCounts is a snapshot of dynamoCounts, as the store process serves it.
type storeCounts struct {
	Requests      map[string]int `json:"requests"`
	FailedWrites  map[string]int `json:"failed_writes"`
	FailedByTable map[string]int `json:"failed_by_table"`
	ByTarget      map[string]int `json:"by_target"`
	BusyMS        map[string]int `json:"busy_ms"`
	BytesOut      map[string]int `json:"bytes_out"`
	Connections   int64          `json:"connections"`
}

// countsPath is where the store process serves its counts.
const countsPath = "/__fleet_counts"

// wrap counts each request next serves, and serves the counts at countsPath.
func (c *dynamoCounts) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == countsPath {
			w.Header().Set("Content-Type", "application/json")
			c.mu.Lock()
			out := storeCounts{Requests: c.requests.Snapshot(), FailedWrites: c.failedWrites.Snapshot(), FailedByTable: c.failedByTable.Snapshot(), ByTarget: c.byTarget.Snapshot(),
				BusyMS: maps.Clone(c.busyMS), BytesOut: maps.Clone(c.bytesOut), Connections: c.conns.Load()}
			c.mu.Unlock()
			_ = json.NewEncoder(w).Encode(out)
			return
		}
		op := "other"
		if _, o, ok := strings.Cut(r.Header.Get("X-Amz-Target"), "."); ok {
			op = o
		}
		c.requests.Add(op)
		target := peekTarget(r)
		c.byTarget.Add(op + " " + target)
		table := ""
		if op == "PutItem" || op == "UpdateItem" || op == "DeleteItem" {
			table = target
		}
		s := &failureSniffer{ResponseWriter: w}
		began := time.Now()
		next.ServeHTTP(s, r)
		c.mu.Lock()
		if c.busyMS == nil {
			c.busyMS, c.bytesOut = map[string]int{}, map[string]int{}
		}
		c.busyMS[op] += int(time.Since(began).Milliseconds())
		c.bytesOut[op] += s.bytes
		c.mu.Unlock()
		if s.status == http.StatusBadRequest &&
			(bytes.Contains(s.head, []byte("ConditionalCheckFailed")) || bytes.Contains(s.head, []byte("TransactionCanceled"))) {
			c.failedWrites.Add(op)
			if table != "" {
				c.failedByTable.Add(op + " " + table)
			}
		}
	})
}

// countConn counts each connection the store accepts (http.Server.ConnState).
func (c *dynamoCounts) countConn(_ net.Conn, st http.ConnState) {
	if st == http.StateNew {
		c.conns.Add(1)
	}
}

// peekTarget reads what a request names, leaving r's body whole for the
// store: its table, and "/index" for a Query of an index; a transaction's
// tables, each once, joined by "+". "" when it cannot tell. It scans the
// body for the names (the SDK writes compact JSON) rather than decode it:
// the store process pays for every request it counts.
func peekTarget(r *http.Request) string {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), r.Body))
	if err != nil {
		return ""
	}
	var tables []string
	for rest := body; ; {
		name, after, ok := stringField(rest, `"TableName":"`)
		if !ok {
			break
		}
		if !slices.Contains(tables, name) {
			tables = append(tables, name)
		}
		rest = after
	}
	target := strings.Join(tables, "+")
	if index, _, ok := stringField(body, `"IndexName":"`); ok {
		target += "/" + index
	}
	return target
}

// stringField finds the first field whose opening is key (`"Name":"`) in
// compact JSON and returns its value (unescaped names only: table and
// index names have no quotes) and the bytes after it.
func stringField(body []byte, key string) (string, []byte, bool) {
	i := bytes.Index(body, []byte(key))
	if i < 0 {
		return "", nil, false
	}
	rest := body[i+len(key):]
	end := bytes.IndexByte(rest, '"')
	if end < 0 {
		return "", nil, false
	}
	return string(rest[:end]), rest[end+1:], true
}

// failureSniffer keeps the status and the start of an error answer's body.
type failureSniffer struct {
	http.ResponseWriter
	status int
	head   []byte
	bytes  int
}

func (s *failureSniffer) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

func (s *failureSniffer) Write(p []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	s.bytes += len(p)
	if s.status >= 400 && len(s.head) < 512 {
		s.head = append(s.head, p[:min(len(p), 512-len(s.head))]...)
	}
	return s.ResponseWriter.Write(p)
}

// fleet is the simulator's shared state: where the control plane is, what
// the workers saw, and the live workers.
type fleet struct {
	url      string
	enroll   *client.Client
	hc       *http.Client
	queue    string
	hostKey  string
	capacity int
	body     bodyDist
	reqs     daemonRequests

	mu       sync.Mutex
	claims   map[string][]claimSeen // by invocation id
	answered map[string][]ackSeen   // by invocation id: acks the control plane answered
	// cutOff holds the invocations one of whose succeeded acks was on its
	// way when its worker was killed: the control plane may have recorded
	// it, and nobody is left to hear the answer.
	cutOff map[string]bool
	live   []*vworker
	booted int // workers ever started (machine ids)

	letGo    atomic.Int64 // live workers the control plane let go (410/401 on a poll)
	failures atomic.Int64 // requests that failed (answered with an error or not at all)
	wg       sync.WaitGroup
}

// claimSeen is a run command a worker heard: when its poll was sent, and
// when the answer came.
type claimSeen struct {
	attempt  int
	sent, at time.Time
}

type ackSeen struct {
	attempt  int
	state    string
	recorded bool
}

func newFleet(url, enrollToken, queue string, capacity int, body bodyDist) *fleet {
	// One transport for every worker, keeping a connection per concurrent
	// request: with the default two idle connections per host, a thousand
	// pollers would open and close a connection per request.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost = 0, 8192
	hc := &http.Client{Transport: tr}
	return &fleet{url: url, hc: hc, enroll: client.New(url, enrollToken, client.WithHTTPClient(hc)), queue: queue,
		hostKey: hostkey.Of(nil), capacity: capacity, body: body,
		claims: map[string][]claimSeen{}, answered: map[string][]ackSeen{}, cutOff: map[string]bool{}}
}

// boot starts a new worker (a new machine) and reports it.
func (f *fleet) boot(ctx context.Context) *vworker {
	f.mu.Lock()
	f.booted++
	w := &vworker{f: f, machineID: fmt.Sprintf("fleet-%05d", f.booted), stopc: make(chan stopKind, 1),
		wake: make(chan bool, 1), bodyDone: make(chan *vrun, f.capacity+1), ackDone: make(chan string, f.capacity+1),
		runs: map[string]*vrun{}, acking: map[string]bool{}}
	w.bootID = w.machineID + "-boot"
	f.live = append(f.live, w)
	f.mu.Unlock()
	f.wg.Go(func() { w.run(ctx) })
	return w
}

// gone takes w off the live list.
func (f *fleet) gone(w *vworker) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, l := range f.live {
		if l == w {
			f.live = append(f.live[:i], f.live[i+1:]...)
			return
		}
	}
}

// pick reports a live worker that is ready, preferring one that runs
// something; nil when there is none.
func (f *fleet) pick() *vworker {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ready, busy []*vworker
	for _, w := range f.live {
		if !w.ready.Load() || w.stopping.Load() {
			continue
		}
		ready = append(ready, w)
		if w.busy.Load() > 0 {
			busy = append(busy, w)
		}
	}
	switch {
	case len(busy) > 0:
		return busy[rand.IntN(len(busy))]
	case len(ready) > 0:
		return ready[rand.IntN(len(ready))]
	}
	return nil
}

// readyCount reports how many live workers are ready (hello answered, wake
// socket up where hello offered one, first poll answered).
func (f *fleet) readyCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, w := range f.live {
		if w.ready.Load() {
			n++
		}
	}
	return n
}

func (f *fleet) claimed(id string, attempt int, sent, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.claims[id] = append(f.claims[id], claimSeen{attempt, sent, at})
}

func (f *fleet) ackAnswered(id string, a ackSeen) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answered[id] = append(f.answered[id], a)
}

// ackCutOff notes a succeeded ack of id whose worker was killed before it
// heard the answer.
func (f *fleet) ackCutOff(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cutOff[id] = true
}

// heard sorts ids: how many have a succeeded ack answered recorded, and
// those without one whose succeeded ack was cut off by a kill.
func (f *fleet) heard(ids []string) (succeeded int, cutOff []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		switch {
		case heardSuccess(f.answered[id]):
			succeeded++
		case f.cutOff[id]:
			cutOff = append(cutOff, id)
		}
	}
	return succeeded, cutOff
}

// heardSuccess reports whether one of acks is a succeeded ack answered
// recorded.
func heardSuccess(acks []ackSeen) bool {
	return slices.ContainsFunc(acks, func(a ackSeen) bool { return a.recorded && a.state == wire.StateSucceeded })
}

// stopKind is how a worker leaves the fleet.
type stopKind int

const (
	stopKill stopKind = iota // stops dead: no bye, its sockets close, its work is found stale
	stopBye                  // stops claiming, finishes and acks what runs, says bye
)

// vworker is one virtual daemon.
type vworker struct {
	f                 *fleet
	machineID, bootID string
	stopc             chan stopKind
	ready, stopping   atomic.Bool
	busy              atomic.Int32

	// Owned by the worker's loop goroutine.
	sess      simSession
	runs      map[string]*vrun // running bodies by invocation id
	acking    map[string]bool  // outcomes whose ack is not answered yet
	draining  bool
	wake      chan bool // from the socket: true for work, false for news
	wakeUp    atomic.Bool
	bodyDone  chan *vrun
	ackDone   chan string
	pollFails int
}

type simSession struct {
	workerID, token               string
	api                           *client.Client
	interval, longPoll, wakeEvery time.Duration
	staleAfter                    time.Duration
	wakeURL                       string
}

type vrun struct {
	id      string
	attempt int
	timer   *time.Timer
}

// run is the worker's life: hello, then the poll loop until it is stopped
// or ctx ends.
func (w *vworker) run(ctx context.Context) {
	defer w.f.gone(w)
	life, die := context.WithCancel(ctx)
	defer die()
	if err := w.hello(life); err != nil {
		return
	}
	wctx, stopWake := context.WithCancel(life)
	defer stopWake()
	if w.sess.wakeURL != "" {
		w.f.wg.Go(func() { w.wakeSocket(wctx, w.sess.wakeURL, w.sess.token) })
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	kick := func() {
		timer.Stop()
		timer.Reset(0)
	}
	for {
		select {
		case <-life.Done():
			return
		case k := <-w.stopc:
			if k == stopKill {
				return // die() closes the sockets and drops the bodies and acks
			}
			w.draining = true
			stopWake()
			kick()
		case <-timer.C:
			wait, ok := w.poll(life)
			if !ok {
				return
			}
			if w.draining && len(w.runs) == 0 && len(w.acking) == 0 {
				w.bye(life)
				return
			}
			timer.Reset(wait)
		case work := <-w.wake:
			if !work || (!w.draining && len(w.runs) < w.f.capacity) {
				kick()
			}
		case r := <-w.bodyDone:
			if w.runs[r.id] == r {
				w.finish(life, r, wire.StateSucceeded)
				kick()
			}
		case id := <-w.ackDone:
			delete(w.acking, id)
			if w.draining {
				kick()
			}
		}
	}
}

// hello registers the worker (retrying what is retryable, as nymph does)
// and takes the session's cadence as nymph does (agent/hello.go).
func (w *vworker) hello(ctx context.Context) error {
	capacity := w.f.capacity
	req := wire.HelloRequest{MachineID: w.machineID, BootID: w.bootID, Label: w.machineID, Lanes: []string{w.f.queue},
		Capabilities: wire.Capabilities{MaxConcurrency: &capacity}, Versions: map[string]string{"nymph": "fleet-sim"},
		HostKey: w.f.hostKey}
	var res wire.HelloResponse
	var err error
	for attempt := range 8 {
		w.f.reqs[reqHello].Add(1)
		hctx, cancel := context.WithTimeout(ctx, simRequestTimeout)
		res, err = w.f.enroll.Hello(hctx, req)
		cancel()
		if err == nil || !client.Retryable(err) || ctx.Err() != nil {
			break
		}
		w.f.failures.Add(1)
		if !sleepCtx(ctx, simJitter(time.Duration(attempt+1)*time.Second)) {
			return ctx.Err()
		}
	}
	if err != nil {
		w.f.failures.Add(1)
		return fmt.Errorf("hello %s: %w", w.machineID, err)
	}
	s := simSession{workerID: res.WorkerID, token: res.Token,
		staleAfter: time.Duration(res.StaleAfterS * float64(time.Second)),
		interval:   time.Duration(res.PollIntervalS * float64(time.Second)),
		api:        client.New(w.f.url, res.Token, client.WithHTTPClient(w.f.hc))}
	if s.interval <= 0 {
		s.interval = 5 * time.Second
	}
	c := cadence.Of(s.staleAfter)
	if res.LongPollS > 0 {
		s.longPoll = min(time.Duration(res.LongPollS*float64(time.Second)), s.interval, simRequestTimeout/2)
	}
	if res.WakeURL != "" {
		s.wakeURL = res.WakeURL
		s.wakeEvery = max(s.interval, time.Duration(res.WakePollIntervalS*float64(time.Second)))
		if s.staleAfter > 0 {
			s.wakeEvery = max(s.interval, min(s.wakeEvery, c.MaxGap))
		}
	}
	w.sess = s
	return nil
}

// idle reports whether the worker may take work and runs nothing: its poll
// may be held, and with the socket up it polls at the wake interval.
func (w *vworker) idle() bool { return !w.draining && len(w.runs) == 0 }

// poll sends one heartbeat and handles its commands (agent/poll.go), and
// reports how long to wait before the next; false when the worker is over.
func (w *vworker) poll(ctx context.Context) (time.Duration, bool) {
	hold := time.Duration(0)
	if w.idle() {
		hold = w.sess.longPoll
	}
	began := time.Now()
	inflight := []string{}
	for id := range w.runs {
		inflight = append(inflight, id)
	}
	for id := range w.acking {
		inflight = append(inflight, id)
	}
	phase := wire.PhaseReady
	if w.draining {
		phase = wire.PhaseDraining
	}
	capacity, current := w.f.capacity, len(w.runs)
	req := wire.PollRequest{WorkerID: w.sess.workerID, Queue: w.f.queue, Invocations: inflight, Phase: phase,
		HostKey: w.f.hostKey, TimeoutS: hold.Seconds(),
		UpdatedCapabilities: &wire.Capabilities{MaxConcurrency: &capacity, CurrentInvocations: &current}}
	w.f.reqs[reqPoll].Add(1)
	pctx, cancel := context.WithTimeout(ctx, simRequestTimeout+hold)
	resp, err := w.sess.api.Poll(pctx, req)
	cancel()
	at := time.Now()
	switch {
	case ctx.Err() != nil:
		return 0, false
	case errors.Is(err, wire.ErrWorkerGone) || errors.Is(err, wire.ErrUnauthorized):
		// Let go while alive (found stale): what it ran was handed out
		// again. Like nymph, say hello again as a new worker.
		w.f.letGo.Add(1)
		for id, r := range w.runs {
			r.timer.Stop()
			delete(w.runs, id)
		}
		w.busy.Store(0)
		if w.draining {
			return 0, false
		}
		if err := w.hello(ctx); err != nil {
			return 0, false
		}
		return 0, true
	case err != nil:
		w.f.failures.Add(1)
		w.pollFails++
		wait := min(w.sess.interval*time.Duration(1<<min(w.pollFails, 4)), cadence.Of(w.sess.staleAfter).MaxGap)
		return simJitter(max(wait, w.sess.interval)), true
	}
	w.pollFails = 0
	w.ready.Store(true)
	gotWork := false
	for _, c := range resp.Commands {
		switch {
		case c.Type == wire.CommandRun && c.Invocation != nil:
			inv := c.Invocation
			w.f.claimed(inv.InvocationID, inv.Attempt, began, at)
			r := &vrun{id: inv.InvocationID, attempt: inv.Attempt}
			r.timer = time.AfterFunc(w.f.body.draw(), func() {
				select {
				case w.bodyDone <- r:
				case <-ctx.Done():
				}
			})
			w.runs[r.id] = r
			gotWork = true
		case c.Type == wire.CommandCancel:
			if r, ok := w.runs[c.InvocationID]; ok {
				r.timer.Stop()
				w.finish(ctx, r, wire.StateCancelled)
			}
		case c.Type == wire.CommandDrain:
			w.draining = true
		}
	}
	w.busy.Store(int32(len(w.runs)))
	if gotWork && len(w.runs) < w.f.capacity && !w.draining {
		return 0, true // room for more: ask again at once
	}
	interval := w.sess.interval
	if w.wakeUp.Load() && w.sess.wakeEvery > 0 && w.idle() {
		interval = w.sess.wakeEvery
	}
	if hold > 0 {
		return simJitter(max(0, interval-time.Since(began))), true
	}
	return simJitter(interval), true
}

// finish ends r with state and sends its ack in the background (nymph's
// acker retries while the poll lists the outcome as in flight).
func (w *vworker) finish(ctx context.Context, r *vrun, state string) {
	delete(w.runs, r.id)
	w.busy.Store(int32(len(w.runs)))
	w.acking[r.id] = true
	ack := wire.AckRequest{WorkerID: w.sess.workerID, InvocationID: r.id, Attempt: r.attempt, State: state}
	if state == wire.StateSucceeded {
		ack.ExitCode = new(0)
	}
	ack.Phase = wire.PhaseReady
	if w.draining {
		ack.Phase = wire.PhaseDraining
	}
	api := w.sess.api
	w.f.wg.Go(func() {
		defer func() {
			select {
			case w.ackDone <- r.id:
			case <-ctx.Done():
			}
		}()
		for attempt := range 10 {
			w.f.reqs[reqAck].Add(1)
			actx, cancel := context.WithTimeout(ctx, simRequestTimeout)
			res, err := api.Ack(actx, ack)
			cancel()
			if err == nil {
				w.f.ackAnswered(r.id, ackSeen{attempt: r.attempt, state: state, recorded: res.Recorded})
				return
			}
			if ctx.Err() != nil {
				w.cutOff(r.id, state) // killed with its ack in flight
				return
			}
			w.f.failures.Add(1)
			if !client.Retryable(err) {
				return
			}
			if !sleepCtx(ctx, simJitter(min(500*time.Millisecond<<attempt, 5*time.Second))) {
				w.cutOff(r.id, state) // killed before it tried again
				return
			}
		}
	})
}

// cutOff notes a succeeded ack the worker's kill cut off: the request was
// sent, so the control plane may have recorded it.
func (w *vworker) cutOff(id, state string) {
	if state == wire.StateSucceeded {
		w.f.ackCutOff(id)
	}
}

// bye tells the control plane the worker leaves with nothing in flight.
func (w *vworker) bye(ctx context.Context) {
	w.f.reqs[reqBye].Add(1)
	bctx, cancel := context.WithTimeout(ctx, simRequestTimeout)
	defer cancel()
	if err := w.sess.api.Bye(bctx, wire.ByeRequest{WorkerID: w.sess.workerID, Reason: wire.ByeSignal}); err != nil {
		w.f.failures.Add(1)
	}
}

// wakeSocket keeps the worker's wake socket until ctx ends, as nymph's
// wakeclient does: reconnect with jittered backoff, a keep-alive ping every
// 4 minutes, "poll now" on each wake and whenever the socket comes up or
// goes down.
func (w *vworker) wakeSocket(ctx context.Context, url, token string) {
	failures := 0
	for ctx.Err() == nil {
		up := w.wakeSession(ctx, url, token)
		if ctx.Err() != nil {
			return
		}
		if up >= simStableAfter {
			failures = 0
			continue
		}
		failures++
		wait := min(simBackoffMin<<min(failures-1, 16), simBackoffMax)
		if !sleepCtx(ctx, min(time.Duration(float64(wait)*(0.5+rand.Float64())), simBackoffMax)) {
			return
		}
	}
}

// wakeSession serves one socket until it fails or ctx ends, and reports
// how long it was up.
func (w *vworker) wakeSession(ctx context.Context, url, token string) time.Duration {
	w.f.reqs[reqWakeConnect].Add(1)
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	conn, _, err := websocket.Dial(dctx, url, &websocket.DialOptions{HTTPClient: w.f.hc,
		HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			w.f.failures.Add(1)
		}
		return 0
	}
	defer conn.CloseNow()
	since := time.Now()
	w.wakeUp.Store(true)
	w.signal(true)
	defer func() {
		w.wakeUp.Store(false)
		w.signal(true)
	}()
	// The keep-alive: one timer at a time, each arming the next.
	sctx, stop := context.WithCancel(ctx)
	var ping atomic.Pointer[time.Timer]
	var sendPing func()
	sendPing = func() {
		if sctx.Err() != nil {
			return
		}
		w.f.reqs[reqWakePing].Add(1)
		pctx, cancel := context.WithTimeout(sctx, 30*time.Second)
		_ = conn.Write(pctx, websocket.MessageText, []byte(wire.WakePing))
		cancel()
		ping.Store(time.AfterFunc(simPingEvery, sendPing))
	}
	ping.Store(time.AfterFunc(simPingEvery, sendPing))
	defer func() {
		stop()
		ping.Load().Stop()
	}()
	conn.SetReadLimit(64 << 10)
	for {
		_, b, err := conn.Read(ctx)
		if err != nil {
			return time.Since(since)
		}
		var m wire.WakeMessage
		if json.Unmarshal(b, &m) != nil || m.Type != wire.WakeTypeWake {
			continue // a pong, or nothing of ours
		}
		w.signal(m.Queue != "")
	}
}

// signal hands the loop a wake without blocking: work (true) or news.
func (w *vworker) signal(work bool) {
	select {
	case w.wake <- work:
	default:
	}
}

// stop asks the worker to leave the fleet.
func (w *vworker) stop(k stopKind) {
	w.stopping.Store(true)
	select {
	case w.stopc <- k:
	default:
	}
}

// sleepCtx waits d and reports whether ctx is still live.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
