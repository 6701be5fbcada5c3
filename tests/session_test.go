package tests

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/store/storetest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// sharedStore is one embedded DynamoDB that several `lakeshore dev` in
// turn run on (--store aws at its endpoint), so state outlives a restart.
func sharedStore(t *testing.T) backend {
	endpoint, prefix := storetest.EmbeddedEndpoint(t), storetest.Prefix(t)
	return backend{"shared-store", func(testing.TB) ([]string, []string) {
		return []string{"--store", "aws", "--table-prefix", prefix, "--host-poll-interval", "0"}, []string{
			"AWS_ENDPOINT_URL=" + endpoint, "AWS_REGION=us-east-1",
			"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test", "AWS_EC2_METADATA_DISABLED=true",
		}
	}}
}

// freeAddr is a loopback address nothing listens on, for control planes
// that follow each other on one address.
func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// webSession is one login to the web view over HTTP, as a browser holds
// it: the cookie's value and the CSRF token of its pages.
type webSession struct{ cookie, csrf string }

var csrfInPage = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// webDo sends a request to the view with session cookie value cookie
// (none for ""), never following a redirect.
func webDo(t *testing.T, base, cookie, method, path string, form url.Values) (*http.Response, string) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, base+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if cookie != "" {
		req.AddCookie(&http.Cookie{Name: "lakeshore_session", Value: cookie})
	}
	hc := &http.Client{Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// webLogin logs in to the view at base with tok.
func webLogin(t *testing.T, base, tok string) webSession {
	t.Helper()
	resp, body := webDo(t, base, "", "POST", "/ui/login", url.Values{"token": {tok}})
	if resp.StatusCode != http.StatusSeeOther || len(resp.Cookies()) != 1 {
		t.Fatalf("login: %d %v %s", resp.StatusCode, resp.Cookies(), body)
	}
	s := webSession{cookie: resp.Cookies()[0].Value}
	_, page := webDo(t, base, s.cookie, "GET", "/ui/", nil)
	m := csrfInPage.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF token in the fleet page after a login:\n%s", page)
	}
	s.csrf = m[1]
	return s
}

// wantWebRefused checks that session s is refused on every page and
// action of the view at base: the fleet page is the login form, another
// page goes to it, the live parts answer 401, an action 403 (or 401).
func wantWebRefused(t *testing.T, base string, s webSession, inv, wrk, why string) {
	t.Helper()
	for _, rq := range []struct {
		method, path string
		form         url.Values
	}{
		{"GET", "/ui/", nil},
		{"GET", "/ui/live", nil},
		{"GET", "/ui/invocations/" + inv, nil},
		{"GET", "/ui/invocations/" + inv + "/live", nil},
		{"POST", "/ui/invocations/" + inv + "/cancel", url.Values{"csrf": {s.csrf}, "back": {"/ui/"}}},
		{"POST", "/ui/workers/" + wrk + "/drain", url.Values{"csrf": {s.csrf}}},
		{"POST", "/ui/workers/" + wrk + "/setup", url.Values{"csrf": {s.csrf}, "command": {"touch /tmp/lakeshore-session-test"}}},
		{"POST", "/ui/logout", url.Values{"csrf": {s.csrf}}},
	} {
		resp, body := webDo(t, base, s.cookie, rq.method, rq.path, rq.form)
		var refused bool
		switch {
		case rq.path == "/ui/":
			refused = resp.StatusCode == http.StatusOK && strings.Contains(body, `name="token"`) && !strings.Contains(body, inv)
		case strings.HasSuffix(rq.path, "/live"):
			refused = resp.StatusCode == http.StatusUnauthorized
		case rq.method == "GET":
			refused = resp.StatusCode == http.StatusSeeOther && resp.Header.Get("Location") == "/ui/"
		default:
			refused = resp.StatusCode == http.StatusForbidden || resp.StatusCode == http.StatusUnauthorized
		}
		if !refused {
			t.Errorf("%s: %s %s answered %d (Location %q), want refused", why, rq.method, rq.path, resp.StatusCode, resp.Header.Get("Location"))
		}
	}
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
	shared, addr := sharedStore(t), freeAddr(t)
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
	withOld, withNew, loggedOut := webLogin(t, d1.URL, oldOperator), webLogin(t, d1.URL, newOperator), webLogin(t, d1.URL, newOperator)
	if resp, body := webDo(t, d1.URL, withOld.cookie, "GET", "/ui/invocations/"+inv.InvocationID, nil); resp.StatusCode != 200 || !strings.Contains(body, inv.InvocationID) {
		t.Fatalf("during the overlap the old token's session: %d", resp.StatusCode)
	}
	if resp, _ := webDo(t, d1.URL, loggedOut.cookie, "POST", "/ui/logout", url.Values{"csrf": {loggedOut.csrf}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("logout: %d", resp.StatusCode)
	}
	wantWebRefused(t, d1.URL, loggedOut, inv.InvocationID, wrk, "a logged-out cookie replayed")
	d1.stop(t)

	d2 := dev(newOperator)
	op := client.New(d2.URL, newOperator)
	wantWebRefused(t, d2.URL, withOld, inv.InvocationID, wrk, "the old token's session after the rotation")
	wantWebRefused(t, d2.URL, loggedOut, inv.InvocationID, wrk, "a logged-out cookie after the restart")
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
		if resp, body := webDo(t, d2.URL, withNew.cookie, "GET", path, nil); resp.StatusCode != 200 || !strings.Contains(body, inv.InvocationID) {
			t.Fatalf("the new token's session after the rotation, %s: %d", path, resp.StatusCode)
		}
	}
	if resp, _ := webDo(t, d2.URL, withNew.cookie, "POST", "/ui/invocations/"+inv.InvocationID+"/cancel",
		url.Values{"csrf": {withNew.csrf}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("the new token's session's cancel after the rotation: %d", resp.StatusCode)
	}
	if got, err := op.GetInvocation(ctx, inv.InvocationID); err != nil || got.State != wire.StateCancelled {
		t.Fatalf("after the new session's cancel: %s %v, want cancelled", got.State, err)
	}
}
