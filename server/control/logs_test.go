package control_test

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// logsFixture is a worker that holds attempt 1 of two invocations, over
// the embedded store, the service and the store on one fake clock.
type logsFixture struct {
	ctx    context.Context
	st     *store.Store
	svc    *control.Service
	clock  *clock.Fake
	worker string
	inv    [2]string
}

func newLogsFixture(t *testing.T) *logsFixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	c := clock.NewFake(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	st := embeddedStore(t)
	st.Clock = c.Clock()
	svc := control.New(control.Config{Store: st, Clock: c.Clock(), Logger: slog.New(slog.DiscardHandler)})
	hello, err := svc.Hello(ctx, wire.HelloRequest{MachineID: "m1", BootID: "b1", Lanes: []string{"q"},
		Capabilities: wire.Capabilities{MaxConcurrency: ptr(2)}}.Registration(), func(string) (string, error) { return "hash", nil })
	if err != nil {
		t.Fatal(err)
	}
	f := &logsFixture{ctx: ctx, st: st, svc: svc, clock: c, worker: hello.Worker.ID}
	for i := range f.inv {
		inv, _, err := svc.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"true"}, MaxAttempts: 1}.Spec())
		if err != nil {
			t.Fatal(err)
		}
		f.inv[i] = inv.ID
	}
	resp, err := svc.Poll(ctx, wire.PollRequest{WorkerID: f.worker, Queue: "q", Phase: wire.PhaseReady, Invocations: []string{},
		UpdatedCapabilities: &wire.Capabilities{MaxConcurrency: ptr(2), CurrentInvocations: ptr(0)}}.Poll(), nil)
	if err != nil || len(resp) != 2 {
		t.Fatalf("claim both: %+v %v", resp, err)
	}
	return f
}

// ship sends chunks of attempt 1 of invocation id as the worker.
func (f *logsFixture) ship(id string, chunks ...wire.LogChunk) error {
	req := wire.LogsRequest{WorkerID: f.worker, Logs: []wire.LogBatch{{InvocationID: id, Attempt: 1, Chunks: chunks}}}
	_, err := f.svc.ShipLogs(f.ctx, req.WorkerID, req.Batches(), func(domain.Worker) error { return nil })
	return err
}

// stored reads every stored chunk of attempt 1 of invocation id.
func (f *logsFixture) stored(t *testing.T, id string) []domain.LogChunk {
	t.Helper()
	var all []domain.LogChunk
	for range domain.MaxLogChunks {
		page, err := f.st.Logs(f.ctx, id, 1, len(all), 64)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			return all
		}
		all = append(all, page...)
	}
	return all
}

func wantRefused(t *testing.T, what string, err error, code wire.Code) {
	t.Helper()
	if got := wire.CodeOf(err); err == nil || got != code {
		t.Fatalf("%s: %v (code %s); want refused, %s", what, err, got, code)
	}
}

// TestShipLogsCapsEachStream: a worker that holds an attempt and ships far
// past the per-stream cap (400 chunks of 32 KiB, 12.5 MiB, 4 a request as
// the API allows) is refused once its stream reaches the cap; skipping
// ahead in seq gains it nothing, the store holds no more than the cap, and
// stderr, with a cap of its own, does not reopen stdout.
func TestShipLogsCapsEachStream(t *testing.T) {
	f := newLogsFixture(t)
	id := f.inv[0]
	full := bytes.Repeat([]byte("x"), domain.LogChunkBytes)
	accepted, refusedAt := 0, -1
	for seq := 0; seq < 400; seq += 4 {
		var req []wire.LogChunk
		for i := range 4 {
			req = append(req, wire.LogChunk{Seq: seq + i, Stream: domain.LogStdout, Data: full, At: f.clock.Now()})
		}
		if err := f.ship(id, req...); err != nil {
			wantRefused(t, "a request past the cap", err, wire.CodeConflict)
			if refusedAt < 0 {
				refusedAt = seq
			}
			continue
		}
		accepted += 4
	}
	if want := domain.MaxLogStreamBytes / domain.LogChunkBytes; accepted != want || refusedAt != want {
		t.Fatalf("%d chunks accepted, first refused request at seq %d; want %d, %d", accepted, refusedAt, want, want)
	}
	// Past the cap: a chunk after a gap, and a stderr chunk far ahead.
	wantRefused(t, "a chunk past a gap", f.ship(id, wire.LogChunk{Seq: 1000, Stream: domain.LogStdout, Data: full}), wire.CodeConflict)
	var total int64
	for _, c := range f.stored(t, id) {
		total += int64(len(c.Data))
	}
	if total > domain.MaxLogStreamBytes {
		t.Fatalf("the store holds %d bytes of stdout; the cap is %d", total, domain.MaxLogStreamBytes)
	}
	// The other stream has its own cap, from where the attempt is.
	next := domain.MaxLogStreamBytes / domain.LogChunkBytes
	if err := f.ship(id, wire.LogChunk{Seq: next, Stream: domain.LogStderr, Data: []byte("err\n")}); err != nil {
		t.Fatalf("stderr under its cap: %v", err)
	}
	wantRefused(t, "stdout once more", f.ship(id, wire.LogChunk{Seq: next + 1, Stream: domain.LogStdout, Data: []byte("x")}), wire.CodeConflict)
}

// TestShipLogsWritesEachChunkOnce: a chunk shipped again the same (nymph's
// retry after a lost answer) is taken as stored; a chunk under a stored seq
// with other bytes is refused and the stored bytes stay.
func TestShipLogsWritesEachChunkOnce(t *testing.T) {
	f := newLogsFixture(t)
	id := f.inv[0]
	at := f.clock.Now()
	first := []wire.LogChunk{
		{Seq: 0, Stream: domain.LogStdout, Data: []byte("hello\n"), At: at},
		{Seq: 1, Stream: domain.LogStderr, Data: []byte{0xff, 0x00}, At: at},
	}
	if err := f.ship(id, first...); err != nil {
		t.Fatal(err)
	}
	if err := f.ship(id, append(first, wire.LogChunk{Seq: 2, Stream: domain.LogStdout, Data: []byte("more\n"), At: at})...); err != nil {
		t.Fatalf("a retry of stored chunks, and one more: %v", err)
	}
	for name, c := range map[string]wire.LogChunk{
		"other bytes":  {Seq: 0, Stream: domain.LogStdout, Data: []byte("HACKED\n"), At: at},
		"other stream": {Seq: 1, Stream: domain.LogStdout, Data: []byte{0xff, 0x00}, At: at},
		"an eof added": {Seq: 2, Stream: domain.LogStdout, Data: []byte("more\n"), At: at, EOF: true},
	} {
		wantRefused(t, "a rewrite with "+name, f.ship(id, c), wire.CodeConflict)
	}
	got := f.stored(t, id)
	if len(got) != 3 || string(got[0].Data) != "hello\n" || !bytes.Equal(got[1].Data, []byte{0xff, 0x00}) || got[1].Stream != domain.LogStderr ||
		string(got[2].Data) != "more\n" || got[2].EOF {
		t.Fatalf("stored after the rewrites: %+v", got)
	}
}

// TestShipLogsClosesAfterTheAttemptEnds: once an attempt ended, its
// worker may ship for domain.LogGrace more (the rest of its output after
// the ack), and not after: nothing is written then. A chunk after the
// attempt's eof is refused too.
func TestShipLogsClosesAfterTheAttemptEnds(t *testing.T) {
	f := newLogsFixture(t)
	id := f.inv[0]
	if err := f.ship(id, wire.LogChunk{Seq: 0, Stream: domain.LogStdout, Data: []byte("running\n")}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.Ack(f.ctx, wire.AckRequest{WorkerID: f.worker, InvocationID: id, Attempt: 1, State: wire.StateSucceeded}.Outcome(), nil); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(domain.LogGrace)
	if err := f.ship(id, wire.LogChunk{Seq: 1, Stream: domain.LogStdout, Data: []byte("the rest\n")}); err != nil {
		t.Fatalf("the rest, within the grace: %v", err)
	}
	f.clock.Advance(time.Second)
	wantRefused(t, "a chunk past the grace", f.ship(id, wire.LogChunk{Seq: 2, Stream: domain.LogStdout, Data: []byte("later\n")}), wire.CodeConflict)
	if got := f.stored(t, id); len(got) != 2 {
		t.Fatalf("%d chunks stored; want the 2 shipped in time", len(got))
	}

	other := f.inv[1]
	if err := f.ship(other, wire.LogChunk{Seq: 0, Stream: domain.LogStdout, EOF: true}); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, "a chunk after the eof", f.ship(other, wire.LogChunk{Seq: 1, Stream: domain.LogStdout, Data: []byte("x")}), wire.CodeConflict)
}
