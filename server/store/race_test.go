package store_test

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// raceBackends are the engines on which a conditional write is atomic, as
// it is on DynamoDB: the embedded store (the handler serves one request at
// a time) and a single-threaded moto.
//
// The shared moto_server is deliberately absent. It serves each request on
// its own thread (werkzeug, threaded=True) and moto's DynamoDB backend
// takes no locks: a conditional put evaluates its condition and then writes
// the item as separate Python steps, and the interpreter may switch threads
// between them. Two racing claims can then both see version 1 and both
// write version 2, and two pollers would both "win" one invocation. The
// window is narrow (a few hundred racing claims on it showed no double claim
// while these tests were written), so a pass there would prove nothing and a
// rare failure there would be the emulator's, not the store's.
var raceBackends = []backend{
	{name: "embedded", client: storetest.Embedded},
	{name: "moto-single", client: func(t testing.TB) *dynamodb.Client {
		return storetest.Client(storetest.MotoSingleThreaded(t))
	}},
}

// maxClaimPasses bounds every poller's loop: a poller that cannot finish in
// this many claims is a failure, never a hang.
const maxClaimPasses = 1000

// poller is one worker claiming concurrently with others, recording what it
// got. Pollers only report errors; the test goroutine fails the test.
type poller struct {
	s         *store.Store // the store it claims through (nil: the fixture's)
	w         domain.Worker
	max       int
	claimed   []domain.Invocation
	conflicts int
	passes    int
	err       error
}

// run claims up to p.max at a time until a claim pass finds the queue empty
// (nothing claimed and no race lost: the claim index had no candidates) or,
// with once, until it holds something.
func (p *poller) run(f *fixture, once bool) {
	s := cmp.Or(p.s, f.s)
	for p.passes < maxClaimPasses {
		p.passes++
		res, err := s.Claim(f.ctx, p.w, "q", p.max)
		if err != nil {
			p.err = err
			return
		}
		p.claimed = append(p.claimed, res.Claimed...)
		p.conflicts += res.Conflicts
		if (once && len(p.claimed) > 0) || (len(res.Claimed) == 0 && res.Conflicts == 0) {
			return
		}
	}
	p.err = fmt.Errorf("worker %s: queue not drained after %d claim passes", p.w.ID, maxClaimPasses)
}

// startPollers says hello as n workers concurrently, then lets them all
// claim at once (a channel, not a sleep, lines them up) and waits for them.
func startPollers(t *testing.T, f *fixture, n int, maxFor func(i int) int, once bool) []*poller {
	t.Helper()
	return startPollersOn(t, f, nil, n, maxFor, once)
}

// startPollersOn is startPollers with poller i claiming through
// stores[i%len(stores)] (none: the fixture's store).
func startPollersOn(t *testing.T, f *fixture, stores []*store.Store, n int, maxFor func(i int) int, once bool) []*poller {
	t.Helper()
	ps := make([]*poller, n)
	var hellos, done sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		p := &poller{max: maxFor(i)}
		if len(stores) > 0 {
			p.s = stores[i%len(stores)]
		}
		ps[i] = p
		hellos.Add(1)
		done.Go(func() {
			req := helloReq(fmt.Sprintf("machine-%02d", i), "boot-1")
			req.Capabilities.MaxConcurrency = &p.max
			res, err := f.svc.Register(f.ctx, req.Registration(), f.issue)
			if err == nil {
				p.w, err = f.svc.Heartbeat(f.ctx, wire.PollRequest{WorkerID: res.Worker.ID, Phase: wire.PhaseReady}.Poll(), nil)
			}
			hellos.Done()
			if err != nil {
				p.err = err
				return
			}
			<-start
			p.run(f, once)
		})
	}
	hellos.Wait()
	close(start)
	done.Wait()
	for _, p := range ps {
		if p.err != nil {
			t.Fatalf("poller: %v", p.err)
		}
	}
	return ps
}

// checkClaims requires that the pollers between them claimed exactly want,
// each once, as attempt 1, and that the table agrees.
func checkClaims(t *testing.T, f *fixture, ps []*poller, want []domain.Invocation) {
	t.Helper()
	holder := map[string]string{}
	conflicts := 0
	for _, p := range ps {
		conflicts += p.conflicts
		for _, inv := range p.claimed {
			if prev, dup := holder[inv.ID]; dup {
				t.Fatalf("%s claimed twice: by %s and by %s", inv.ID, prev, p.w.ID)
			}
			holder[inv.ID] = p.w.ID
			if inv.Attempt != 1 || inv.WorkerID != p.w.ID {
				t.Fatalf("%s claimed as attempt %d by %s (poller %s)", inv.ID, inv.Attempt, inv.WorkerID, p.w.ID)
			}
		}
	}
	if len(holder) != len(want) {
		t.Fatalf("%d invocations claimed, want %d", len(holder), len(want))
	}
	for _, inv := range want {
		got := f.get(inv.ID)
		if got.State != domain.StateRunning || got.Attempt != 1 || got.WorkerID != holder[inv.ID] || len(got.Attempts) != 1 {
			t.Fatalf("%s stored as %s attempt %d by %s (%d attempts), claimed by %s",
				inv.ID, got.State, got.Attempt, got.WorkerID, len(got.Attempts), holder[inv.ID])
		}
	}
	f.wantStats("q", map[domain.InvocationState]int{domain.StateRunning: len(want)}, 0)
	t.Logf("%d pollers claimed %d invocations with %d lost races", len(ps), len(want), conflicts)
}

// TestRaceFiftyPollersOneInvocation: of 50 workers polling at once for one
// queued invocation, exactly one gets it.
func TestRaceFiftyPollersOneInvocation(t *testing.T) {
	for _, b := range raceBackends {
		t.Run(b.name, func(t *testing.T) {
			f := newFixture(t, b, b.client(t))
			inv := f.submit(submitReq())
			ps := startPollers(t, f, 50, func(int) int { return 1 }, true)
			checkClaims(t, f, ps, []domain.Invocation{inv})
		})
	}
}

// TestRaceEveryInvocationClaimedOnce: 20 workers of capacity 1 to 4 drain
// 200 queued invocations; each is claimed exactly once.
func TestRaceEveryInvocationClaimedOnce(t *testing.T) {
	for _, b := range raceBackends {
		t.Run(b.name, func(t *testing.T) {
			f := newFixture(t, b, b.client(t))
			invs := f.submitN("q", 200)
			ps := startPollers(t, f, 20, func(i int) int { return i%4 + 1 }, false)
			checkClaims(t, f, ps, invs)
			// The holder index agrees with the claims.
			total := 0
			for _, p := range ps {
				held := f.held(p.w.ID)
				slices.Sort(held)
				if mine := sortedIDs(p.claimed); !slices.Equal(held, mine) {
					t.Fatalf("Held(%s) = %v, claimed %v", p.w.ID, held, mine)
				}
				total += len(held)
			}
			if total != len(invs) {
				t.Fatalf("holder index holds %d, want %d", total, len(invs))
			}
		})
	}
}

// TestRaceManyStoresClaimOnce: deployed, every Lambda instance has its own
// store and claim pool, so pollers of different instances read the same
// candidates and race on the claim's conditional put alone. Five stores,
// each with its own SDK client over one embedded server, and 20 pollers
// spread over them drain 200 invocations; each is claimed exactly once,
// at attempt 1, by the worker the table names, and the holder index adds
// up.
func TestRaceManyStoresClaimOnce(t *testing.T) {
	endpoint := storetest.EmbeddedEndpoint(t)
	f := newFixture(t, raceBackends[0], storetest.Client(endpoint))
	stores := make([]*store.Store, 5)
	for i := range stores {
		s := store.New(storetest.Client(endpoint), f.prefix)
		s.Clock = f.clock.Clock()
		stores[i] = s
	}
	invs := f.submitN("q", 200)
	ps := startPollersOn(t, f, stores, 20, func(i int) int { return i%4 + 1 }, false)
	checkClaims(t, f, ps, invs)
	total := 0
	for _, p := range ps {
		total += len(f.held(p.w.ID))
	}
	if total != len(invs) {
		t.Fatalf("holder index holds %d, want %d", total, len(invs))
	}
}

// TestRaceRetriedHellosOneWorker: a daemon's hello retried concurrently
// (same machine and boot) lands on one worker row.
func TestRaceRetriedHellosOneWorker(t *testing.T) {
	for _, b := range raceBackends {
		t.Run(b.name, func(t *testing.T) {
			f := newFixture(t, b, b.client(t))
			const n = 6
			got := make([]string, n)
			errs := make([]error, n)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					<-start
					res, err := f.svc.Register(f.ctx, helloReq("m1", "boot-1").Registration(), f.issue)
					got[i], errs[i] = res.Worker.ID, err
				})
			}
			close(start)
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("Hello: %v", err)
			}
			for _, id := range got {
				if id != got[0] {
					t.Fatalf("concurrent retried hellos made workers %v", got)
				}
			}
			ws, _, err := f.s.ListWorkers(f.ctx, 100, "")
			if err != nil || len(ws) != 1 {
				t.Fatalf("ListWorkers = %d rows, %v; want 1", len(ws), err)
			}
		})
	}
}

// TestRaceLateAndCurrentAcks: for each of 20 redelivered invocations, the
// lost worker (attempt 1) and the new one (attempt 2) ack at once. Exactly
// one outcome is recorded per invocation and done_count moves once each.
func TestRaceLateAndCurrentAcks(t *testing.T) {
	for _, b := range raceBackends {
		t.Run(b.name, func(t *testing.T) {
			f := newFixture(t, b, b.client(t))
			const n = 20
			invs := f.submitN("q", n)
			a, bw := f.worker("m-a", ""), f.worker("m-b", "")
			if res := f.claim(a, "q", n); len(res.Claimed) != n {
				t.Fatalf("a claimed %d, want %d", len(res.Claimed), n)
			}
			if got, err := f.svc.HandBack(f.ctx, a.ID, domain.Loss{Kind: domain.EndStale}); err != nil || got != n {
				t.Fatalf("HandBack = %d, %v", got, err)
			}
			if res := f.claim(bw, "q", n); len(res.Claimed) != n {
				t.Fatalf("b claimed %d, want %d", len(res.Claimed), n)
			}

			type outcome struct {
				resp store.AckResult
				err  error
			}
			results := make([][2]outcome, n)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i, inv := range invs {
				for j, w := range []domain.Worker{a, bw} {
					state := []domain.InvocationState{domain.StateSucceeded, domain.StateFailed}[j]
					wg.Go(func() {
						<-start
						resp, err := f.ackAs(f.hash(w.ID), ackReq(w, inv, j+1, state))
						results[i][j] = outcome{resp, err}
					})
				}
			}
			close(start)
			wg.Wait()
			for i, r := range results {
				if r[0].err != nil || r[1].err != nil {
					t.Fatalf("%s: acks failed: %v / %v", invs[i].ID, r[0].err, r[1].err)
				}
				if r[0].resp.Recorded == r[1].resp.Recorded {
					t.Fatalf("%s: recorded %v and %v, want exactly one", invs[i].ID, r[0].resp.Recorded, r[1].resp.Recorded)
				}
				winner := r[0].resp.State
				if r[1].resp.Recorded {
					winner = r[1].resp.State
				}
				if got := f.get(invs[i].ID); got.State != winner || r[0].resp.State != winner || r[1].resp.State != winner {
					t.Fatalf("%s: stored %s, acks answered %s and %s", invs[i].ID, got.State, r[0].resp.State, r[1].resp.State)
				}
			}
			if st := f.stats("q"); st.DoneCount != n || st.Counts[domain.StateSucceeded]+st.Counts[domain.StateFailed] != n {
				t.Fatalf("stats %+v, want done_count %d", st, n)
			}
		})
	}
}

// TestRaceReaperAndAck: the reaper hands back the last attempt of each of
// 20 invocations (max_attempts 1: it fails them, worker_lost) while their
// worker acks them. Each ends in exactly one terminal state, counted once.
func TestRaceReaperAndAck(t *testing.T) {
	for _, b := range raceBackends {
		t.Run(b.name, func(t *testing.T) {
			f := newFixture(t, b, b.client(t))
			const n = 20
			var invs []domain.Invocation
			for i := range n {
				req := submitReq("job", fmt.Sprint(i))
				req.MaxAttempts = 1
				invs = append(invs, f.submit(req))
			}
			w := f.worker("m-a", "")
			if res := f.claim(w, "q", n); len(res.Claimed) != n {
				t.Fatalf("claimed %d, want %d", len(res.Claimed), n)
			}
			acks := make([]store.AckResult, n)
			requeued := make([]domain.Invocation, n)
			errs := make([]error, 2*n)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i, inv := range invs {
				wg.Go(func() {
					<-start
					acks[i], errs[2*i] = f.ackAs(f.hash(w.ID), ackReq(w, inv, 1, domain.StateSucceeded))
				})
				wg.Go(func() {
					<-start
					requeued[i], _, errs[2*i+1] = f.s.Requeue(f.ctx, inv.ID, w.ID, domain.Loss{Kind: domain.EndStale, Why: "stale"})
				})
			}
			close(start)
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("ack or requeue failed: %v", err)
			}
			succeeded, failed := 0, 0
			for i, inv := range invs {
				got := f.get(inv.ID)
				switch {
				case acks[i].Recorded && got.State == domain.StateSucceeded:
					succeeded++
				case !acks[i].Recorded && got.State == domain.StateFailed && got.Error != nil && got.Error.Type == wire.ErrorTypeWorkerLost:
					failed++
				default:
					t.Fatalf("%s: ack %+v, requeue answered %s, stored %s", inv.ID, acks[i], requeued[i].State, got.State)
				}
			}
			f.wantStats("q", nonZero(map[domain.InvocationState]int{domain.StateSucceeded: succeeded, domain.StateFailed: failed}), n)
			t.Logf("%d acks won, %d reaper failures won", succeeded, failed)
		})
	}
}

// nonZero drops the zero counts of m.
func nonZero(m map[domain.InvocationState]int) map[domain.InvocationState]int {
	for k, v := range m {
		if v == 0 {
			delete(m, k)
		}
	}
	return m
}
