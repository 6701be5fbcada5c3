package rie_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/rie"
	"github.com/dreamlake/lakeshore/shared/syncbuf"
)

// BenchmarkPoolInvoke measures what the emulator adds to one invocation of
// a warm emulator: the round trip of an event the function answers at
// once (its own work is a JSON echo, microseconds).
func BenchmarkPoolInvoke(b *testing.B) {
	p, _ := testPoolWith(b, func(fn *rie.Function) { fn.MaxConcurrency = 1 })
	ctx := context.Background()
	if _, err := p.Invoke(ctx, []byte(`{}`)); err != nil { // the cold start
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := p.Invoke(ctx, []byte(`{}`)); err != nil {
			b.Fatal(err)
		}
	}
}

// testPool builds testdata/fn as a static bootstrap and returns a pool of it
// under the real emulator (skipped without it, failed under CI=true).
func testPool(t *testing.T, max int) (*rie.Pool, *syncbuf.Buffer) {
	t.Helper()
	return testPoolWith(t, func(fn *rie.Function) { fn.MaxConcurrency = max })
}

// testPoolWith is testPool with the function's settings changed by set.
func testPoolWith(t testing.TB, set func(*rie.Function)) (*rie.Pool, *syncbuf.Buffer) {
	t.Helper()
	emulator, err := rie.Find()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	bootstrap := filepath.Join(t.TempDir(), "bootstrap")
	build := exec.Command("go", "build", "-tags", "lambda.norpc", "-o", bootstrap, "./testdata/fn")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	logs := &syncbuf.Buffer{}
	fn := rie.Function{Name: "fn", Bootstrap: bootstrap, Emulator: emulator,
		Env: []string{"RIE_TEST_VALUE=configured"}, Timeout: 5 * time.Second, Logs: logs}
	set(&fn)
	p, err := rie.NewPool(fn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p, logs
}

type answer struct {
	PID   int             `json:"pid"`
	Event json.RawMessage `json:"event"`
	Env   string          `json:"env"`
}

func invoke(t *testing.T, p *rie.Pool, event string) (answer, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := p.Invoke(ctx, []byte(event))
	var a answer
	if err == nil {
		if err := json.Unmarshal(out, &a); err != nil {
			t.Fatalf("answer %q: %v", out, err)
		}
	}
	return a, err
}

// TestPoolInvokesAndReusesWarmInstances: an answer comes back with the
// configured environment; sequential invocations reuse one warm emulator,
// whose INIT the pool recorded once.
func TestPoolInvokesAndReusesWarmInstances(t *testing.T) {
	p, _ := testPool(t, 4)
	first, err := invoke(t, p, `{"n":1}`)
	if err != nil || string(first.Event) != `{"n":1}` || first.Env != "configured" {
		t.Fatalf("first: %+v %v", first, err)
	}
	second, err := invoke(t, p, `{"n":2}`)
	if err != nil || second.PID != first.PID {
		t.Fatalf("second ran in pid %d, first in %d (%v): want the warm instance", second.PID, first.PID, err)
	}
	s := p.Stats()
	if s.Instances != 1 || s.Invocations != 2 || len(s.InitMS) != 1 || s.InitMS[0] <= 0 {
		t.Fatalf("stats %+v: want one instance, two invocations, one INIT", s)
	}
}

// TestPoolScalesOutUpToItsLimit: concurrent invocations run on separate
// emulators, never more than MaxConcurrency; the rest wait their turn. The
// bodies block on a file until both emulators are up, so no timing decides
// how many start.
func TestPoolScalesOutUpToItsLimit(t *testing.T) {
	p, _ := testPool(t, 2)
	release := filepath.Join(t.TempDir(), "release")
	event := fmt.Sprintf(`{"wait_file":%q}`, release)
	var wg sync.WaitGroup
	pids := make([]int, 5)
	errs := make([]error, 5)
	for i := range 5 {
		wg.Go(func() {
			var a answer
			a, errs[i] = invoke(t, p, event)
			pids[i] = a.PID
		})
	}
	deadline := time.Now().Add(20 * time.Second)
	for p.Stats().Instances < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	distinct := map[int]bool{}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("invocation %d: %v", i, err)
		}
		distinct[pids[i]] = true
	}
	if s := p.Stats(); s.Instances != 2 || len(distinct) != 2 || s.Invocations != 5 {
		t.Fatalf("stats %+v, %d distinct pids: want 2 instances for 5 concurrent invocations", s, len(distinct))
	}
}

// TestPoolFunctionErrorAndCrash: a handler error is a *FunctionError and
// the instance stays; a crashed bootstrap is replaced by a fresh one.
func TestPoolFunctionErrorAndCrash(t *testing.T) {
	p, _ := testPool(t, 1)
	_, err := invoke(t, p, `{"fail":"no such thing"}`)
	var fe *rie.FunctionError
	if !errors.As(err, &fe) || fe.Function != "fn" || !strings.Contains(fe.Message, "no such thing") {
		t.Fatalf("handler error: %v", err)
	}
	if _, err := invoke(t, p, `{"exit":true}`); err == nil {
		t.Fatal("a bootstrap that exits mid-invoke answered without error")
	}
	if a, err := invoke(t, p, `{"n":3}`); err != nil || string(a.Event) != `{"n":3}` {
		t.Fatalf("after the crash: %+v %v", a, err)
	}
}

// TestPoolClose: after Close an invocation fails at once.
func TestPoolClose(t *testing.T) {
	p, _ := testPool(t, 1)
	if _, err := invoke(t, p, `{}`); err != nil {
		t.Fatal(err)
	}
	p.Close()
	if _, err := invoke(t, p, `{}`); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("after Close: %v", err)
	}
}

// gatedEmulator returns an emulator that runs the real one at once the
// first time, and every later time only once the file gate exists: a test
// holds every later emulator's start for as long as it likes. launches
// reports how many times it was run.
func gatedEmulator(t *testing.T, gate string) (path string, launches func() int) {
	t.Helper()
	emulator, err := rie.Find()
	if err != nil {
		t.Skip(err) // testPoolWith fails or skips with the reason first
	}
	dir := t.TempDir()
	script := filepath.Join(dir, "gated-rie")
	body := fmt.Sprintf("#!/bin/sh\nmktemp %q >/dev/null\nif ! mkdir %q 2>/dev/null; then\n  while [ ! -e %q ]; do sleep 0.01; done\nfi\nexec %q \"$@\"\n",
		filepath.Join(dir, "launch.XXXXXX"), filepath.Join(dir, "first"), gate, emulator)
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return script, func() int {
		m, _ := filepath.Glob(filepath.Join(dir, "launch.*"))
		return len(m)
	}
}

// TestPoolServesWaitersFromAFreedInstance: invocations that find every
// emulator busy start one more between them, not one each (a flood of
// cold starts on a loaded machine), and take the busy one as soon as it is
// free instead of waiting for that start (held back here until they all
// have their answers, so no timing decides it); the emulator started joins
// the pool once up.
func TestPoolServesWaitersFromAFreedInstance(t *testing.T) {
	gate := filepath.Join(t.TempDir(), "gate")
	var launches func() int
	p, _ := testPoolWith(t, func(fn *rie.Function) {
		fn.MaxConcurrency = 4
		fn.Emulator, launches = gatedEmulator(t, gate)
	})
	release := filepath.Join(t.TempDir(), "release")
	first := make(chan answer, 1)
	go func() {
		a, err := invoke(t, p, fmt.Sprintf(`{"wait_file":%q}`, release))
		if err != nil {
			t.Errorf("first: %v", err)
		}
		first <- a
	}()
	if !within(20*time.Second, func() bool { return p.Stats().Instances == 1 }) {
		t.Fatal("the first emulator never started")
	}
	const waiters = 3
	answers := make(chan answer, waiters)
	for i := range waiters {
		go func() {
			a, err := invoke(t, p, fmt.Sprintf(`{"n":%d}`, i))
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
			}
			answers <- a
		}()
	}
	if !within(20*time.Second, func() bool { return launches() >= 2 }) {
		t.Fatal("no waiter started an emulator")
	}
	// A pool that started one emulator a waiter launches them all at
	// once; this one must not, however long it is given.
	within(2*time.Second, func() bool { return launches() >= 1+waiters })
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	a1 := <-first
	for range waiters {
		select {
		case a := <-answers:
			if a.PID != a1.PID {
				t.Errorf("a waiter ran in pid %d (%s), the first in %d: want the freed emulator", a.PID, a.Event, a1.PID)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a waiter waited for an emulator's start (held back) although the first one came free")
		}
	}
	if n := launches(); n != 2 {
		t.Errorf("%d emulators launched for one busy and %d waiting invocations, want 2 (one start at a time)", n, waiters)
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if !within(20*time.Second, func() bool { return p.Stats().Instances == 2 }) {
		t.Fatalf("stats %+v: want 2 instances, the held-back one joined to the pool", p.Stats())
	}
}

// TestPoolWarmStartsAhead: a pool with Warm starts that many emulators
// before any invocation, and the first invocations use them.
func TestPoolWarmStartsAhead(t *testing.T) {
	p, _ := testPoolWith(t, func(fn *rie.Function) { fn.MaxConcurrency, fn.Warm = 4, 2 })
	within(20*time.Second, func() bool { return p.Stats().Instances == 2 })
	if s := p.Stats(); s.Instances != 2 || s.Invocations != 0 {
		t.Fatalf("stats %+v before any invocation: want 2 warm instances", s)
	}
	if _, err := invoke(t, p, `{"n":1}`); err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.Instances != 2 || s.Invocations != 1 {
		t.Fatalf("stats %+v: the invocation started an emulator although two were warm", s)
	}
}

// TestPoolWaiterGetsTheSlotOfACrashedInstance: a caller waiting for the
// one emulator a pool may run gets a new one when that emulator's
// bootstrap dies under its invocation (its slot free again), instead of
// waiting until its deadline.
func TestPoolWaiterGetsTheSlotOfACrashedInstance(t *testing.T) {
	p, _ := testPool(t, 1)
	die := filepath.Join(t.TempDir(), "die")
	crashed := make(chan error, 1)
	go func() {
		_, err := invoke(t, p, fmt.Sprintf(`{"wait_file":%q,"exit":true}`, die))
		crashed <- err
	}()
	if !within(20*time.Second, func() bool { return p.Stats().Instances == 1 }) {
		t.Fatal("the first emulator never started")
	}
	waiter := make(chan error, 1)
	go func() {
		a, err := invoke(t, p, `{"n":2}`)
		if err == nil && string(a.Event) != `{"n":2}` {
			err = fmt.Errorf("answer %+v", a)
		}
		waiter <- err
	}()
	// Time for the waiter to wait (the pool is full); were it to come
	// later it would find the slot free either way.
	time.Sleep(500 * time.Millisecond)
	if err := os.WriteFile(die, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := <-crashed; err == nil {
		t.Fatal("the invocation whose bootstrap exited answered without error")
	}
	select {
	case err := <-waiter:
		if err != nil {
			t.Fatalf("waiter: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter was not given the crashed emulator's slot")
	}
}

// within reports whether ok held within bound, looking every 10 ms.
func within(bound time.Duration, ok func() bool) bool {
	for deadline := time.Now().Add(bound); !ok(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}
