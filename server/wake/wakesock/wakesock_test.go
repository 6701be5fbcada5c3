package wakesock

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/coder/websocket"

	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/wake/wakelambda"
	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// wait bounds every wait on something that should happen; nothing here
// asserts that anything happens fast.
const wait = 10 * time.Second

// secret is what the harness's management calls carry.
const secret = "management-secret"

const refusedBody = `{"code":"unauthorized","message":"worker token is not valid"}`

// recorder is a Route that records every event it is handed and answers
// with respond.
type recorder struct {
	mu      sync.Mutex
	seen    []events.APIGatewayWebsocketProxyRequest
	respond Route
}

func (rec *recorder) route(ctx context.Context, ev events.APIGatewayWebsocketProxyRequest) (events.APIGatewayProxyResponse, error) {
	rec.mu.Lock()
	rec.seen = append(rec.seen, ev)
	rec.mu.Unlock()
	return rec.respond(ctx, ev)
}

// events returns the recorded events of route ("" for all).
func (rec *recorder) events(route string) []events.APIGatewayWebsocketProxyRequest {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var out []events.APIGatewayWebsocketProxyRequest
	for _, ev := range rec.seen {
		if route == "" || ev.RequestContext.RouteKey == route {
			out = append(out, ev)
		}
	}
	return out
}

// disconnected reports whether $disconnect ran for socket id.
func (rec *recorder) disconnected(id string) bool {
	for _, ev := range rec.events("$disconnect") {
		if ev.RequestContext.ConnectionID == id {
			return true
		}
	}
	return false
}

// basic accepts "Bearer good", refuses anything else with 401 and answers
// a message "quiet" with nothing and any other message m with "re:" + m.
func basic(_ context.Context, ev events.APIGatewayWebsocketProxyRequest) (events.APIGatewayProxyResponse, error) {
	switch ev.RequestContext.RouteKey {
	case "$connect":
		switch ev.Headers["Authorization"] {
		case "Bearer good":
			return events.APIGatewayProxyResponse{StatusCode: http.StatusOK}, nil
		case "Bearer boom":
			return events.APIGatewayProxyResponse{}, errors.New("the route failed")
		}
		return events.APIGatewayProxyResponse{StatusCode: http.StatusUnauthorized, Body: refusedBody}, nil
	case "$default":
		if ev.Body == "quiet" {
			return events.APIGatewayProxyResponse{StatusCode: http.StatusOK}, nil
		}
		return events.APIGatewayProxyResponse{StatusCode: http.StatusOK, Body: "re:" + ev.Body}, nil
	}
	return events.APIGatewayProxyResponse{StatusCode: http.StatusOK}, nil
}

type harness struct {
	ws     *Server
	ts     *httptest.Server
	rec    *recorder
	served atomic.Int64 // requests whose ServeHTTP returned
}

func newHarness(t *testing.T, respond Route) *harness {
	t.Helper()
	h := &harness{rec: &recorder{respond: respond}}
	h.ws = New("/wake/", secret, h.rec.route, slog.New(slog.NewTextHandler(io.Discard, nil)))
	h.ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ws.ServeHTTP(w, r)
		h.served.Add(1)
	}))
	t.Cleanup(func() {
		h.ws.Close()
		h.ts.Close()
	})
	return h
}

func (h *harness) wsURL() string { return "ws" + strings.TrimPrefix(h.ts.URL, "http") + "/wake" }

func (h *harness) manageURL(id string) string {
	return h.ts.URL + "/wake/@connections/" + url.PathEscape(id)
}

func (h *harness) dial(t *testing.T, token, query string) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	u := h.wsURL()
	if query != "" {
		u += "?" + query
	}
	c, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{
		HTTPClient: h.ts.Client(),
		HTTPHeader: http.Header{"Authorization": {"Bearer " + token}},
	})
	if c != nil {
		t.Cleanup(func() { c.CloseNow() })
	}
	return c, resp, err
}

// connect dials an accepted socket and returns it with the connection id
// its $connect carried, once the server holds it. (The client's Dial
// returns before the server holds the socket: see TestPostRightAfterDial.)
func (h *harness) connect(t *testing.T) (*websocket.Conn, string) {
	t.Helper()
	c, id := h.dialAccepted(t)
	waittest.Until(t, wait, "the server to hold the socket", func() bool { return h.holds(id) })
	return c, id
}

// holds reports whether the server holds socket id.
func (h *harness) holds(id string) bool {
	h.ws.mu.Lock()
	defer h.ws.mu.Unlock()
	_, ok := h.ws.conns[id]
	return ok
}

// dialAccepted dials an accepted socket and returns it with the connection
// id its $connect carried, as soon as the client's Dial returns.
func (h *harness) dialAccepted(t *testing.T) (*websocket.Conn, string) {
	t.Helper()
	before := len(h.rec.events("$connect"))
	c, _, err := h.dial(t, "good", "")
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	connects := h.rec.events("$connect")
	if len(connects) != before+1 {
		t.Fatalf("$connect routes = %d, want %d", len(connects), before+1)
	}
	id := connects[len(connects)-1].RequestContext.ConnectionID
	if id == "" {
		t.Fatal("$connect carried no connection id")
	}
	return c, id
}

// reader reads c until it fails, handing over each message, then the error.
type reader struct {
	msgs chan string
	err  chan error
}

func read(c *websocket.Conn) reader {
	r := reader{msgs: make(chan string, 16), err: make(chan error, 1)}
	go func() {
		for {
			_, b, err := c.Read(context.Background())
			if err != nil {
				r.err <- err
				return
			}
			r.msgs <- string(b)
		}
	}()
	return r
}

func (r reader) next(t *testing.T) string {
	t.Helper()
	select {
	case m := <-r.msgs:
		return m
	case err := <-r.err:
		t.Fatalf("the socket failed instead of delivering a message: %v", err)
	case <-time.After(wait):
		t.Fatal("no message within the bound")
	}
	return ""
}

func (r reader) fails(t *testing.T) error {
	t.Helper()
	for {
		select {
		case m := <-r.msgs:
			t.Logf("message before the close: %q", m)
		case err := <-r.err:
			return err
		case <-time.After(wait):
			t.Fatal("the socket did not fail within the bound")
			return nil
		}
	}
}

// do makes a management call with the server's secret.
func do(t *testing.T, client *http.Client, method, u, body string) *http.Response {
	t.Helper()
	return doWith(t, client, secret, method, u, body)
}

// doWith makes a call carrying secret s in the header ("": none).
func doWith(t *testing.T, client *http.Client, s, method, u, body string) *http.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if s != "" {
		req.Header.Set(wire.WakeSecretHeader, s)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

func TestRefusedConnect(t *testing.T) {
	h := newHarness(t, basic)

	c, resp, err := h.dial(t, "bad", "")
	if err == nil {
		t.Fatal("dial of a refused socket succeeded")
	}
	if c != nil {
		t.Fatal("dial of a refused socket returned a connection")
	}
	if resp == nil {
		t.Fatal("no HTTP response for the refused dial")
	}
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("status = %d, want 401", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	if b, _ := io.ReadAll(resp.Body); string(b) != refusedBody {
		t.Errorf("body = %q, want the route's %q", b, refusedBody)
	}

	// The refusing request has been served entirely: anything it would
	// run for the socket has run.
	waittest.Until(t, wait, "the refused request to be served", func() bool { return h.served.Load() >= 1 })
	all := h.rec.events("")
	if len(all) != 1 {
		t.Fatalf("routes run = %+v, want only the $connect", all)
	}
	ev := all[0]
	if ev.RequestContext.RouteKey != "$connect" || ev.RequestContext.EventType != "CONNECT" {
		t.Errorf("route = %q/%q, want $connect/CONNECT", ev.RequestContext.RouteKey, ev.RequestContext.EventType)
	}
	if got := ev.Headers["Authorization"]; got != "Bearer bad" {
		t.Errorf("$connect Authorization = %q, want %q", got, "Bearer bad")
	}
	if ev.RequestContext.ConnectionID == "" {
		t.Error("$connect carried no connection id")
	}
	if ev.RequestContext.Stage != "wake" {
		t.Errorf("stage = %q, want wake", ev.RequestContext.Stage)
	}
	if n := h.ws.Connections(); n != 0 {
		t.Errorf("Connections() = %d after a refusal, want 0", n)
	}

	// A socket that is accepted and closed afterwards has its $disconnect;
	// still none for the refused one.
	ac, id := h.connect(t)
	if err := ac.Close(websocket.StatusNormalClosure, ""); err != nil {
		t.Logf("close: %v", err)
	}
	waittest.Until(t, wait, "$disconnect of the accepted socket", func() bool { return h.rec.disconnected(id) })
	for _, d := range h.rec.events("$disconnect") {
		if d.RequestContext.ConnectionID != id {
			t.Errorf("$disconnect ran for %q, which was never accepted", d.RequestContext.ConnectionID)
		}
	}
}

func TestConnectRouteError(t *testing.T) {
	h := newHarness(t, basic)
	_, resp, err := h.dial(t, "boom", "")
	if err == nil {
		t.Fatal("dial succeeded though the $connect route failed")
	}
	if resp == nil || resp.StatusCode != http.StatusInternalServerError {
		t.Fatalf("response = %+v, want 500", resp)
	}
	waittest.Until(t, wait, "the refused request to be served", func() bool { return h.served.Load() >= 1 })
	if d := h.rec.events("$disconnect"); len(d) != 0 {
		t.Errorf("$disconnect ran for a refused socket: %+v", d)
	}
}

func TestAcceptedSocket(t *testing.T) {
	h := newHarness(t, basic)
	c, _, err := h.dial(t, "good", "v=1")
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	connects := h.rec.events("$connect")
	if len(connects) != 1 {
		t.Fatalf("$connect routes = %d, want 1", len(connects))
	}
	ce := connects[0]
	id := ce.RequestContext.ConnectionID
	waittest.Until(t, wait, "the server to hold the socket", func() bool { return h.holds(id) })
	if ce.Headers["Authorization"] != "Bearer good" || ce.QueryStringParameters["v"] != "1" {
		t.Errorf("$connect headers %v query %v: want the upgrade request's", ce.Headers, ce.QueryStringParameters)
	}
	if n := h.ws.Connections(); n != 1 {
		t.Errorf("Connections() = %d, want 1", n)
	}

	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	msg := `{"type":"wake","queue":"q"}`
	if err := h.ws.Post(ctx, id, []byte(msg)); err != nil {
		t.Fatalf("Post: %v", err)
	}
	typ, b, err := c.Read(ctx)
	if err != nil {
		t.Fatalf("read the post: %v", err)
	}
	if typ != websocket.MessageText || string(b) != msg {
		t.Errorf("client got %v %q, want text %q", typ, b, msg)
	}

	// Messages reach $default; a route response is written back, an empty
	// one is not.
	for _, m := range []string{"quiet", "hello"} {
		if err := c.Write(ctx, websocket.MessageText, []byte(m)); err != nil {
			t.Fatalf("write %q: %v", m, err)
		}
	}
	_, b, err = c.Read(ctx)
	if err != nil {
		t.Fatalf("read the route response: %v", err)
	}
	if string(b) != "re:hello" {
		t.Errorf("route response = %q, want %q (nothing for the empty answer)", b, "re:hello")
	}
	msgs := h.rec.events("$default")
	if len(msgs) != 2 {
		t.Fatalf("$default routes = %+v, want 2", msgs)
	}
	for i, want := range []string{"quiet", "hello"} {
		ev := msgs[i]
		if ev.Body != want || ev.RequestContext.ConnectionID != id || ev.RequestContext.EventType != "MESSAGE" {
			t.Errorf("$default %d = body %q id %q type %q, want %q on %q MESSAGE", i, ev.Body, ev.RequestContext.ConnectionID, ev.RequestContext.EventType, want, id)
		}
		if ev.Headers["Authorization"] != "Bearer good" {
			t.Errorf("$default %d lost the upgrade request's headers: %v", i, ev.Headers)
		}
	}

	// The client closes: $disconnect, and the socket is gone.
	if err := c.Close(websocket.StatusNormalClosure, ""); err != nil {
		t.Logf("close: %v", err)
	}
	waittest.Until(t, wait, "$disconnect", func() bool { return h.rec.disconnected(id) })
	if n := h.ws.Connections(); n != 0 {
		t.Errorf("Connections() = %d after $disconnect, want 0", n)
	}
	if err := h.ws.Post(ctx, id, []byte(msg)); !errors.Is(err, control.ErrConnectionGone) {
		t.Errorf("Post to a closed socket = %v, want ErrConnectionGone", err)
	}
	if err := h.ws.Post(ctx, "never-was=", []byte(msg)); !errors.Is(err, control.ErrConnectionGone) {
		t.Errorf("Post to an unknown socket = %v, want ErrConnectionGone", err)
	}
}

// TestManagementNeedsTheSecret: a management call without the server's
// secret, or with another, is refused as API Gateway refuses an unsigned
// one (403), and leaves the socket alone: nothing is posted, it stays
// open. A server made without a secret refuses every call.
func TestManagementNeedsTheSecret(t *testing.T) {
	h := newHarness(t, basic)
	client := h.ts.Client()
	c, id := h.connect(t)
	r := read(c)
	for _, s := range []string{"", "wrong", secret + "x"} {
		for _, method := range []string{http.MethodPost, http.MethodDelete, http.MethodGet} {
			resp := doWith(t, client, s, method, h.manageURL(id), "forged")
			if resp.StatusCode != http.StatusForbidden || resp.Header.Get("X-Amzn-ErrorType") != "ForbiddenException" {
				t.Errorf("%s with secret %q = %d %q, want 403 ForbiddenException", method, s, resp.StatusCode, resp.Header.Get("X-Amzn-ErrorType"))
			}
		}
	}
	if resp := do(t, client, http.MethodPost, h.manageURL(id), "genuine"); resp.StatusCode != http.StatusOK {
		t.Fatalf("POST with the secret = %d, want 200", resp.StatusCode)
	}
	if m := r.next(t); m != "genuine" {
		t.Fatalf("the client's first message is %q; want the genuine post (the refused ones delivered nothing)", m)
	}
	if n := h.ws.Connections(); n != 1 || h.rec.disconnected(id) {
		t.Fatalf("after refused calls the server holds %d sockets (disconnected: %v); want the socket open", n, h.rec.disconnected(id))
	}

	open := New("/wake", "", basic, slog.New(slog.DiscardHandler))
	defer open.Close()
	for _, s := range []string{"", "anything"} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/wake/@connections/x=", strings.NewReader("m"))
		if s != "" {
			req.Header.Set(wire.WakeSecretHeader, s)
		}
		open.ServeHTTP(rec, req)
		if rec.Code != http.StatusForbidden {
			t.Errorf("a server without a secret answered %d to secret %q, want 403", rec.Code, s)
		}
	}
}

func TestManagementAPI(t *testing.T) {
	h := newHarness(t, basic)
	client := h.ts.Client()
	c, id := h.connect(t)
	r := read(c)

	resp := do(t, client, http.MethodPost, h.manageURL(id), "hello")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST live = %d, want 200", resp.StatusCode)
	}
	if m := r.next(t); m != "hello" {
		t.Errorf("client got %q, want %q", m, "hello")
	}
	if resp := do(t, client, http.MethodGet, h.manageURL(id), ""); resp.StatusCode != http.StatusOK {
		t.Errorf("GET live = %d, want 200", resp.StatusCode)
	}
	big := strings.Repeat("x", maxPost+1)
	if resp := do(t, client, http.MethodPost, h.manageURL(id), big); resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("POST of %d bytes = %d, want 413", len(big), resp.StatusCode)
	}

	gone := func(what, id string) {
		t.Helper()
		for _, method := range []string{http.MethodPost, http.MethodGet, http.MethodDelete} {
			resp := do(t, client, method, h.manageURL(id), "x")
			if resp.StatusCode != http.StatusGone {
				t.Errorf("%s %s = %d, want 410", method, what, resp.StatusCode)
			}
			if et := resp.Header.Get("X-Amzn-ErrorType"); et != "GoneException" {
				t.Errorf("%s %s X-Amzn-ErrorType = %q, want GoneException", method, what, et)
			}
		}
	}
	gone("unknown", "unknown=")

	if resp := do(t, client, http.MethodGet, h.ts.URL+"/elsewhere", ""); resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /elsewhere = %d, want 404", resp.StatusCode)
	}

	// DELETE closes the socket; $disconnect follows.
	resp = do(t, client, http.MethodDelete, h.manageURL(id), "")
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		t.Fatalf("DELETE live = %d, want 2xx", resp.StatusCode)
	}
	if err := r.fails(t); err == nil {
		t.Fatal("the client's read did not fail after DELETE")
	}
	waittest.Until(t, wait, "$disconnect after DELETE", func() bool { return h.rec.disconnected(id) })
	if n := h.ws.Connections(); n != 0 {
		t.Errorf("Connections() = %d after DELETE, want 0", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := h.ws.Post(ctx, id, []byte("late")); !errors.Is(err, control.ErrConnectionGone) {
		t.Errorf("Post to a deleted socket = %v, want ErrConnectionGone", err)
	}
	gone("deleted", id)
}

func TestCloseWaitsForDisconnect(t *testing.T) {
	gate := make(chan struct{})
	var started, finished atomic.Int64
	h := newHarness(t, func(ctx context.Context, ev events.APIGatewayWebsocketProxyRequest) (events.APIGatewayProxyResponse, error) {
		if ev.RequestContext.RouteKey == "$disconnect" {
			started.Add(1)
			select {
			case <-gate:
			case <-ctx.Done():
				return events.APIGatewayProxyResponse{}, ctx.Err()
			}
			finished.Add(1)
		}
		return basic(ctx, ev)
	})
	c1, _ := h.connect(t)
	c2, _ := h.connect(t)
	r1, r2 := read(c1), read(c2)
	if n := h.ws.Connections(); n != 2 {
		t.Fatalf("Connections() = %d, want 2", n)
	}

	closed := make(chan struct{})
	go func() {
		h.ws.Close()
		close(closed)
	}()
	waittest.Until(t, wait, "both $disconnect routes to start", func() bool { return started.Load() == 2 })
	select {
	case <-closed:
		t.Fatal("Close returned while its $disconnect routes were still running")
	default:
	}
	close(gate)
	select {
	case <-closed:
	case <-time.After(wait):
		t.Fatal("Close did not return after its $disconnect routes finished")
	}
	if n := finished.Load(); n != 2 {
		t.Errorf("$disconnect routes finished when Close returned = %d, want 2", n)
	}
	if n := h.ws.Connections(); n != 0 {
		t.Errorf("Connections() = %d after Close, want 0", n)
	}
	r1.fails(t)
	r2.fails(t)

	// A socket that arrives after Close is refused or closed at once; a
	// $connect it ran is followed by its $disconnect.
	connects, disconnects := len(h.rec.events("$connect")), started.Load()
	c3, _, err := h.dial(t, "good", "")
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		if _, _, err := c3.Read(ctx); err == nil || ctx.Err() != nil {
			t.Errorf("a socket accepted after Close stayed open (read: %v)", err)
		}
	}
	if len(h.rec.events("$connect")) > connects {
		waittest.Until(t, wait, "$disconnect of the socket after Close", func() bool { return started.Load() == disconnects+1 })
	}
	if n := h.ws.Connections(); n != 0 {
		t.Errorf("Connections() = %d after Close, want 0", n)
	}
}

func TestManagementWithAWSSDK(t *testing.T) {
	h := newHarness(t, basic)
	c, id := h.connect(t)
	r := read(c)
	cfg := aws.Config{
		Region:      "us-east-1",
		Credentials: credentials.NewStaticCredentialsProvider("a", "b", ""),
	}
	m := wakelambda.NewManagement(cfg, h.ts.URL+"/wake", secret)

	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	msg := `{"type":"wake","queue":"q"}`
	if err := m.Post(ctx, id, []byte(msg)); err != nil {
		t.Fatalf("SDK post to a live socket: %v", err)
	}
	if got := r.next(t); got != msg {
		t.Errorf("client got %q, want %q", got, msg)
	}
	if err := m.Post(ctx, "unknown=", []byte(msg)); !errors.Is(err, control.ErrConnectionGone) {
		t.Errorf("SDK post to an unknown socket = %v, want ErrConnectionGone", err)
	}
	forged := wakelambda.NewManagement(cfg, h.ts.URL+"/wake", "wrong")
	if err := forged.Post(ctx, id, []byte("forged")); err == nil || errors.Is(err, control.ErrConnectionGone) {
		t.Errorf("SDK post with a wrong secret = %v, want a refusal", err)
	}
	if err := forged.CloseConnection(ctx, id); err == nil || errors.Is(err, control.ErrConnectionGone) {
		t.Errorf("SDK close with a wrong secret = %v, want a refusal", err)
	}
	if err := m.Post(ctx, id, []byte(msg)); err != nil {
		t.Fatalf("SDK post after the refused calls: %v", err)
	}
	if got := r.next(t); got != msg {
		t.Errorf("client got %q after the refused calls, want %q", got, msg)
	}

	if err := m.CloseConnection(ctx, id); err != nil {
		t.Fatalf("SDK close of a live socket: %v", err)
	}
	waittest.Until(t, wait, "$disconnect", func() bool { return h.rec.disconnected(id) })
	if err := m.Post(ctx, id, []byte(msg)); !errors.Is(err, control.ErrConnectionGone) {
		t.Errorf("SDK post to a closed socket = %v, want ErrConnectionGone", err)
	}
	if err := m.CloseConnection(ctx, id); !errors.Is(err, control.ErrConnectionGone) {
		t.Errorf("SDK close of a closed socket = %v, want ErrConnectionGone", err)
	}
}

// TestCloseConnectionWhileConnecting: a socket closed while its $connect
// still runs (a newer socket of its worker replaced it) is closed at once
// and refused when its $connect ends, and its $disconnect runs.
func TestCloseConnectionWhileConnecting(t *testing.T) {
	release := make(chan struct{})
	h := newHarness(t, func(ctx context.Context, ev events.APIGatewayWebsocketProxyRequest) (events.APIGatewayProxyResponse, error) {
		if ev.RequestContext.RouteKey == "$connect" {
			<-release
		}
		return basic(ctx, ev)
	})
	dialed := make(chan struct{})
	go func() {
		defer close(dialed)
		c, _, err := h.dial(t, "good", "")
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			_, _, _ = c.Read(ctx) // ends when the server closes it
		}
	}()
	waittest.Until(t, wait, "$connect", func() bool { return len(h.rec.events("$connect")) == 1 })
	id := h.rec.events("$connect")[0].RequestContext.ConnectionID
	// Through the management API, as the wake function closes it: the
	// DELETE must not wait for the $connect (which may be closing the
	// caller's own socket).
	if resp := do(t, h.ts.Client(), http.MethodDelete, h.manageURL(id), ""); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE while connecting = %d, want 204", resp.StatusCode)
	}
	close(release)
	waittest.Until(t, wait, "$disconnect of the closed socket", func() bool { return h.rec.disconnected(id) })
	<-dialed
	if n := h.ws.Connections(); n != 0 {
		t.Fatalf("the server holds %d sockets; want the closed one refused", n)
	}
}

// TestPostRightAfterDial: once the client's Dial has returned, the socket
// is open on both ends, so a Post to it (API Gateway's PostToConnection)
// must deliver. (It once did not always: the 101 went out before the
// socket was held, so a Post in between answered ErrConnectionGone, and the
// control plane then forgot a socket that stayed open, never woken again.)
func TestPostRightAfterDial(t *testing.T) {
	h := newHarness(t, basic)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for i := range 200 {
		c, id := h.dialAccepted(t)
		if err := h.ws.Post(ctx, id, []byte("hi")); err != nil {
			t.Fatalf("attempt %d: Post right after the client's Dial returned: %v", i, err)
		}
		c.CloseNow()
	}
}
