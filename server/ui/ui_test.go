package ui_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/api"
	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/server/api/daemonapi"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/schema"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/server/ui/uitest"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/wire"
)

const (
	enrollToken   = "enroll-token-for-the-ui-tests-0001"
	operatorToken = "operator-token-for-the-ui-tests-01"
)

// served is the router (API and view) over the embedded store, on a
// loopback test server, and a browser-like client with a cookie jar.
type served struct {
	url string
	hc  *http.Client
	op  *client.Client
}

func serve(t *testing.T) served {
	t.Helper()
	return newTables(t).serve(t, nil)
}

// tables is one set of tables on the embedded store, which several
// routers in turn may serve (a restart with other tokens).
type tables struct {
	db     store.DB
	prefix string
}

func newTables(t *testing.T) tables {
	t.Helper()
	db := storetest.Embedded(t)
	prefix := storetest.Prefix(t)
	if err := schema.EnsureTables(t.Context(), db, prefix); err != nil {
		t.Fatal(err)
	}
	return tables{db: db, prefix: prefix}
}

// router is the API and view over tb, its config changed by mod.
func (tb tables) router(t *testing.T, mod func(*apitest.Config)) *api.Server {
	t.Helper()
	cfg := apitest.Config{Store: store.New(tb.db, tb.prefix), Config: api.Config{Config: daemonapi.Config{EnrollToken: enrollToken, OperatorToken: operatorToken,
		Logger: slog.New(slog.DiscardHandler)}}}
	if mod != nil {
		mod(&cfg)
	}
	s, err := apitest.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// serve is router(mod) on a loopback test server.
func (tb tables) serve(t *testing.T, mod func(*apitest.Config)) served {
	t.Helper()
	s := tb.router(t, mod)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	jar, _ := cookiejar.New(nil)
	hc := &http.Client{Jar: jar, Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return served{url: srv.URL, hc: hc, op: client.New(srv.URL, operatorToken)}
}

func (s served) do(t *testing.T, method, path string, form url.Values) (*http.Response, string) {
	t.Helper()
	return uitest.Send(t, s.hc, uitest.Request(t, s.url, "", method, path, form))
}

// TestLoginSessionAndCSRF: the login form, a wrong token refused, the
// session cookie's flags (no Secure on loopback), no token in any page,
// actions refused without the CSRF token and done with it, logout.
func TestLoginSessionAndCSRF(t *testing.T) {
	s := serve(t)
	resp, body := s.do(t, "GET", "/ui/", nil)
	if resp.StatusCode != 200 || !strings.Contains(body, `name="token"`) {
		t.Fatalf("GET /ui/ logged out: %d %s", resp.StatusCode, body)
	}
	for _, h := range []string{"Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options"} {
		if resp.Header.Get(h) == "" {
			t.Errorf("no %s header", h)
		}
	}
	if csp := resp.Header.Get("Content-Security-Policy"); strings.Contains(csp, "unsafe") || !strings.Contains(csp, "script-src 'self'") {
		t.Errorf("CSP %q", csp)
	}
	if resp, _ := s.do(t, "GET", "/ui/live", nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("the live parts logged out: %d", resp.StatusCode)
	}
	if resp, _ := s.do(t, "POST", "/ui/login", url.Values{"token": {"wrong"}}); resp.StatusCode != http.StatusUnauthorized || len(resp.Cookies()) != 0 {
		t.Errorf("a wrong token: %d, cookies %v", resp.StatusCode, resp.Cookies())
	}
	if resp, _ := s.do(t, "POST", "/ui/login", url.Values{"token": {enrollToken}}); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("the enrollment token logged in: %d", resp.StatusCode)
	}
	resp, _ = s.do(t, "POST", "/ui/login", url.Values{"token": {operatorToken}})
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ui/" {
		t.Fatalf("login: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	c := resp.Cookies()
	if len(c) != 1 || !c[0].HttpOnly || c[0].SameSite != http.SameSiteStrictMode || c[0].Secure || strings.Contains(c[0].Value, operatorToken) {
		t.Fatalf("session cookie %+v: want HttpOnly, SameSite=Strict, not Secure on loopback, no token", c)
	}

	inv, _, err := s.op.Submit(t.Context(), wire.SubmitRequest{Queue: "q", Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	_, page := s.do(t, "GET", "/ui/", nil)
	if strings.Contains(page, operatorToken) || strings.Contains(page, enrollToken) {
		t.Fatal("a token is in the page")
	}
	if len(page) > 100<<10 {
		t.Errorf("the fleet page weighs %d bytes; the budget is 100 KB", len(page))
	}
	csrf := uitest.CSRFOf(page)
	if csrf == "" || !strings.Contains(page, inv.InvocationID) {
		t.Fatalf("the fleet page has no CSRF token or lacks %s:\n%s", inv.InvocationID, page)
	}
	cancel := "/ui/invocations/" + inv.InvocationID + "/cancel"
	for _, form := range []url.Values{{}, {"csrf": {"forged"}}} {
		if resp, _ := s.do(t, "POST", cancel, form); resp.StatusCode != http.StatusForbidden {
			t.Errorf("cancel with csrf %q: %d, want 403", form.Get("csrf"), resp.StatusCode)
		}
	}
	if got, _ := s.op.GetInvocation(t.Context(), inv.InvocationID); got.State != wire.StateQueued {
		t.Fatalf("a refused cancel cancelled: %s", got.State)
	}
	if resp, _ := s.do(t, "POST", cancel, url.Values{"csrf": {csrf}, "back": {"https://evil.example/"}}); resp.StatusCode != http.StatusSeeOther ||
		resp.Header.Get("Location") != "/ui/invocations/"+inv.InvocationID {
		t.Fatalf("cancel with the token: %d → %s (an outside back= must not be followed)", resp.StatusCode, resp.Header.Get("Location"))
	}
	if got, _ := s.op.GetInvocation(t.Context(), inv.InvocationID); got.State != wire.StateCancelled {
		t.Fatalf("after the page's cancel: %s", got.State)
	}
	if resp, body := s.do(t, "GET", "/ui/invocations/"+inv.InvocationID, nil); resp.StatusCode != 200 || !strings.Contains(body, "cancelled") {
		t.Errorf("the invocation page: %d", resp.StatusCode)
	}
	if resp, _ := s.do(t, "GET", "/ui/invocations/inv_01J0000000000000000000000X", nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("an unknown invocation's page: %d", resp.StatusCode)
	}

	if resp, _ := s.do(t, "POST", "/ui/logout", url.Values{"csrf": {csrf}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("logout: %d", resp.StatusCode)
	}
	if resp, _ := s.do(t, "GET", "/ui/live", nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("after logout: %d", resp.StatusCode)
	}
}

// TestWorkerStringsAreText: a worker's label with markup and a terminal
// escape renders as text in the page and in the live parts.
func TestWorkerStringsAreText(t *testing.T) {
	s := serve(t)
	label := "<script>alert(1)</script><img src=x onerror=alert(2)>\x1b[31mred"
	if _, err := client.New(s.url, enrollToken).Hello(context.Background(), wire.HelloRequest{MachineID: "m-1", BootID: "b", Label: label,
		Lanes: []string{"q"}}); err != nil {
		t.Fatal(err)
	}
	s.do(t, "POST", "/ui/login", url.Values{"token": {operatorToken}})
	for _, path := range []string{"/ui/", "/ui/live"} {
		_, body := s.do(t, "GET", path, nil)
		if strings.Contains(body, "<script>alert") || strings.Contains(body, "<img") || strings.Contains(body, "\x1b") {
			t.Errorf("%s renders the label as markup or keeps the escape", path)
		}
		if !strings.Contains(body, "alert(1)") {
			t.Errorf("%s lacks the label's text", path)
		}
	}
}

// TestSecureCookieOffLoopback: served on a routable name or behind HTTPS,
// the session cookie is Secure.
func TestSecureCookieOffLoopback(t *testing.T) {
	s := serve(t)
	for _, tc := range []struct{ host, proto string }{{"lakeshore.example.com", ""}, {"127.0.0.1", "https"}} {
		req, _ := http.NewRequest("POST", s.url+"/ui/login", strings.NewReader("token="+operatorToken))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Host = tc.host
		if tc.proto != "" {
			req.Header.Set("X-Forwarded-Proto", tc.proto)
		}
		resp, err := s.hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if c := resp.Cookies(); len(c) != 1 || !c[0].Secure {
			t.Errorf("host %s proto %q: cookie %+v, want Secure", tc.host, tc.proto, c)
		}
	}
}
