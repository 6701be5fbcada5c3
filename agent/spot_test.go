package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/imds"
	"github.com/dreamlake/lakeshore/agent/internal/machineid"
)

// spotIMDS is an IMDSv2 fake on loopback: PUT /latest/api/token issues a
// token that lives for the TTL asked; the notice paths answer only a GET
// carrying a live token (401 otherwise), 404 while there is no notice.
type spotIMDS struct {
	*httptest.Server
	now       func() time.Time // tokens expire by this clock
	mu        sync.Mutex
	tokens    map[string]time.Time // token → expiry
	action    string               // "" : no interruption notice
	at        time.Time
	rebalance time.Time     // zero: no recommendation
	fail      bool          // every request answers 500
	answered  chan struct{} // closed and replaced as each request is answered

	tokenPUTs  atomic.Int32
	gets       atomic.Int32
	tokenless  atomic.Int32 // GETs refused for a missing, unknown or expired token
	nextTokenN atomic.Int32
}

// newSpotIMDS starts the fake; now, if not nil, is its clock (default
// time.Now): pass the watcher's to test token lifetimes without waiting.
func newSpotIMDS(t *testing.T, now func() time.Time) *spotIMDS {
	t.Helper()
	if now == nil {
		now = time.Now
	}
	f := &spotIMDS{now: now, tokens: map[string]time.Time{}, answered: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /latest/api/token", func(w http.ResponseWriter, r *http.Request) {
		f.tokenPUTs.Add(1)
		defer f.wake()
		if f.failing() {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		ttl, err := strconv.Atoi(r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds"))
		if err != nil || ttl < 1 || ttl > 21600 {
			http.Error(w, "bad TTL", http.StatusBadRequest)
			return
		}
		tok := fmt.Sprintf("token-%d", f.nextTokenN.Add(1))
		f.mu.Lock()
		f.tokens[tok] = f.now().Add(time.Duration(ttl) * time.Second)
		f.mu.Unlock()
		w.Header().Set("X-aws-ec2-metadata-token-ttl-seconds", strconv.Itoa(ttl)) // as IMDS answers
		fmt.Fprint(w, tok)
	})
	mux.HandleFunc("GET /latest/meta-data/", func(w http.ResponseWriter, r *http.Request) {
		f.gets.Add(1)
		defer f.wake()
		if f.failing() {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		f.mu.Lock()
		exp, ok := f.tokens[r.Header.Get("X-aws-ec2-metadata-token")]
		action, at, rebalance := f.action, f.at, f.rebalance
		f.mu.Unlock()
		if !ok || f.now().After(exp) {
			f.tokenless.Add(1)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		switch r.URL.Path {
		case "/latest/meta-data/spot/instance-action":
			if action == "" {
				http.NotFound(w, r)
				return
			}
			json.NewEncoder(w).Encode(map[string]string{"action": action, "time": at.UTC().Format(time.RFC3339)})
		case "/latest/meta-data/events/recommendations/rebalance":
			if rebalance.IsZero() {
				http.NotFound(w, r)
				return
			}
			json.NewEncoder(w).Encode(map[string]string{"noticeTime": rebalance.UTC().Format(time.RFC3339)})
		default:
			http.NotFound(w, r)
		}
	})
	f.Server = httptest.NewServer(mux)
	t.Cleanup(f.Close)
	return f
}

// wake tells waitFor that a request was answered (its counter moved
// before).
func (f *spotIMDS) wake() {
	f.mu.Lock()
	defer f.mu.Unlock()
	close(f.answered)
	f.answered = make(chan struct{})
}

// waitFor waits until cond holds, checking it again as each request is
// answered, for at most spotTestWait.
func (f *spotIMDS) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(spotTestWait)
	defer deadline.Stop()
	for {
		f.mu.Lock()
		answered := f.answered
		f.mu.Unlock()
		if cond() {
			return
		}
		select {
		case <-answered:
		case <-deadline.C:
			t.Fatalf("%s: not within %s (token PUTs %d, GETs %d)", what, spotTestWait, f.tokenPUTs.Load(), f.gets.Load())
		}
	}
}

func (f *spotIMDS) failing() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fail
}

func (f *spotIMDS) set(mod func(f *spotIMDS)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	mod(f)
}

// revokeTokens forgets every token issued, as a restarted IMDS would.
func (f *spotIMDS) revokeTokens() { f.set(func(f *spotIMDS) { clear(f.tokens) }) }

const spotTestInterval = 20 * time.Millisecond

// spotTestWait bounds every wait: generous, the tests assert what happened,
// never how fast.
const spotTestWait = 10 * time.Second

func watchSpotTest(t *testing.T, endpoint string, mod func(*SpotOptions)) <-chan SpotNotice {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	opts := SpotOptions{Endpoint: endpoint, Interval: spotTestInterval, Logger: slog.New(slog.DiscardHandler)}
	if mod != nil {
		mod(&opts)
	}
	ch := WatchSpot(ctx, opts)
	t.Cleanup(func() {
		cancel()
		for range ch { // closed once the watcher stops
		}
	})
	return ch
}

// waitGets waits until the fake has answered n more metadata GETs.
func waitGets(t *testing.T, f *spotIMDS, n int32) {
	t.Helper()
	want := f.gets.Load() + n
	f.waitFor(t, fmt.Sprintf("%d more metadata GETs", n), func() bool { return f.gets.Load() >= want })
}

func expectNotice(t *testing.T, ch <-chan SpotNotice) SpotNotice {
	t.Helper()
	select {
	case n := <-ch:
		return n
	case <-time.After(spotTestWait):
		t.Fatal("no spot notice")
		return SpotNotice{}
	}
}

func expectNoNotice(t *testing.T, f *spotIMDS, ch <-chan SpotNotice) {
	t.Helper()
	waitGets(t, f, 10) // five more polls of both paths
	select {
	case n := <-ch:
		t.Fatalf("unexpected spot notice %+v", n)
	default:
	}
}

func TestSpotNoNotice(t *testing.T) {
	f := newSpotIMDS(t, nil)
	ch := watchSpotTest(t, f.URL, nil)
	expectNoNotice(t, f, ch)
	if f.tokenless.Load() != 0 {
		t.Fatalf("%d GETs without a valid token; IMDSv2 needs one on each", f.tokenless.Load())
	}
	if f.tokenPUTs.Load() != 1 {
		t.Fatalf("%d token PUTs; one token should serve every poll within its TTL", f.tokenPUTs.Load())
	}
}

func TestSpotInterruptionSentOnce(t *testing.T) {
	f := newSpotIMDS(t, nil)
	ch := watchSpotTest(t, f.URL, nil)
	expectNoNotice(t, f, ch)
	at := time.Now().Add(2 * time.Minute).Truncate(time.Second)
	f.set(func(f *spotIMDS) { f.action, f.at = "terminate", at })
	n := expectNotice(t, ch)
	if n.Kind != SpotInterruption || n.Action != "terminate" || !n.Time.Equal(at) {
		t.Fatalf("notice %+v; want an interruption, terminate at %s", n, at)
	}
	expectNoNotice(t, f, ch) // the same notice, still served, is not sent again
	// A changed notice is news.
	f.set(func(f *spotIMDS) { f.action = "stop" })
	if n := expectNotice(t, ch); n.Kind != SpotInterruption || n.Action != "stop" {
		t.Fatalf("changed notice %+v", n)
	}
}

func TestSpotRebalance(t *testing.T) {
	f := newSpotIMDS(t, nil)
	ch := watchSpotTest(t, f.URL, nil)
	at := time.Now().Truncate(time.Second)
	f.set(func(f *spotIMDS) { f.rebalance = at })
	n := expectNotice(t, ch)
	if n.Kind != SpotRebalance || n.Action != "" || !n.Time.Equal(at) {
		t.Fatalf("notice %+v; want a rebalance recommendation at %s", n, at)
	}
	expectNoNotice(t, f, ch)
}

// TestSpotTokenRefresh: one IMDSv2 token serves every poll (the SDK's
// client keeps it for its six-hour life), and a token IMDS forgot (401: it
// restarted) is replaced within the same poll, so the notice behind it is
// not a tick late.
func TestSpotTokenRefresh(t *testing.T) {
	f := newSpotIMDS(t, nil)
	ch := watchSpotTest(t, f.URL, nil)
	waitGets(t, f, 6) // three polls
	if puts := f.tokenPUTs.Load(); puts != 1 {
		t.Fatalf("%d token PUTs for three polls; one token should serve them all", puts)
	}
	f.revokeTokens()
	at := time.Now().Add(time.Minute).Truncate(time.Second)
	f.set(func(f *spotIMDS) { f.action, f.at = "hibernate", at })
	if n := expectNotice(t, ch); n.Action != "hibernate" {
		t.Fatalf("notice after the token was revoked %+v", n)
	}
	if puts, refused := f.tokenPUTs.Load(), f.tokenless.Load(); puts != 2 || refused < 1 {
		t.Fatalf("after the revocation: %d token PUTs, %d GETs refused; want a second token after the refusal", puts, refused)
	}
}

// spotTriedTransport tells tried after each request it made, answered or
// not (nothing listening, say).
type spotTriedTransport struct {
	base  http.RoundTripper
	tried chan<- struct{}
}

func (s spotTriedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	defer func() {
		select {
		case s.tried <- struct{}{}:
		default: // the test stopped counting
		}
	}()
	return s.base.RoundTrip(r)
}

// TestSpotEndpointDown: nothing listens, or IMDS answers 500: no notice, no
// panic, and the watcher keeps trying until IMDS answers again.
func TestSpotEndpointDown(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	tried := make(chan struct{}, 16)
	ch := watchSpotTest(t, dead.URL, func(o *SpotOptions) {
		o.HTTP = &http.Client{Transport: spotTriedTransport{base: &http.Transport{DisableKeepAlives: true}, tried: tried}}
	})
	deadline := time.After(spotTestWait)
	for range 10 { // ten tries, on several ticks
		select {
		case <-tried:
		case n, ok := <-ch:
			t.Fatalf("notice from a dead endpoint: %+v %v", n, ok)
		case <-deadline:
			t.Fatal("the watcher stopped trying a dead endpoint")
		}
	}

	f := newSpotIMDS(t, nil)
	f.set(func(f *spotIMDS) { f.fail = true; f.action, f.at = "terminate", time.Now().Add(time.Minute) })
	ch = watchSpotTest(t, f.URL, nil)
	f.waitFor(t, "five token PUTs to a failing IMDS", func() bool { return f.tokenPUTs.Load() >= 5 })
	select {
	case n := <-ch:
		t.Fatalf("notice while IMDS fails: %+v", n)
	default:
	}
	f.set(func(f *spotIMDS) { f.fail = false })
	if n := expectNotice(t, ch); n.Action != "terminate" {
		t.Fatalf("notice after IMDS recovered: %+v", n)
	}
}

func TestSpotEndpointSelection(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	for _, tc := range []struct {
		name, configured, source string
		env                      map[string]string
		want                     string
		ok                       bool
	}{
		{"off EC2", "", machineid.SourceFile, nil, "", false},
		{"machine id flag", "", machineid.SourceFlag, nil, "", false},
		{"on EC2", "", machineid.SourceIMDS, nil, imds.DefaultEndpoint, true},
		{"config", "http://127.0.0.1:1", machineid.SourceHostname, nil, "http://127.0.0.1:1", true},
		{"env", "", machineid.SourceHostname, map[string]string{"AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://127.0.0.1:2"}, "http://127.0.0.1:2", true},
		{"config over env", "http://127.0.0.1:1", machineid.SourceIMDS, map[string]string{"AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://127.0.0.1:2"}, "http://127.0.0.1:1", true},
		{"disabled", "", machineid.SourceIMDS, map[string]string{"AWS_EC2_METADATA_DISABLED": "true"}, "", false},
	} {
		got, ok := spotEndpoint(tc.configured, tc.source, env(tc.env))
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: spotEndpoint = %q %v; want %q %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

func TestSpotGrace(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		reclaim time.Time
		want    time.Duration
	}{
		{time.Time{}, 30 * time.Second},                                // no notice: the configured grace
		{now.Add(2 * time.Minute), 30 * time.Second},                   // reclaim far off: the configured grace
		{now.Add(30 * time.Second), 15 * time.Second},                  // 30 s − kill-after 10 s − 5 s
		{now.Add(12 * time.Second), 0},                                 // too close: terminate at once
		{now.Add(-time.Minute), 0},                                     // already past
		{now.Add(45*time.Second + time.Millisecond), 30 * time.Second}, // exactly enough
	} {
		if got := spotGrace(30*time.Second, 10*time.Second, tc.reclaim, now); got != tc.want {
			t.Errorf("spotGrace(reclaim %v) = %s; want %s", tc.reclaim.Sub(now), got, tc.want)
		}
	}
}
