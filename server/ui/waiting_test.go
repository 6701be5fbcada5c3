package ui_test

import (
	"context"
	"html"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestQueuedWorkSaysWhyItWaits: queued work whose host key the provisioner
// holds back (its hosts failed their setup) says so on its page, with the
// setup's failure, in the page and in its live part.
func TestQueuedWorkSaysWhyItWaits(t *testing.T) {
	tb := newTables(t)
	s := tb.serve(t, nil)
	inv, _, err := s.op.Submit(t.Context(), wire.SubmitRequest{Queue: "q", Argv: []string{"true"},
		RunConfig: wire.RunConfig{HostSetup: []string{"echo trying; exit 1"}}})
	if err != nil {
		t.Fatal(err)
	}
	key := domain.ProvisionKey{Queue: "q", HostKey: inv.HostKey}
	if err := store.New(tb.db, tb.prefix).SaveKeyHold(context.Background(), &domain.KeyHold{Key: key, Failures: 3, Stopped: true,
		Until: time.Now().Add(time.Hour), Last: domain.Host{Key: key, Reason: `its host setup failed: "echo trying; exit 1" exited 1`}}); err != nil {
		t.Fatal(err)
	}
	s.do(t, "POST", "/ui/login", url.Values{"token": {operatorToken}})
	for _, path := range []string{"/ui/invocations/" + inv.InvocationID, "/ui/invocations/" + inv.InvocationID + "/live"} {
		resp, body := s.do(t, "GET", path, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, body)
		}
		body = html.UnescapeString(strings.ReplaceAll(body, `\u003c`, "<"))
		if !strings.Contains(body, "3 hosts launched for it failed") || !strings.Contains(body, "exited 1") {
			t.Errorf("%s does not say why the work waits:\n%s", path, body)
		}
	}
}
