package api_test

// Native fuzz targets for the router (go test -fuzz; `make fuzz` runs each).
//
// Every target drives the real router in process (an httptest recorder
// against api.New) over an embedded DynamoDB that is reached in process too,
// and checks on every input:
//
//   - the router does not panic and never answers 5xx;
//   - a 4xx answer is JSON {"error": {"code", "message"}} whose code maps to
//     that very status, and every table is as it was (docs/design.md §9:
//     bad input changes nothing);
//   - a GET, or any other answer that is not a 2xx, changes nothing either;
//   - a 2xx answer is JSON (or empty, for a 204).
//
// "Unchanged" is a scan of every table compared with the fixture's. While
// fuzzing (-fuzz) the scan is skipped for a request that sent DynamoDB no
// request able to write (fuzzScanAlways): that makes fuzzing several times
// faster, and `go test` replays every seed and saved failure with the scan.
//
// Building a store is far slower than one request, so a fuzz worker builds
// its fixture once and keeps it while inputs are refused; after an input
// that may have changed the tables (a 2xx to a POST) the fixture's items are
// put back (fuzzPlane.reset) before the next input. Every input therefore
// meets the same state, and the clock stands still, so a failing input
// fails again when `go test` replays it.
//
// Fuzzed bodies and paths name the fixture's actors through placeholders
// that are replaced before the request is sent (fuzzActors), so a checked-in
// corpus file stays valid although every fixture has fresh ids.

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/server/api"
	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/server/api/daemonapi"
	"github.com/dreamlake/lakeshore/server/blobs"
	"github.com/dreamlake/lakeshore/server/blobs/blobstest"
	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/embedded"
	"github.com/dreamlake/lakeshore/server/store/schema"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/ids"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// fuzzNow is the instant every fuzz fixture lives at. With the clock still,
// projected worker states never drift while a fixture is reused.
var fuzzNow = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)

// Token selectors: the first fuzz argument of every target picks the
// Authorization header (modulo fuzzTokens).
const (
	tokNone        = iota // no Authorization header
	tokEnroll             // the enrollment token
	tokOperator           // the operator token
	tokA                  // worker A's current token
	tokB                  // worker B's token
	tokC                  // worker C's token (C is draining)
	tokASuperseded        // the token A's retried hello replaced
	tokAForged            // shaped like A's token, with a wrong secret
	fuzzTokens
)

// fuzzActors are the placeholders a fuzzed path or body may hold, and what
// each stands for in the fixture (built by newFuzzPlane).
var fuzzActors = []struct{ placeholder, means string }{
	{"$A", "worker A: machine-a, lanes default and gpu, max_concurrency 2, active, holds $R"},
	{"$B", "worker B: machine-b, lane default, has setup command $P pending"},
	{"$C", "worker C: machine-c, draining"},
	{"$R", "invocation running on A (attempt 1)"},
	{"$Q", "invocation queued on default"},
	{"$D", "invocation A ran to success"},
	{"$X", "invocation an operator cancelled while queued"},
	{"$K", "invocation submitted with idempotency_key idem-1"},
	{"$S", "setup command A ran and reported (succeeded)"},
	{"$P", "setup command pending for B"},
	{"$N", "next_cursor of GET /v1/invocations?limit=1"},
	{"$M", "next_cursor of GET /v1/workers?limit=1"},
	{"$U", "run of 2 jobs on batch (matrix model=a,b), idempotency_key run-1"},
}

// fuzzPlane is one fixture: a router over a populated embedded store.
type fuzzPlane struct {
	router http.Handler
	db     *dynamodb.Client
	prefix string
	tokens [fuzzTokens]string
	expand *strings.Replacer
	log    *bytes.Buffer
	// writes counts DynamoDB requests that may write (inProcessHTTP).
	writes *atomic.Int64

	// pristine is the scan of the tables as built; items and keys are what
	// reset puts back: each table's items, and its key attributes.
	pristine snapshot
	items    map[string][]map[string]types.AttributeValue
	keys     map[string][]string
}

// fuzzState is the fixture of this process, shared by every target; the
// fuzz engine runs one input at a time per process, the mutex keeps it so.
var fuzzState struct {
	mu    sync.Mutex
	plane *fuzzPlane
	// dirty is set unless the last input provably left the tables as the
	// fixture built them; the next input then resets them first.
	dirty bool
}

// inProcessHTTP serves the SDK's requests straight from a handler: the same
// client, signing and wire format as over a socket, without one. It counts
// the requests that may write: one that sent none cannot have changed a
// table.
type inProcessHTTP struct {
	h      http.Handler
	writes *atomic.Int64
}

// dynamoReads are the DynamoDB operations that change no item.
var dynamoReads = []string{"GetItem", "BatchGetItem", "TransactGetItems", "Query", "Scan", "DescribeTable", "ListTables"}

func (c inProcessHTTP) Do(r *http.Request) (*http.Response, error) {
	_, op, _ := strings.Cut(r.Header.Get("X-Amz-Target"), ".")
	if !slices.Contains(dynamoReads, op) {
		c.writes.Add(1)
	}
	rec := httptest.NewRecorder()
	c.h.ServeHTTP(rec, r)
	return rec.Result(), nil
}

// newFuzzPlane builds a fixture: a fresh embedded DynamoDB with the tables
// of template.yaml, and through the router itself three workers, five
// invocations and two setup commands in the states fuzzActors describes.
func newFuzzPlane() (*fuzzPlane, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	writes := &atomic.Int64{}
	base := store.EndpointClient("http://minidyn.invalid")
	db := dynamodb.New(base.Options(), func(o *dynamodb.Options) {
		o.HTTPClient = inProcessHTTP{h: embedded.Handler(), writes: writes}
	})
	const prefix = "fuzz-"
	if err := schema.EnsureTables(ctx, db, prefix); err != nil {
		return nil, fmt.Errorf("create tables: %w", err)
	}
	now := func() time.Time { return fuzzNow }
	st := store.New(db, prefix)
	st.Clock = clock.Of(now)
	st.IDs = &ids.Generator{Clock: clock.Of(now)}
	logs := &bytes.Buffer{}
	bs, _ := blobstest.Start() // lives as long as the process's fixture
	srv, err := apitest.Build(apitest.Config{Store: st,
		Config: api.Config{Config: daemonapi.Config{EnrollToken: enrollToken, OperatorToken: operatorToken, Logger: slog.New(slog.NewJSONHandler(logs, nil))}},
		Control: control.Config{Clock: clock.Of(now), Blobs: blobs.UseCases{Store: bs},
			// A long poll re-checks a few times and never really waits.
			MaxPollWait: 250 * time.Millisecond,
			Sleep:       func(context.Context, time.Duration) error { return nil }},
	})
	if err != nil {
		return nil, err
	}
	p := &fuzzPlane{router: srv, db: db, prefix: prefix, log: logs, writes: writes}
	b := fuzzBuilder{p: p}

	var a1, a, wb, wc wire.HelloResponse
	b.call("POST", "/v1/daemon/hello", enrollToken, wire.HelloRequest{MachineID: "machine-a", BootID: "boot-1",
		Lanes: []string{"default", "gpu"}, Capabilities: wire.Capabilities{MaxConcurrency: new(2)}}, 200, &a1)
	b.call("POST", "/v1/daemon/hello", enrollToken, wire.HelloRequest{MachineID: "machine-a", BootID: "boot-1",
		Lanes: []string{"default", "gpu"}, Capabilities: wire.Capabilities{MaxConcurrency: new(2)}}, 200, &a)
	b.call("POST", "/v1/daemon/hello", enrollToken, wire.HelloRequest{MachineID: "machine-b", BootID: "boot-1",
		Lanes: []string{"default"}}, 200, &wb)
	b.call("POST", "/v1/daemon/hello", enrollToken, wire.HelloRequest{MachineID: "machine-c", BootID: "boot-1",
		Lanes: []string{"default"}}, 200, &wc)
	if b.err != nil {
		return nil, b.err
	}
	if a.WorkerID != a1.WorkerID {
		return nil, fmt.Errorf("retried hello made worker %s, then %s", a1.WorkerID, a.WorkerID)
	}
	poll := func(w wire.HelloResponse, req wire.PollRequest) []wire.Command {
		req.WorkerID = w.WorkerID
		var resp wire.PollResponse
		b.call("POST", "/v1/daemon/poll", w.Token, req, 200, &resp)
		return resp.Commands
	}
	submit := func(req wire.SubmitRequest) string {
		var inv wire.Invocation
		b.call("POST", "/v1/invocations", operatorToken, req, 201, &inv)
		return inv.InvocationID
	}
	run := func(cmds []wire.Command) string {
		for _, c := range cmds {
			if c.Type == wire.CommandRun {
				return c.Invocation.InvocationID
			}
		}
		b.fail(fmt.Errorf("poll handed out no run command: %+v", cmds))
		return ""
	}

	// A runs a setup command and reports it.
	var setupA, setupB wire.SetupAccepted
	b.call("POST", "/v1/workers/"+a.WorkerID+"/setup", operatorToken, wire.SetupRequest{Argv: []string{"true"}}, 202, &setupA)
	poll(a, wire.PollRequest{Phase: wire.PhaseSetup, Invocations: []string{}})
	poll(a, wire.PollRequest{Phase: wire.PhaseReady, Invocations: []string{}, SetupResults: []wire.SetupResult{
		{CommandID: setupA.CommandID, Status: wire.SetupSucceeded, DurationMS: 3, OutputTail: "ok"}}})
	// A runs D to success, then holds R.
	done := submit(wire.SubmitRequest{Queue: "default", Argv: []string{"echo", "first"}})
	if got := run(poll(a, wire.PollRequest{Phase: wire.PhaseReady, Invocations: []string{}})); got != done && b.err == nil {
		b.fail(fmt.Errorf("A claimed %s, want %s", got, done))
	}
	var ackResp wire.AckResponse
	b.call("POST", "/v1/daemon/ack", a.Token, wire.AckRequest{WorkerID: a.WorkerID, InvocationID: done, Attempt: 1,
		State: wire.StateSucceeded, ExitCode: new(0), ResultBlob: json.RawMessage(`{"ok":true}`), StdoutTail: "first"}, 200, &ackResp)
	running := submit(wire.SubmitRequest{Queue: "default", Argv: []string{"sleep", "600"}, TimeoutS: 900,
		RunConfig: wire.RunConfig{RunSetup: []string{"cd /tmp"}, Env: map[string]string{"MODE": "fuzz"}, Workdir: "tmp"}})
	if got := run(poll(a, wire.PollRequest{Phase: wire.PhaseReady, Invocations: []string{}})); got != running && b.err == nil {
		b.fail(fmt.Errorf("A claimed %s, want %s", got, running))
	}
	// A's attempt of R has an upload pending (fuzzUpload), its bytes put.
	var up wire.ArtifactUpload
	b.call("POST", "/v1/daemon/artifacts", a.Token, wire.ArtifactUploadRequest{WorkerID: a.WorkerID, InvocationID: running,
		Attempt: 1, Name: "out.txt", Size: int64(len(fuzzArtifact)), SHA256: fuzzArtifactSHA}, 200, &up)
	if b.err == nil {
		if up.UploadID != fuzzUpload {
			b.fail(fmt.Errorf("fixture: upload id %q, want %q", up.UploadID, fuzzUpload))
		} else if err := putBody(up, fuzzArtifact); err != nil {
			b.fail(err)
		}
	}
	// B and C poll once (active); B gets a setup command it has not run; C
	// is drained. Then the queue gets work nobody has claimed.
	poll(wb, wire.PollRequest{Phase: wire.PhaseReady, Invocations: []string{}})
	poll(wc, wire.PollRequest{Phase: wire.PhaseReady, Invocations: []string{}})
	b.call("POST", "/v1/workers/"+wb.WorkerID+"/setup", operatorToken, wire.SetupRequest{Argv: []string{"apt-get", "install", "-y", "jq"}}, 202, &setupB)
	b.call("POST", "/v1/workers/"+wc.WorkerID+"/drain", operatorToken, nil, 202, nil)
	cancelled := submit(wire.SubmitRequest{Queue: "default", Argv: []string{"echo", "never"}})
	b.call("POST", "/v1/invocations/"+cancelled+"/cancel", operatorToken, nil, 200, nil)
	queued := submit(wire.SubmitRequest{Queue: "default", Argv: []string{"echo", "third"}, MaxAttempts: 2})
	keyed := submit(wire.SubmitRequest{Queue: "gpu", Argv: []string{"train"}, IdempotencyKey: "idem-1"})
	var runMade wire.RunCreated
	b.call("POST", "/v1/runs", operatorToken, wire.RunRequest{Queue: "batch", Argv: []string{"eval", "{model}"},
		Matrix: map[string][]string{"model": {"a", "b"}}, IdempotencyKey: "run-1"}, 201, &runMade)

	var invs wire.InvocationList
	var ws wire.WorkerList
	b.call("GET", "/v1/invocations?limit=1", operatorToken, nil, 200, &invs)
	b.call("GET", "/v1/workers?limit=1", operatorToken, nil, 200, &ws)
	if b.err != nil {
		return nil, b.err
	}
	if invs.NextCursor == "" || ws.NextCursor == "" {
		return nil, fmt.Errorf("no next_cursor from the lists (%q, %q)", invs.NextCursor, ws.NextCursor)
	}

	p.tokens = [fuzzTokens]string{
		tokEnroll:      enrollToken,
		tokOperator:    operatorToken,
		tokA:           a.Token,
		tokB:           wb.Token,
		tokC:           wc.Token,
		tokASuperseded: a1.Token,
		tokAForged:     "wtk_" + strings.TrimPrefix(a.WorkerID, "wrk_") + "_" + strings.Repeat("A", 43),
	}
	means := map[string]string{
		"$A": a.WorkerID, "$B": wb.WorkerID, "$C": wc.WorkerID,
		"$R": running, "$Q": queued, "$D": done, "$X": cancelled, "$K": keyed,
		"$S": setupA.CommandID, "$P": setupB.CommandID,
		"$N": invs.NextCursor, "$M": ws.NextCursor, "$U": runMade.RunID,
	}
	var pairs []string
	for _, actor := range fuzzActors {
		pairs = append(pairs, actor.placeholder, means[actor.placeholder])
	}
	p.expand = strings.NewReplacer(pairs...)
	if err := p.keep(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// The fixture's pending artifact upload: its content, digest and id.
const (
	fuzzArtifact    = "out\n"
	fuzzArtifactSHA = "54034ac5c6e9ea95734ec2b729fd6d62abf64af34a9f9ce5d466cb788191a73d"
	fuzzUpload      = "up1"
)

// putBody PUTs body where upload up says.
func putBody(up wire.ArtifactUpload, body string) error {
	req, err := http.NewRequest(up.Method, up.URL, strings.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("fixture: PUT %s: %d", up.URL, resp.StatusCode)
	}
	return nil
}

// fuzzBuilder sends the fixture's setup requests, keeping the first error.
type fuzzBuilder struct {
	p   *fuzzPlane
	err error
}

func (b *fuzzBuilder) fail(err error) {
	if b.err == nil {
		b.err = err
	}
}

func (b *fuzzBuilder) call(method, path, token string, body any, want int, out any) {
	if b.err != nil {
		return
	}
	var raw []byte
	if body != nil {
		var err error
		if raw, err = json.Marshal(body); err != nil {
			b.fail(err)
			return
		}
	}
	req := httptest.NewRequest(method, path, bytes.NewReader(raw))
	req.Header.Set("Authorization", "Bearer "+token)
	rec := httptest.NewRecorder()
	b.p.router.ServeHTTP(rec, req)
	if rec.Code != want {
		b.fail(fmt.Errorf("fixture: %s %s answered %d, want %d: %s", method, path, rec.Code, want, rec.Body))
		return
	}
	if out != nil {
		if err := json.Unmarshal(rec.Body.Bytes(), out); err != nil {
			b.fail(fmt.Errorf("fixture: %s %s: decode %s: %w", method, path, rec.Body, err))
		}
	}
}

// snapshot reads every item of every table, like harness.snapshot.
func (p *fuzzPlane) snapshot(ctx context.Context) (snapshot, error) {
	return storetest.ReadSnapshot(ctx, p.db, p.prefix)
}

// keep records the fixture's items, and each table's key attributes, for
// reset.
func (p *fuzzPlane) keep(ctx context.Context) error {
	p.items = map[string][]map[string]types.AttributeValue{}
	p.keys = map[string][]string{}
	tables, err := storetest.Tables(p.prefix)
	if err != nil {
		return err
	}
	for _, table := range tables {
		out, err := p.db.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
		if err != nil {
			return fmt.Errorf("describe %s: %w", table, err)
		}
		for _, k := range out.Table.KeySchema {
			p.keys[table] = append(p.keys[table], aws.ToString(k.AttributeName))
		}
		if p.items[table], err = storetest.ScanTable(ctx, p.db, table); err != nil {
			return err
		}
	}
	p.pristine, err = p.snapshot(ctx)
	return err
}

// reset puts the tables back as the fixture built them, several times
// faster than building a new one: it deletes every item the fixture did not
// have and puts back every item it had, then checks the scan.
func (p *fuzzPlane) reset(ctx context.Context) error {
	tables, err := storetest.Tables(p.prefix)
	if err != nil {
		return err
	}
	for _, table := range tables {
		keyOf := func(item map[string]types.AttributeValue) (map[string]types.AttributeValue, string, error) {
			k := map[string]types.AttributeValue{}
			for _, name := range p.keys[table] {
				k[name] = item[name]
			}
			s, err := storetest.ItemJSON(k)
			return k, s, err
		}
		had := map[string]bool{}
		var writes []types.WriteRequest
		for _, item := range p.items[table] {
			_, k, err := keyOf(item)
			if err != nil {
				return err
			}
			had[k] = true
			writes = append(writes, types.WriteRequest{PutRequest: &types.PutRequest{Item: item}})
		}
		now, err := storetest.ScanTable(ctx, p.db, table)
		if err != nil {
			return err
		}
		for _, item := range now {
			key, k, err := keyOf(item)
			if err != nil {
				return err
			}
			if !had[k] {
				writes = append(writes, types.WriteRequest{DeleteRequest: &types.DeleteRequest{Key: key}})
			}
		}
		for chunk := range slices.Chunk(writes, 25) {
			pending := map[string][]types.WriteRequest{table: chunk}
			for len(pending) > 0 {
				out, err := p.db.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{RequestItems: pending})
				if err != nil {
					return fmt.Errorf("reset %s: %w", table, err)
				}
				pending = out.UnprocessedItems
			}
		}
	}
	snap, err := p.snapshot(ctx)
	if err != nil {
		return err
	}
	if !maps.EqualFunc(p.pristine, snap, slices.Equal) {
		return fmt.Errorf("reset left the tables changed:\n%s", p.pristine.Diff(snap))
	}
	return nil
}

// fuzzExchange sends one fuzzed request (placeholders expanded) with the
// selected token, checks every property, and reports the status, or 0 for
// a target no HTTP server would pass on.
func fuzzExchange(t *testing.T, tok uint8, method, target string, body []byte) int {
	t.Helper()
	fuzzState.mu.Lock()
	defer fuzzState.mu.Unlock()
	if fuzzState.plane != nil && fuzzState.dirty {
		if err := fuzzState.plane.reset(context.Background()); err != nil {
			t.Logf("fuzz fixture: %v; building a new one", err)
			fuzzState.plane = nil
		}
		fuzzState.dirty = false
	}
	if fuzzState.plane == nil {
		p, err := newFuzzPlane()
		if err != nil {
			t.Fatalf("fuzz fixture: %v", err)
		}
		fuzzState.plane = p
	}
	p := fuzzState.plane

	target = p.expand.Replace(target)
	body = []byte(p.expand.Replace(string(body)))
	req, err := http.NewRequest(method, "http://lakeshore.test"+target, bytes.NewReader(body))
	if err != nil {
		return 0
	}
	if len(body) > 0 {
		req.Header.Set("Content-Type", "application/json")
	}
	if tok := p.tokens[int(tok)%fuzzTokens]; tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	p.log.Reset()
	rec := httptest.NewRecorder()
	fuzzState.dirty = true // until the tables are shown unchanged
	writesBefore := p.writes.Load()
	p.router.ServeHTTP(rec, req)

	status, raw := rec.Code, rec.Body.Bytes()
	what := fmt.Sprintf("%s %s (token %d, body %q)", method, target, int(tok)%fuzzTokens, clipBytes(body))
	switch {
	case status >= 500 || status < 200:
		t.Fatalf("%s answered %d: %s\nlog: %s", what, status, raw, p.log)
	case status >= 400:
		var eb wire.ErrorBody
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s answered %d with Content-Type %q", what, status, ct)
		}
		if err := json.Unmarshal(raw, &eb); err != nil {
			t.Fatalf("%s answered %d with a body that is not JSON (%v): %q", what, status, err, raw)
		}
		if eb.Error.Code == "" || eb.Error.Message == "" || wire.Status(eb.Error.Code) != status {
			t.Fatalf("%s answered %d with error %+v (code maps to %d)", what, status, eb.Error, wire.Status(eb.Error.Code))
		}
	case status >= 300:
		// Unclean paths get a JSON 404, never ServeMux's HTML redirect.
		t.Fatalf("%s answered %d (Location %q): %q", what, status, rec.Header().Get("Location"), raw)
	case status == http.StatusNoContent:
		if len(raw) != 0 {
			t.Errorf("%s answered 204 with a body: %q", what, raw)
		}
	case rec.Header().Get("Content-Type") == "application/x-ndjson":
		// A run's results: JSON lines, each one JSON value.
		for line := range bytes.Lines(raw) {
			if !json.Valid(line) {
				t.Fatalf("%s answered %d with a line that is not JSON: %q", what, status, line)
			}
		}
	default:
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s answered %d with Content-Type %q", what, status, ct)
		}
		if !json.Valid(raw) {
			t.Fatalf("%s answered %d with a body that is not JSON: %q", what, status, raw)
		}
	}

	if status < 300 && method != http.MethodGet {
		return status // it may have changed the tables: the next input resets them first
	}
	if p.writes.Load() == writesBefore && !fuzzScanAlways() {
		// Not one request that could write reached the store.
		fuzzState.dirty = false
		return status
	}
	after, err := p.snapshot(context.Background())
	if err != nil {
		t.Fatalf("after %s: %v", what, err)
	}
	if !maps.EqualFunc(p.pristine, after, slices.Equal) {
		t.Fatalf("%s answered %d (%s) and changed the store:\n%s", what, status, raw, p.pristine.Diff(after))
	}
	fuzzState.dirty = false
	return status
}

// fuzzScanAlways reports whether every refused input is checked against a
// scan of the tables. While fuzzing (-fuzz), a scan is made only when the
// request reached the store with a request that could write: a scan costs
// several times the request, and reads alone cannot change a table. Seeds
// and reproducers (plain go test) always get the scan.
var fuzzScanAlways = sync.OnceValue(func() bool {
	f := flag.Lookup("test.fuzz")
	return f == nil || f.Value.String() == ""
})

// clipBytes shortens a body quoted in a failure message.
func clipBytes(b []byte) []byte {
	if len(b) <= 512 {
		return b
	}
	return append(b[:512:512], "…"...)
}

// fuzzSeeds collects a target's seed inputs and the status each must get,
// so that `go test` (which runs the seeds) also pins them.
type fuzzSeeds struct {
	f     *testing.F
	wants map[string]int
}

func newFuzzSeeds(f *testing.F) *fuzzSeeds { return &fuzzSeeds{f: f, wants: map[string]int{}} }

// add adds one seed; want 0 checks only the properties.
func (s *fuzzSeeds) add(want int, args ...any) {
	s.f.Add(args...)
	if want != 0 {
		s.wants[seedKey(args...)] = want
	}
}

// check fails t if the input is a seed answered other than pinned.
func (s *fuzzSeeds) check(t *testing.T, status int, args ...any) {
	t.Helper()
	if want, ok := s.wants[seedKey(args...)]; ok && status != want {
		t.Errorf("seed answered %d, want %d", status, want)
	}
}

func seedKey(args ...any) string {
	var b strings.Builder
	for _, a := range args {
		fmt.Fprintf(&b, "%T:%q;", a, a)
	}
	return b.String()
}

// daemonSeed is one seed of a daemon route: token selector, body, status.
type daemonSeed struct {
	tok  uint8
	body string
	want int
}

// withBrokenBodies adds to seeds the malformed variants of a valid body and
// the wrong tokens.
func withBrokenBodies(valid string, tok uint8, seeds ...daemonSeed) []daemonSeed {
	return append(seeds,
		daemonSeed{tok, "", 400},
		daemonSeed{tok, "null", 400},
		daemonSeed{tok, "[]", 400},
		daemonSeed{tok, valid[:len(valid)-1], 400},
		daemonSeed{tok, valid + "{}", 400},
		daemonSeed{tok, valid + " x", 400},
		daemonSeed{tok, strings.Replace(valid, `"`, "\"\xff", 1), 400},
		daemonSeed{tok, `{"pad":"` + strings.Repeat("x", wire.MaxBodyBytes) + `"}`, 413},
		daemonSeed{tokNone, valid, 401},
		daemonSeed{tokOperator, valid, 401},
	)
}

// fuzzDaemonRoute fuzzes POST path with (token selector, body).
func fuzzDaemonRoute(f *testing.F, path string, seeds []daemonSeed) {
	s := newFuzzSeeds(f)
	for _, seed := range seeds {
		s.add(seed.want, seed.tok, []byte(seed.body))
	}
	f.Fuzz(func(t *testing.T, tok uint8, body []byte) {
		s.check(t, fuzzExchange(t, tok, http.MethodPost, path, body), tok, body)
	})
}

// The daemon routes, one fuzz target each.
const (
	pathHello = "/v1/daemon/hello"
	pathPoll  = "/v1/daemon/poll"
	pathAck   = "/v1/daemon/ack"
	pathBye   = "/v1/daemon/bye"
	pathLogs  = "/v1/daemon/logs"

	pathArtifacts        = "/v1/daemon/artifacts"
	pathArtifactComplete = "/v1/daemon/artifacts/complete"
)

// A well-formed host key and ids of nothing in the fixture.
const (
	fuzzHostKey   = "hk1_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	fuzzNoInv     = "inv_01J00000000000000000000000"
	fuzzNoWorker  = "wrk_01J00000000000000000000000"
	fuzzNoCommand = "cmd_01J00000000000000000000000"
)

func FuzzHello(f *testing.F) {
	const valid = `{"machine_id":"machine-new","boot_id":"boot-1","lanes":["default"]}`
	fuzzDaemonRoute(f, pathHello, withBrokenBodies(valid, tokEnroll,
		daemonSeed{tokEnroll, valid, 200},
		daemonSeed{tokEnroll, `{"machine_id":"machine-full","boot_id":"b","label":"gpu box","tags":{"zone":"a","":"x"},"lanes":["default","gpu"],"capabilities":{"max_concurrency":4,"current_invocations":1},"versions":{"nymph":"1.2.3"},"host_key":"` + fuzzHostKey + `"}`, 400},
		daemonSeed{tokEnroll, `{"machine_id":"machine-full","boot_id":"b","label":"gpu box","tags":{"zone":"a"},"lanes":["default","gpu"],"capabilities":{"max_concurrency":4,"current_invocations":1},"versions":{"nymph":"1.2.3"},"host_key":"` + fuzzHostKey + `"}`, 200},
		// The same machine and boot as A (a retried hello), and a new boot
		// of A's machine (retires A, requeues $R).
		daemonSeed{tokEnroll, `{"machine_id":"machine-a","boot_id":"boot-1","lanes":["default","gpu"],"capabilities":{"max_concurrency":2}}`, 200},
		daemonSeed{tokEnroll, `{"machine_id":"machine-a","boot_id":"boot-2","lanes":["default"]}`, 200},
		daemonSeed{tokEnroll, `{"machine_id":"machine-c","boot_id":"boot-1"}`, 200},
		daemonSeed{tokEnroll, `{"machine_id":"machine-new","lanes":["default"]}`, 400},
		daemonSeed{tokEnroll, `{"machine_id":"m","boot_id":"b","lanes":["no spaces"]}`, 400},
		daemonSeed{tokEnroll, `{"machine_id":"m","boot_id":"b","capabilities":{"max_concurrency":0}}`, 400},
		daemonSeed{tokEnroll, `{"machine_id":"m","boot_id":"b","host_key":"hk1_abc"}`, 400},
		daemonSeed{tokEnroll, `{"machine_id":12,"boot_id":"b"}`, 400},
		daemonSeed{tokA, valid, 401},
	))
}

func FuzzPoll(f *testing.F) {
	const valid = `{"worker_id":"$A","phase":"ready","invocations":["$R"]}`
	fuzzDaemonRoute(f, pathPoll, withBrokenBodies(valid, tokA,
		daemonSeed{tokA, valid, 200},
		daemonSeed{tokA, `{"worker_id":"$A"}`, 200},
		// Omits $R (requeued), asks for cancelled and unknown work.
		daemonSeed{tokA, `{"worker_id":"$A","queue":"gpu","timeout_s":1.5,"invocations":[]}`, 200},
		daemonSeed{tokA, `{"worker_id":"$A","queue":"default","timeout_s":20,"invocations":["$R","$D","$X","$Q","` + fuzzNoInv + `"],"phase":"setup","host_key":"` + fuzzHostKey + `","updated_capabilities":{"current_invocations":1,"max_concurrency":4},"setup_results":[{"command_id":"$S","status":"succeeded","exit_code":0,"duration_ms":5,"output_tail":"ok"},{"command_id":"$P","status":"failed","exit_code":2},{"command_id":"` + fuzzNoCommand + `","status":"failed"}]}`, 200},
		daemonSeed{tokA, `{"worker_id":"$A","phase":"draining","invocations":["$R"]}`, 200},
		daemonSeed{tokB, `{"worker_id":"$B","phase":"setup","invocations":[],"setup_results":[{"command_id":"$P","status":"succeeded","exit_code":0,"duration_ms":1200,"output_tail":"done"}]}`, 200},
		daemonSeed{tokC, `{"worker_id":"$C","phase":"ready","invocations":[]}`, 200},
		daemonSeed{tokA, `{"worker_id":"$A","phase":"booting"}`, 400},
		daemonSeed{tokA, `{"worker_id":"$A","timeout_s":-1}`, 400},
		daemonSeed{tokA, `{"worker_id":"$A","queue":"other"}`, 400},
		daemonSeed{tokA, `{"worker_id":"$A","invocations":["inv_nope"]}`, 400},
		daemonSeed{tokA, `{"worker_id":"$A","updated_capabilities":{"current_invocations":-1}}`, 400},
		daemonSeed{tokA, `{"worker_id":"$B"}`, 403},
		daemonSeed{tokB, valid, 403},
		daemonSeed{tokASuperseded, valid, 401},
		daemonSeed{tokAForged, valid, 401},
		daemonSeed{tokEnroll, valid, 401},
	))
}

func FuzzAck(f *testing.F) {
	const valid = `{"worker_id":"$A","invocation_id":"$R","attempt":1,"state":"succeeded","exit_code":0,"result_blob":{"ok":true},"stdout_tail":"out"}`
	fuzzDaemonRoute(f, pathAck, withBrokenBodies(valid, tokA,
		daemonSeed{tokA, valid, 200},
		daemonSeed{tokA, `{"worker_id":"$A","invocation_id":"$R","attempt":1,"state":"failed","exit_code":2,"result_blob":[1,"two",null],"error":{"type":"oom","message":"killed"},"stdout_tail":"o","stderr_tail":"e"}`, 200},
		daemonSeed{tokA, `{"worker_id":"$A","invocation_id":"$R","attempt":1,"state":"cancelled","result_blob":null}`, 200},
		daemonSeed{tokA, `{"worker_id":"$A","invocation_id":"$D","attempt":1,"state":"failed"}`, 200},
		daemonSeed{tokA, `{"worker_id":"$A","invocation_id":"$R","attempt":2,"state":"succeeded"}`, 403},
		daemonSeed{tokA, `{"worker_id":"$A","invocation_id":"$Q","attempt":1,"state":"succeeded"}`, 403},
		daemonSeed{tokB, `{"worker_id":"$B","invocation_id":"$R","attempt":1,"state":"succeeded"}`, 403},
		daemonSeed{tokA, `{"worker_id":"$A","invocation_id":"` + fuzzNoInv + `","attempt":1,"state":"succeeded"}`, 404},
		daemonSeed{tokA, `{"worker_id":"$A","invocation_id":"$R","attempt":1,"state":"running"}`, 400},
		daemonSeed{tokA, `{"worker_id":"$A","invocation_id":"$R","attempt":0,"state":"failed"}`, 400},
		daemonSeed{tokA, `{"worker_id":"$A","invocation_id":"$R","attempt":1,"state":"failed","error":{"message":"x"}}`, 400},
		daemonSeed{tokA, `{"worker_id":"$A","invocation_id":"$A","attempt":1,"state":"failed"}`, 400},
		daemonSeed{tokASuperseded, valid, 401},
		daemonSeed{tokAForged, valid, 401},
	))
}

func FuzzBye(f *testing.F) {
	const valid = `{"worker_id":"$A","reason":"idle","inflight_abandoned":1}`
	fuzzDaemonRoute(f, pathBye, withBrokenBodies(valid, tokA,
		daemonSeed{tokA, valid, 204},
		daemonSeed{tokB, `{"worker_id":"$B","reason":"signal"}`, 204},
		daemonSeed{tokC, `{"worker_id":"$C","reason":"drain","inflight_abandoned":0}`, 204},
		daemonSeed{tokA, `{"worker_id":"$A","reason":"spot_interruption"}`, 204},
		daemonSeed{tokA, `{"worker_id":"$A","reason":"bored"}`, 400},
		daemonSeed{tokA, `{"worker_id":"$A","reason":"idle","inflight_abandoned":-1}`, 400},
		daemonSeed{tokA, `{"worker_id":"$B","reason":"idle"}`, 403},
		daemonSeed{tokASuperseded, valid, 401},
		daemonSeed{tokAForged, valid, 401},
	))
}

func FuzzLogs(f *testing.F) {
	const valid = `{"worker_id":"$A","logs":[{"invocation_id":"$R","attempt":1,"chunks":[{"seq":0,"stream":"stdout","data":"aGkK","at":"2026-12-01T00:00:00Z"}]}]}`
	chunk := func(c string) string {
		return `{"worker_id":"$A","logs":[{"invocation_id":"$R","attempt":1,"chunks":[` + c + `]}]}`
	}
	fuzzDaemonRoute(f, pathLogs, withBrokenBodies(valid, tokA,
		daemonSeed{tokA, valid, 200},
		daemonSeed{tokA, chunk(`{"seq":0,"stream":"stderr","data":"","at":"2026-12-01T00:00:01Z","dropped":100},{"seq":1,"stream":"stdout","at":"2026-12-01T00:00:02Z","eof":true}`), 200},
		// Every input meets the fixture's tables, which hold no chunk: one
		// past the first is out of order.
		daemonSeed{tokA, chunk(`{"seq":1,"stream":"stdout","at":"2026-12-01T00:00:01Z"}`), 409},
		daemonSeed{tokA, chunk(`{"seq":-1,"stream":"stdout","at":"2026-12-01T00:00:00Z"}`), 400},
		daemonSeed{tokA, chunk(`{"seq":65536,"stream":"stdout","at":"2026-12-01T00:00:00Z"}`), 400},
		daemonSeed{tokA, chunk(`{"seq":0,"stream":"stdin","at":"2026-12-01T00:00:00Z"}`), 400},
		daemonSeed{tokA, chunk(`{"seq":0,"stream":"stdout","data":"not base64!","at":"2026-12-01T00:00:00Z"}`), 400},
		daemonSeed{tokA, chunk(`{"seq":0,"stream":"stdout","dropped":-1,"at":"2026-12-01T00:00:00Z"}`), 400},
		daemonSeed{tokA, chunk(``), 400},
		daemonSeed{tokA, `{"worker_id":"$A","logs":[]}`, 400},
		daemonSeed{tokA, `{"worker_id":"$A","logs":[{"invocation_id":"$R","attempt":2,"chunks":[{"seq":0,"stream":"stdout","at":"2026-12-01T00:00:00Z"}]}]}`, 403},
		daemonSeed{tokB, `{"worker_id":"$B","logs":[{"invocation_id":"$R","attempt":1,"chunks":[{"seq":0,"stream":"stdout","at":"2026-12-01T00:00:00Z"}]}]}`, 403},
		daemonSeed{tokA, `{"worker_id":"$A","logs":[{"invocation_id":"` + fuzzNoInv + `","attempt":1,"chunks":[{"seq":0,"stream":"stdout","at":"2026-12-01T00:00:00Z"}]}]}`, 404},
		daemonSeed{tokA, `{"worker_id":"$B","logs":[{"invocation_id":"$R","attempt":1,"chunks":[{"seq":0,"stream":"stdout","at":"2026-12-01T00:00:00Z"}]}]}`, 403},
		daemonSeed{tokAForged, valid, 401},
	))
}

func FuzzArtifacts(f *testing.F) {
	upload := func(worker, inv string, attempt int, name, size, sha string) string {
		return fmt.Sprintf(`{"worker_id":%q,"invocation_id":%q,"attempt":%d,"name":%q,"size":%s,"sha256":%q}`,
			worker, inv, attempt, name, size, sha)
	}
	valid := upload("$A", "$R", 1, "preds.jsonl", "12", fuzzArtifactSHA)
	fuzzDaemonRoute(f, pathArtifacts, withBrokenBodies(valid, tokA,
		daemonSeed{tokA, valid, 200},
		daemonSeed{tokA, `{"worker_id":"$A","invocation_id":"$R","attempt":1,"name":"ckpt","size":0,"sha256":"` + fuzzArtifactSHA + `","content_type":"` + wire.ContentTypeDir + `"}`, 200},
		daemonSeed{tokA, upload("$A", "$R", 1, "out.txt", "4", fuzzArtifactSHA), 200}, // replaces the pending one
		daemonSeed{tokA, upload("$A", "$R", 2, "x", "1", fuzzArtifactSHA), 403},
		daemonSeed{tokA, upload("$A", "$Q", 1, "x", "1", fuzzArtifactSHA), 403},
		daemonSeed{tokB, upload("$B", "$R", 1, "x", "1", fuzzArtifactSHA), 403},
		daemonSeed{tokA, upload("$A", "$D", 1, "x", "1", fuzzArtifactSHA), 409},
		daemonSeed{tokA, upload("$A", fuzzNoInv, 1, "x", "1", fuzzArtifactSHA), 404},
		daemonSeed{tokA, upload("$A", "$R", 1, "x", "6000000000", fuzzArtifactSHA), 400},
		daemonSeed{tokA, upload("$A", "$R", 1, "../x", "1", fuzzArtifactSHA), 400},
		daemonSeed{tokA, `{"worker_id":"$A","invocation_id":"$R","attempt":1,"name":"a\u0001b","size":1,"sha256":"` + fuzzArtifactSHA + `"}`, 400},
		daemonSeed{tokA, upload("$A", "$R", 1, strings.Repeat("n", 129), "1", fuzzArtifactSHA), 400},
		daemonSeed{tokA, upload("$A", "$R", 1, "x", "-1", fuzzArtifactSHA), 400},
		daemonSeed{tokA, upload("$A", "$R", 1, "x", "1", "ABC"), 400},
		daemonSeed{tokA, upload("$A", "$R", 0, "x", "1", fuzzArtifactSHA), 400},
		daemonSeed{tokA, upload("$B", "$R", 1, "x", "1", fuzzArtifactSHA), 403},
		daemonSeed{tokASuperseded, valid, 401},
		daemonSeed{tokAForged, valid, 401},
		daemonSeed{tokOperator, valid, 401},
	))
}

func FuzzArtifactComplete(f *testing.F) {
	complete := func(worker, inv string, attempt int, name, upload string) string {
		return fmt.Sprintf(`{"worker_id":%q,"invocation_id":%q,"attempt":%d,"name":%q,"upload_id":%q}`,
			worker, inv, attempt, name, upload)
	}
	valid := complete("$A", "$R", 1, "out.txt", fuzzUpload)
	fuzzDaemonRoute(f, pathArtifactComplete, withBrokenBodies(valid, tokA,
		daemonSeed{tokA, valid, 200},
		daemonSeed{tokA, `{"worker_id":"$A","invocation_id":"$R","attempt":1,"name":"out.txt","upload_id":"up1","parts":[{"number":1,"etag":"\"e\""}]}`, 200},
		daemonSeed{tokA, complete("$A", "$R", 1, "out.txt", "up2"), 409},
		daemonSeed{tokA, complete("$A", "$R", 1, "other.txt", fuzzUpload), 409},
		daemonSeed{tokA, complete("$A", "$D", 1, "out.txt", fuzzUpload), 409},
		daemonSeed{tokA, complete("$A", "$R", 2, "out.txt", fuzzUpload), 403},
		daemonSeed{tokB, complete("$B", "$R", 1, "out.txt", fuzzUpload), 403},
		daemonSeed{tokA, complete("$A", fuzzNoInv, 1, "out.txt", fuzzUpload), 404},
		daemonSeed{tokA, complete("$A", "$R", 1, "out.txt", ""), 400},
		daemonSeed{tokA, complete("$A", "$R", 1, "a/b", fuzzUpload), 400},
		daemonSeed{tokASuperseded, valid, 401},
		daemonSeed{tokAForged, valid, 401},
	))
}

// Operator POST routes, picked by the route selector (modulo 5); {id} is
// the fuzzed id, path-escaped, so any bytes reach the handler's id check.
var fuzzOperatorPosts = []string{
	"/v1/invocations",
	"/v1/invocations/{id}/cancel",
	"/v1/workers/{id}/drain",
	"/v1/workers/{id}/setup",
	"/v1/hosts/release",
	"/v1/runs",
	"/v1/runs/{id}/cancel",
	"/v1/runs/{id}/retry",
}

func FuzzOperatorPost(f *testing.F) {
	s := newFuzzSeeds(f)
	add := func(want int, tok, route uint8, id, body string) { s.add(want, tok, route, id, []byte(body)) }
	const submit = `{"queue":"default","argv":["echo","hi"]}`
	add(201, tokOperator, 0, "", submit)
	add(201, tokOperator, 0, "", `{"queue":"gpu","argv":["python","train.py"],"env":{"SEED":"1"},"run_config":{"host_setup":["apt-get install -y jq"],"run_setup":["cd /srv"],"env":{"A":"b"},"workdir":"srv"},"timeout_s":3600,"max_attempts":5,"idempotency_key":"idem-2"}`)
	add(200, tokOperator, 0, "", `{"queue":"gpu","argv":["train"],"idempotency_key":"idem-1"}`)
	add(409, tokOperator, 0, "", `{"queue":"gpu","argv":["train","--fast"],"idempotency_key":"idem-1"}`)
	add(400, tokOperator, 0, "", `{"queue":"my queue","argv":["x"]}`)
	add(400, tokOperator, 0, "", `{"queue":"default","argv":[]}`)
	add(400, tokOperator, 0, "", `{"queue":"default","argv":["x"],"env":{"A=B":"c"}}`)
	add(400, tokOperator, 0, "", `{"queue":"default","argv":["x"],"timeout_s":"5m"}`)
	add(400, tokOperator, 0, "", `{"queue":"default","argv":["x"],"max_attempts":21}`)
	add(400, tokOperator, 0, "", `{"queue":"default","argv":["x"],"run_config":{"run_setup":[""]}}`)
	add(400, tokOperator, 0, "", submit[:len(submit)-1])
	add(400, tokOperator, 0, "", "")
	add(413, tokOperator, 0, "", `{"pad":"`+strings.Repeat("x", wire.MaxBodyBytes)+`"}`)
	add(401, tokNone, 0, "", submit)
	add(401, tokEnroll, 0, "", submit)
	add(200, tokOperator, 1, "$Q", "")
	add(202, tokOperator, 1, "$R", "")
	add(409, tokOperator, 1, "$D", "")
	add(409, tokOperator, 1, "$X", "")
	add(404, tokOperator, 1, fuzzNoInv, "")
	add(400, tokOperator, 1, "$A", "")
	add(400, tokOperator, 1, "nope", "")
	add(401, tokA, 1, "$Q", "")
	add(202, tokOperator, 2, "$A", "")
	add(202, tokOperator, 2, "$C", "")
	add(404, tokOperator, 2, fuzzNoWorker, "")
	add(400, tokOperator, 2, "$R", "")
	add(400, tokOperator, 2, "../invocations", "")
	add(202, tokOperator, 3, "$A", `{"argv":["apt-get","install","-y","jq"]}`)
	add(202, tokOperator, 3, "$B", `{"argv":["true"]}`)
	add(404, tokOperator, 3, fuzzNoWorker, `{"argv":["true"]}`)
	add(400, tokOperator, 3, "$A", `{}`)
	add(400, tokOperator, 3, "$A", `{"argv":[""]}`)
	add(400, tokOperator, 3, "$A", `{"argv":["a\u0000b"]}`)
	add(400, tokOperator, 3, "$Q", `{"argv":["true"]}`)
	add(200, tokOperator, 4, "", `{"queue":"default"}`)
	add(200, tokOperator, 4, "", `{"queue":"gpu","host_key":"hk1_`+strings.Repeat("ab", 32)+`"}`)
	add(400, tokOperator, 4, "", `{"queue":""}`)
	add(400, tokOperator, 4, "", `{"queue":"default","host_key":"hk1_x"}`)
	add(401, tokA, 4, "", `{"queue":"default"}`)
	const runReq = `{"queue":"batch","argv":["eval","{model}"],"matrix":{"model":["a","b"]},"idempotency_key":"run-1"}`
	add(200, tokOperator, 5, "", runReq)
	add(201, tokOperator, 5, "", `{"queue":"batch","argv":["x","{m}"],"matrix":{"m":["1","2","3"],"n":["x"]}}`)
	add(201, tokOperator, 5, "", `{"queue":"default","argv":["true"],"jobs":[{},{"argv":["echo","two"],"env":{"K":"v"}}]}`)
	add(409, tokOperator, 5, "", `{"queue":"batch","argv":["eval","{model}"],"matrix":{"model":["a"]},"idempotency_key":"run-1"}`)
	add(400, tokOperator, 5, "", `{"queue":"batch","argv":["x"]}`)
	add(400, tokOperator, 5, "", `{"queue":"batch","argv":["x","{nope}"],"matrix":{"m":["1"]}}`)
	add(400, tokOperator, 5, "", `{"queue":"batch","argv":["x"],"matrix":{"m":[]}}`)
	add(400, tokOperator, 5, "", `{"queue":"batch","jobs":[{"argv":["x"]},{}]}`)
	add(401, tokA, 5, "", runReq)
	add(202, tokOperator, 6, "$U", "")
	add(404, tokOperator, 6, "run_01M8XNMPKC26KCW2AJE19QW19M", "")
	add(400, tokOperator, 6, "$R", "")
	add(401, tokNone, 6, "$U", "")
	add(202, tokOperator, 7, "$U", `{"failed":true}`)
	add(400, tokOperator, 7, "$U", `{"failed":false}`)
	add(400, tokOperator, 7, "$U", `{}`)
	add(404, tokOperator, 7, "run_01M8XNMPKC26KCW2AJE19QW19M", `{"failed":true}`)
	add(401, tokA, 7, "$U", `{"failed":true}`)
	f.Fuzz(func(t *testing.T, tok, route uint8, id string, body []byte) {
		path := strings.Replace(fuzzOperatorPosts[int(route)%len(fuzzOperatorPosts)], "{id}", url.PathEscape(id), 1)
		s.check(t, fuzzExchange(t, tok, http.MethodPost, path, body), tok, route, id, body)
	})
}

// fuzzGets are GET targets (after /v1/) the fixture answers 200.
var fuzzGets = []string{
	"invocations", "invocations?limit=1", "invocations?limit=500&queue=default",
	"invocations?queue=default&state=queued&limit=2", "invocations?state=succeeded",
	"invocations?cursor=$N", "invocations?limit=2&cursor=$N",
	"invocations/$R", "invocations/$D", "invocations/$X", "invocations/$K",
	"invocations/$R/logs", "invocations/$R/logs?attempt=1&after=0&limit=2", "invocations/$Q/logs",
	"workers", "workers?limit=1&cursor=$M", "workers?cursor=$M", "workers?state=stale", "workers?state=active&label=x",
	"workers/$A", "workers/$B", "workers/$C",
	"workers/$A/setup-results", "workers/$B/setup-results",
	"queues/default", "queues/gpu", "queues/nothing-here", "healthz", "hosts",
	"runs", "runs?queue=batch", "runs/$U", "runs/$U/results", "runs/$U/results?records=true&from=1&limit=1",
	"invocations/$R/artifacts", "invocations/$D/artifacts", "runs/$U/artifacts",
}

// FuzzOperatorGet fuzzes every GET route: the input is the path and query
// after /v1/, placeholders allowed.
func FuzzOperatorGet(f *testing.F) {
	s := newFuzzSeeds(f)
	add := func(want int, tok uint8, target string) { s.add(want, tok, target) }
	for _, target := range fuzzGets {
		add(200, tokOperator, target)
	}
	add(400, tokOperator, "invocations?limit=0")
	add(400, tokOperator, "invocations?limit=abc")
	add(400, tokOperator, "invocations?state=QUEUED")
	add(400, tokOperator, "invocations?queue=a%23b")
	add(400, tokOperator, "invocations?cursor=abc")
	add(400, tokOperator, "invocations?cursor=eyJub3N1Y2giOiJrZXkifQ")
	add(400, tokOperator, "invocations?queue=gpu&cursor=$N") // a cursor of another listing
	add(400, tokOperator, "workers?cursor=$N")
	add(400, tokOperator, "workers?limit=501")
	add(400, tokOperator, "workers?state=asleep")
	add(400, tokOperator, "invocations/nope")
	add(400, tokOperator, "invocations/$A")
	add(400, tokOperator, "workers/$R")
	add(400, tokOperator, "workers/$R/setup-results")
	add(400, tokOperator, "queues/a%23b")
	add(400, tokOperator, "queues/..%2e")
	add(404, tokOperator, "invocations/"+fuzzNoInv)
	add(404, tokOperator, "workers/"+fuzzNoWorker)
	add(404, tokOperator, "workers/"+fuzzNoWorker+"/setup-results")
	add(404, tokOperator, "nope")
	add(404, tokOperator, "invocations/$R/extra")
	add(400, tokOperator, "invocations/$R/logs?attempt=x")
	add(400, tokOperator, "invocations/$R/logs?limit=65")
	add(400, tokOperator, "invocations/$R/logs?after=-1")
	add(404, tokOperator, "invocations/$R/logs?attempt=5")
	add(404, tokOperator, "invocations/"+fuzzNoInv+"/logs")
	add(404, tokOperator, "invocations/"+fuzzNoInv+"/artifacts")
	add(400, tokOperator, "invocations/$A/artifacts")
	add(400, tokOperator, "runs/$R/artifacts")
	add(401, tokA, "invocations/$R/artifacts")
	add(401, tokNone, "runs/$U/artifacts")
	add(405, tokOperator, "daemon/poll")
	add(405, tokOperator, "invocations/$R/cancel")
	add(401, tokNone, "invocations")
	add(401, tokA, "workers/$A")
	add(401, tokEnroll, "queues/default")
	add(200, tokNone, "healthz")
	f.Fuzz(func(t *testing.T, tok uint8, target string) {
		s.check(t, fuzzExchange(t, tok, http.MethodGet, "/v1/"+target, nil), tok, target)
	})
}

// TestFuzzTargetsCoverRoutes: every route of api.Routes() is the target of
// some seed that the fixture answers 2xx, so fuzzing starts from an input
// that gets through each handler.
func TestFuzzTargetsCoverRoutes(t *testing.T) {
	mux := http.NewServeMux()
	for _, r := range api.Routes() {
		mux.HandleFunc(r, func(http.ResponseWriter, *http.Request) {})
	}
	reached := map[string]bool{}
	reach := func(method, path string) {
		req := httptest.NewRequest(method, path, nil)
		if _, pattern := mux.Handler(req); pattern != "" {
			reached[pattern] = true
		}
	}
	for _, p := range []string{pathHello, pathPoll, pathAck, pathBye, pathLogs, pathArtifacts, pathArtifactComplete} {
		reach("POST", p)
	}
	for _, p := range fuzzOperatorPosts {
		reach("POST", strings.Replace(p, "{id}", "$R", 1))
	}
	for _, p := range fuzzGets {
		reach("GET", "/v1/"+p)
	}
	for _, r := range api.Routes() {
		if !reached[r] {
			t.Errorf("no fuzz target reaches %s", r)
		}
	}
}
