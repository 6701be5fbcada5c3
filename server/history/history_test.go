package history_test

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/dreamlake/lakeshore/server/api"
	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/server/api/daemonapi"
	"github.com/dreamlake/lakeshore/server/blobs"
	"github.com/dreamlake/lakeshore/server/blobs/blobstest"
	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/hoststatus"
	"github.com/dreamlake/lakeshore/server/provision"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/schema"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/server/ui/uitest"
	"github.com/dreamlake/lakeshore/server/wake"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/ids"
	"github.com/dreamlake/lakeshore/shared/wire"
)

func TestMain(m *testing.M) { storetest.Main(m) }

// history is how much a plane has behind it.
type history struct {
	terminal int // terminal invocations: half jobs of the live run, half plain
	gone     int // reaped gone workers, as many expired sessions and sockets
	runs     int // finished runs besides the live one
}

// small is the short history. It fills every page a path reads (100 rows,
// the operator lists' default), so a path whose cost follows its page reads
// as much here as on the long one, and only a path that reads history
// grows.
var small = history{terminal: 200, gone: 10, runs: 120}

// big is the long history: 100,000 terminal invocations with
// LAKESHORE_HISTORY_FULL set, 10,000 otherwise (the default run, under
// -race, stays within a minute).
func big() history {
	if os.Getenv("LAKESHORE_HISTORY_FULL") != "" {
		return history{terminal: 100_000, gone: 10_000, runs: 10_000}
	}
	return history{terminal: 10_000, gone: 10_000, runs: 2_000}
}

const queue = "default"

// start is the planes' clock: the history happened before it.
var start = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// plane is a control plane over an embedded store whose requests (by
// operation) and items read (by operation) are counted.
type plane struct {
	t        *testing.T
	st       *store.Store
	svc      *control.Service
	clock    *clock.Fake
	requests *storetest.Counter // calls: a retried attempt is the network's, not the path's
	attempts *storetest.Counter // HTTP attempts, retries included (logged)
	items    *storetest.Counter
	url      string
	operator *client.Client
	daemon   *client.Client
	runID    string
	// live workers by name, with their tokens.
	workers map[string]liveWorker
	// artifactJob is a terminal job of the live run with an artifact.
	artifactJob string
	session     uitest.Session
	poster      *wakeCounter
}

type liveWorker struct{ id, token string }

// wakeCounter takes every wake, posts nothing and counts the wakes of the
// live socket: the wake's reads are what is measured, and that it still
// finds the live socket.
type wakeCounter struct{ live atomic.Int32 }

func (p *wakeCounter) Wake(_ context.Context, id, _ string) error {
	if id == liveSocket {
		p.live.Add(1)
	}
	return nil
}

func (*wakeCounter) CloseConnection(context.Context, string) error { return nil }

// liveSocket is the connection id of the live fleet's one wake socket.
const liveSocket = "live-socket"

func newPlane(t *testing.T, h history) *plane {
	t.Helper()
	ctx := t.Context()
	endpoint := storetest.EmbeddedEndpoint(t)
	db := storetest.Client(endpoint)
	prefix := storetest.Prefix(t)
	if err := schema.EnsureTables(ctx, db, prefix); err != nil {
		t.Fatalf("create tables: %v", err)
	}
	p := &plane{t: t, clock: clock.NewFake(start), requests: &storetest.Counter{}, attempts: &storetest.Counter{}, items: &storetest.Counter{}, workers: map[string]liveWorker{}, poster: &wakeCounter{}}
	counting := dynamodb.New(db.Options(), storetest.CountCalls(p.requests), storetest.CountRequests(p.attempts), storetest.CountItemsRead(p.items))
	p.st = store.New(counting, prefix)
	p.st.Clock = p.clock.Clock()
	p.st.IDs = &ids.Generator{Clock: p.st.Clock}
	p.st.Shuffle = func(int, func(i, j int)) {} // the same candidates on every plane
	p.seed(ctx, db, h)

	p.svc = control.New(control.Config{Store: p.st, Clock: p.st.Clock, Blobs: blobs.UseCases{Store: blobstest.New(t)},
		WakeURL: "ws://127.0.0.1:1/wake", Poster: p.poster, Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	srv, err := api.New(api.Config{Sessions: p.st, Config: daemonapi.Config{Control: p.svc, EnrollToken: apitest.EnrollToken,
		OperatorToken: apitest.OperatorToken, Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))}})
	if err != nil {
		t.Fatalf("build the plane: %v", err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	p.url = hs.URL
	p.operator = client.New(hs.URL, apitest.OperatorToken)
	p.daemon = client.New(hs.URL, apitest.EnrollToken)
	p.live(ctx)
	return p
}

// seed writes history h straight into the tables, encoded as the store
// encodes them: terminal invocations (half of them jobs of the live run
// the live work also belongs to, half plain, all in the live work's
// queue), finished runs, reaped gone workers, expired web sessions and
// expired wake sockets.
func (p *plane) seed(ctx context.Context, db *dynamodb.Client, h history) {
	t := p.t
	past := start.Add(-48 * time.Hour)
	gen := &ids.Generator{Clock: clock.NewFake(past.Add(-time.Hour)).Clock()}
	tables := p.st.Tables()
	must := func(item map[string]types.AttributeValue, err error) map[string]types.AttributeValue {
		t.Helper()
		if err != nil {
			t.Fatalf("encode: %v", err)
		}
		return item
	}
	runJobs := h.terminal / 2
	p.runID = gen.New(ids.Run)
	live := domain.Run{ID: p.runID, Queue: queue, Total: runJobs + liveJobs, Submitted: true, CreatedAt: past,
		Counts: domain.RunCounts{Done: runJobs, Succeeded: runJobs}}
	runs := []map[string]types.AttributeValue{must(p.st.RunItem(live))}
	for range h.runs {
		r := domain.Run{ID: gen.New(ids.Run), Queue: queue, Total: 1, Submitted: true, CreatedAt: past,
			Counts: domain.RunCounts{Done: 1, Succeeded: 1}}
		runs = append(runs, must(p.st.RunItem(r)))
	}
	var invs []map[string]types.AttributeValue
	zero := 0
	for i := range h.terminal {
		id := gen.New(ids.Invocation)
		inv := domain.Invocation{ID: id, Queue: queue, State: domain.StateSucceeded, Attempt: 1, MaxAttempts: 3,
			Argv: []string{"true"}, ExitCode: &zero, CreatedAt: past, StartedAt: past, FinishedAt: past.Add(time.Minute),
			Attempts: []domain.Attempt{{Attempt: 1, WorkerID: "wrk_gone", ClaimedAt: past, EndedAt: past.Add(time.Minute),
				Outcome: "succeeded", Recorded: true, Artifacts: []domain.Artifact{{Name: "out.txt", Size: 1, CreatedAt: past}}}}}
		if i < runJobs {
			var err error
			if inv.ID, err = ids.Child(ids.Invocation, p.runID, i); err != nil {
				t.Fatal(err)
			}
			inv.RunID, inv.RunIndex = p.runID, i
			p.artifactJob = inv.ID
		}
		invs = append(invs, must(p.st.InvocationItem(inv)))
	}
	for i := range liveJobs {
		n := runJobs + i
		id, err := ids.Child(ids.Invocation, p.runID, n)
		if err != nil {
			t.Fatal(err)
		}
		inv := domain.Invocation{ID: id, Queue: queue, State: domain.StateQueued, MaxAttempts: 3, Argv: []string{"true"},
			CreatedAt: start.Add(-time.Minute), RunID: p.runID, RunIndex: n}
		invs = append(invs, must(p.st.InvocationItem(inv)))
	}
	var workers, sessions, sockets []map[string]types.AttributeValue
	gone := start.Add(-72 * time.Hour)
	for i := range h.gone {
		w := domain.Worker{ID: gen.New(ids.Worker), MachineID: fmt.Sprintf("machine-gone-%d", i), BootID: "boot", Lanes: []string{queue},
			MaxConcurrency: 1, State: domain.WorkerGone, Phase: domain.PhaseTerminating, GoneKind: domain.EndGone, GoneWhy: "bye",
			CreatedAt: gone.Add(-time.Hour), LastSeenAt: gone, GoneAt: gone, Reaped: true}
		workers = append(workers, must(p.st.WorkerItem(w)))
		sessions = append(sessions, map[string]types.AttributeValue{
			"idempotency_key":   &types.AttributeValueMemberS{Value: "uisession#expired-" + strconv.Itoa(i)},
			"token_fingerprint": &types.AttributeValueMemberS{Value: "old"},
			"created_at":        unix(gone.Add(-12 * time.Hour)), "last_seen_at": unix(gone), "expires_at": unix(gone),
		})
		sockets = append(sockets, map[string]types.AttributeValue{
			"wake_key":      &types.AttributeValueMemberS{Value: wake.Key(queue, "")},
			"connection_id": &types.AttributeValueMemberS{Value: "gone-" + strconv.Itoa(i)},
			"worker_id":     &types.AttributeValueMemberS{Value: w.ID},
			"expires_at":    unix(gone),
		})
	}
	for _, s := range []struct {
		table string
		items []map[string]types.AttributeValue
	}{{tables.Queues, runs}, {tables.Invocations, invs}, {tables.Workers, workers}, {tables.Idempotency, sessions}, {tables.Connections, sockets}} {
		if err := storetest.BatchPut(ctx, db, s.table, s.items); err != nil {
			t.Fatalf("seed: %v", err)
		}
	}
	if err := p.st.NoteQueue(ctx, queue); err != nil {
		t.Fatalf("note queue: %v", err)
	}
}

// liveJobs is how many jobs of the live run are queued when the plane
// starts.
const liveJobs = 4

func unix(t time.Time) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(t.Unix(), 10)}
}

// live brings up the live fleet through the API: three workers, one of
// them running a job, a socket listening on the queue, and a web session.
func (p *plane) live(ctx context.Context) {
	t := p.t
	for _, name := range []string{"a", "b", "c"} {
		p.workers[name] = p.hello(ctx, "machine-"+name)
	}
	if got := p.poll(ctx, "a", true); len(got.Commands) != 1 || got.Commands[0].Type != wire.CommandRun {
		t.Fatalf("worker a's first poll claimed %+v, want one run", got.Commands)
	}
	if err := p.st.PutConnection(ctx, store.Connection{ID: liveSocket, WorkerID: p.workers["b"].id,
		Keys: []string{wake.Key(queue, "")}, ConnectedAt: start, ExpiresAt: start.Add(2 * time.Hour)}); err != nil {
		t.Fatalf("put connection: %v", err)
	}
	p.session = uitest.Login(t, p.url, apitest.OperatorToken)
}

func (p *plane) hello(ctx context.Context, machine string) liveWorker {
	one := 1
	res, err := p.daemon.Hello(ctx, wire.HelloRequest{MachineID: machine, BootID: "boot-1", Lanes: []string{queue},
		Capabilities: wire.Capabilities{MaxConcurrency: &one}})
	if err != nil {
		p.t.Fatalf("hello %s: %v", machine, err)
	}
	return liveWorker{id: res.WorkerID, token: res.Token}
}

// poll polls as worker name, ready, holding nothing (claim: with a free
// slot) or the one it runs.
func (p *plane) poll(ctx context.Context, name string, claim bool) wire.PollResponse {
	w := p.workers[name]
	held := 0
	if !claim {
		held = 1
	}
	res, err := p.daemon.WithToken(w.token).Poll(ctx, wire.PollRequest{WorkerID: w.id, Queue: queue, Phase: wire.PhaseReady,
		UpdatedCapabilities: &wire.Capabilities{CurrentInvocations: &held}, Invocations: []string{}})
	if err != nil {
		p.t.Fatalf("poll as %s: %v", name, err)
	}
	return res
}

// path is one hot path, called once.
type path struct {
	name string
	call func(ctx context.Context, p *plane) error
}

// cost is what one call of a path cost: requests and items read, by
// operation.
type cost struct{ requests, items map[string]int }

func (c cost) String() string {
	var parts []string
	for _, op := range slices.Sorted(maps.Keys(c.requests)) {
		parts = append(parts, fmt.Sprintf("%s %d/%d", op, c.requests[op], c.items[op]))
	}
	return strings.Join(parts, ", ")
}

// paths are the hot paths, in the order a plane runs them (each leaves
// the plane as the next expects).
var paths = []path{
	{"hello", func(ctx context.Context, p *plane) error {
		one := 1
		_, err := p.daemon.Hello(ctx, wire.HelloRequest{MachineID: "machine-new", BootID: "boot-1", Lanes: []string{queue},
			Capabilities: wire.Capabilities{MaxConcurrency: &one}})
		return err
	}},
	{"poll (holding, no claim)", func(ctx context.Context, p *plane) error {
		w := p.workers["a"]
		one := 1
		_, err := p.daemon.WithToken(w.token).Poll(ctx, wire.PollRequest{WorkerID: w.id, Queue: queue, Phase: wire.PhaseReady,
			UpdatedCapabilities: &wire.Capabilities{CurrentInvocations: &one}})
		return err
	}},
	{"poll that claims", func(ctx context.Context, p *plane) error {
		res := p.poll(ctx, "b", true)
		if len(res.Commands) != 1 || res.Commands[0].Invocation == nil {
			return fmt.Errorf("claimed %+v, want one run", res.Commands)
		}
		p.workers["b:held"] = liveWorker{id: res.Commands[0].Invocation.InvocationID, token: strconv.Itoa(res.Commands[0].Invocation.Attempt)}
		return nil
	}},
	{"ack", func(ctx context.Context, p *plane) error {
		w, held := p.workers["b"], p.workers["b:held"]
		attempt, _ := strconv.Atoi(held.token)
		zero := 0
		_, err := p.daemon.WithToken(w.token).Ack(ctx, wire.AckRequest{WorkerID: w.id, InvocationID: held.id, Attempt: attempt,
			State: wire.StateSucceeded, ExitCode: &zero})
		return err
	}},
	{"submit (and its wake)", func(ctx context.Context, p *plane) error {
		before := p.poster.live.Load()
		if _, _, err := p.operator.Submit(ctx, wire.SubmitRequest{Queue: queue, Argv: []string{"true"}}); err != nil {
			return err
		}
		if p.poster.live.Load() == before {
			return fmt.Errorf("the submit's wake did not reach the live socket")
		}
		return nil
	}},
	{"bye", func(ctx context.Context, p *plane) error {
		w := p.workers["c"]
		return p.daemon.WithToken(w.token).Bye(ctx, wire.ByeRequest{WorkerID: w.id, Reason: wire.ByeIdle})
	}},
	{"sweep", func(ctx context.Context, p *plane) error {
		_, err := p.svc.Sweep(ctx)
		return err
	}},
	{"host poller", func(ctx context.Context, p *plane) error {
		_, err := (&hoststatus.Poller{Store: p.st, Control: p.svc}).Poll(ctx)
		return err
	}},
	{"provisioner pass", func(ctx context.Context, p *plane) error {
		_, err := provision.New(provision.Config{Store: p.st, EC2: &fakeEC2{}, LaunchTemplate: "lt-history",
			Limits: domain.ProvisionLimits{MaxHosts: 2}, Clock: p.st.Clock}).Pass(ctx)
		return err
	}},
	{"fleet page", func(ctx context.Context, p *plane) error {
		return p.page("/ui/")
	}},
	{"fleet refresh", func(ctx context.Context, p *plane) error {
		return p.page("/ui/live")
	}},
	{"fleet refresh, filtered by queue and state", func(ctx context.Context, p *plane) error {
		return p.page("/ui/live?state=succeeded&queue=" + queue)
	}},
	{"fleet refresh, by the first characters of an id", func(ctx context.Context, p *plane) error {
		return p.page("/ui/live?id=inv_0")
	}},
	{"fleet refresh, an older page and back", func(ctx context.Context, p *plane) error {
		il, err := p.operator.ListInvocations(ctx, client.ListInvocationsParams{Order: wire.OrderNewest, Limit: 50})
		if err != nil || il.NextCursor == "" || il.PrevCursor == "" {
			return fmt.Errorf("a page of 50 newest: cursors %q %q, %v", il.NextCursor, il.PrevCursor, err)
		}
		if err := p.page("/ui/live?after=" + il.NextCursor); err != nil {
			return err
		}
		return p.page("/ui/live?before=" + il.PrevCursor)
	}},
	{"queue stats", func(ctx context.Context, p *plane) error {
		_, err := p.operator.QueueStats(ctx, queue)
		return err
	}},
	{"run status", func(ctx context.Context, p *plane) error {
		_, err := p.operator.Run(ctx, p.runID)
		return err
	}},
	{"runs list", func(ctx context.Context, p *plane) error {
		_, err := p.operator.RunsPage(ctx, client.RunsParams{})
		return err
	}},
	{"runs list of a queue", func(ctx context.Context, p *plane) error {
		_, err := p.operator.RunsPage(ctx, client.RunsParams{Queue: queue})
		return err
	}},
	{"ls invocations", func(ctx context.Context, p *plane) error {
		_, err := p.operator.ListInvocations(ctx, client.ListInvocationsParams{})
		return err
	}},
	{"ls invocations --state queued", func(ctx context.Context, p *plane) error {
		_, err := p.operator.ListInvocations(ctx, client.ListInvocationsParams{State: wire.StateQueued})
		return err
	}},
	{"ls invocations --queue", func(ctx context.Context, p *plane) error {
		_, err := p.operator.ListInvocations(ctx, client.ListInvocationsParams{Queue: queue})
		return err
	}},
	{"ls workers", func(ctx context.Context, p *plane) error {
		_, err := p.operator.ListWorkers(ctx, 0, "")
		return err
	}},
	{"invocation artifacts", func(ctx context.Context, p *plane) error {
		_, err := p.operator.InvocationArtifacts(ctx, p.artifactJob)
		return err
	}},
	{"run artifacts", func(ctx context.Context, p *plane) error {
		_, err := p.operator.RunArtifactsPage(ctx, p.runID, 0, 0)
		return err
	}},
}

// fakeEC2 knows one launch template and launches whatever it is asked.
type fakeEC2 struct{ launched int }

func (f *fakeEC2) RunInstances(_ context.Context, in *ec2.RunInstancesInput, _ ...func(*ec2.Options)) (*ec2.RunInstancesOutput, error) {
	out := &ec2.RunInstancesOutput{}
	for range aws.ToInt32(in.MinCount) {
		f.launched++
		out.Instances = append(out.Instances, ec2types.Instance{InstanceId: aws.String(fmt.Sprintf("i-%017d", f.launched))})
	}
	return out, nil
}

func (f *fakeEC2) DescribeLaunchTemplates(context.Context, *ec2.DescribeLaunchTemplatesInput, ...func(*ec2.Options)) (*ec2.DescribeLaunchTemplatesOutput, error) {
	return &ec2.DescribeLaunchTemplatesOutput{LaunchTemplates: []ec2types.LaunchTemplate{{LaunchTemplateName: aws.String("lt-history")}}}, nil
}

func (f *fakeEC2) DescribeLaunchTemplateVersions(context.Context, *ec2.DescribeLaunchTemplateVersionsInput, ...func(*ec2.Options)) (*ec2.DescribeLaunchTemplateVersionsOutput, error) {
	return &ec2.DescribeLaunchTemplateVersionsOutput{LaunchTemplateVersions: []ec2types.LaunchTemplateVersion{{
		LaunchTemplateData: &ec2types.ResponseLaunchTemplateData{}}}}, nil
}

func (f *fakeEC2) TerminateInstances(context.Context, *ec2.TerminateInstancesInput, ...func(*ec2.Options)) (*ec2.TerminateInstancesOutput, error) {
	return &ec2.TerminateInstancesOutput{}, nil
}

func (f *fakeEC2) DescribeInstances(context.Context, *ec2.DescribeInstancesInput, ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error) {
	return &ec2.DescribeInstancesOutput{}, nil
}

// page loads a page of the web view with the plane's session.
func (p *plane) page(path string) error {
	resp, body := uitest.Do(p.t, p.url, p.session.Cookie, "GET", path, nil)
	if resp.StatusCode != 200 {
		return fmt.Errorf("GET %s: %d %s", path, resp.StatusCode, body)
	}
	return nil
}

// measure runs every path once on a plane with history h, and reports
// what each cost.
func measure(t *testing.T, h history) map[string]cost {
	began := time.Now()
	p := newPlane(t, h)
	t.Logf("history %+v ready in %s", h, time.Since(began).Round(time.Millisecond))
	ctx := t.Context()
	out := map[string]cost{}
	for _, pa := range paths {
		p.requests.Reset()
		p.attempts.Reset()
		p.items.Reset()
		if err := pa.call(ctx, p); err != nil {
			t.Fatalf("%s: %v", pa.name, err)
		}
		if retried := p.attempts.Total() - p.requests.Total(); retried > 0 {
			t.Logf("%s: the SDK retried %d of its requests (not counted against it)", pa.name, retried)
		}
		out[pa.name] = cost{requests: p.requests.Snapshot(), items: p.items.Snapshot()}
	}
	return out
}

// TestHotPathsIndependentOfHistory runs every hot path once on a plane
// with a short history and once on one with a long history, and fails for
// each whose DynamoDB requests or items read (by operation) grow.
func TestHotPathsIndependentOfHistory(t *testing.T) {
	short, long := measure(t, small), measure(t, big())
	for _, pa := range paths {
		s, l := short[pa.name], long[pa.name]
		t.Logf("%-32s short: %s | long: %s", pa.name, s, l)
		for _, op := range slices.Sorted(maps.Keys(l.requests)) {
			if l.requests[op] > s.requests[op] {
				t.Errorf("%s: %d %s requests with the long history, %d with the short", pa.name, l.requests[op], op, s.requests[op])
			}
			if l.items[op] > s.items[op] {
				t.Errorf("%s: %s read %d items with the long history, %d with the short", pa.name, op, l.items[op], s.items[op])
			}
		}
	}
}
