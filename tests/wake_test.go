package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// The wake channel with real processes: `lakeshore dev` (in process with
// long polls off, so the socket and not a held poll brings the work; and
// through the real bootstraps with --lambdas) and nymph. At the default
// 60 s stale window an idle nymph with its socket up polls every 20 s, so
// work that starts within a few seconds of its submit was brought by a wake.

// wakePlanes are the control planes the wake tests run on.
var wakePlanes = []struct {
	name string
	b    backend
	args []string
}{
	{"in-process", backends[0], []string{"--long-poll=false"}},
	{"lambdas", lambdasBackend, nil},
}

// forEachWakePlane runs fn on each wake plane (a 60 s stale window: idle
// polls 20 s apart) with a nymph labelled label whose socket is up and idle.
func forEachWakePlane(t *testing.T, label string, fn func(t *testing.T, d *devServer, n *nymphProc)) {
	for _, p := range wakePlanes {
		t.Run(p.name, func(t *testing.T) {
			d := startDev(t, p.b, append(p.args, "--stale-after", "60s")...)
			n := startNymph(t, d, label)
			n.waitConnected(t)
			fn(t, d, n)
		})
	}
}

// startedWithin submits a body and reports how long it took to start (the
// daemon's "body started" line), failing the test if it did not start, or
// finish, within a minute.
func startedWithin(t *testing.T, op *client.Client, n *nymphProc) time.Duration {
	t.Helper()
	before := len(n.logLines(t, "body started"))
	sent := time.Now()
	inv := submitSh(t, op, "true", 0)
	var took time.Duration
	waittest.Until(t, time.Minute, "body of "+inv.InvocationID+" started", func() bool {
		if len(n.logLines(t, "body started")) > before {
			took = time.Since(sent)
			return true
		}
		return false
	})
	if got := waitTerminal(t, op, inv.InvocationID, time.Minute); got.State != wire.StateSucceeded {
		t.Fatalf("invocation ended %s, want succeeded: %+v", got.State, got)
	}
	return took
}

// waitConnected waits until nymph's wake socket is up and the poll its
// connect triggers has been answered: from then on it is idle, polling
// every 20 s.
func (p *nymphProc) waitConnected(t *testing.T) {
	t.Helper()
	waittest.Until(t, 30*time.Second, "the wake socket up and a poll after it", func() bool {
		_, after, ok := strings.Cut(p.logs.String(), "wake socket connected")
		return ok && strings.Contains(after, `"msg":"poll"`)
	})
}

// waitIdleAfterRun waits until nymph has answered the poll that a run's
// end triggers (its slot is free): that poll can claim work submitted while
// it is in flight, without a wake, so a submit that must be brought by a
// wake waits for it. Before any run it returns at once.
func (p *nymphProc) waitIdleAfterRun(t *testing.T) {
	t.Helper()
	waittest.Until(t, 30*time.Second, "a poll after nymph's last run", func() bool {
		logs := p.logs.String()
		i := strings.LastIndex(logs, `"msg":"finished"`)
		return i < 0 || strings.Contains(logs[i:], `"msg":"poll"`)
	})
}

// TestWakeChannelStartsIdleWork: an idle nymph with its wake socket up is
// told "poll now" by a submit, and the body starts within seconds although
// its next idle poll is up to 20 s away; each start follows a wake.
func TestWakeChannelStartsIdleWork(t *testing.T) {
	forEachWakePlane(t, "woken", func(t *testing.T, d *devServer, n *nymphProc) {
		op := d.Operator()
		for i := range 3 {
			n.waitIdleAfterRun(t)
			woken := len(n.logLines(t, "woken: work may be waiting"))
			if took := startedWithin(t, op, n); took > 5*time.Second {
				t.Fatalf("submit %d: the body started %s after its submit; a wake should have brought it in well under the 20 s idle poll", i, took)
			}
			if len(n.logLines(t, "woken: work may be waiting")) == woken {
				t.Fatalf("submit %d: the body started but nymph was not woken", i)
			}
		}
	})
}

// TestWakeChannelNews: a drain for an idle worker reaches it over its
// socket; it drains and says bye at once, not at its next idle poll.
func TestWakeChannelNews(t *testing.T) {
	forEachWakePlane(t, "drained", func(t *testing.T, d *devServer, n *nymphProc) {
		op := d.Operator()
		w, ok := workerNamed(context.Background(), op, "drained")
		if !ok {
			t.Fatal("no worker")
		}
		asked := time.Now()
		if _, err := op.DrainWorker(context.Background(), w.WorkerID); err != nil {
			t.Fatal(err)
		}
		if code := n.wait(t, time.Minute); code != 0 {
			t.Fatalf("nymph exited %d after a drain, want 0", code)
		}
		if took := time.Since(asked); took > 10*time.Second {
			t.Fatalf("the drain took %s to reach an idle worker with a socket; its idle poll is 20 s apart, the socket should bring it at once", took)
		}
		if len(n.logLines(t, "woken: news for this worker")) == 0 {
			t.Fatal("nymph drained without being woken for the news")
		}
	})
}

// TestNoWakeChannel: against a control plane without the wake channel (an
// older one) nymph opens no socket and polls on the interval; work runs.
func TestNoWakeChannel(t *testing.T) {
	d := startDev(t, backends[0], "--wake-channel=false", "--long-poll=false", "--stale-after", "6s")
	op := d.Operator()
	n := startNymph(t, d, "plain")
	waitPolls(t, op, "plain", 2)
	if took := startedWithin(t, op, n); took > 10*time.Second {
		t.Fatalf("the body started %s after its submit; the 1 s poll interval should have brought it", took)
	}
	if strings.Contains(n.logs.String(), "wake socket") {
		t.Fatalf("nymph tried a wake socket the control plane does not offer:\n%s", n.logs.String())
	}
}

// TestWakeSocketLostOrBlocked: a socket that is refused (a proxy that
// blocks WebSockets), or that drops and cannot come back, never delays
// work beyond one poll interval (5 s at the 60 s stale window): nymph falls
// back to polling on the interval while it retries the socket.
func TestWakeSocketLostOrBlocked(t *testing.T) {
	t.Parallel()
	t.Run("blocked", func(t *testing.T) {
		t.Parallel()
		d := startDev(t, backends[0], "--long-poll=false", "--stale-after", "60s")
		p := newWakeProxy(t, d)
		p.refuse.Store(true)
		n := startNymph(t, p.dev(d), "blocked")
		n.waitLog(t, 30*time.Second, "wake socket down")
		for i := range 3 {
			if took := startedWithin(t, d.Operator(), n); took > 8*time.Second {
				t.Fatalf("submit %d: started %s after its submit with the socket blocked; want within the 5 s poll interval", i, took)
			}
		}
		if strings.Contains(n.logs.String(), "wake socket connected") {
			t.Fatal("the socket connected through a proxy that refuses it")
		}
	})
	t.Run("dropped", func(t *testing.T) {
		t.Parallel()
		d := startDev(t, backends[0], "--long-poll=false", "--stale-after", "60s")
		p := newWakeProxy(t, d)
		n := startNymph(t, p.dev(d), "dropped")
		n.waitLog(t, 30*time.Second, "wake socket connected")
		p.refuse.Store(true) // it cannot come back
		dropSocket(t, d)
		n.waitLog(t, 30*time.Second, "wake socket closed; reconnecting")
		for i := range 3 {
			if took := startedWithin(t, d.Operator(), n); took > 8*time.Second {
				t.Fatalf("submit %d: started %s after its submit with the socket gone; want within the 5 s poll interval", i, took)
			}
		}
		p.refuse.Store(false) // it comes back, and wakes work again
		waittest.Until(t, time.Minute, "the socket reconnected", func() bool {
			return strings.Count(n.logs.String(), "wake socket connected") >= 2
		})
	})
}

// dropSocket closes the dev server's only wake socket from the server
// side, through the management API the Lambdas post with.
func dropSocket(t *testing.T, d *devServer) {
	t.Helper()
	var id string
	for _, line := range strings.Split(d.logText(), "\n") {
		var rec struct {
			Msg          string `json:"msg"`
			ConnectionID string `json:"connection_id"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "wake socket connected" {
			id = rec.ConnectionID
		}
	}
	if id == "" {
		t.Fatal("the dev server logged no wake socket")
	}
	req, _ := http.NewRequest(http.MethodDelete, d.URL+"/wake/@connections/"+url.PathEscape(id), nil)
	req.Header.Set(wire.WakeSecretHeader, d.WakeSecret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE @connections/%s = %d, want 204", id, resp.StatusCode)
	}
}

// wakeProxy stands between nymph and the dev server, as a corporate proxy
// or a load balancer might: it forwards everything, points hello's wake_url
// at itself, and refuses WebSocket upgrades while refuse is set.
type wakeProxy struct {
	srv    *httptest.Server
	refuse atomic.Bool
}

func newWakeProxy(t *testing.T, d *devServer) *wakeProxy {
	t.Helper()
	target, err := url.Parse(d.URL)
	if err != nil {
		t.Fatal(err)
	}
	p := &wakeProxy{}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.ModifyResponse = func(resp *http.Response) error {
		if resp.Request.URL.Path != "/v1/daemon/hello" || resp.StatusCode != http.StatusOK {
			return nil
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		var hello map[string]any
		if err := json.Unmarshal(body, &hello); err != nil {
			return err
		}
		if u, ok := hello["wake_url"].(string); ok {
			hello["wake_url"] = strings.Replace(u, target.Host, p.srv.Listener.Addr().String(), 1)
		}
		body, _ = json.Marshal(hello)
		resp.Body = io.NopCloser(bytes.NewReader(body))
		resp.ContentLength = int64(len(body))
		resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
		return nil
	}
	// Unstarted until p.srv is set: the handler reads its address.
	p.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") && p.refuse.Load() {
			http.Error(w, "WebSockets are not allowed here", http.StatusForbidden)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	p.srv.Start()
	t.Cleanup(p.srv.Close)
	return p
}

// dev is d as seen through the proxy.
func (p *wakeProxy) dev(d *devServer) *devServer {
	c := *d
	c.URL = p.srv.URL
	return &c
}

// TestWakeChannelSocketFlood: a worker that opens 400 wake sockets with its
// token and never polls does not keep the wakes from an honest nymph on
// the same queue. nymph polls every 30 s here (no long polls), so only a
// wake can start its work within 10 s of a submit. With --lambdas the
// replaced sockets are closed through the management API's DELETE.
func TestWakeChannelSocketFlood(t *testing.T) {
	for _, p := range wakePlanes {
		t.Run(p.name, func(t *testing.T) {
			testSocketFlood(t, startDev(t, p.b, append(p.args, "--stale-after", "120s")...))
		})
	}
}

func testSocketFlood(t *testing.T, d *devServer) {
	n := startNymph(t, d, "honest", "--poll-interval", "30s")
	n.waitConnected(t)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hello, err := d.Enroll().Hello(ctx, wire.HelloRequest{MachineID: "hostile", BootID: "b", Label: "hostile", Lanes: []string{"q"}})
	if err != nil {
		t.Fatal(err)
	}
	const flood = 400
	var open atomic.Int64
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for range flood {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			c, _, err := websocket.Dial(ctx, hello.WakeURL, &websocket.DialOptions{
				HTTPHeader: http.Header{"Authorization": {"Bearer " + hello.Token}},
			})
			if err != nil {
				t.Errorf("hostile socket: %v", err)
				return
			}
			open.Add(1)
			go func() { // hold it until the server closes it or the test ends
				defer c.CloseNow()
				_, _, _ = c.Read(ctx)
				open.Add(-1)
			}()
		})
	}
	wg.Wait()
	waittest.Until(t, time.Minute, "the hostile worker's sockets capped", func() bool { return open.Load() <= 4 })

	op := d.Operator()
	for i := range 5 {
		if took := startedWithin(t, op, n); took > 10*time.Second {
			t.Fatalf("submit %d: the honest nymph started its body %s after the submit; with 400 hostile sockets a wake should still bring it well before its 30 s poll", i, took)
		}
	}
}
