package tests

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/server/ui/uitest"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// sharedStore is one embedded DynamoDB that several `lakeshore dev` in
// turn run on (--store aws at its endpoint), so state outlives a restart.
func sharedStore(t *testing.T) backend {
	endpoint, prefix, blobDir := storetest.EmbeddedEndpoint(t), storetest.Prefix(t), t.TempDir()
	return backend{"shared-store", func(testing.TB) ([]string, []string) {
		// The embedded store speaks DynamoDB only: artifacts go to a
		// directory (--store aws alone would create an S3 bucket there).
		return []string{"--store", "aws", "--table-prefix", prefix, "--host-poll-interval", "0", "--artifacts-dir", blobDir}, []string{
			"AWS_ENDPOINT_URL=" + endpoint, "AWS_REGION=us-east-1",
			"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test", "AWS_EC2_METADATA_DISABLED=true",
		}
	}}
}

// TestWebSessionsAcrossRotation: the operator token's rotation and the
// web view, on real `lakeshore dev` processes over one store. During the
// overlap (--operator-token NEW,OLD) sessions log in with either token;
// after the restart with NEW alone, every session opened with OLD is
// refused on every page and action, and changes nothing, while one
// opened with NEW keeps working (its cancel cancels). A cookie copied
// before its logout is refused too, after the restart as before it.
func TestWebSessionsAcrossRotation(t *testing.T) {
	const oldOperator, newOperator = "operator-token-old-sessions-0123456", "operator-token-new-sessions-0123456"
	shared, addr := sharedStore(t), fmt.Sprintf("127.0.0.1:%d", freePort(t))
	ctx := context.Background()
	dev := func(operator string) *devServer {
		return startDev(t, shared, "--addr", addr, "--stale-after", "10m", "--operator-token", operator)
	}

	d1 := dev(newOperator + "," + oldOperator)
	inv, _, err := client.New(d1.URL, oldOperator).Submit(ctx, wire.SubmitRequest{Queue: "nobody-serves-this", Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	hello, err := d1.Enroll().Hello(ctx, wire.HelloRequest{MachineID: "m-web-sessions", BootID: "b", Lanes: []string{"q"}})
	if err != nil {
		t.Fatal(err)
	}
	wrk := hello.WorkerID
	withOld, withNew, loggedOut := uitest.Login(t, d1.URL, oldOperator), uitest.Login(t, d1.URL, newOperator), uitest.Login(t, d1.URL, newOperator)
	if resp, body := uitest.Do(t, d1.URL, withOld.Cookie, "GET", "/ui/invocations/"+inv.InvocationID, nil); resp.StatusCode != 200 || !strings.Contains(body, inv.InvocationID) {
		t.Fatalf("during the overlap the old token's session: %d", resp.StatusCode)
	}
	if resp, _ := uitest.Do(t, d1.URL, loggedOut.Cookie, "POST", "/ui/logout", url.Values{"csrf": {loggedOut.CSRF}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("logout: %d", resp.StatusCode)
	}
	uitest.WantRefused(t, d1.URL, loggedOut, inv.InvocationID, wrk, "a logged-out cookie replayed")
	d1.stop(t)

	d2 := dev(newOperator)
	op := client.New(d2.URL, newOperator)
	uitest.WantRefused(t, d2.URL, withOld, inv.InvocationID, wrk, "the old token's session after the rotation")
	uitest.WantRefused(t, d2.URL, loggedOut, inv.InvocationID, wrk, "a logged-out cookie after the restart")
	if got, err := op.GetInvocation(ctx, inv.InvocationID); err != nil || got.State != wire.StateQueued {
		t.Fatalf("after the refused sessions' cancels: %s %v, want still queued", got.State, err)
	}
	if w, err := op.GetWorker(ctx, wrk); err != nil || w.State == "draining" || w.State == "gone" {
		t.Fatalf("after the refused sessions' drains: %s %v, want not draining", w.State, err)
	}
	if res, err := op.SetupResults(ctx, wrk); err != nil || len(res.SetupResults) != 0 {
		t.Fatalf("after the refused sessions' setups: %+v %v, want no setup command", res, err)
	}

	for _, path := range []string{"/ui/", "/ui/live", "/ui/invocations/" + inv.InvocationID} {
		if resp, body := uitest.Do(t, d2.URL, withNew.Cookie, "GET", path, nil); resp.StatusCode != 200 || !strings.Contains(body, inv.InvocationID) {
			t.Fatalf("the new token's session after the rotation, %s: %d", path, resp.StatusCode)
		}
	}
	if resp, _ := uitest.Do(t, d2.URL, withNew.Cookie, "POST", "/ui/invocations/"+inv.InvocationID+"/cancel",
		url.Values{"csrf": {withNew.CSRF}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("the new token's session's cancel after the rotation: %d", resp.StatusCode)
	}
	if got, err := op.GetInvocation(ctx, inv.InvocationID); err != nil || got.State != wire.StateCancelled {
		t.Fatalf("after the new session's cancel: %s %v, want cancelled", got.State, err)
	}
}
