package control_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/auth"
	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/server/wake"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/hostkey"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// recordingPoster is a wake channel whose sockets are a set of ids: a post
// to one of them is recorded, a post to any other is "gone".
type recordingPoster struct {
	mu     sync.Mutex
	open   map[string]bool
	posts  []post
	closed []string
}

type post struct {
	id  string
	msg wire.WakeMessage
}

func (p *recordingPoster) Wake(_ context.Context, id, queue string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.open[id] {
		return fmt.Errorf("post to %s: %w", id, control.ErrConnectionGone)
	}
	var m wire.WakeMessage
	if err := json.Unmarshal(wire.WakeFor(queue), &m); err != nil {
		return err
	}
	p.posts = append(p.posts, post{id, m})
	return nil
}

func (p *recordingPoster) CloseConnection(_ context.Context, id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.open[id] {
		return fmt.Errorf("close %s: %w", id, control.ErrConnectionGone)
	}
	p.open[id] = false
	p.closed = append(p.closed, id)
	return nil
}

func (p *recordingPoster) take() []post {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.posts
	p.posts = nil
	return out
}

// wakeChannelFixture is the use cases over the embedded store with a wake
// channel (a recordingPoster) and no long polls, as on Lambda.
type wakeChannelFixture struct {
	ctx    context.Context
	st     *store.Store
	clock  *clock.Fake
	svc    *control.Service
	hub    *wake.Hub
	poster *recordingPoster
	// sleeping hears each held poll that has looked for work, found none,
	// and waits (its re-check never fires: it waits until woken).
	sleeping <-chan struct{}
}

func newWakeChannelFixture(t *testing.T) wakeChannelFixture {
	t.Helper()
	p := &recordingPoster{open: map[string]bool{}}
	f := newWakeChannelFixtureWith(t, p)
	f.poster = p
	return f
}

// newWakeChannelFixtureWith is the fixture posting through p.
func newWakeChannelFixtureWith(t *testing.T, p control.Poster) wakeChannelFixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	st, c := storetest.Store(t)
	hub := &wake.Hub{}
	sleeping := make(chan struct{}, 16)
	sleep := func(ctx context.Context, d time.Duration) error {
		select {
		case sleeping <- struct{}{}:
		default:
		}
		return blockSleep(ctx, d)
	}
	svc := control.New(control.Config{Store: st, Sleep: sleep, Wake: hub, Clock: st.Clock,
		WakeURL: "wss://wake.example/wake", Poster: p, Logger: slog.New(slog.DiscardHandler),
		Rand: rand.New(rand.NewPCG(1, 2))})
	return wakeChannelFixture{ctx: ctx, st: st, clock: c, svc: svc, hub: hub, sleeping: sleeping}
}

// worker says hello for machine on queue q (host key hk) and returns its
// id and token.
func (f wakeChannelFixture) worker(t *testing.T, machine, hk string) (id, token string) {
	t.Helper()
	resp, err := f.svc.Hello(f.ctx, wire.HelloRequest{MachineID: machine, BootID: "b", Lanes: []string{"q"}, HostKey: hk}.Registration(),
		func(workerID string) (string, error) {
			tok, hash, err := auth.NewWorkerToken(workerID)
			token = tok
			return hash, err
		})
	if err != nil {
		t.Fatal(err)
	}
	if resp.WakeURL != "wss://wake.example/wake" || resp.LongPoll || resp.WakeInterval.Seconds() != 20 {
		t.Fatalf("hello = %+v; want the wake channel with a 20 s idle poll and no long polls", resp)
	}
	return resp.Worker.ID, token
}

// connect opens socket id for token.
func (f wakeChannelFixture) connect(t *testing.T, id, token string) {
	t.Helper()
	if _, err := f.svc.Connect(f.ctx, id, token, ""); err != nil {
		t.Fatalf("connect %s: %v", id, err)
	}
	if f.poster != nil {
		f.poster.mu.Lock()
		f.poster.open[id] = true
		f.poster.mu.Unlock()
	}
}

func (f wakeChannelFixture) submit(t *testing.T, queue string) {
	t.Helper()
	if _, _, err := f.svc.Submit(f.ctx, wire.SubmitRequest{Queue: queue, Argv: []string{"true"}}.Spec()); err != nil {
		t.Fatal(err)
	}
}

// TestConnectChecksTheWorkerToken: only a live worker's own token opens a
// socket; a wrong secret, a made-up worker and a gone worker are refused,
// and nothing is recorded for them.
func TestConnectChecksTheWorkerToken(t *testing.T) {
	f := newWakeChannelFixture(t)
	id, token := f.worker(t, "m1", "")
	other, _ := f.worker(t, "m2", "")
	// The worker's own id with another secret: the token names a worker
	// that exists (a token carries the id without its "wrk_" prefix).
	wrongSecret := "wtk_" + strings.TrimPrefix(id, "wrk_") + "_wrong"
	if owner, ok := auth.WorkerOf(wrongSecret); !ok || owner != id {
		t.Fatalf("the wrong-secret token names %q, want %s", owner, id)
	}
	// A gone worker's socket is refused too (TestConnectRefusesAGoneWorker).
	for _, tc := range []struct {
		name, token string
		want        error
	}{
		{"no token", "", wire.ErrUnauthorized},
		{"not a worker token", "enroll-token", wire.ErrUnauthorized},
		{"wrong secret", wrongSecret, wire.ErrUnauthorized},
		{"no such worker", "wtk_wrk_01NOSUCHWORKER0000000000000_x", wire.ErrUnauthorized},
	} {
		if _, err := f.svc.Connect(f.ctx, "c-"+tc.name, tc.token, ""); !errors.Is(err, tc.want) {
			t.Errorf("%s: connect = %v, want %v", tc.name, err, tc.want)
		}
	}
	// A wrong secret and an unknown worker read alike, as on the HTTP
	// daemon routes: the channel is no oracle of which workers exist.
	_, wrong := f.svc.Connect(f.ctx, "c-a", wrongSecret, "")
	_, unknown := f.svc.Connect(f.ctx, "c-b", "wtk_wrk_01NOSUCHWORKER0000000000000_x", "")
	if wrong == nil || unknown == nil || wrong.Error() != unknown.Error() || wrong.Error() != store.ErrWorkerToken.Error() {
		t.Errorf("wrong secret = %v, unknown worker = %v; want both %v", wrong, unknown, store.ErrWorkerToken)
	}
	if _, err := f.svc.Bye(f.ctx, wire.ByeRequest{WorkerID: other, Reason: wire.ByeSignal}.Bye(), nil); err != nil {
		t.Fatal(err)
	}
	if conns, err := f.st.Connections(f.ctx, wake.Key("q", "")); err != nil || len(conns) != 0 {
		t.Fatalf("refused sockets were recorded: %+v %v", conns, err)
	}
	w, err := f.svc.Connect(f.ctx, "c-ok", token, "")
	if err != nil || w.ID != id {
		t.Fatalf("connect with the worker's token = %+v, %v", w, err)
	}
}

// TestConnectRefusesAGoneWorker: a worker that said bye cannot open a
// socket (410: say hello again).
func TestConnectRefusesAGoneWorker(t *testing.T) {
	f := newWakeChannelFixture(t)
	id, token := f.worker(t, "m1", "")
	if _, err := f.svc.Bye(f.ctx, wire.ByeRequest{WorkerID: id, Reason: wire.ByeSignal}.Bye(), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.Connect(f.ctx, "c1", token, ""); !errors.Is(err, wire.ErrWorkerGone) {
		t.Fatalf("connect of a gone worker = %v, want 410", err)
	}
}

// TestSubmitWakesAFewSockets: a submit posts "wake" to two of the sockets
// that listen on its queue, not to all of them, and a submit to a queue
// nobody serves posts nothing.
func TestSubmitWakesAFewSockets(t *testing.T) {
	f := newWakeChannelFixture(t)
	var sockets []string
	for i := range 5 {
		_, tok := f.worker(t, fmt.Sprintf("m%d", i), "")
		id := fmt.Sprintf("c%d", i)
		f.connect(t, id, tok)
		sockets = append(sockets, id)
	}
	f.submit(t, "q")
	posts := f.poster.take()
	if len(posts) != 2 || posts[0].id == posts[1].id {
		t.Fatalf("one submit posted %+v; want two different sockets", posts)
	}
	for _, p := range posts {
		if !slices.Contains(sockets, p.id) || p.msg != (wire.WakeMessage{Type: wire.WakeTypeWake, Queue: "q"}) {
			t.Errorf("post %+v: want a wake for queue q to one of %v", p, sockets)
		}
	}
	f.submit(t, "other")
	if posts := f.poster.take(); len(posts) != 0 {
		t.Fatalf("a submit to a queue nobody serves posted %+v", posts)
	}
}

// TestKeyedWorkWakesOnlyItsKeysWorkers: work with a host key wakes the
// workers that advertise that key, never generic ones (they cannot claim
// it, and a wake spent on them leaves the keyed worker to its slow idle
// poll).
func TestKeyedWorkWakesOnlyItsKeysWorkers(t *testing.T) {
	f := newWakeChannelFixture(t)
	setup := []string{"echo keyed"}
	for i := range 4 {
		_, tok := f.worker(t, fmt.Sprintf("m-generic-%d", i), "")
		f.connect(t, fmt.Sprintf("generic-%d", i), tok)
	}
	_, keyedTok := f.worker(t, "m-keyed", hostkey.Of(setup))
	f.connect(t, "keyed", keyedTok)
	for i := range 10 {
		if _, _, err := f.svc.Submit(f.ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"true"}, RunConfig: wire.RunConfig{HostSetup: setup}}.Spec()); err != nil {
			t.Fatal(err)
		}
		want := []post{{"keyed", wire.WakeMessage{Type: wire.WakeTypeWake, Queue: "q"}}}
		if posts := f.poster.take(); !slices.Equal(posts, want) {
			t.Fatalf("keyed submit %d posted %+v; want %+v (the keyed worker's socket only)", i, posts, want)
		}
	}
}

// TestWakeSkipsAClosedSocket: a socket the channel reports gone is
// forgotten, and the wake goes on to the next one instead.
func TestWakeSkipsAClosedSocket(t *testing.T) {
	f := newWakeChannelFixture(t)
	_, t1 := f.worker(t, "m1", "")
	_, t2 := f.worker(t, "m2", "")
	f.connect(t, "c1", t1)
	f.connect(t, "c2", t2)
	f.poster.mu.Lock()
	f.poster.open["c2"] = false // closed without a $disconnect
	f.poster.mu.Unlock()
	f.submit(t, "q") // wants two sockets: it tries both, whatever the order
	posts := f.poster.take()
	if len(posts) != 1 || posts[0].id != "c1" {
		t.Fatalf("posted %+v; want c1 only (c2 is gone)", posts)
	}
	conns, err := f.st.Connections(f.ctx, wake.Key("q", ""))
	if err != nil {
		t.Fatal(err)
	}
	if len(conns) != 1 || conns[0].ID != "c1" {
		t.Fatalf("recorded sockets %+v; want only c1 (the gone c2 forgotten)", conns)
	}
}

// TestHeldPollTakesTheWakeFirst: where this process holds a poll that can
// claim the work, the hub wakes it and no socket is posted to.
func TestHeldPollTakesTheWakeFirst(t *testing.T) {
	f := newWakeChannelFixture(t)
	id, _ := f.worker(t, "m1", "")
	_, tok2 := f.worker(t, "m2", "")
	f.connect(t, "c2", tok2)
	done := make(chan []domain.Command, 1)
	go func() {
		resp, err := f.svc.Poll(f.ctx, wire.PollRequest{WorkerID: id, Queue: "q", Phase: wire.PhaseReady, Invocations: []string{}, TimeoutS: 15}.Poll(), nil)
		if err != nil {
			t.Error(err)
		}
		done <- resp
	}()
	// Submitted once the poll has looked and waits: a submit that lands
	// before its look is claimed by the look, not by the wake, and then
	// the submit's wake finds no held poll and goes to a socket.
	select {
	case <-f.sleeping:
	case <-done:
		t.Fatal("the poll answered before anything was submitted")
	case <-f.ctx.Done():
		t.Fatal("the poll never waited")
	}
	f.submit(t, "q")
	if cmds := <-done; len(cmds) != 1 || cmds[0].Type != wire.CommandRun {
		t.Fatalf("the held poll answered %+v; want the run", cmds)
	}
	if posts := f.poster.take(); len(posts) != 0 {
		t.Fatalf("the held poll took the work, yet sockets were woken: %+v", posts)
	}
}

// TestWorkerNewsReachesItsSocket: a drain or a setup command for an idle
// worker is posted to that worker's socket (a wake with no queue), so it
// polls now rather than at its slow idle interval; other sockets hear
// nothing.
func TestWorkerNewsReachesItsSocket(t *testing.T) {
	f := newWakeChannelFixture(t)
	id, tok := f.worker(t, "m1", "")
	_, tok2 := f.worker(t, "m2", "")
	f.connect(t, "mine", tok)
	f.connect(t, "theirs", tok2)
	if _, err := f.svc.AddSetup(f.ctx, id, []string{"true"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.Drain(f.ctx, id); err != nil {
		t.Fatal(err)
	}
	want := []post{{"mine", wire.WakeMessage{Type: wire.WakeTypeWake}}, {"mine", wire.WakeMessage{Type: wire.WakeTypeWake}}}
	if posts := f.poster.take(); !slices.Equal(posts, want) {
		t.Fatalf("posted %+v; want %+v", posts, want)
	}
}

// TestDisconnectForgetsTheSocket: after $disconnect the socket is woken no
// more, and a second $disconnect is a no-op.
func TestDisconnectForgetsTheSocket(t *testing.T) {
	f := newWakeChannelFixture(t)
	_, tok := f.worker(t, "m1", "hk1")
	f.connect(t, "c1", tok)
	for _, k := range []string{wake.Key("q", ""), wake.Key("q", "hk1")} {
		if conns, err := f.st.Connections(f.ctx, k); err != nil || len(conns) != 1 {
			t.Fatalf("socket under %s: %+v %v; want it", k, conns, err)
		}
	}
	for range 2 {
		if err := f.svc.Disconnect(f.ctx, "c1"); err != nil {
			t.Fatal(err)
		}
	}
	f.submit(t, "q")
	if posts := f.poster.take(); len(posts) != 0 {
		t.Fatalf("a disconnected socket was woken: %+v", posts)
	}
	for _, k := range []string{wake.Key("q", ""), wake.Key("q", "hk1")} {
		if conns, err := f.st.Connections(f.ctx, k); err != nil || len(conns) != 0 {
			t.Fatalf("socket under %s after disconnect: %+v %v", k, conns, err)
		}
	}
}

// failingPoster answers every post with an error that is not "gone".
type failingPoster struct {
	mu    sync.Mutex
	posts int
}

func (p *failingPoster) Wake(context.Context, string, string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.posts++
	return errors.New("management API unavailable")
}

func (p *failingPoster) CloseConnection(context.Context, string) error {
	return errors.New("management API unavailable")
}

// TestFailingWakeChannelIsSkipped: when posting fails, the channel is left
// alone for a while, so a hand-back of many invocations does not wait on it
// for each; the submits themselves succeed.
func TestFailingWakeChannelIsSkipped(t *testing.T) {
	p := &failingPoster{}
	f := newWakeChannelFixtureWith(t, p)
	_, token := f.worker(t, "m1", "")
	f.connect(t, "c1", token)
	for range 5 {
		f.submit(t, "q") // with the channel down, each submit still succeeds
	}
	if p.posts != 1 {
		t.Fatalf("%d posts to a failing channel over 5 submits; want 1, then a pause", p.posts)
	}
}

// socketIDs lists the ids of the sockets listening on wake key k, sorted.
func (f wakeChannelFixture) socketIDs(t *testing.T, k string) []string {
	t.Helper()
	conns, err := f.st.Connections(f.ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range conns {
		ids = append(ids, c.ID)
	}
	slices.Sort(ids)
	return ids
}

// TestOneWorkerCannotStarveAnother: a worker that opens 400 sockets keeps
// only the 4 newest (the older ones closed and forgotten as newer ones
// replace them), and a wake picks among workers, not sockets, so the
// worker with one socket hears every submit to the queue both serve.
func TestOneWorkerCannotStarveAnother(t *testing.T) {
	f := newWakeChannelFixture(t)
	hostile, hostileTok := f.worker(t, "m-hostile", "")
	_, honestTok := f.worker(t, "m-honest", "")
	var hostileSockets []string
	for i := range 400 {
		id := fmt.Sprintf("h%03d", i)
		f.connect(t, id, hostileTok)
		hostileSockets = append(hostileSockets, id)
		f.clock.Advance(time.Millisecond)
	}
	f.connect(t, "honest", honestTok)
	newest := hostileSockets[len(hostileSockets)-4:]
	if got := f.socketIDs(t, wake.WorkerKey(hostile)); !slices.Equal(got, newest) {
		t.Fatalf("the hostile worker keeps %d sockets; want its 4 newest %v", len(got), newest)
	}
	if got, want := f.socketIDs(t, wake.Key("q", "")), append(slices.Clone(newest), "honest"); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Fatalf("the queue's listeners are %v; want %v", got, want)
	}
	f.poster.mu.Lock()
	closed := slices.Sorted(slices.Values(f.poster.closed))
	f.poster.mu.Unlock()
	if !slices.Equal(closed, hostileSockets[:396]) {
		t.Fatalf("closed %d sockets; want the 396 oldest of the hostile worker's", len(closed))
	}
	for i := range 100 {
		f.submit(t, "q")
		posts := f.poster.take()
		if !slices.ContainsFunc(posts, func(p post) bool { return p.id == "honest" }) {
			t.Fatalf("submit %d woke %+v, not the honest worker's socket", i, posts)
		}
		if len(posts) > 5 {
			t.Fatalf("submit %d posted to %d sockets; want at most two workers' (5 sockets)", i, len(posts))
		}
	}
}

// TestEachSocketPastTheCapReplacesTheOldest: a worker keeps at most 4
// sockets after every connect, not only after some: the 5th closes and
// forgets the oldest, the 6th the next.
func TestEachSocketPastTheCapReplacesTheOldest(t *testing.T) {
	f := newWakeChannelFixture(t)
	id, tok := f.worker(t, "m1", "")
	var sockets []string
	for i := range 6 {
		sockets = append(sockets, fmt.Sprintf("c%d", i))
		f.connect(t, sockets[i], tok)
		f.clock.Advance(time.Millisecond)
		kept := sockets[max(0, len(sockets)-4):]
		if got := f.socketIDs(t, wake.WorkerKey(id)); !slices.Equal(got, kept) {
			t.Fatalf("after %d connects the worker keeps %v; want the 4 newest %v", i+1, got, kept)
		}
		f.poster.mu.Lock()
		closed := slices.Clone(f.poster.closed)
		f.poster.mu.Unlock()
		if want := sockets[:len(sockets)-len(kept)]; !slices.Equal(closed, want) {
			t.Fatalf("after %d connects closed %v; want %v", i+1, closed, want)
		}
	}
}

// TestSocketCapHoldsUnderConcurrentConnects: sockets of one worker that
// connect all at once still end within the cap. (Fewer may remain: two
// that connect at once may each replace the other. nymph holds one or two
// sockets, never enough to be replaced.)
func TestSocketCapHoldsUnderConcurrentConnects(t *testing.T) {
	f := newWakeChannelFixture(t)
	id, tok := f.worker(t, "m1", "")
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range 100 {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if _, err := f.svc.Connect(f.ctx, fmt.Sprintf("c%03d", i), tok, ""); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if got := f.socketIDs(t, wake.WorkerKey(id)); len(got) > 4 {
		t.Fatalf("after 100 concurrent connects the worker keeps %d sockets; want at most 4", len(got))
	}
}
