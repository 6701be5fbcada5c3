package api_test

import (
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// logsOf is a logs request of worker for attempt n of invocation id: one
// chunk of text.
func logsOf(worker, id string, n int, text string) wire.LogsRequest {
	return wire.LogsRequest{WorkerID: worker, Logs: []wire.LogBatch{{InvocationID: id, Attempt: n,
		Chunks: []wire.LogChunk{{Seq: 0, Stream: "stdout", Data: []byte(text), At: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}}}}}
}

// TestDaemonRoutesRefuseAnotherWorkersToken: worker B, with its own valid
// token, acts for worker A on every daemon route that names a worker.
// Each answers 403 forbidden and writes nothing to any table: A's row,
// A's work and A's output stay as they were.
func TestDaemonRoutesRefuseAnotherWorkersToken(t *testing.T) {
	f := newAuthFixture(t)
	h := f.h
	routes := f.daemonRoutes()
	delete(routes, "hello") // it names no worker
	routes["logs"] = route{"POST", "/v1/daemon/logs", logsOf(f.a.id, f.running, 1, "written by B")}
	for name, r := range routes {
		t.Run(name, func(t *testing.T) {
			h.unchanged(t, func() {
				h.do(r.method, r.path, f.b.token, r.body).wantError(t, 403, wire.CodeForbidden)
			})
		})
	}
	if inv := h.invocation(f.running); inv.State != wire.StateRunning || inv.WorkerID != f.a.id || inv.Attempt != 1 {
		t.Errorf("A's invocation after B's refused requests: %s on %s attempt %d", inv.State, inv.WorkerID, inv.Attempt)
	}

	// The snapshot sees a write to the logs table: A's own request makes one.
	before := h.snapshot()
	h.do("POST", "/v1/daemon/logs", f.a.token, logsOf(f.a.id, f.running, 1, "written by A")).want(t, 200, nil)
	if before.Diff(h.snapshot()) == "" {
		t.Fatal("A's own logs wrote nothing the snapshot sees")
	}
}

// TestLogsOnlyFromTheAttemptsHolder: a worker writes the output of an
// attempt only if it ran that attempt. Another worker, with its own valid
// token and naming itself, is refused 403 for A's running attempt, and A
// for an attempt it never ran; neither writes a thing, and the attempt's
// output reads as only its holder wrote it.
func TestLogsOnlyFromTheAttemptsHolder(t *testing.T) {
	f := newAuthFixture(t)
	h := f.h
	cases := []struct {
		name string
		w    worker
		req  wire.LogsRequest
	}{
		{"B writes A's running attempt", f.b, logsOf(f.b.id, f.running, 1, "B was here")},
		{"A writes an attempt it did not run", f.a, logsOf(f.a.id, f.running, 2, "A was here")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h.unchanged(t, func() {
				h.do("POST", "/v1/daemon/logs", tc.w.token, tc.req).wantError(t, 403, wire.CodeForbidden)
			})
		})
	}

	h.do("POST", "/v1/daemon/logs", f.a.token, logsOf(f.a.id, f.running, 1, "A ran it")).want(t, 200, nil)
	var page wire.LogPage
	h.do("GET", "/v1/invocations/"+f.running+"/logs?attempt=1", operatorToken, nil).want(t, 200, &page)
	if len(page.Chunks) != 1 || string(page.Chunks[0].Data) != "A ran it" {
		t.Errorf("attempt 1's output reads %+v, want only A's chunk", page.Chunks)
	}
}
