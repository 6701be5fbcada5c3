package acks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// Acker backoff and timeout defaults.
const (
	DefaultAckMinBackoff     = 200 * time.Millisecond
	DefaultAckMaxBackoff     = 30 * time.Second
	DefaultAckAttemptTimeout = 30 * time.Second
)

// Options configures an Acker. Every field is optional.
type Options struct {
	// Logger receives one line per answered, rejected or retried ack; nil
	// means slog.Default().
	Logger *slog.Logger
	// HTTP sends the acks; nil means http.DefaultClient.
	HTTP *http.Client
	// UserAgent is sent with each ack; empty means the client's default.
	UserAgent string
	// MinBackoff and MaxBackoff bound the wait between tries (defaults
	// 200 ms and 30 s). The wait before try n+1 is drawn uniformly from
	// [0, min(MaxBackoff, MinBackoff·2ⁿ)): full jitter, so a fleet that lost
	// the control plane at once does not come back in lock step.
	MinBackoff, MaxBackoff time.Duration
	// AttemptTimeout bounds one try, so a connection that hangs is given up
	// and tried again instead of holding the ack forever (default 30 s).
	AttemptTimeout time.Duration
	// Sleep waits d or until ctx ends (reporting ctx.Err()); nil means a
	// real timer. Tests pass one that returns at once.
	Sleep func(ctx context.Context, d time.Duration) error
	// Rand returns a number in [0, 1) for the jitter; nil means
	// math/rand/v2. It is never called concurrently.
	Rand func() float64
	// Clock stamps SpooledAt (zero: real time).
	Clock clock.Clock
	// OnAnswered, when set, is called once the control plane has answered
	// an ack and it is out of the spool: err is nil with the answer, or the
	// *wire.Error of a final 4xx. It is called before the ack leaves
	// Pending, so after Flush returns every answer has been seen.
	OnAnswered func(a SpooledAck, resp wire.AckResponse, err error)
}

// Acker delivers acks until the control plane answers them (docs/design.md §6):
// each ack is spooled first, so one the control plane has not answered when
// the daemon stops is sent again by the next daemon on the same state dir.
// An Acker is safe for concurrent use.
type Acker struct {
	spool          *Spool
	log            *slog.Logger
	http           *http.Client
	userAgent      string
	minBackoff     time.Duration
	maxBackoff     time.Duration
	attemptTimeout time.Duration
	sleep          func(context.Context, time.Duration) error
	clock          clock.Clock
	onAnswered     func(SpooledAck, wire.AckResponse, error)

	mu      sync.Mutex
	rand    func() float64 // guarded by mu: an injected one need not be safe
	pending map[ackKey]*pendingAck
	changed chan struct{} // closed and replaced whenever pending shrinks
	// retryNow ends when RetryNow is called (then is replaced): every
	// sender waiting out a backoff tries again at once.
	retryNow       context.Context
	cancelRetryNow context.CancelFunc
	clients        map[ackClientKey]*client.Client
}

// ackKey names one attempt's ack; the spool keeps one file per key.
type ackKey struct {
	invocationID string
	attempt      int
}

// ackClientKey selects the client an ack is sent with: acks of a previous
// daemon go with that daemon's token, possibly to another control plane.
type ackClientKey struct {
	url, token string
}

// pendingAck is an ack a goroutine is sending.
type pendingAck struct {
	ack      SpooledAck
	done     chan struct{} // closed when the sender stops
	answered bool          // set before done is closed
}

// NewAcker returns an Acker that spools in spool.
func New(spool *Spool, opts Options) *Acker {
	k := &Acker{
		spool:          spool,
		log:            opts.Logger,
		http:           opts.HTTP,
		userAgent:      opts.UserAgent,
		minBackoff:     opts.MinBackoff,
		maxBackoff:     opts.MaxBackoff,
		attemptTimeout: opts.AttemptTimeout,
		sleep:          opts.Sleep,
		rand:           opts.Rand,
		clock:          opts.Clock,
		onAnswered:     opts.OnAnswered,
		pending:        map[ackKey]*pendingAck{},
		changed:        make(chan struct{}),
		clients:        map[ackClientKey]*client.Client{},
	}
	k.retryNow, k.cancelRetryNow = context.WithCancel(context.Background())
	if k.log == nil {
		k.log = slog.Default()
	}
	if k.minBackoff <= 0 {
		k.minBackoff = DefaultAckMinBackoff
	}
	if k.maxBackoff <= 0 {
		k.maxBackoff = DefaultAckMaxBackoff
	}
	k.maxBackoff = max(k.maxBackoff, k.minBackoff)
	if k.attemptTimeout <= 0 {
		k.attemptTimeout = DefaultAckAttemptTimeout
	}
	if k.sleep == nil {
		k.sleep = clock.Sleep
	}
	if k.rand == nil {
		k.rand = rand.Float64
	}
	return k
}

// Submit spools a and sends it on a goroutine, trying again until the
// control plane answers or ctx ends; it returns once the ack is durably
// spooled. ctx should outlive the drain (the daemon's Flush waits on these
// sends): an ack whose ctx ends unanswered stays in the spool for the next
// start's Resend. A zero SpooledAt is set to now; a.WorkerID and
// a.Ack.WorkerID may be given either way but must agree.
//
// If the spool cannot be written the ack is still sent from memory and the
// error says it would not survive a restart. Submitting an attempt that is
// already pending changes nothing: its first outcome is the one that counts.
func (k *Acker) Submit(ctx context.Context, a SpooledAck) error {
	a, err := normalizeAck(a)
	if err != nil {
		return fmt.Errorf("ack: %w", err)
	}
	if a.SpooledAt.IsZero() {
		a.SpooledAt = k.clock.Now().UTC()
	}
	key := ackKey{a.Ack.InvocationID, a.Ack.Attempt}
	k.mu.Lock()
	_, dup := k.pending[key]
	k.mu.Unlock()
	if dup {
		return nil
	}
	putErr := k.spool.Put(a)
	if p, started := k.track(a); started {
		go k.send(ctx, p)
	}
	if putErr != nil {
		return fmt.Errorf("ack of %s attempt %d is being sent but would not survive a restart: %w",
			a.Ack.InvocationID, a.Ack.Attempt, putErr)
	}
	return nil
}

// Resend sends every ack left in the spool by an earlier process and waits
// until each is answered or ctx ends. Call it at start, before hello: the
// earlier worker's acks should land before the new worker claims anything,
// and until they are answered their invocations are Pending. It reports an
// error when ctx ended (or a send stopped) with acks still unanswered; they
// stay in the spool.
func (k *Acker) Resend(ctx context.Context) error {
	acks, err := k.spool.List()
	if err != nil {
		return fmt.Errorf("ack resend: %w", err)
	}
	var waits []*pendingAck
	for _, a := range acks {
		a, err := normalizeAck(a)
		if err != nil {
			k.log.Warn("ack resend: spooled ack cannot be sent; left in the spool",
				"invocation_id", a.Ack.InvocationID, "attempt", a.Ack.Attempt, "error", err.Error())
			continue
		}
		p, started := k.track(a)
		if started {
			go k.send(ctx, p)
		}
		waits = append(waits, p)
	}
	if len(waits) > 0 {
		k.log.Info("ack resend: sending acks left by an earlier run", "count", len(waits))
	}
	unanswered := 0
	for _, p := range waits {
		for !k.await(ctx, p) && ctx.Err() == nil {
			// A sender started elsewhere (an earlier, shorter Resend) gave
			// up while ours still has time: take the ack over.
			var started bool
			if p, started = k.track(p.ack); started {
				go k.send(ctx, p)
			}
		}
		if !k.isAnswered(p) {
			unanswered++
		}
	}
	if unanswered > 0 {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("ack resend: %d of %d acks not answered: %w", unanswered, len(waits), err)
		}
		return fmt.Errorf("ack resend: %d of %d acks not answered", unanswered, len(waits))
	}
	return nil
}

// Pending reports, sorted, the invocation ids that have an ack being sent
// and not yet answered. The poll lists them in invocations, so the control
// plane neither hands them out again nor redelivers them meanwhile.
func (k *Acker) Pending() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	ids := make([]string, 0, len(k.pending))
	for key := range k.pending {
		ids = append(ids, key.invocationID)
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// Flush waits until no ack is being sent or ctx ends, and reports how many
// still are. An ack stops being sent when it is answered or when the ctx it
// was submitted with ends.
func (k *Acker) Flush(ctx context.Context) int {
	for {
		k.mu.Lock()
		n, changed := len(k.pending), k.changed
		k.mu.Unlock()
		if n == 0 {
			return 0
		}
		select {
		case <-changed:
		case <-ctx.Done():
			k.mu.Lock()
			defer k.mu.Unlock()
			return len(k.pending)
		}
	}
}

// RetryNow cuts short the backoff of every ack waiting to be tried again:
// call it when a request to the control plane has just succeeded (a poll,
// a hello), since an ack's next try is then likely to succeed too. A try
// under way when it is called goes again at once if it fails. The acker
// calls it itself whenever the control plane answers an ack. A nil Acker
// has nothing to retry.
func (k *Acker) RetryNow() {
	if k == nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.cancelRetryNow()
	k.retryNow, k.cancelRetryNow = context.WithCancel(context.Background())
}

// retrySignal reports the context the next RetryNow ends.
func (k *Acker) retrySignal() context.Context {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.retryNow
}

// await waits until p's sender stops or ctx ends and reports whether p was
// answered.
func (k *Acker) await(ctx context.Context, p *pendingAck) bool {
	select {
	case <-p.done:
	case <-ctx.Done():
	}
	return k.isAnswered(p)
}

// isAnswered reports whether the control plane answered p.
func (k *Acker) isAnswered(p *pendingAck) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return p.answered
}

// track registers a as pending unless its attempt already is; started
// reports whether the caller must start its sender.
func (k *Acker) track(a SpooledAck) (p *pendingAck, started bool) {
	key := ackKey{a.Ack.InvocationID, a.Ack.Attempt}
	k.mu.Lock()
	defer k.mu.Unlock()
	if p, ok := k.pending[key]; ok {
		return p, false
	}
	p = &pendingAck{ack: a, done: make(chan struct{})}
	k.pending[key] = p
	return p, true
}

// finish takes p out of pending and wakes Flush and Resend.
func (k *Acker) finish(p *pendingAck, answered bool) {
	key := ackKey{p.ack.Ack.InvocationID, p.ack.Ack.Attempt}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.pending[key] == p {
		delete(k.pending, key)
	}
	p.answered = answered
	close(p.done)
	close(k.changed)
	k.changed = make(chan struct{})
}

// send tries p's ack until the control plane answers or ctx ends.
func (k *Acker) send(ctx context.Context, p *pendingAck) {
	a := p.ack
	log := k.log.With("worker_id", a.Ack.WorkerID, "invocation_id", a.Ack.InvocationID, "attempt", a.Ack.Attempt)
	for try := 0; ; try++ {
		// Taken before the try: a request that succeeds while this one
		// fails means the control plane is back, and this ack should not
		// wait out its backoff.
		retry := k.retrySignal()
		resp, err := k.sendOnce(ctx, a)
		switch {
		case err == nil:
			log.Info("ack answered", "recorded", resp.Recorded, "state", resp.State, "tries", try+1)
			k.answered(p, resp, nil, log)
			k.RetryNow()
			return
		case ctx.Err() != nil:
			log.Info("ack not answered before its context ended; left in the spool", "tries", try+1)
			k.finish(p, false)
			return
		case !client.Retryable(err) && !errors.Is(err, context.DeadlineExceeded):
			// A 4xx: the same ack gets the same answer however often it
			// is sent. (A deadline here is this try's own timeout, since
			// ctx is still alive, and is worth another try.)
			code := wire.CodeOf(err)
			msg := "ack rejected by the control plane; dropped"
			if a.Ack.State == wire.AckRequeued && code == wire.CodeConflict {
				msg = "hand-back refused: the control plane does not see this worker draining; dropped, and the attempt stays running there until a poll that no longer lists it, this worker's bye or the sweep hands it back"
			}
			log.Warn(msg, "code", string(code), "status", wire.Status(code), "state", a.Ack.State, "phase", a.Ack.Phase,
				"recorded", false, "error", err.Error())
			k.answered(p, wire.AckResponse{}, err, log)
			k.RetryNow() // a refusal is an answer: the control plane is up
			return
		}
		d := k.backoff(try)
		log.Warn("ack not answered; will retry", "error", err.Error(), "tries", try+1, "backoff", d.String())
		if k.pause(ctx, retry, d) {
			log.Debug("another request to the control plane succeeded; retrying the ack at once", "tries", try+1)
		}
		if ctx.Err() != nil {
			log.Info("ack not answered before its context ended; left in the spool", "tries", try+1)
			k.finish(p, false)
			return
		}
	}
}

// pause waits d, or until ctx or retry ends, and reports whether retry cut
// it short.
func (k *Acker) pause(ctx, retry context.Context, d time.Duration) bool {
	wait, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(retry, cancel)
	defer stop()
	_ = k.sleep(wait, d)
	return retry.Err() != nil && ctx.Err() == nil
}

// answered takes an answered ack out of the spool, tells OnAnswered and
// then takes it out of pending.
func (k *Acker) answered(p *pendingAck, resp wire.AckResponse, err error, log *slog.Logger) {
	if rerr := k.spool.Remove(p.ack.Ack.InvocationID, p.ack.Ack.Attempt); rerr != nil {
		// The next start resends it and the control plane answers
		// recorded:false: harmless, so only worth a line.
		log.Error("answered ack could not be removed from the spool", "error", rerr.Error())
	}
	if k.onAnswered != nil {
		k.onAnswered(p.ack, resp, err)
	}
	k.finish(p, true)
}

// sendOnce makes one try, bounded by the attempt timeout.
func (k *Acker) sendOnce(ctx context.Context, a SpooledAck) (wire.AckResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, k.attemptTimeout)
	defer cancel()
	return k.client(a.ControlPlane, a.Token).Ack(ctx, a.Ack)
}

// client reports the API client for url and token, made once per pair.
func (k *Acker) client(url, token string) *client.Client {
	key := ackClientKey{url, token}
	k.mu.Lock()
	defer k.mu.Unlock()
	c, ok := k.clients[key]
	if !ok {
		c = client.New(url, token, client.WithHTTPClient(k.http))
		if k.userAgent != "" {
			c.UserAgent = k.userAgent
		}
		k.clients[key] = c
	}
	return c
}

// backoff reports how long to wait after failed try number try (from 0):
// full jitter over an exponentially growing cap.
func (k *Acker) backoff(try int) time.Duration {
	ceiling := k.minBackoff
	for i := 0; i < try && ceiling < k.maxBackoff; i++ {
		ceiling *= 2
	}
	ceiling = min(ceiling, k.maxBackoff)
	k.mu.Lock()
	r := k.rand()
	k.mu.Unlock()
	r = min(max(r, 0), 1)
	return time.Duration(r * float64(ceiling))
}

// normalizeAck fills whichever of the two worker ids is missing from the
// other and reports whether a can be sent at all.
func normalizeAck(a SpooledAck) (SpooledAck, error) {
	switch {
	case a.Ack.WorkerID == "":
		a.Ack.WorkerID = a.WorkerID
	case a.WorkerID == "":
		a.WorkerID = a.Ack.WorkerID
	case a.WorkerID != a.Ack.WorkerID:
		return a, fmt.Errorf("worker id %q and the ack's worker id %q differ", a.WorkerID, a.Ack.WorkerID)
	}
	return a, checkSpooledAck(a)
}
