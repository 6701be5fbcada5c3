package api_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/ids"
	"github.com/dreamlake/lakeshore/shared/wire"
)

const (
	enrollToken   = apitest.EnrollToken
	operatorToken = apitest.OperatorToken
)

// harness is an api.Server over a fresh embedded store, served on
// 127.0.0.1, driven with plain net/http.
type harness struct {
	t      *testing.T
	url    string
	db     *dynamodb.Client
	prefix string
	store  *store.Store
}

// option adjusts the router config (and the store) before New.
type option = func(*apitest.Config)

func newHarness(t *testing.T, opts ...option) *harness {
	t.Helper()
	p := apitest.New(t, opts...)
	if !strings.HasPrefix(p.URL, "http://127.0.0.1:") {
		t.Fatalf("test server on %s, want loopback", p.URL)
	}
	return &harness{t: t, url: p.URL, db: p.DB, prefix: p.Prefix, store: p.Store}
}

// response is one raw HTTP answer.
type response struct {
	status int
	header http.Header
	body   []byte
}

// bodyOf renders a request body: nil for none, string and []byte as is,
// anything else as JSON.
func bodyOf(v any) io.Reader {
	switch b := v.(type) {
	case nil:
		return nil
	case string:
		return strings.NewReader(b)
	case []byte:
		return bytes.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			panic(err)
		}
		return bytes.NewReader(raw)
	}
}

// doAuth sends a request with the raw Authorization header auth ("" for none).
func (h *harness) doAuth(method, path, auth string, body any) response {
	h.t.Helper()
	req, err := http.NewRequest(method, h.url+path, bodyOf(body))
	if err != nil {
		h.t.Fatalf("new request: %v", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// do sends a request with a bearer token ("" for no Authorization header).
func (h *harness) do(method, path, token string, body any) response {
	h.t.Helper()
	auth := ""
	if token != "" {
		auth = "Bearer " + token
	}
	return h.doAuth(method, path, auth, body)
}

// want asserts the status and decodes the JSON body into out (if non-nil).
func (r response) want(t *testing.T, status int, out any) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d; body %s", r.status, status, r.body)
	}
	if out != nil {
		if ct := r.header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("Content-Type %q, want application/json", ct)
		}
		if err := json.Unmarshal(r.body, out); err != nil {
			t.Fatalf("decode %s: %v", r.body, err)
		}
	}
}

// wantError asserts an error answer: status, the JSON error shape and code.
func (r response) wantError(t *testing.T, status int, code wire.Code) wire.ErrorDetail {
	t.Helper()
	if r.status != status {
		t.Errorf("status %d, want %d; body %s", r.status, status, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	var body wire.ErrorBody
	if err := json.Unmarshal(r.body, &body); err != nil {
		t.Fatalf("error body %q is not JSON: %v", r.body, err)
	}
	if body.Error.Code != code {
		t.Errorf("error code %q, want %q; body %s", body.Error.Code, code, r.body)
	}
	if body.Error.Message == "" {
		t.Errorf("error without message: %s", r.body)
	}
	return body.Error
}

// --- daemon helpers ---

// worker is a daemon that said hello.
type worker struct {
	id, token string
	hello     wire.HelloResponse
}

func (h *harness) helloReq(req wire.HelloRequest) worker {
	h.t.Helper()
	var resp wire.HelloResponse
	h.do("POST", "/v1/daemon/hello", enrollToken, req).want(h.t, 200, &resp)
	if !ids.Valid(ids.Worker, resp.WorkerID) || resp.Token == "" {
		h.t.Fatalf("hello answered %+v", resp)
	}
	return worker{id: resp.WorkerID, token: resp.Token, hello: resp}
}

// hello registers a daemon serving the "default" lane.
func (h *harness) hello(machine, boot string) worker {
	h.t.Helper()
	return h.helloReq(wire.HelloRequest{MachineID: machine, BootID: boot, Lanes: []string{"default"}})
}

func (h *harness) pollResp(w worker, req wire.PollRequest) response {
	h.t.Helper()
	if req.WorkerID == "" {
		req.WorkerID = w.id
	}
	return h.do("POST", "/v1/daemon/poll", w.token, req)
}

func (h *harness) poll(w worker, req wire.PollRequest) []wire.Command {
	h.t.Helper()
	var resp wire.PollResponse
	h.pollResp(w, req).want(h.t, 200, &resp)
	if resp.Commands == nil {
		h.t.Errorf("poll answered commands: null, want a list")
	}
	return resp.Commands
}

func (h *harness) ack(w worker, req wire.AckRequest) wire.AckResponse {
	h.t.Helper()
	if req.WorkerID == "" {
		req.WorkerID = w.id
	}
	var resp wire.AckResponse
	h.do("POST", "/v1/daemon/ack", w.token, req).want(h.t, 200, &resp)
	return resp
}

func (h *harness) bye(w worker, reason string) {
	h.t.Helper()
	r := h.do("POST", "/v1/daemon/bye", w.token, wire.ByeRequest{WorkerID: w.id, Reason: reason})
	r.want(h.t, 204, nil)
	if len(r.body) != 0 {
		h.t.Errorf("bye 204 with body %q", r.body)
	}
}

// --- operator helpers ---

func (h *harness) submitReq(req wire.SubmitRequest) wire.Invocation {
	h.t.Helper()
	var inv wire.Invocation
	h.do("POST", "/v1/invocations", operatorToken, req).want(h.t, 201, &inv)
	return inv
}

// submit queues argv on the default queue.
func (h *harness) submit(argv ...string) wire.Invocation {
	h.t.Helper()
	return h.submitReq(wire.SubmitRequest{Queue: "default", Argv: argv})
}

func (h *harness) invocation(id string) wire.Invocation {
	h.t.Helper()
	var inv wire.Invocation
	h.do("GET", "/v1/invocations/"+id, operatorToken, nil).want(h.t, 200, &inv)
	return inv
}

func (h *harness) worker(id string) wire.Worker {
	h.t.Helper()
	var w wire.Worker
	h.do("GET", "/v1/workers/"+id, operatorToken, nil).want(h.t, 200, &w)
	return w
}

func (h *harness) queue(name string) wire.QueueStats {
	h.t.Helper()
	var q wire.QueueStats
	h.do("GET", "/v1/queues/"+name, operatorToken, nil).want(h.t, 200, &q)
	return q
}

// --- commands ---

// ofType filters commands by type.
func ofType(cmds []wire.Command, typ string) []wire.Command {
	var out []wire.Command
	for _, c := range cmds {
		if c.Type == typ {
			out = append(out, c)
		}
	}
	return out
}

func runIDs(cmds []wire.Command) []string {
	var out []string
	for _, c := range ofType(cmds, wire.CommandRun) {
		out = append(out, c.Invocation.InvocationID)
	}
	slices.Sort(out)
	return out
}

// --- snapshots ---

// snapshot is every item of every table, normalised to sorted JSON lines.
type snapshot = storetest.Snapshot

func (h *harness) snapshot() snapshot {
	h.t.Helper()
	return storetest.TakeSnapshot(h.t, h.db, h.prefix)
}

// unchanged runs fn, which must be refused, and fails if any table
// changed.
func (h *harness) unchanged(t *testing.T, fn func()) {
	t.Helper()
	before := storetest.TakeSnapshot(t, h.db, h.prefix)
	fn()
	if d := before.Diff(storetest.TakeSnapshot(t, h.db, h.prefix)); d != "" {
		t.Errorf("a refused request changed the store:\n%s", d)
	}
}

// --- clocks and sleeps ---

func newClock() *clock.Fake {
	return clock.NewFake(time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC))
}

// withClock drives both the router and its store from c.
func withClock(c *clock.Fake) option {
	return func(cfg *apitest.Config) {
		cfg.Control.Clock = c.Clock()
		cfg.Store.Clock = c.Clock()
	}
}

func newID(prefix string) string { return (&ids.Generator{}).New(prefix) }
