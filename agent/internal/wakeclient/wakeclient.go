// Package wakeclient keeps nymph's wake socket (docs/dispatch.md): a
// WebSocket to the control plane's wake channel, over which it is told
// "poll now" when work it can take, or news for its worker, arrives. The
// socket is only a hint: the HTTP poll stays the heartbeat and the only way
// to claim, so a socket that cannot connect, drops or goes quiet costs
// latency, never work. The client reconnects with jittered backoff, sends a
// keep-alive (API Gateway closes a socket after 10 idle minutes) and
// reconnects when the keep-alive is not answered.
package wakeclient

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// Defaults of Options.
const (
	defaultPingEvery  = 4 * time.Minute
	defaultPongWait   = 30 * time.Second
	defaultBackoffMin = time.Second
	defaultBackoffMax = time.Minute
	dialTimeout       = 10 * time.Second
	// stableAfter is how long a socket must stay up for its drop to be
	// news rather than a failure: the first drop after one reconnects at
	// once; a socket that keeps dropping sooner backs off like a refusal.
	stableAfter = 30 * time.Second
)

// Options configure a Client; zero values take the defaults.
type Options struct {
	HTTP *http.Client
	// HTTPFor, if set, is the client for the socket at a URL (IAM mode
	// signs the upgrade for the wake channel's own host); else HTTP.
	HTTPFor func(url string) *http.Client
	Logger  *slog.Logger
	// PingEvery is how often a quiet socket sends wire.WakePing (default
	// 4 min, inside API Gateway's 10-minute idle limit); PongWait how long
	// it waits for the pong before it reconnects (default 30 s).
	PingEvery, PongWait time.Duration
	// BackoffMin and BackoffMax bound the wait between failed connects
	// (default 1 s doubling to 1 min, each jittered and never past
	// BackoffMax).
	BackoffMin, BackoffMax time.Duration
}

// Client keeps one socket to the wake channel of the session Use names.
// Build it with New, start Run, and read Work and News.
type Client struct {
	opts Options
	log  *slog.Logger
	// clock times how long a socket stays up; jitter draws in [0, 1) for
	// the backoff. Tests replace them.
	clock  clock.Clock
	jitter func() float64

	mu      sync.Mutex
	target  target
	changed chan struct{} // closed and replaced when target changes

	work, news chan struct{}
	up         atomic.Bool
}

type target struct{ url, token string }

// New returns a client that connects nowhere until Use names a channel.
func New(o Options) *Client {
	if o.HTTP == nil {
		o.HTTP = http.DefaultClient
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.PingEvery <= 0 {
		o.PingEvery = defaultPingEvery
	}
	if o.PongWait <= 0 {
		o.PongWait = defaultPongWait
	}
	if o.BackoffMin <= 0 {
		o.BackoffMin = defaultBackoffMin
	}
	if o.BackoffMax <= 0 {
		o.BackoffMax = max(o.BackoffMin, defaultBackoffMax)
	}
	o.BackoffMax = max(o.BackoffMax, o.BackoffMin)
	return &Client{opts: o, log: o.Logger, jitter: rand.Float64, changed: make(chan struct{}),
		work: make(chan struct{}, 1), news: make(chan struct{}, 1)}
}

// Use points the client at the wake channel url with the worker token
// (after a hello, or a new hello); url "" closes the socket (no channel, or
// a drain: nothing more to claim). The same target again changes nothing.
func (c *Client) Use(url, token string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := target{url, token}
	if url == "" {
		t = target{}
	}
	if t == c.target {
		return
	}
	c.target = t
	close(c.changed)
	c.changed = make(chan struct{})
}

func (c *Client) current() (target, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.target, c.changed
}

// Work fires when work for the worker's queue arrived, and when the socket
// came up or went down (a wake may have been missed meanwhile): poll now if
// there is room for work.
func (c *Client) Work() <-chan struct{} { return c.work }

// News fires when the control plane has news for this worker (a drain, a
// setup command, its retirement): poll now, busy or not.
func (c *Client) News() <-chan struct{} { return c.news }

// Up reports whether the socket is open now: an idle daemon may then poll
// at the slower wake_poll_interval_s.
func (c *Client) Up() bool { return c.up.Load() }

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// retries counts how the sessions in a row went, for the backoff.
type retries struct {
	failures   int // connects in a row that failed, or came up and dropped soon
	quickDrops int // sockets in a row that dropped within stableAfter
}

// after records how a session ended: up is how long its socket was up (0:
// none came up, or the target changed), err why it failed (nil: it ended).
// It answers the error to back off on, nil to reconnect at once. A socket
// that stayed up stableAfter worked, however it ended: the count starts
// over, so its failure waits the first step, not the step the failures
// before it reached.
func (r *retries) after(up time.Duration, err error) error {
	if up >= stableAfter {
		r.failures, r.quickDrops = 0, 0
	}
	switch {
	case err == nil && (up == 0 || up >= stableAfter): // a new target, or a socket that worked and ended
		r.failures, r.quickDrops = 0, 0
		return nil
	case err == nil:
		r.quickDrops++
		if r.quickDrops < 2 {
			r.failures = 0
			return nil // one short-lived socket: reconnect at once
		}
		err = errors.New("the wake socket keeps dropping soon after it connects")
	}
	r.failures++
	return err
}

// Run keeps the socket until ctx ends.
func (c *Client) Run(ctx context.Context) {
	var r retries
	for ctx.Err() == nil {
		t, changed := c.current()
		if t.url == "" {
			select {
			case <-ctx.Done():
			case <-changed:
			}
			continue
		}
		up, err := c.session(ctx, t, changed)
		if ctx.Err() != nil {
			return
		}
		if err = r.after(up, err); err == nil {
			continue
		}
		wait := c.backoff(r.failures)
		c.log.Warn("wake socket down; polling on the interval meanwhile", "error", err.Error(), "retry_in", wait.Round(time.Millisecond))
		tm := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-changed:
			r = retries{}
		case <-tm.C:
		}
		tm.Stop()
	}
}

// backoff is the jittered wait after the nth failed connect in a row: the
// step (BackoffMin doubling) times a draw in [0.5, 1.5), capped at
// BackoffMax after the jitter, so no wait is longer than the cap.
func (c *Client) backoff(n int) time.Duration {
	d := c.opts.BackoffMin << min(n-1, 16)
	d = min(d, c.opts.BackoffMax)
	return min(time.Duration(float64(d)*(0.5+c.jitter())), c.opts.BackoffMax)
}

// session connects to t and serves the socket until it fails (the error),
// or t stops being the target or ctx ends (nil). up is how long a socket
// that came up stayed up, whether it dropped (nil) or failed (the error),
// and 0 when none came up or t stopped being the target while it was.
func (c *Client) session(ctx context.Context, t target, changed <-chan struct{}) (up time.Duration, err error) {
	hc := c.opts.HTTP
	if c.opts.HTTPFor != nil {
		hc = c.opts.HTTPFor(t.url)
	}
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	conn, _, err := websocket.Dial(dctx, t.url, &websocket.DialOptions{
		HTTPClient: hc,
		HTTPHeader: http.Header{"Authorization": {"Bearer " + t.token}},
	})
	cancel()
	if err != nil {
		return 0, err // refused or unreachable alike: back off and retry
	}
	defer conn.CloseNow()
	since := c.clock.Now()
	upFor := func() time.Duration { return max(c.clock.Since(since), time.Nanosecond) }
	conn.SetReadLimit(64 << 10)
	c.up.Store(true)
	c.log.Info("wake socket connected", "url", t.url)
	signal(c.work) // a wake may have been missed while it was down
	defer func() {
		c.up.Store(false)
		signal(c.work)
	}()

	sctx, stop := context.WithCancel(ctx)
	defer stop()
	pongs := make(chan struct{}, 1)
	readErr := make(chan error, 1)
	go func() { readErr <- c.read(sctx, conn, pongs) }()
	ping := time.NewTicker(c.opts.PingEvery)
	defer ping.Stop()
	var pongTimer *time.Timer // set while a ping waits for its pong
	var pongDue <-chan time.Time
	defer func() {
		if pongTimer != nil {
			pongTimer.Stop()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			_ = conn.Close(websocket.StatusGoingAway, "nymph is stopping")
			return 0, nil
		case <-changed:
			_ = conn.Close(websocket.StatusNormalClosure, "new worker session")
			return 0, nil
		case err := <-readErr:
			c.log.Info("wake socket closed; reconnecting", "error", err.Error())
			return upFor(), nil
		case <-ping.C:
			wctx, cancel := context.WithTimeout(sctx, c.opts.PongWait)
			err := conn.Write(wctx, websocket.MessageText, []byte(wire.WakePing))
			cancel()
			if err != nil {
				return upFor(), err
			}
			if pongTimer == nil {
				pongTimer = time.NewTimer(c.opts.PongWait)
				pongDue = pongTimer.C
			}
		case <-pongs:
			if pongTimer != nil {
				pongTimer.Stop()
				pongTimer, pongDue = nil, nil
			}
		case <-pongDue:
			return upFor(), errors.New("the keep-alive was not answered")
		}
	}
}

// read hands each message to the loop's channels until the socket fails.
func (c *Client) read(ctx context.Context, conn *websocket.Conn, pongs chan<- struct{}) error {
	for {
		_, b, err := conn.Read(ctx)
		if err != nil {
			return err
		}
		var m wire.WakeMessage
		if json.Unmarshal(b, &m) != nil {
			continue // not ours to understand; a wake is only a hint
		}
		switch {
		case m.Type == wire.WakeTypePong:
			select {
			case pongs <- struct{}{}:
			default:
			}
		case m.Type == wire.WakeTypeWake && m.Queue == "":
			signal(c.news)
		case m.Type == wire.WakeTypeWake:
			signal(c.work)
		}
	}
}
