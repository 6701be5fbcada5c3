package wakeclient

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/coder/websocket"

	"github.com/dreamlake/lakeshore/server/auth"
	"github.com/dreamlake/lakeshore/server/wake/wakelambda"
	"github.com/dreamlake/lakeshore/server/wake/wakesock"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// wait bounds every wait on something that should happen; nothing here
// asserts that anything happens fast.
const wait = 10 * time.Second

const pong = `{"type":"pong"}`

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

type event = events.APIGatewayWebsocketProxyRequest
type response = events.APIGatewayProxyResponse

// plane is the control plane's side: a wakesock.Server behind httptest
// whose routes the test answers, recording every event it is handed.
type plane struct {
	t       *testing.T
	ts      *httptest.Server
	url     string
	respond wakesock.Route

	cur atomic.Pointer[wakesock.Server] // the server new requests go to

	mu      sync.Mutex
	servers []*wakesock.Server
	seen    []event
}

func newPlane(t *testing.T, respond wakesock.Route) *plane {
	t.Helper()
	p := &plane{t: t, respond: respond}
	p.swap()
	p.ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.cur.Load().ServeHTTP(w, r)
	}))
	p.url = "ws" + strings.TrimPrefix(p.ts.URL, "http") + "/wake"
	t.Cleanup(func() {
		p.mu.Lock()
		servers := p.servers
		p.mu.Unlock()
		for _, s := range servers {
			s.Close()
		}
		p.ts.Close()
	})
	return p
}

// manageSecret is what the planes' management calls carry.
const manageSecret = "test-secret"

// swap sends new requests to a new server and returns the old one.
func (p *plane) swap() *wakesock.Server {
	s := wakesock.New("/wake", manageSecret, p.route, discard)
	p.mu.Lock()
	p.servers = append(p.servers, s)
	p.mu.Unlock()
	return p.cur.Swap(s)
}

func (p *plane) route(ctx context.Context, ev event) (response, error) {
	p.mu.Lock()
	p.seen = append(p.seen, ev)
	p.mu.Unlock()
	return p.respond(ctx, ev)
}

// events returns the recorded events of route ("" for all).
func (p *plane) events(route string) []event {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []event
	for _, ev := range p.seen {
		if route == "" || ev.RequestContext.RouteKey == route {
			out = append(out, ev)
		}
	}
	return out
}

func (p *plane) connects() []event { return p.events("$connect") }

// lastConnect is the latest $connect's connection id.
func (p *plane) lastConnect() string {
	c := p.connects()
	if len(c) == 0 {
		p.t.Fatal("no $connect seen")
	}
	return c[len(c)-1].RequestContext.ConnectionID
}

func (p *plane) disconnected(id string) bool {
	for _, ev := range p.events("$disconnect") {
		if ev.RequestContext.ConnectionID == id {
			return true
		}
	}
	return false
}

// pings counts the keep-alives socket id sent.
func (p *plane) pings(id string) int {
	n := 0
	for _, ev := range p.events("$default") {
		if ev.RequestContext.ConnectionID == id && ev.Body == wire.WakePing {
			n++
		}
	}
	return n
}

// post sends msg to socket id through the management API's Poster.
func (p *plane) post(id, msg string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := p.cur.Load().Post(ctx, id, []byte(msg)); err != nil {
		p.t.Fatalf("post %q to %s: %v", msg, id, err)
	}
}

// accept answers $connect with 200 for the tokens given (401 for any
// other) and a keep-alive with a pong.
func accept(tokens ...string) wakesock.Route {
	return func(_ context.Context, ev event) (response, error) {
		switch ev.RequestContext.RouteKey {
		case "$connect":
			for _, tok := range tokens {
				if ev.Headers["Authorization"] == "Bearer "+tok {
					return response{StatusCode: http.StatusOK}, nil
				}
			}
			return response{StatusCode: http.StatusUnauthorized, Body: `{"code":"unauthorized","message":"no"}`}, nil
		case "$default":
			if ev.Body == wire.WakePing {
				return response{StatusCode: http.StatusOK, Body: pong}, nil
			}
			return response{StatusCode: http.StatusBadRequest}, nil
		}
		return response{StatusCode: http.StatusOK}, nil
	}
}

// run starts c.Run; the test's cleanup cancels it and waits for it.
func run(t *testing.T, c *Client) (cancel context.CancelFunc, done <-chan struct{}) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := make(chan struct{})
	go func() {
		defer close(d)
		c.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-d:
		case <-time.After(wait):
			t.Error("Run did not return after its context was cancelled")
		}
	})
	return cancel, d
}

func (p *plane) client(o Options) *Client {
	o.HTTP = p.ts.Client()
	o.Logger = discard
	return New(o)
}

func fast() Options {
	return Options{BackoffMin: 10 * time.Millisecond, BackoffMax: 40 * time.Millisecond}
}

func recv(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(wait):
		t.Fatalf("%s did not fire within the bound", what)
	}
}

func fired(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// holds reports whether the management API has socket id (GET 200).
func (p *plane) holds(id string) bool {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.ts.URL+"/wake/@connections/"+url.PathEscape(id), nil)
	req.Header.Set(wire.WakeSecretHeader, manageSecret)
	resp, err := p.ts.Client().Do(req)
	if err != nil {
		p.t.Fatalf("GET connection: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// up starts a client on p with token tok and waits for its socket, up on
// the client and held by the server (which holds it a moment after the
// client's handshake ends: see wakesock's TestPostRightAfterDial).
func up(t *testing.T, p *plane, o Options, tok string) (*Client, string) {
	t.Helper()
	c := p.client(o)
	c.Use(p.url, tok)
	run(t, c)
	recv(t, c.Work(), "Work on connect")
	if !c.Up() {
		t.Fatal("Up() = false after the connect's Work")
	}
	id := p.lastConnect()
	waittest.Until(t, wait, "the server to hold the socket", func() bool { return p.holds(id) })
	return c, id
}

func TestConnectsWithToken(t *testing.T) {
	p := newPlane(t, accept("tok1"))
	c := p.client(fast())
	if c.Up() {
		t.Fatal("Up() = true before Run")
	}
	c.Use(p.url, "tok1")
	run(t, c)
	recv(t, c.Work(), "Work on connect")
	if !c.Up() {
		t.Error("Up() = false after the connect's Work")
	}
	connects := p.connects()
	if len(connects) != 1 {
		t.Fatalf("$connect routes = %d, want 1", len(connects))
	}
	if got := connects[0].Headers["Authorization"]; got != "Bearer tok1" {
		t.Errorf("Authorization = %q, want %q", got, "Bearer tok1")
	}
	if fired(c.News()) {
		t.Error("News fired on connect")
	}
	waittest.Until(t, wait, "the server to hold the socket", func() bool { return p.cur.Load().Connections() == 1 })
}

func TestWakeMessages(t *testing.T) {
	p := newPlane(t, accept("tok"))
	c, id := up(t, p, fast(), "tok")

	p.post(id, `{"type":"wake","queue":"q"}`)
	recv(t, c.Work(), "Work on a queue's wake")
	p.post(id, `{"type":"wake"}`)
	recv(t, c.News(), "News on a worker's wake")

	garbage := []string{
		`not json`,
		`{"type":"wake"`,
		`{"type":"wake","queue":1}`,
		`{"type":"nap","queue":"q"}`,
		`{"type":"WAKE"}`,
		`null`,
		`[]`,
		`""`,
		pong, // unasked for
	}
	// Messages are read in order, so once the sentinel's signal fired the
	// garbage before it was read too.
	for _, m := range garbage {
		p.post(id, m)
	}
	p.post(id, `{"type":"wake"}`)
	recv(t, c.News(), "News on the sentinel wake")
	if fired(c.Work()) {
		t.Error("garbage fired Work")
	}
	for _, m := range garbage {
		p.post(id, m)
	}
	p.post(id, `{"type":"wake","queue":"q"}`)
	recv(t, c.Work(), "Work on the sentinel wake")
	if fired(c.News()) {
		t.Error("garbage fired News")
	}
	if !c.Up() || len(p.connects()) != 1 || p.disconnected(id) {
		t.Errorf("garbage disturbed the socket: Up %v, %d connects, disconnected %v", c.Up(), len(p.connects()), p.disconnected(id))
	}
}

// gatedSecondConnect answers like accept(tok), except that the second
// $connect reports itself on arrived and waits for release.
func gatedSecondConnect(tok string, arrived chan<- struct{}, release <-chan struct{}) wakesock.Route {
	next := accept(tok)
	var n atomic.Int64
	return func(ctx context.Context, ev event) (response, error) {
		if ev.RequestContext.RouteKey == "$connect" && n.Add(1) == 2 {
			arrived <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
				return response{}, ctx.Err()
			}
		}
		return next(ctx, ev)
	}
}

func TestReconnectsAfterServerClose(t *testing.T) {
	for _, tc := range []struct {
		name  string
		close func(t *testing.T, p *plane, id string)
	}{
		{"management DELETE", func(t *testing.T, p *plane, id string) {
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodDelete, p.ts.URL+"/wake/@connections/"+url.PathEscape(id), nil)
			req.Header.Set(wire.WakeSecretHeader, manageSecret)
			resp, err := p.ts.Client().Do(req)
			if err != nil {
				t.Fatalf("DELETE: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode < 200 || resp.StatusCode > 299 {
				t.Fatalf("DELETE = %d, want 2xx", resp.StatusCode)
			}
		}},
		{"Server.Close", func(t *testing.T, p *plane, id string) {
			go p.swap().Close() // it waits for the $disconnect; the client reconnects to the new one
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			arrived, release := make(chan struct{}, 1), make(chan struct{})
			p := newPlane(t, gatedSecondConnect("tok", arrived, release))
			t.Cleanup(func() { close(release) }) // before the plane closes
			// A socket that worked and dropped is reconnected without
			// the backoff, which would outlast every bound here.
			c, id := up(t, p, Options{BackoffMin: time.Hour, BackoffMax: time.Hour}, "tok")

			tc.close(t, p, id)
			recv(t, arrived, "a second $connect")
			if c.Up() {
				t.Error("Up() = true while reconnecting")
			}
			if !fired(c.Work()) {
				t.Error("Work did not fire when the socket went down")
			}
			waittest.Until(t, wait, "$disconnect of the closed socket", func() bool { return p.disconnected(id) })

			release <- struct{}{}
			recv(t, c.Work(), "Work on reconnect")
			if !c.Up() {
				t.Error("Up() = false after the reconnect's Work")
			}
			connects := p.connects()
			if len(connects) != 2 {
				t.Fatalf("$connect routes = %d, want 2", len(connects))
			}
			if got := connects[1].Headers["Authorization"]; got != "Bearer tok" {
				t.Errorf("reconnect Authorization = %q, want %q", got, "Bearer tok")
			}
			if connects[1].RequestContext.ConnectionID == id {
				t.Error("the reconnect reused the closed socket's id")
			}
		})
	}
}

func TestRefusedKeepsRetrying(t *testing.T) {
	p := newPlane(t, accept("new"))
	c := p.client(fast())
	c.Use(p.url, "old")
	run(t, c)

	waittest.Until(t, wait, "several refused $connects", func() bool {
		if c.Up() {
			t.Fatal("Up() = true though every $connect was refused")
		}
		return len(p.connects()) >= 4
	})
	for i, ev := range p.connects() {
		if got := ev.Headers["Authorization"]; got != "Bearer old" {
			t.Errorf("$connect %d Authorization = %q, want %q", i, got, "Bearer old")
		}
	}
	if fired(c.Work()) {
		t.Error("Work fired though no socket came up")
	}
	if d := p.events("$disconnect"); len(d) != 0 {
		t.Errorf("$disconnect for refused sockets: %d", len(d))
	}

	c.Use(p.url, "new")
	recv(t, c.Work(), "Work on connect with the new token")
	if !c.Up() {
		t.Error("Up() = false after the connect's Work")
	}
	connects := p.connects()
	if got := connects[len(connects)-1].Headers["Authorization"]; got != "Bearer new" {
		t.Errorf("last $connect Authorization = %q, want %q", got, "Bearer new")
	}
}

func TestUseNewTokenReconnectsAtOnce(t *testing.T) {
	// A backoff this long would outlast every bound: only the new target
	// can explain a reconnect.
	slow := Options{BackoffMin: time.Hour, BackoffMax: time.Hour}

	t.Run("refused", func(t *testing.T) {
		p := newPlane(t, accept("new"))
		c := p.client(slow)
		c.Use(p.url, "old")
		run(t, c)
		waittest.Until(t, wait, "the refused $connect", func() bool { return len(p.connects()) >= 1 })

		c.Use(p.url, "new")
		recv(t, c.Work(), "Work on connect with the new token")
		if !c.Up() {
			t.Error("Up() = false after the connect's Work")
		}
		connects := p.connects()
		if len(connects) != 2 {
			t.Fatalf("$connect routes = %d, want 2 (one refused, one with the new token)", len(connects))
		}
		if got := connects[1].Headers["Authorization"]; got != "Bearer new" {
			t.Errorf("second $connect Authorization = %q, want %q", got, "Bearer new")
		}
	})

	t.Run("connected", func(t *testing.T) {
		p := newPlane(t, accept("old", "new"))
		c, id := up(t, p, slow, "old")

		c.Use(p.url, "old") // the same target: nothing changes
		c.Use(p.url, "new")
		waittest.Until(t, wait, "$disconnect of the old socket", func() bool { return p.disconnected(id) })
		waittest.Until(t, wait, "a $connect with the new token", func() bool { return len(p.connects()) >= 2 })
		waittest.Until(t, wait, "Up() with the new token", c.Up)
		connects := p.connects()
		if len(connects) != 2 {
			t.Fatalf("$connect routes = %d, want 2", len(connects))
		}
		if got := connects[1].Headers["Authorization"]; got != "Bearer new" {
			t.Errorf("second $connect Authorization = %q, want %q", got, "Bearer new")
		}
	})
}

func TestKeepAliveAnswered(t *testing.T) {
	// Pings every 20 ms for longer than PongWait: were a pong not taken as
	// the answer, the first socket would have been dropped before it sent
	// this many pings (the ticker never runs ahead of its period).
	const pings = 75
	o := fast()
	o.PingEvery, o.PongWait = 20*time.Millisecond, time.Second
	p := newPlane(t, accept("tok"))
	c, id := up(t, p, o, "tok")

	waittest.Until(t, wait, "pings on the first socket", func() bool { return p.pings(id) >= pings })
	for _, ev := range p.events("$default") {
		if ev.Body != wire.WakePing {
			t.Errorf("$default body = %q, want %q", ev.Body, wire.WakePing)
		}
	}
	if n := len(p.connects()); n != 1 {
		t.Errorf("$connect routes = %d, want 1: an answered keep-alive keeps the socket", n)
	}
	if p.disconnected(id) || !c.Up() {
		t.Errorf("the socket went down though every ping was answered (disconnected %v, Up %v)", p.disconnected(id), c.Up())
	}
}

func TestKeepAliveUnanswered(t *testing.T) {
	o := fast()
	o.PingEvery, o.PongWait = 20*time.Millisecond, 100*time.Millisecond
	answer := accept("tok")
	p := newPlane(t, func(ctx context.Context, ev event) (response, error) {
		if ev.RequestContext.RouteKey == "$default" {
			return response{StatusCode: http.StatusOK}, nil // no route response
		}
		return answer(ctx, ev)
	})
	_, id := up(t, p, o, "tok")

	waittest.Until(t, wait, "a reconnect after the unanswered keep-alive", func() bool { return len(p.connects()) >= 2 })
	waittest.Until(t, wait, "$disconnect of the quiet socket", func() bool { return p.disconnected(id) })
	if p.pings(id) == 0 {
		t.Error("the dropped socket sent no ping")
	}
	// Its pings came before its $disconnect.
	after := false
	for _, ev := range p.events("") {
		if ev.RequestContext.ConnectionID != id {
			continue
		}
		if ev.RequestContext.RouteKey == "$disconnect" {
			after = true
		} else if after {
			t.Errorf("%s on the socket after its $disconnect", ev.RequestContext.RouteKey)
		}
	}
}

func TestUseEmptyCloses(t *testing.T) {
	p := newPlane(t, accept("tok", "tok2"))
	c, id := up(t, p, fast(), "tok")

	c.Use("", "ignored")
	waittest.Until(t, wait, "$disconnect", func() bool { return p.disconnected(id) })
	waittest.Until(t, wait, "Up() = false", func() bool { return !c.Up() })
	recv(t, c.Work(), "Work when the socket closed")

	// With a 10 ms backoff a client still trying would have connected
	// again many times over by now (this wait can only miss a bug, not
	// invent one).
	time.Sleep(300 * time.Millisecond)
	if n := len(p.connects()); n != 1 {
		t.Fatalf("$connect routes = %d after Use(\"\"), want 1", n)
	}
	if c.Up() {
		t.Error("Up() = true after Use(\"\")")
	}

	// The next connect is the next target's, not the old one's.
	c.Use(p.url, "tok2")
	recv(t, c.Work(), "Work on connect")
	connects := p.connects()
	if len(connects) != 2 {
		t.Fatalf("$connect routes = %d, want 2", len(connects))
	}
	if got := connects[1].Headers["Authorization"]; got != "Bearer tok2" {
		t.Errorf("second $connect Authorization = %q, want %q", got, "Bearer tok2")
	}
}

func TestRunReturnsOnCancel(t *testing.T) {
	waitDone := func(t *testing.T, done <-chan struct{}) {
		t.Helper()
		select {
		case <-done:
		case <-time.After(wait):
			t.Fatal("Run did not return after its context was cancelled")
		}
	}

	t.Run("no target", func(t *testing.T) {
		p := newPlane(t, accept("tok"))
		c := p.client(fast())
		cancel, done := run(t, c)
		cancel()
		waitDone(t, done)
		if n := len(p.connects()); n != 0 {
			t.Errorf("$connect routes = %d without a target, want 0", n)
		}
	})

	t.Run("connected", func(t *testing.T) {
		p := newPlane(t, accept("tok"))
		c := p.client(fast())
		c.Use(p.url, "tok")
		cancel, done := run(t, c)
		recv(t, c.Work(), "Work on connect")
		id := p.lastConnect()
		cancel()
		waitDone(t, done)
		if c.Up() {
			t.Error("Up() = true after Run returned")
		}
		waittest.Until(t, wait, "$disconnect of the socket", func() bool { return p.disconnected(id) })
	})

	t.Run("backing off", func(t *testing.T) {
		p := newPlane(t, accept())
		c := p.client(Options{BackoffMin: time.Hour, BackoffMax: time.Hour})
		c.Use(p.url, "tok")
		cancel, done := run(t, c)
		waittest.Until(t, wait, "the refused $connect", func() bool { return len(p.connects()) >= 1 })
		cancel()
		waitDone(t, done)
	})

	t.Run("dialing", func(t *testing.T) {
		arrived, release := make(chan struct{}, 1), make(chan struct{})
		p := newPlane(t, func(ctx context.Context, ev event) (response, error) {
			if ev.RequestContext.RouteKey == "$connect" {
				arrived <- struct{}{}
				select {
				case <-release:
				case <-ctx.Done():
					return response{}, ctx.Err()
				}
			}
			return accept("tok")(ctx, ev)
		})
		t.Cleanup(func() { close(release) })
		c := p.client(fast())
		c.Use(p.url, "tok")
		cancel, done := run(t, c)
		recv(t, arrived, "the $connect")
		cancel()
		waitDone(t, done)
		if c.Up() {
			t.Error("Up() = true though the socket never came up")
		}
	})
}

// fakeConnector is the control plane behind the real route handler.
type fakeConnector struct {
	token        string
	disconnected chan string
}

func (f fakeConnector) Connect(_ context.Context, id, token, _ string) (domain.Worker, error) {
	if token != f.token {
		return domain.Worker{}, wire.Errorf(wire.CodeUnauthorized, "worker token is not valid")
	}
	return domain.Worker{}, nil
}

func (f fakeConnector) Disconnect(_ context.Context, id string) error {
	select {
	case f.disconnected <- id:
	default:
	}
	return nil
}

// TestWithRealHandler runs the client against the wake channel's own
// route handler: its $connect takes the token the client sends and its
// pong is what the client takes for one.
func TestWithRealHandler(t *testing.T) {
	fc := fakeConnector{token: "good", disconnected: make(chan string, 16)}
	p := newPlane(t, wakelambda.Handler(fc, auth.DaemonAuthToken, discard))
	o := fast()
	o.PingEvery, o.PongWait = 20*time.Millisecond, time.Second
	c := p.client(o)

	c.Use(p.url, "bad")
	run(t, c)
	waittest.Until(t, wait, "refused $connects", func() bool { return len(p.connects()) >= 2 })
	if c.Up() {
		t.Error("Up() = true with a refused token")
	}

	c.Use(p.url, "good")
	recv(t, c.Work(), "Work on connect")
	id := p.lastConnect()
	waittest.Until(t, wait, "pings answered for longer than PongWait", func() bool { return p.pings(id) >= 75 })
	if !c.Up() || p.disconnected(id) {
		t.Errorf("the real handler's pongs did not keep the socket (Up %v, disconnected %v)", c.Up(), p.disconnected(id))
	}

	c.Use("", "")
	select {
	case got := <-fc.disconnected:
		if got != id {
			t.Errorf("Disconnect(%q), want %q", got, id)
		}
	case <-time.After(wait):
		t.Fatal("the handler's Disconnect did not run after Use(\"\")")
	}
}

func TestOptionDefaults(t *testing.T) {
	c := New(Options{})
	o := c.opts
	if o.HTTP == nil || o.Logger == nil {
		t.Error("no default HTTP client or logger")
	}
	if o.PingEvery != defaultPingEvery || o.PongWait != defaultPongWait || o.BackoffMin != defaultBackoffMin || o.BackoffMax != defaultBackoffMax {
		t.Errorf("defaults = ping %v pong %v backoff %v..%v", o.PingEvery, o.PongWait, o.BackoffMin, o.BackoffMax)
	}
	if c := New(Options{BackoffMin: 2 * time.Minute}); c.opts.BackoffMax < c.opts.BackoffMin {
		t.Errorf("BackoffMax %v below BackoffMin %v", c.opts.BackoffMax, c.opts.BackoffMin)
	}
	if c.Up() {
		t.Error("Up() = true for a new client")
	}
}

func TestBackoff(t *testing.T) {
	const lo, hi = 10 * time.Millisecond, time.Second
	c := New(Options{BackoffMin: lo, BackoffMax: hi})
	base := lo
	for n := 1; n <= 100; n++ {
		for range 50 {
			d := c.backoff(n)
			if d < base/2 || d >= base*3/2 || d > hi {
				t.Fatalf("backoff(%d) = %v, want within [%v, %v) and at most %v", n, d, base/2, base*3/2, hi)
			}
		}
		base = min(base*2, hi)
	}
}

// TestDroppedAtOnceBacksOff: a server that accepts every socket and drops
// it at once (a misbehaving proxy, a control plane that closes sockets as
// they come) should be retried with the backoff, like one that refuses.
// (It once reconnected in a hot loop, each round also firing Work, a poll:
// any socket that came up reset the backoff.)
func TestDroppedAtOnceBacksOff(t *testing.T) {
	var accepted atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		accepted.Add(1)
		_ = conn.Close(websocket.StatusGoingAway, "dropped at once")
	}))
	t.Cleanup(ts.Close)
	c := New(Options{HTTP: ts.Client(), Logger: discard, BackoffMin: time.Hour, BackoffMax: time.Hour})
	c.Use("ws"+strings.TrimPrefix(ts.URL, "http")+"/wake", "tok")
	run(t, c)
	waittest.Until(t, wait, "the first socket", func() bool { return accepted.Load() >= 1 })
	// With an hour's backoff no correct client connects more than a
	// couple of times, however long this takes.
	time.Sleep(500 * time.Millisecond)
	if n := accepted.Load(); n > 3 {
		t.Errorf("%d sockets in half a second with a 1 h backoff: the client reconnects in a hot loop", n)
	}
}

// TestBackoffNeverPastCap: with the defaults (1 s doubling to 1 min) no
// draw of the jitter, up to the largest, makes a wait longer than the
// minute, and none is shorter than half its step.
func TestBackoffNeverPastCap(t *testing.T) {
	c := New(Options{})
	draws := rand.New(rand.NewPCG(1, 2))
	for n := 1; n <= 64; n++ {
		step := min(defaultBackoffMin<<min(n-1, 16), defaultBackoffMax)
		for i := range 200 {
			j := draws.Float64()
			if i == 0 {
				j = math.Nextafter(1, 0) // the largest draw
			}
			c.jitter = func() float64 { return j }
			if d := c.backoff(n); d > defaultBackoffMax || d < step/2 {
				t.Fatalf("backoff(%d) with draw %v = %v, want within [%v, %v]", n, j, d, step/2, defaultBackoffMax)
			}
		}
	}
}

// TestRetryStartsOverAfterGoodSocket: after failures in a row, a socket
// that stayed up past stableAfter and then failed (its keep-alive
// unanswered) is retried after the first step again, not the next.
func TestRetryStartsOverAfterGoodSocket(t *testing.T) {
	c := New(Options{})
	c.jitter = func() float64 { return math.Nextafter(1, 0) }
	var r retries
	refused := errors.New("refused")
	for range 8 {
		if r.after(0, refused) == nil {
			t.Fatal("a refused connect reconnects at once")
		}
	}
	if d := c.backoff(r.failures); d != defaultBackoffMax {
		t.Fatalf("after 8 refusals the wait is %v, want the cap %v", d, defaultBackoffMax)
	}
	if r.after(time.Hour, errors.New("the keep-alive was not answered")) == nil {
		t.Fatal("a failed socket reconnects at once")
	}
	if d, first := c.backoff(r.failures), defaultBackoffMin*3/2; r.failures != 1 || d > first {
		t.Errorf("after a socket that was up an hour failed: failures %d, wait %v; want 1 and at most the first step's %v", r.failures, d, first)
	}
	// A socket that was up and ended cleanly reconnects at once and also
	// starts the count over.
	r = retries{failures: 8}
	if err := r.after(time.Hour, nil); err != nil || r.failures != 0 {
		t.Errorf("after a socket that was up an hour ended: %v, failures %d", err, r.failures)
	}
}

// TestSessionReportsUpTimeOnFailure: a socket that came up and then failed
// (its keep-alive unanswered) reports how long it was up, so Run can tell a
// socket that worked from one that never did. The clock reads an hour
// later at every read after the socket came up.
func TestSessionReportsUpTimeOnFailure(t *testing.T) {
	answer := accept("tok")
	p := newPlane(t, func(ctx context.Context, ev event) (response, error) {
		if ev.RequestContext.RouteKey == "$default" {
			return response{StatusCode: http.StatusOK}, nil // no pong
		}
		return answer(ctx, ev)
	})
	o := fast()
	o.PingEvery, o.PongWait = 20*time.Millisecond, 100*time.Millisecond
	c := p.client(o)
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var reads atomic.Int64
	c.clock = clock.Of(func() time.Time {
		if reads.Add(1) == 1 {
			return start
		}
		return start.Add(time.Hour)
	})
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	up, err := c.session(ctx, target{p.url, "tok"}, make(chan struct{}))
	if err == nil || ctx.Err() != nil {
		t.Fatalf("session ended with %v (ctx %v), want the unanswered keep-alive", err, ctx.Err())
	}
	if up != time.Hour {
		t.Errorf("session up = %v after failing, want the hour it was up", up)
	}
}
