package agent

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// nopPoster is a wake channel that delivers nothing.
type nopPoster struct{}

func (nopPoster) Wake(context.Context, string, string) error    { return nil }
func (nopPoster) CloseConnection(context.Context, string) error { return nil }

// hostGuard fails every request to host, counting them, and hands the
// rest to base.
type hostGuard struct {
	base    http.RoundTripper
	host    string
	refused atomic.Int64
}

func (g *hostGuard) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.EqualFold(r.URL.Host, g.host) {
		g.refused.Add(1)
		return nil, errors.New("the test refuses every request to " + g.host)
	}
	return g.base.RoundTrip(r)
}

// TestWakeURLToAnotherHostInClearIsRefused: a hello whose wake_url is
// plain ws:// to another host makes nymph log once that it does not use
// the channel, never connect there (the worker token would travel in
// clear), and run its work from its polls.
func TestWakeURLToAnotherHostInClearIsRefused(t *testing.T) {
	p := apitest.New(t, func(c *apitest.Config) { c.Control.WakeURL, c.Control.Poster = "ws://evil.example:1/", nopPoster{} })
	guard := &hostGuard{base: http.DefaultTransport, host: "evil.example:1"}
	logs := newLogRecorder()
	a := newFakeTimeAgent(t, p, "wary", func(c *Config) {
		c.HTTP = &http.Client{Transport: guard}
		c.Logger = logs.logger()
	})
	started := make(chan string, 1)
	a.testHookRunStarted = func(id string) {
		select {
		case started <- id:
		default:
		}
	}
	runAgent(t, a)
	logs.wait(t, "hello", func(r logRecord) bool { return r.Msg == "hello" })
	inv, _, err := operator(p).Submit(context.Background(), wire.SubmitRequest{Queue: "q", Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-started:
		if id != inv.InvocationID {
			t.Fatalf("started %s, want %s", id, inv.InvocationID)
		}
	case <-time.After(time.Minute):
		t.Fatal("the submitted invocation never started from a poll")
	}
	if n := guard.refused.Load(); n != 0 {
		t.Fatalf("nymph sent %d requests to the wake_url's host", n)
	}
	refusals := logs.find(func(r logRecord) bool { return strings.Contains(r.Msg, "not using the wake channel") })
	if len(refusals) != 1 || !strings.Contains(refusals[0].String(), "evil.example") {
		t.Fatalf("logged %v; want one line that names the refused wake_url", refusals)
	}
}

// runAgent runs a until the test ends, and fails the test if Run then
// returns an error.
func runAgent(t *testing.T, a *Agent) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}
