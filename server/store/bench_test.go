package store_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/schema"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/hostkey"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// benchStore is a store on fresh tables of a new embedded server, whose
// requests are counted.
func benchStore(b testing.TB) (*store.Store, *storetest.Counter) {
	return benchStoreOver(b, func(db, _ store.DB, _ string) store.DB { return db })
}

// benchStoreOver is benchStore with its counted client wrapped by wrap
// (given also the client it was copied from, which is not counted, and the
// table prefix).
func benchStoreOver(b testing.TB, wrap func(db, plain store.DB, prefix string) store.DB) (*store.Store, *storetest.Counter) {
	b.Helper()
	ctx := context.Background()
	plain := storetest.Embedded(b)
	prefix := storetest.Prefix(b)
	if err := schema.EnsureTables(ctx, plain, prefix); err != nil {
		b.Fatalf("EnsureTables: %v", err)
	}
	counter := &storetest.Counter{}
	return store.New(wrap(storetest.CountingClient(plain, counter), plain, prefix), prefix), counter
}

func benchIssue(string) (string, error) { return "bench-hash", nil }

// benchWorker says hello as machine and polls once as ready.
func benchWorker(b testing.TB, s *store.Store, machine, hostKey string) domain.Worker {
	b.Helper()
	ctx := context.Background()
	req := helloReq(machine, "boot-1")
	req.HostKey = hostKey
	svc := storetest.Control(s)
	res, err := svc.Register(ctx, req.Registration(), benchIssue)
	if err != nil {
		b.Fatalf("Hello: %v", err)
	}
	w, err := svc.Heartbeat(ctx, wire.PollRequest{WorkerID: res.Worker.ID, Phase: wire.PhaseReady}.Poll(), nil)
	if err != nil {
		b.Fatalf("Heartbeat: %v", err)
	}
	return w
}

// claimKnobs are the Store fields a claim benchmark may set, and the shape
// of its queue.
type claimKnobs struct {
	window    int  // Store.ClaimWindow; 0 keeps the default
	noShuffle bool // Store.Shuffle a no-op: every poller tries the head first
	// backlog is how many invocations stay queued after the b.N claimed:
	// 0 drains the queue (its tail, where pollers outnumber the work left,
	// included); a deep backlog measures a busy queue's steady state.
	backlog int
	// processes is how many stores (each its own claim pool, as each
	// Lambda instance or control plane process has) the pollers are spread
	// over; 0: one, shared by all pollers (`lakeshore dev`).
	processes int
	// noPool turns the claim pool off (Store.ClaimPoolTTL 0): every claim
	// reads the index, as before the pool.
	noPool bool
	// shards is Store.ClaimShards; partitionRate, when set, limits each
	// claim index partition to that many writes a second
	// (storetest.PartitionLimited), as AWS does at about 1,000.
	shards        int
	partitionRate float64
	// head keeps separate processes reading the head of the claim index
	// until they lose a race (Store.SpreadClaims off), as `lakeshore dev`
	// does; by default they spread from the start, as Lambda instances do.
	head bool
}

// benchClaim pre-submits b.N (+ backlog) invocations, then lets pollers
// workers claim them concurrently, one at a time each (a worker of capacity
// 1), until b.N are claimed (without a backlog: until the queue is empty);
// claims/s is over the time until the b.N-th claim landed.
// It reports claims per second, the lost conditional writes per claim
// (ClaimResult.Conflicts) and the DynamoDB requests per claim.
func benchClaim(b *testing.B, pollers int, knobs claimKnobs) {
	ctx := context.Background()
	var limited *storetest.PartitionLimited
	s, counter := benchStoreOver(b, func(db, _ store.DB, prefix string) store.DB {
		if knobs.partitionRate == 0 {
			return db
		}
		limited = &storetest.PartitionLimited{DB: db, Table: store.NamesFor(prefix).Invocations, Attr: "claim_key", Rate: knobs.partitionRate}
		return limited
	})
	s.ClaimShards = knobs.shards
	svc := storetest.Control(s)
	if knobs.window > 0 {
		s.ClaimWindow = knobs.window
	}
	if knobs.noShuffle {
		s.Shuffle = func(int, func(i, j int)) {}
	}
	if knobs.noPool {
		s.ClaimPoolTTL = 0
	}
	// Each process is a store of its own over the same tables.
	s.SpreadClaims = knobs.processes > 1 && !knobs.head
	procs := []*store.Store{s}
	for range knobs.processes - 1 {
		p := store.New(s.DB(), prefixOf(s))
		p.ClaimWindow, p.Shuffle, p.ClaimPoolTTL, p.ClaimShards = s.ClaimWindow, s.Shuffle, s.ClaimPoolTTL, s.ClaimShards
		p.SpreadClaims = s.SpreadClaims
		procs = append(procs, p)
	}
	submitJobs(b, svc, b.N+knobs.backlog)
	workers := make([]domain.Worker, pollers)
	for i := range workers {
		workers[i] = benchWorker(b, s, fmt.Sprintf("machine-%02d", i), "")
	}
	counter.Reset()
	if limited != nil {
		limited.Limit(true)
	}

	var mu sync.Mutex
	var claimed, conflicts int
	var firstErr error
	var lastClaim time.Time // when the b.N-th claim landed: the clock stops there
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, w := range workers {
		s := procs[i%len(procs)]
		wg.Go(func() {
			<-start
			for range b.N + maxClaimPasses {
				res, err := s.Claim(ctx, w, "q", 1)
				mu.Lock()
				claimed += len(res.Claimed)
				conflicts += res.Conflicts
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if claimed >= b.N && lastClaim.IsZero() {
					lastClaim = time.Now()
				}
				enough := claimed >= b.N
				mu.Unlock()
				if err != nil || enough {
					return
				}
				if len(res.Claimed) == 0 {
					// What the index holds is being claimed by other
					// pollers: until all b.N are claimed, look again
					// later, as a held poll re-checks on its backoff
					// (control.claim, 100 ms at first).
					time.Sleep(100 * time.Millisecond)
				}
			}
		})
	}
	b.ResetTimer()
	began := time.Now()
	close(start)
	wg.Wait()
	b.StopTimer()
	elapsed := lastClaim.Sub(began)

	if firstErr != nil {
		b.Fatalf("Claim: %v", firstErr)
	}
	if claimed < b.N || (knobs.backlog == 0 && claimed != b.N) {
		b.Fatalf("claimed %d of %d", claimed, b.N)
	}
	b.ReportMetric(float64(claimed)/elapsed.Seconds(), "claims/s")
	b.ReportMetric(float64(conflicts)/float64(claimed), "conflicts/claim")
	b.ReportMetric(float64(counter.Total())/float64(claimed), "requests/claim")
}

// BenchmarkClaim drains a queue with 1, 10 and 50 concurrent pollers on the
// embedded store, with the store's default knobs. Target: at most 0.5
// conflicts per claim at 50 pollers.
func BenchmarkClaim(b *testing.B) {
	for _, n := range []int{1, 10, 50} {
		b.Run(fmt.Sprintf("pollers=%d", n), func(b *testing.B) { benchClaim(b, n, claimKnobs{}) })
	}
	// The same 50 pollers spread over 50 processes (Lambda instances),
	// each with its own claim pool, reading from random points of the
	// queue (Store.SpreadClaims): draining the queue, and in a deep queue
	// (a run of thousands of jobs); then reading its head as one process
	// does, until each loses a race; and in one process with no pool.
	// Target: at most 0.1 conflicts per claim, at least 500 claims/s in
	// the deep queue.
	b.Run("pollers=50/processes=50", func(b *testing.B) { benchClaim(b, 50, claimKnobs{processes: 50}) })
	b.Run("pollers=50/processes=50/backlog=4000", func(b *testing.B) {
		benchClaim(b, 50, claimKnobs{processes: 50, backlog: 4000})
	})
	b.Run("pollers=50/processes=50/head", func(b *testing.B) { benchClaim(b, 50, claimKnobs{processes: 50, head: true}) })
	// Shards spread those processes' racers over several partitions.
	b.Run("pollers=50/processes=50/shards=4", func(b *testing.B) { benchClaim(b, 50, claimKnobs{processes: 50, shards: 4}) })
	b.Run("pollers=50/nopool", func(b *testing.B) { benchClaim(b, 50, claimKnobs{noPool: true}) })
}

// BenchmarkClaimShards drains a queue whose claim index partitions each
// take 25 writes a second (a fortieth of AWS's, so the embedded store is
// not what limits first), with 50 pollers in one process, for 1 to 8 claim
// shards. Claims/s grows with the shards until the store itself is the
// limit. A poller that finds nothing it may take looks again 100 ms later,
// so requests/claim counts those empty polls too.
func BenchmarkClaimShards(b *testing.B) {
	for _, n := range []int{1, 2, 4, 8} {
		b.Run(fmt.Sprintf("shards=%d", n), func(b *testing.B) {
			benchClaim(b, 50, claimKnobs{shards: n, partitionRate: 25})
		})
	}
}

// prefixOf is the table prefix s was made with.
func prefixOf(s *store.Store) string {
	return strings.TrimSuffix(s.Tables().Workers, store.WorkersSuffix)
}

// BenchmarkClaimKnobs shows how Store.ClaimWindow and Store.Shuffle change
// contention at 50 pollers.
func BenchmarkClaimKnobs(b *testing.B) {
	cases := []struct {
		name  string
		knobs claimKnobs
	}{
		{"pollers=50/drain/window=8", claimKnobs{window: 8}},
		{"pollers=50/drain/window=128", claimKnobs{window: 128}},
		{"pollers=50/drain/window=32/noshuffle", claimKnobs{window: 32, noShuffle: true}},
		{"pollers=50/backlog=1000/window=32", claimKnobs{window: 32, backlog: 1000}},
		{"pollers=50/backlog=1000/window=128", claimKnobs{window: 128, backlog: 1000}},
		{"pollers=50/backlog=1000/window=256", claimKnobs{window: 256, backlog: 1000}},
		// A busy queue's steady state across 50 processes (Lambda
		// instances), where the pool is off after the first lost race.
		{"pollers=50/processes=50/backlog=1000", claimKnobs{processes: 50, backlog: 1000}},
		{"pollers=50/processes=50/backlog=1000/window=256", claimKnobs{processes: 50, backlog: 1000, window: 256}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) { benchClaim(b, 50, c.knobs) })
	}
}

// benchMeteredStore is benchStore whose requests are also billed in
// DynamoDB request units (storetest.Meter).
func benchMeteredStore(b testing.TB) (*store.Store, *storetest.Counter, *storetest.Meter) {
	var meter *storetest.Meter
	s, counter := benchStoreOver(b, func(db, plain store.DB, prefix string) store.DB {
		m, err := storetest.NewMeter(db, plain, prefix)
		if err != nil {
			b.Fatal(err)
		}
		meter = m
		return m
	})
	return s, counter, meter
}

// lifecycleRunJobs is the size of the run the run-job case submits.
const lifecycleRunJobs = 10

// BenchmarkLifecycle measures one invocation's life on one worker: submit,
// claim, ack (hello and polls excluded), in DynamoDB requests (target: at
// most 5) and in the write and read request units DynamoDB bills for them
// (wru/lifecycle, rru/lifecycle; storetest.Meter), in all and per table and
// index (wru:invocations.claim/lifecycle is the claim index of the
// invocations table). The run-job case is one job of a run of 10, its
// share of the run's own writes included; the retry case fails its first
// attempt under a retry policy, is released by the sweep (ReleaseRetries,
// whose query is counted in full) and succeeds on its second; the
// output-tails case acks with full output tails. Every case acks through
// another store (process) than the one that claimed, as on Lambda, where
// the ack function never claims, except ack-in-process, which acks as
// `lakeshore dev` does: through the store that claimed.
func BenchmarkLifecycle(b *testing.B) {
	setup := []string{"install the toolchain"}
	cases := []struct {
		name           string
		workerHostKey  string
		submitHostKey  bool
		idempotencyKey bool
		run            bool
		retry          bool
		tails          bool // the ack carries full output tails (wire.MaxTailBytes each)
		ackInProcess   bool // the ack reaches the process that claimed (lakeshore dev)
	}{
		{name: "plain"},
		{name: "idempotency-key", idempotencyKey: true},
		{name: "host-key-work", workerHostKey: hostkey.Of(setup), submitHostKey: true},
		// A worker with a host key polls its key's partition first; when
		// that is empty, claiming any-host work costs one more query.
		{name: "host-key-worker-plain-work", workerHostKey: hostkey.Of(setup)},
		{name: "run-job", run: true},
		{name: "retry", retry: true},
		// A body that printed more than its tails hold: the ack stores
		// 4 KiB of stdout and of stderr, so the item it writes is over 8 KB.
		{name: "output-tails", tails: true},
		// In `lakeshore dev` the store that claimed acks: it reads nothing,
		// and checks the token inside its transaction instead.
		{name: "ack-in-process", ackInProcess: true},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			s, counter, meter := benchMeteredStore(b)
			fake := clock.NewFake(time.Now())
			s.Clock = fake.Clock()
			svc := storetest.Control(s)
			w := benchWorker(b, s, "machine-1", c.workerHostKey)
			acker := svc
			if !c.ackInProcess {
				other := store.New(s.DB(), prefixOf(s))
				other.Clock = s.Clock
				acker = storetest.Control(other)
			}
			// claimAck claims one invocation (want's, when want is set) and
			// acks its attempt with state.
			claimAck := func(want string, attempt int, state domain.InvocationState) {
				res, err := s.Claim(ctx, w, "q", 1)
				if err != nil || len(res.Claimed) != 1 || (want != "" && res.Claimed[0].ID != want) {
					b.Fatalf("Claim = %v, %v; want %s", invIDs(res.Claimed), err, want)
				}
				ack := ackReq(w, res.Claimed[0], attempt, state)
				if c.tails {
					ack.StdoutTail = strings.Repeat("o", wire.MaxTailBytes)
					ack.StderrTail = strings.Repeat("e", wire.MaxTailBytes)
				}
				if state == domain.StateFailed {
					ack.Error = &wire.ErrorInfo{Type: wire.ErrorTypeExitCode, Message: "exit status 1"}
				}
				resp, err := acker.Ack(ctx, ack.Outcome(), authorizeHash("bench-hash"))
				if err != nil || !resp.Recorded {
					b.Fatalf("Ack = %+v, %v", resp, err)
				}
			}
			counter.Reset()
			meter.Reset()
			lives := 0
			b.ResetTimer()
			for i := range b.N {
				if c.run {
					if _, _, err := svc.SubmitRun(ctx, matrixRun("q", lifecycleRunJobs).RunSpec()); err != nil {
						b.Fatalf("SubmitRun: %v", err)
					}
					for range lifecycleRunJobs {
						claimAck("", 1, domain.StateSucceeded)
					}
					lives += lifecycleRunJobs
					continue
				}
				req := submitReq("job", fmt.Sprint(i))
				if c.submitHostKey {
					req.RunConfig.HostSetup = setup
				}
				if c.idempotencyKey {
					req.IdempotencyKey = fmt.Sprintf("key-%d", i)
				}
				if c.retry {
					req.Retry = &wire.RetryPolicy{ExitCodes: []int{1}}
				}
				inv, _, err := svc.Submit(ctx, req.Spec())
				if err != nil {
					b.Fatalf("Submit: %v", err)
				}
				if c.retry {
					claimAck(inv.ID, 1, domain.StateFailed)
					fake.Advance(time.Hour) // past the backoff
					if released, err := s.ReleaseRetries(ctx); err != nil || len(released) != 1 {
						b.Fatalf("ReleaseRetries = %d, %v", len(released), err)
					}
					claimAck(inv.ID, 2, domain.StateSucceeded)
				} else {
					claimAck(inv.ID, 1, domain.StateSucceeded)
				}
				lives++
			}
			b.StopTimer()
			reportLifecycle(b, counter, meter, lives)
		})
	}
}

// reportLifecycle reports the requests and units counted over lives
// invocations' lives, per life.
func reportLifecycle(b *testing.B, counter *storetest.Counter, meter *storetest.Meter, lives int) {
	per := func(n float64) float64 { return n / float64(lives) }
	b.ReportMetric(per(float64(counter.Total())), "requests/lifecycle")
	snap := counter.Snapshot()
	for _, op := range slices.Sorted(maps.Keys(snap)) {
		b.ReportMetric(per(float64(snap[op])), op+"/lifecycle")
	}
	total := meter.Total()
	b.ReportMetric(per(total.Write), "wru/lifecycle")
	b.ReportMetric(per(total.Read), "rru/lifecycle")
	units := meter.Snapshot()
	for _, name := range slices.Sorted(maps.Keys(units)) {
		metric := strings.ReplaceAll(name, "/", ".")
		if u := units[name]; u.Write > 0 {
			b.ReportMetric(per(u.Write), "wru:"+metric+"/lifecycle")
		}
		if u := units[name]; u.Read > 0 {
			b.ReportMetric(per(u.Read), "rru:"+metric+"/lifecycle")
		}
	}
}
