package api_test

import (
	"encoding/base64"
	"net/http"
	"strings"
	"testing"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// authFixture is a store with two workers and work in flight: A (whose
// first token was superseded by a retried hello) runs one invocation and
// has finished another; B is idle.
type authFixture struct {
	h                *harness
	a, b             worker
	supersededA      string // A's token from its first hello
	forgedA          string // shaped like A's token, wrong secret
	running, done    string // invocation ids
	unknownInv       string
	unknownWorkerTok string // shaped like a token of a worker that does not exist
}

func newAuthFixture(t *testing.T) *authFixture {
	t.Helper()
	h := newHarness(t)
	first := h.hello("machine-a", "boot-1")
	a := h.hello("machine-a", "boot-1")
	if a.id != first.id {
		t.Fatalf("retried hello made a new worker")
	}
	b := h.hello("machine-b", "boot-1")
	done := h.submit("first")
	if got := runIDs(h.poll(a, wire.PollRequest{Phase: wire.PhaseReady})); len(got) != 1 || got[0] != done.InvocationID {
		t.Fatalf("A claimed %v", got)
	}
	h.ack(a, wire.AckRequest{InvocationID: done.InvocationID, Attempt: 1, State: wire.StateSucceeded})
	running := h.submit("second")
	if got := runIDs(h.poll(a, wire.PollRequest{Phase: wire.PhaseReady})); len(got) != 1 || got[0] != running.InvocationID {
		t.Fatalf("A claimed %v", got)
	}
	h.submit("third") // queued, so a refused poll would have something to claim
	other := newID("wrk")
	return &authFixture{
		h: h, a: a, b: b,
		supersededA:      first.token,
		forgedA:          "wtk_" + strings.TrimPrefix(a.id, "wrk_") + "_" + strings.Repeat("A", 43),
		running:          running.InvocationID,
		done:             done.InvocationID,
		unknownInv:       newID("inv"),
		unknownWorkerTok: "wtk_" + strings.TrimPrefix(other, "wrk_") + "_" + strings.Repeat("B", 43),
	}
}

type route struct {
	method, path string
	body         any
}

func (f *authFixture) daemonRoutes() map[string]route {
	return map[string]route{
		"hello": {"POST", "/v1/daemon/hello", wire.HelloRequest{MachineID: "machine-c", BootID: "boot-1"}},
		"poll":  {"POST", "/v1/daemon/poll", wire.PollRequest{WorkerID: f.a.id, Phase: wire.PhaseReady, Invocations: []string{f.running}}},
		"ack":   {"POST", "/v1/daemon/ack", wire.AckRequest{WorkerID: f.a.id, InvocationID: f.running, Attempt: 1, State: wire.StateSucceeded}},
		"bye":   {"POST", "/v1/daemon/bye", wire.ByeRequest{WorkerID: f.a.id, Reason: wire.ByeIdle}},
	}
}

func (f *authFixture) operatorRoutes() map[string]route {
	return map[string]route{
		"submit":          {"POST", "/v1/invocations", wire.SubmitRequest{Queue: "default", Argv: []string{"x"}}},
		"list invocation": {"GET", "/v1/invocations", nil},
		"get invocation":  {"GET", "/v1/invocations/" + f.running, nil},
		"cancel":          {"POST", "/v1/invocations/" + f.running + "/cancel", nil},
		"list workers":    {"GET", "/v1/workers", nil},
		"get worker":      {"GET", "/v1/workers/" + f.a.id, nil},
		"drain":           {"POST", "/v1/workers/" + f.a.id + "/drain", nil},
		"setup":           {"POST", "/v1/workers/" + f.a.id + "/setup", wire.SetupRequest{Argv: []string{"true"}}},
		"setup results":   {"GET", "/v1/workers/" + f.a.id + "/setup-results", nil},
		"queue stats":     {"GET", "/v1/queues/default", nil},
	}
}

type authCase struct {
	name   string
	auth   string // the whole Authorization header; "" for none
	status int
	code   wire.Code
}

// commonBad are refused on every route: no usable bearer.
func commonBad(right string) []authCase {
	return []authCase{
		{"no Authorization header", "", 401, wire.CodeUnauthorized},
		{"empty bearer", "Bearer ", 401, wire.CodeUnauthorized},
		{"bearer without token", "Bearer", 401, wire.CodeUnauthorized},
		{"wrong scheme (Basic)", "Basic " + right, 401, wire.CodeUnauthorized},
		{"no scheme", right, 401, wire.CodeUnauthorized},
		{"wrong token", "Bearer not-the-token", 401, wire.CodeUnauthorized},
		{"right token with suffix", "Bearer " + right + "x", 401, wire.CodeUnauthorized},
		{"right token truncated", "Bearer " + right[:len(right)-1], 401, wire.CodeUnauthorized},
	}
}

func TestAuthMatrix(t *testing.T) {
	f := newAuthFixture(t)
	h := f.h
	bearer := func(tok string) string { return "Bearer " + tok }

	matrix := map[string][]authCase{}
	// hello takes only the enrollment token.
	matrix["hello"] = append(commonBad(enrollToken),
		authCase{"operator token", bearer(operatorToken), 401, wire.CodeUnauthorized},
		authCase{"worker token", bearer(f.a.token), 401, wire.CodeUnauthorized},
	)
	// poll, ack, bye take A's current token only.
	for _, name := range []string{"poll", "ack", "bye"} {
		matrix[name] = append(commonBad(f.a.token),
			authCase{"enrollment token", bearer(enrollToken), 401, wire.CodeUnauthorized},
			authCase{"operator token", bearer(operatorToken), 401, wire.CodeUnauthorized},
			authCase{"worker B's token acting for A", bearer(f.b.token), 403, wire.CodeForbidden},
			authCase{"A's token superseded by a retried hello", bearer(f.supersededA), 401, wire.CodeUnauthorized},
			authCase{"forged token: A's id, wrong secret", bearer(f.forgedA), 401, wire.CodeUnauthorized},
			authCase{"token shape without secret", bearer("wtk_" + strings.TrimPrefix(f.a.id, "wrk_") + "_"), 401, wire.CodeUnauthorized},
		)
	}
	for name := range f.operatorRoutes() {
		matrix[name] = append(commonBad(operatorToken),
			authCase{"enrollment token", bearer(enrollToken), 401, wire.CodeUnauthorized},
			authCase{"worker token", bearer(f.a.token), 401, wire.CodeUnauthorized},
			authCase{"upper-cased operator token", bearer(strings.ToUpper(operatorToken)), 401, wire.CodeUnauthorized},
		)
	}

	routes := f.daemonRoutes()
	for name, r := range f.operatorRoutes() {
		routes[name] = r
	}
	for name, cases := range matrix {
		r := routes[name]
		t.Run(name, func(t *testing.T) {
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					h.unchanged(t, func() {
						resp := h.doAuth(r.method, r.path, tc.auth, r.body)
						d := resp.wantError(t, tc.status, tc.code)
						if strings.Contains(d.Message, f.a.token) || strings.Contains(d.Message, operatorToken) {
							t.Errorf("error message echoes a token: %q", d.Message)
						}
					})
				})
			}
		})
	}

	// The tokens themselves still work: the matrix refused for the right reason.
	t.Run("control: right tokens work", func(t *testing.T) {
		h.do("GET", "/v1/workers", operatorToken, nil).want(t, 200, nil)
		h.poll(f.a, wire.PollRequest{Phase: wire.PhaseReady, Invocations: []string{f.running},
			UpdatedCapabilities: &wire.Capabilities{CurrentInvocations: intp(1)}})
		h.doAuth("GET", "/v1/workers", "bearer "+operatorToken, nil).want(t, 200, nil)
	})
}

// TestAckOfAnotherWorkersInvocation: B, with its own valid token, cannot ack
// the invocation A runs, nor one A finished.
func TestAckOfAnotherWorkersInvocation(t *testing.T) {
	f := newAuthFixture(t)
	h := f.h
	for _, tc := range []struct {
		name string
		inv  string
	}{
		{"running on A", f.running},
		{"finished by A", f.done},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h.unchanged(t, func() {
				h.do("POST", "/v1/daemon/ack", f.b.token, wire.AckRequest{WorkerID: f.b.id, InvocationID: tc.inv, Attempt: 1, State: wire.StateFailed}).
					wantError(t, 403, wire.CodeForbidden)
			})
		})
	}
	t.Run("A acks an attempt it did not run", func(t *testing.T) {
		h.unchanged(t, func() {
			h.do("POST", "/v1/daemon/ack", f.a.token, wire.AckRequest{WorkerID: f.a.id, InvocationID: f.running, Attempt: 2, State: wire.StateFailed}).
				wantError(t, 403, wire.CodeForbidden)
		})
	})
}

// TestAckChecksTokenFirst: an ack with a token that is not the worker's
// current one must be refused with 401 whatever invocation it names. A
// forged or revoked token must not learn whether an invocation exists, who
// ran it, or its outcome (docs/design.md §9: a daemon "can never ack, renew or read
// another worker's invocation").
func TestAckChecksTokenFirst(t *testing.T) {
	f := newAuthFixture(t)
	h := f.h
	tokens := map[string]string{
		"forged token (A's id, wrong secret)": f.forgedA,
		"A's superseded token":                f.supersededA,
	}
	invs := []struct {
		name, id string
	}{
		{"running invocation A holds", f.running},
		{"invocation A finished", f.done},
		{"unknown invocation", f.unknownInv},
	}
	for tname, tok := range tokens {
		for _, inv := range invs {
			t.Run(tname+" on "+inv.name, func(t *testing.T) {
				h.unchanged(t, func() {
					h.do("POST", "/v1/daemon/ack", tok, wire.AckRequest{WorkerID: f.a.id, InvocationID: inv.id, Attempt: 1, State: wire.StateSucceeded}).
						wantError(t, 401, wire.CodeUnauthorized)
				})
			})
		}
	}
}

// TestTokenOfUnknownWorker: a well-shaped token for a worker id that does
// not exist is a bad token (401), not a lookup that reveals the id is free.
func TestTokenOfUnknownWorker(t *testing.T) {
	f := newAuthFixture(t)
	h := f.h
	wid := "wrk_" + strings.Split(strings.TrimPrefix(f.unknownWorkerTok, "wtk_"), "_")[0]
	for name, r := range map[string]route{
		"poll": {"POST", "/v1/daemon/poll", wire.PollRequest{WorkerID: wid}},
		"bye":  {"POST", "/v1/daemon/bye", wire.ByeRequest{WorkerID: wid, Reason: wire.ByeIdle}},
		"ack":  {"POST", "/v1/daemon/ack", wire.AckRequest{WorkerID: wid, InvocationID: f.running, Attempt: 1, State: wire.StateSucceeded}},
	} {
		t.Run(name, func(t *testing.T) {
			h.unchanged(t, func() {
				h.do(r.method, r.path, f.unknownWorkerTok, r.body).wantError(t, 401, wire.CodeUnauthorized)
			})
		})
	}
}

// TestSupersededTokenAfterNewBoot: after a new boot, the old worker's token
// still authenticates as the old (gone) worker: its poll gets 410 with
// reason replaced, never work. That it polled at all proves its process
// runs: the machine id conflict is recorded on it, and only that changes.
func TestSupersededTokenAfterNewBoot(t *testing.T) {
	h := newHarness(t)
	old := h.hello("m", "boot-1")
	h.hello("m", "boot-2")
	inv := h.submit("x")
	detail := h.pollResp(old, wire.PollRequest{Phase: wire.PhaseReady}).wantError(t, 410, wire.CodeWorkerGone)
	if detail.Reason != wire.ReasonReplaced || !strings.Contains(detail.Message, "boot-2") {
		t.Errorf("410 detail %+v; want reason replaced, naming the boot that replaced it", detail)
	}
	if w := h.worker(old.id); w.State != "gone" || !strings.Contains(w.StateWhy, "another process uses machine id m") {
		t.Errorf("the replaced worker after its poll: %s %q; want the conflict on record", w.State, w.StateWhy)
	}
	if got := h.invocation(inv.InvocationID); got.State != wire.StateQueued {
		t.Errorf("the invocation went %s; a replaced worker claims nothing", got.State)
	}
}

func TestHealthzNeedsNoToken(t *testing.T) {
	h := newHarness(t)
	h.doAuth("GET", "/v1/healthz", "Bearer nonsense", nil).want(t, http.StatusOK, nil)
}

// b64 encodes a cursor the way the API does, with arbitrary content.
func b64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

// TestUncleanPathsAreJSON404: "//", "/./", "/../" and trailing slashes get
// the wire API's 404, not ServeMux's HTML redirect (which a client that
// follows redirects could turn into a second POST), and change nothing.
func TestUncleanPathsAreJSON404(t *testing.T) {
	h := newHarness(t)
	w := h.hello("m", "b")
	for _, tc := range []struct{ method, path string }{
		{"GET", "/v1/./healthz"},
		{"GET", "/v1/workers//" + w.id},
		{"GET", "/v1/invocations/../workers"},
		{"GET", "/v1/workers/"},
		{"POST", "/v1/daemon//poll"},
		{"POST", "/v1/daemon/./bye"},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			h.unchanged(t, func() {
				h.do(tc.method, tc.path, operatorToken, wire.ByeRequest{WorkerID: w.id, Reason: wire.ByeIdle}).
					wantError(t, http.StatusNotFound, wire.CodeNoRoute)
			})
		})
	}
}

// TestDaemonRoutesHideWhichWorkersExist: with a secret it does not hold, a
// caller learns nothing about a worker id from any daemon route that
// checks a worker token: the answer to an id that names no worker and to a
// real worker's id are the same bytes (status, code, message).
func TestDaemonRoutesHideWhichWorkersExist(t *testing.T) {
	f := newAuthFixture(t)
	h := f.h
	unknown := "wrk_" + strings.Split(strings.TrimPrefix(f.unknownWorkerTok, "wtk_"), "_")[0]
	routes := func(wid string) map[string]route {
		return map[string]route{
			"poll": {"POST", "/v1/daemon/poll", wire.PollRequest{WorkerID: wid, Phase: wire.PhaseReady}},
			"ack":  {"POST", "/v1/daemon/ack", wire.AckRequest{WorkerID: wid, InvocationID: f.running, Attempt: 1, State: wire.StateSucceeded}},
			"bye":  {"POST", "/v1/daemon/bye", wire.ByeRequest{WorkerID: wid, Reason: wire.ByeIdle}},
			"logs": {"POST", "/v1/daemon/logs", wire.LogsRequest{WorkerID: wid, Logs: []wire.LogBatch{{InvocationID: f.running, Attempt: 1,
				Chunks: []wire.LogChunk{{Seq: 0, Stream: "stdout", Data: []byte("x")}}}}}},
		}
	}
	known, made := routes(f.a.id), routes(unknown)
	for name := range known {
		t.Run(name, func(t *testing.T) {
			h.unchanged(t, func() {
				k := h.do(known[name].method, known[name].path, f.forgedA, known[name].body)
				u := h.do(made[name].method, made[name].path, f.unknownWorkerTok, made[name].body)
				k.wantError(t, 401, wire.CodeUnauthorized)
				if k.status != u.status || string(k.body) != string(u.body) {
					t.Errorf("a wrong secret for worker %s answers %d %s; a worker id that does not exist answers %d %s",
						f.a.id, k.status, k.body, u.status, u.body)
				}
			})
		})
	}
}
