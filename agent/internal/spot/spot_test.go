package spot

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/imds"
	"github.com/dreamlake/lakeshore/agent/internal/imds/imdstest"
	"github.com/dreamlake/lakeshore/agent/internal/machineid"
)

const spotTestInterval = 20 * time.Millisecond

// spotTestWait bounds every wait: generous, the tests assert what happened,
// never how fast.
const spotTestWait = 10 * time.Second

func watchSpotTest(t *testing.T, endpoint string, mod func(*Options)) <-chan Notice {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	opts := Options{Endpoint: endpoint, Interval: spotTestInterval, Logger: slog.New(slog.DiscardHandler)}
	if mod != nil {
		mod(&opts)
	}
	ch := Watch(ctx, opts)
	t.Cleanup(func() {
		cancel()
		for range ch { // closed once the watcher stops
		}
	})
	return ch
}

// waitGets waits until the fake has answered n more metadata GETs.
func waitGets(t *testing.T, f *imdstest.Server, n int32) {
	t.Helper()
	want := f.Gets.Load() + n
	f.WaitFor(t, fmt.Sprintf("%d more metadata GETs", n), spotTestWait, func() bool { return f.Gets.Load() >= want })
}

func expectNotice(t *testing.T, ch <-chan Notice) Notice {
	t.Helper()
	select {
	case n := <-ch:
		return n
	case <-time.After(spotTestWait):
		t.Fatal("no spot notice")
		return Notice{}
	}
}

func expectNoNotice(t *testing.T, f *imdstest.Server, ch <-chan Notice) {
	t.Helper()
	waitGets(t, f, 10) // five more polls of both paths
	select {
	case n := <-ch:
		t.Fatalf("unexpected spot notice %+v", n)
	default:
	}
}

func TestSpotNoNotice(t *testing.T) {
	f := imdstest.New(t, imdstest.State{})
	ch := watchSpotTest(t, f.URL, nil)
	expectNoNotice(t, f, ch)
	if f.Tokenless.Load() != 0 {
		t.Fatalf("%d GETs without a valid token; IMDSv2 needs one on each", f.Tokenless.Load())
	}
	if f.TokenPUTs.Load() != 1 {
		t.Fatalf("%d token PUTs; one token should serve every poll within its TTL", f.TokenPUTs.Load())
	}
}

func TestSpotInterruptionSentOnce(t *testing.T) {
	f := imdstest.New(t, imdstest.State{})
	ch := watchSpotTest(t, f.URL, nil)
	expectNoNotice(t, f, ch)
	at := time.Now().Add(2 * time.Minute).Truncate(time.Second)
	f.Set(func(s *imdstest.State) { s.Action, s.At = "terminate", at })
	n := expectNotice(t, ch)
	if n.Kind != Interruption || n.Action != "terminate" || !n.Time.Equal(at) {
		t.Fatalf("notice %+v; want an interruption, terminate at %s", n, at)
	}
	expectNoNotice(t, f, ch) // the same notice, still served, is not sent again
	// A changed notice is news.
	f.Set(func(s *imdstest.State) { s.Action = "stop" })
	if n := expectNotice(t, ch); n.Kind != Interruption || n.Action != "stop" {
		t.Fatalf("changed notice %+v", n)
	}
}

func TestSpotRebalance(t *testing.T) {
	f := imdstest.New(t, imdstest.State{})
	ch := watchSpotTest(t, f.URL, nil)
	at := time.Now().Truncate(time.Second)
	f.Set(func(s *imdstest.State) { s.Rebalance = at })
	n := expectNotice(t, ch)
	if n.Kind != Rebalance || n.Action != "" || !n.Time.Equal(at) {
		t.Fatalf("notice %+v; want a rebalance recommendation at %s", n, at)
	}
	expectNoNotice(t, f, ch)
}

// TestSpotTokenRefresh: one IMDSv2 token serves every poll (the SDK's
// client keeps it for its six-hour life), and a token IMDS forgot (401: it
// restarted) is replaced within the same poll, so the notice behind it is
// not a tick late.
func TestSpotTokenRefresh(t *testing.T) {
	f := imdstest.New(t, imdstest.State{})
	ch := watchSpotTest(t, f.URL, nil)
	waitGets(t, f, 6) // three polls
	if puts := f.TokenPUTs.Load(); puts != 1 {
		t.Fatalf("%d token PUTs for three polls; one token should serve them all", puts)
	}
	f.RevokeTokens()
	at := time.Now().Add(time.Minute).Truncate(time.Second)
	f.Set(func(s *imdstest.State) { s.Action, s.At = "hibernate", at })
	if n := expectNotice(t, ch); n.Action != "hibernate" {
		t.Fatalf("notice after the token was revoked %+v", n)
	}
	if puts, refused := f.TokenPUTs.Load(), f.Tokenless.Load(); puts != 2 || refused < 1 {
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
	ch := watchSpotTest(t, dead.URL, func(o *Options) {
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

	f := imdstest.New(t, imdstest.State{})
	f.Set(func(s *imdstest.State) { s.Fail = true; s.Action, s.At = "terminate", time.Now().Add(time.Minute) })
	ch = watchSpotTest(t, f.URL, nil)
	f.WaitFor(t, "five token PUTs to a failing IMDS", spotTestWait, func() bool { return f.TokenPUTs.Load() >= 5 })
	select {
	case n := <-ch:
		t.Fatalf("notice while IMDS fails: %+v", n)
	default:
	}
	f.Set(func(s *imdstest.State) { s.Fail = false })
	if n := expectNotice(t, ch); n.Action != "terminate" {
		t.Fatalf("notice after IMDS recovered: %+v", n)
	}
}

// TestSpotEndpointSelection: the link-local default only on EC2 (the
// machine id came from IMDS); an endpoint configured or in the environment
// anywhere; none when IMDS is turned off and nothing is configured.
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
		got, ok := Endpoint(tc.configured, tc.source, env(tc.env))
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: Endpoint = %q %v; want %q %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}
