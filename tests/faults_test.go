package tests

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// The fault suite: real nymph processes against `lakeshore dev`,
// every body appending `invocation attempt worker unix-time` to a ledger.
// Each fault is injected mid-run; then the batch drains and the outcome is
// computed Jepsen-style from the control plane and the ledger.

const (
	faultAgents      = 3
	faultInvocations = 100
	faultStaleAfter  = 3 * time.Second
)

// faultEnv is one fault's world.
type faultEnv struct {
	t      *testing.T
	dev    *devServer
	op     *client.Client
	agents []*nymphProc
	dirs   []string
	ledger string
	ids    []string
	queue  string
}

// faultResult is one row of the report.
type faultResult struct {
	fault string
	outcomes
	worstRedelivery                   time.Duration
	bodiesStarted, executionsRepeated int
}

// outcomes is what the control plane says became of a batch nobody
// cancelled: the invariants of the fault suite and the fleet simulator.
type outcomes struct {
	invocations, lost, doubleCounted int
	// wronglyCancelled counts invocations that ended cancelled although no
	// operator cancelled them: lost work, counted in lost too.
	wronglyCancelled int
	// badHistory counts invocations whose attempt history disagrees with
	// them (historyFault); the first few are in badHistoryNotes.
	badHistory      int
	badHistoryNotes []string
	redelivered     int
	// succeeded counts the invocations that ended succeeded.
	succeeded int
}

var (
	reportMu sync.Mutex
	report   []faultResult
)

// faultSpec describes one fault run.
type faultSpec struct {
	name     string
	backend  backend
	devArgs  []string
	machines []string // machine ids of the agents (default f0, f1, …)
	// agent0Env and agent0Wrap adjust agent f0 alone: extra environment, and
	// a command its nymph runs under (e.g. `ip netns exec NAME`).
	agent0Env, agent0Wrap []string
	// agentArgs are extra flags for every agent.
	agentArgs []string
	// capacity is each agent's --capacity (default 2).
	capacity int
	// body is the shell script of every invocation (default faultBody).
	body string
	// inject causes the fault. It returns when it happened and, for a fault
	// on one agent, the invocations that agent held then: the time until
	// each is handed back (no longer running on that worker) is the time to
	// redelivery.
	inject func(e *faultEnv) (time.Time, []wire.Invocation)
	// heal, if set, ends the fault once its work was handed back; it is
	// given when the fault happened.
	heal func(e *faultEnv, at time.Time)
	// heldEnds, if set, is how the attempts the faulted agent held must read
	// in their invocations' history (one of these outcomes).
	heldEnds []string
}

// runFault runs a fault on the default agents.
func runFault(t *testing.T, name string, b backend, inject func(e *faultEnv) (time.Time, []wire.Invocation), devArgs ...string) faultResult {
	return runFaultSpec(t, faultSpec{name: name, backend: b, devArgs: devArgs, inject: inject})
}

// runFaultSpec starts the agents, submits the batch, waits until progress
// is under way, injects the fault, drains and checks the invariants.
func runFaultSpec(t *testing.T, f faultSpec) faultResult {
	t.Helper()
	e := &faultEnv{t: t, queue: "q", ledger: filepath.Join(t.TempDir(), "ledger")}
	e.dev = startDev(t, f.backend, append([]string{"--stale-after", faultStaleAfter.String()}, f.devArgs...)...)
	e.op = e.dev.Operator()
	for i := range faultAgents {
		dir := t.TempDir()
		e.dirs = append(e.dirs, dir)
		var env, wrap []string
		if i == 0 {
			env, wrap = f.agent0Env, f.agent0Wrap
		}
		args := append([]string{"--capacity", strconv.Itoa(cmp.Or(f.capacity, 2)), "--log-level", "info"}, f.agentArgs...)
		if f.machines != nil {
			args = append(args, "--machine-id", f.machines[i])
		}
		e.agents = append(e.agents, startNymphCmd(t, e.dev, fmt.Sprintf("f%d", i), dir, env, wrap, args...))
	}
	e.submitBatch(cmp.Or(f.body, faultBody))
	e.waitDone(faultInvocations / 5)
	faultAt, held := f.inject(e)
	handedBack := e.waitHandedBack(held, faultAt)
	if f.heal != nil {
		f.heal(e, faultAt)
	}
	e.drain(3 * time.Minute)
	res := e.measure(f.name, faultAt)
	res.worstRedelivery = handedBack
	if f.heldEnds != nil {
		e.checkHeldEnds(held, f.heldEnds)
	}
	reportMu.Lock()
	report = append(report, res)
	reportMu.Unlock()
	t.Logf("%+v", res)
	if res.lost != 0 || res.doubleCounted != 0 {
		t.Fatalf("%s: lost %d (of which %d cancelled though no operator cancelled them), double-counted %d; want 0 and 0",
			f.name, res.lost, res.wronglyCancelled, res.doubleCounted)
	}
	if res.badHistory != 0 {
		t.Fatalf("%s: %d invocations' attempt history disagrees with them: %s", f.name, res.badHistory,
			strings.Join(res.badHistoryNotes, "; "))
	}
	return res
}

// faultBody is the default body: a ledger line, then a short sleep.
const faultBody = `echo "$NYMPH_INVOCATION_ID $NYMPH_ATTEMPT $NYMPH_WORKER_ID $(date +%s.%N)" >> "$LEDGER"; sleep 0.$((RANDOM % 5 + 2))`

func (e *faultEnv) submitBatch(body string) {
	for i := range faultInvocations {
		inv, _, err := e.op.Submit(context.Background(), wire.SubmitRequest{
			Queue: e.queue, Argv: []string{"/bin/sh", "-c", body}, Env: map[string]string{"LEDGER": e.ledger},
			MaxAttempts: 10, IdempotencyKey: fmt.Sprintf("fault-%d", i),
		})
		if err != nil {
			e.t.Fatalf("submit %d: %v", i, err)
		}
		e.ids = append(e.ids, inv.InvocationID)
	}
}

// stats reads the queue's counts; an error fails the test (a zero value
// would read as "nothing done" and hide it).
func (e *faultEnv) stats() wire.QueueStats {
	e.t.Helper()
	st, err := e.op.QueueStats(context.Background(), e.queue)
	if err != nil {
		e.t.Fatalf("queue stats: %v", err)
	}
	return st
}

// waitStats polls the queue's counts until cond holds. A read that fails
// is retried: some faults take the control plane down for a while.
func (e *faultEnv) waitStats(limit time.Duration, what string, cond func(wire.QueueStats) bool) {
	e.t.Helper()
	waittest.Until(e.t, limit, what, func() bool {
		st, err := e.op.QueueStats(context.Background(), e.queue)
		return err == nil && cond(st)
	})
}

// waitDone waits until at least n invocations are terminal.
func (e *faultEnv) waitDone(n int) {
	e.waitStats(2*time.Minute, fmt.Sprintf("%d invocations done", n), func(st wire.QueueStats) bool { return st.DoneCount >= n })
}

// drain waits until nothing is queued or running.
func (e *faultEnv) drain(limit time.Duration) {
	e.waitStats(limit, "batch drained", func(st wire.QueueStats) bool {
		return st.Counts[wire.StateQueued]+st.Counts[wire.StateRunning] == 0 && st.DoneCount > 0
	})
}

// waitHandedBack waits until none of held runs on the worker that held it
// at the fault, and reports how long after the fault that was.
func (e *faultEnv) waitHandedBack(held []wire.Invocation, faultAt time.Time) time.Duration {
	var worst time.Duration
	for _, h := range held {
		waittest.Until(e.t, time.Minute, "invocation "+h.InvocationID+" handed back", func() bool {
			inv, err := e.op.GetInvocation(context.Background(), h.InvocationID)
			return err == nil && !(inv.State == wire.StateRunning && inv.WorkerID == h.WorkerID && inv.Attempt == h.Attempt)
		})
		worst = max(worst, time.Since(faultAt))
	}
	return worst
}

// running lists the queue's running invocations and each worker's label;
// an error fails the test.
func (e *faultEnv) running() ([]wire.Invocation, map[string]string) {
	e.t.Helper()
	ctx := context.Background()
	list, err := e.op.ListInvocations(ctx, client.ListInvocationsParams{Queue: e.queue, State: wire.StateRunning, Limit: 500})
	if err != nil {
		e.t.Fatalf("list running invocations: %v", err)
	}
	ws, err := e.op.ListWorkers(ctx, 100, "")
	if err != nil {
		e.t.Fatalf("list workers: %v", err)
	}
	label := map[string]string{}
	for _, w := range ws.Workers {
		label[w.WorkerID] = w.Label
	}
	return list.Invocations, label
}

// heldBy lists the invocations agent i runs now.
func (e *faultEnv) heldBy(i int) []wire.Invocation {
	e.t.Helper()
	list, label := e.running()
	var out []wire.Invocation
	for _, inv := range list {
		if label[inv.WorkerID] == fmt.Sprintf("f%d", i) {
			out = append(out, inv)
		}
	}
	return out
}

type ledgerLine struct {
	inv, worker string
	attempt     int
	at          time.Time
}

func (e *faultEnv) readLedger() []ledgerLine {
	f, err := os.Open(e.ledger)
	if err != nil {
		e.t.Fatalf("ledger: %v", err)
	}
	defer f.Close()
	var out []ledgerLine
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) != 4 {
			continue // a line torn by a killed body
		}
		att, _ := strconv.Atoi(fs[1])
		secs, _ := strconv.ParseFloat(fs[3], 64)
		out = append(out, ledgerLine{inv: fs[0], attempt: att, worker: fs[2], at: time.Unix(0, int64(secs*1e9))})
	}
	return out
}

// measure computes the report row: the batch's outcomes (checkOutcomes),
// and from the ledger how many bodies ran and how many invocations ran more
// than once (at-least-once execution: the price of never losing work).
func (e *faultEnv) measure(name string, faultAt time.Time) faultResult {
	res := faultResult{fault: name, outcomes: checkOutcomes(e.t, e.op, e.queue, e.ids, 1)}
	lines := e.readLedger()
	res.bodiesStarted = len(lines)
	seen := map[string]int{}
	for _, l := range lines {
		seen[l.inv]++
	}
	for _, n := range seen {
		if n > 1 {
			res.executionsRepeated++
		}
	}
	return res
}

// checkOutcomes reads every invocation of ids (parallel reads at once) and
// the queue's counts, and computes lost (submitted, never terminal, or
// cancelled though nobody cancelled it), double-counted (terminal
// transitions counted beyond one per invocation), redelivered (attempt > 1)
// and the invocations whose attempt history disagrees with them. The batch
// must be the queue's only work: the queue's counts are compared with it.
func checkOutcomes(t testing.TB, op *client.Client, queue string, ids []string, parallel int) outcomes {
	t.Helper()
	res := outcomes{invocations: len(ids)}
	invs := make([]*wire.Invocation, len(ids))
	next := make(chan int)
	var wg sync.WaitGroup
	for range max(parallel, 1) {
		wg.Go(func() {
			for i := range next {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				inv, err := op.GetInvocation(ctx, ids[i])
				cancel()
				if err == nil {
					invs[i] = &inv
				}
			}
		})
	}
	for i := range ids {
		next <- i
	}
	close(next)
	wg.Wait()
	terminal := 0
	for _, inv := range invs {
		if inv == nil || !wire.Terminal(inv.State) {
			res.lost++
			continue
		}
		terminal++
		if inv.State == wire.StateSucceeded {
			res.succeeded++
		}
		// Nobody cancels these batches: a cancelled invocation is work a
		// fault threw away.
		if inv.State == wire.StateCancelled && !inv.CancelRequested {
			res.wronglyCancelled++
			res.lost++
		}
		if inv.Attempt > 1 {
			res.redelivered++
		}
		if why := historyFault(*inv); why != "" {
			res.badHistory++
			if len(res.badHistoryNotes) < 5 {
				res.badHistoryNotes = append(res.badHistoryNotes, inv.InvocationID+": "+why)
			}
		}
	}
	st, err := op.QueueStats(context.Background(), queue)
	if err != nil {
		t.Fatalf("queue stats: %v", err)
	}
	counted := st.Counts[wire.StateSucceeded] + st.Counts[wire.StateFailed] + st.Counts[wire.StateCancelled]
	res.doubleCounted = max(st.DoneCount-terminal, counted-terminal, 0)
	return res
}

// historyFault reports how a finished invocation's attempt history
// disagrees with it ("" when it agrees): one entry per claim, every one
// ended, exactly one recorded (none for worker_lost) and that one the
// invocation's own outcome and worker.
func historyFault(inv wire.Invocation) string {
	if len(inv.Attempts) != inv.Attempt {
		return fmt.Sprintf("%d attempts in the history, attempt %d", len(inv.Attempts), inv.Attempt)
	}
	var recorded []wire.Attempt
	for _, a := range inv.Attempts {
		if a.Outcome == "" || a.EndedAt == nil || a.EndedAt.Before(a.ClaimedAt) {
			return fmt.Sprintf("attempt %d of a %s invocation has not ended: %+v", a.Attempt, inv.State, a)
		}
		if a.Recorded {
			recorded = append(recorded, a)
		}
	}
	lost := inv.Error != nil && inv.Error.Type == "worker_lost"
	switch {
	case lost && len(recorded) != 0:
		return "worker_lost, yet an attempt's outcome is recorded"
	case lost:
		return ""
	case len(recorded) != 1:
		return fmt.Sprintf("%d attempts recorded, want 1", len(recorded))
	case recorded[0].Outcome != inv.State || recorded[0].WorkerID != inv.WorkerID:
		return fmt.Sprintf("recorded attempt %d reads %s by %s; the invocation is %s by %s",
			recorded[0].Attempt, recorded[0].Outcome, recorded[0].WorkerID, inv.State, inv.WorkerID)
	}
	return ""
}

// checkHeldEnds checks that each attempt in held (what the faulted agent
// ran at the fault) ended as one of ends, or with its own outcome recorded
// (its ack got out before the fault).
func (e *faultEnv) checkHeldEnds(held []wire.Invocation, ends []string) {
	e.t.Helper()
	if len(held) == 0 {
		e.t.Fatal("the faulted agent held nothing: no attempt history to check")
	}
	for _, h := range held {
		inv, err := e.op.GetInvocation(context.Background(), h.InvocationID)
		if err != nil || len(inv.Attempts) < h.Attempt {
			e.t.Fatalf("invocation %s: %v, %d attempts; want attempt %d in its history", h.InvocationID, err, len(inv.Attempts), h.Attempt)
		}
		a := inv.Attempts[h.Attempt-1]
		if a.WorkerID != h.WorkerID || !(slices.Contains(ends, a.Outcome) || a.Recorded) {
			e.t.Errorf("invocation %s attempt %d: %+v; want worker %s and one of %v", h.InvocationID, h.Attempt, a, h.WorkerID, ends)
		}
	}
}

// victim picks the agent running the most work now, and that work, from
// one listing: a second listing could find the work finished (bodies run
// a few hundred ms, and a listing through the Lambda bootstraps can take
// as long). It lists again until some agent runs something.
func (e *faultEnv) victim() (int, []wire.Invocation) {
	e.t.Helper()
	best := 0
	var held []wire.Invocation
	waittest.Until(e.t, time.Minute, "an agent running work", func() bool {
		list, label := e.running()
		byAgent := map[string][]wire.Invocation{}
		for _, inv := range list {
			byAgent[label[inv.WorkerID]] = append(byAgent[label[inv.WorkerID]], inv)
		}
		best = 0
		for i := range e.agents {
			if len(byAgent[fmt.Sprintf("f%d", i)]) > len(byAgent[fmt.Sprintf("f%d", best)]) {
				best = i
			}
		}
		held = byAgent[fmt.Sprintf("f%d", best)]
		return len(held) > 0
	})
	return best, held
}

func TestFaultSIGKILL(t *testing.T) {
	t.Parallel()
	runFaultSpec(t, faultSpec{name: "SIGKILL an agent mid-run", backend: backends[0], inject: sigkillVictim,
		heldEnds: []string{"stale"}})
}

// sigkillVictim SIGKILLs the agent running the most work.
func sigkillVictim(e *faultEnv) (time.Time, []wire.Invocation) {
	v, held := e.victim()
	at := time.Now()
	_ = e.agents[v].cmd.Process.Signal(syscall.SIGKILL)
	return at, held
}

// TestFaultSIGKILLThroughLambdas is the capstone through the real Lambda
// path: every poll, ack and sweep runs in a bootstrap under the emulator.
func TestFaultSIGKILLThroughLambdas(t *testing.T) {
	t.Parallel()
	runFaultSpec(t, faultSpec{name: "SIGKILL an agent mid-run (Lambda bootstraps)", backend: lambdasBackend,
		inject: sigkillVictim, heldEnds: []string{"stale"}})
}

func TestFaultSIGSTOP(t *testing.T) {
	t.Parallel()
	victim := 0
	runFaultSpec(t, faultSpec{name: "SIGSTOP past stale_after, then SIGCONT", backend: backends[0],
		inject: func(e *faultEnv) (time.Time, []wire.Invocation) {
			var held []wire.Invocation
			victim, held = e.victim()
			at := time.Now()
			_ = e.agents[victim].cmd.Process.Signal(syscall.SIGSTOP)
			return at, held
		},
		// Frozen for two stale windows: its work is swept and handed out
		// meanwhile. Then it wakes: its late acks must be no-ops (or count,
		// if first), and the bodies it still runs must get cancels.
		heal: func(e *faultEnv, at time.Time) {
			time.Sleep(time.Until(at.Add(2 * faultStaleAfter)))
			_ = e.agents[victim].cmd.Process.Signal(syscall.SIGCONT)
		}})
}

// staleReturnBody writes its ledger line, then runs 4 s (longer than the
// 3 s stale window); while $FAULT_HOLD names a file that exists it runs on
// (at most 60 s), so the test decides how long agent f0's bodies last.
const staleReturnBody = `echo "$NYMPH_INVOCATION_ID $NYMPH_ATTEMPT $NYMPH_WORKER_ID $(date +%s.%N)" >> "$LEDGER"; ` +
	`i=0; while [ -n "$FAULT_HOLD" ] && [ -e "$FAULT_HOLD" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; sleep 4`

// TestFaultStaleAndReturn: agent f0 is frozen (SIGSTOP) while its bodies,
// longer than stale_after, run on; its work is swept and runs again on the
// other agents as attempt 2; then f0 wakes while its own bodies still run.
// Its polls get superseded cancels and its killed bodies ack cancelled:
// those acks must change nothing. An invocation that ends cancelled here is
// lost work (no operator cancels anything in this suite).
func TestFaultStaleAndReturn(t *testing.T) {
	t.Parallel()
	hold := filepath.Join(t.TempDir(), "hold")
	if err := os.WriteFile(hold, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var held []wire.Invocation
	runFaultSpec(t, faultSpec{name: "stale and return (bodies > stale_after)", backend: backends[0],
		capacity: 8, body: staleReturnBody,
		// Only f0's daemon has FAULT_HOLD in its environment; --pass-env
		// hands it to its bodies.
		agent0Env: []string{"FAULT_HOLD=" + hold},
		agentArgs: []string{"--pass-env", "FAULT_HOLD"},
		inject: func(e *faultEnv) (time.Time, []wire.Invocation) {
			waittest.Until(t, time.Minute, "f0 running a full load", func() bool {
				held = e.heldBy(0)
				return len(held) == 8
			})
			at := time.Now()
			_ = e.agents[0].cmd.Process.Signal(syscall.SIGSTOP)
			return at, held
		},
		heal: func(e *faultEnv, at time.Time) {
			waittest.Until(t, time.Minute, "f0's work running again elsewhere", func() bool {
				for _, h := range held {
					inv, err := e.op.GetInvocation(context.Background(), h.InvocationID)
					if err != nil || inv.Attempt < 2 || !(inv.State == wire.StateRunning || wire.Terminal(inv.State)) {
						return false
					}
				}
				return true
			})
			_ = e.agents[0].cmd.Process.Signal(syscall.SIGCONT)
			// f0's first poll awake tells it to stop every superseded
			// attempt (its bodies are still held running until then).
			waittest.Until(t, 30*time.Second, "f0 told to stop its superseded attempts", func() bool {
				return strings.Count(e.agents[0].logs.String(), `"reason":"superseded"`) >= len(held)
			})
			if err := os.Remove(hold); err != nil {
				t.Fatal(err)
			}
		}})
}

// TestFaultSIGTERM: one SIGTERM drains (in-flight work finishes inside the
// grace); the agent says bye and no work needs handing back.
func TestFaultSIGTERM(t *testing.T) {
	t.Parallel()
	runFault(t, "SIGTERM an agent mid-run (drain)", backends[0], func(e *faultEnv) (time.Time, []wire.Invocation) {
		at := time.Now()
		v, _ := e.victim()
		_ = e.agents[v].cmd.Process.Signal(syscall.SIGTERM)
		return at, nil // its work finishes inside the grace: nothing to hand back
	})
}

// holdBody is faultBody whose run, on a daemon that passes $FAULT_HOLD to
// it, waits while that file exists (at most 300 s): the test decides when
// that agent's bodies may end.
const holdBody = `echo "$NYMPH_INVOCATION_ID $NYMPH_ATTEMPT $NYMPH_WORKER_ID $(date +%s.%N)" >> "$LEDGER"; ` +
	`i=0; while [ -n "$FAULT_HOLD" ] && [ -e "$FAULT_HOLD" ] && [ $i -lt 3000 ]; do sleep 0.1; i=$((i+1)); done; ` +
	`sleep 0.$((RANDOM % 5 + 2))`

// TestFaultSIGTERMTwice: a second SIGTERM skips the grace: bodies are
// killed, and the bye hands their work back at once. Agent f0's bodies wait
// on a file the test never removes before the signals, so f0 certainly
// holds work when they come: each held invocation must be handed back and
// run again (attempt > its held one) elsewhere, and f0's bye must count
// them in inflight_abandoned. The stale window (30 s) and the grace (2 min)
// are set long so that only the second signal and the bye can explain a
// hand-back inside 10 s — a generous bound for a loaded machine (about 1 s
// is typical).
func TestFaultSIGTERMTwice(t *testing.T) {
	t.Parallel()
	hold := filepath.Join(t.TempDir(), "hold")
	if err := os.WriteFile(hold, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	const capacity = 2
	var (
		held []wire.Invocation
		env  *faultEnv
	)
	res := runFaultSpec(t, faultSpec{name: "SIGTERM twice (no grace): bye hands back", backend: backends[0],
		devArgs: []string{"--stale-after", "30s"}, capacity: capacity, body: holdBody,
		// Only f0's daemon has FAULT_HOLD in its environment; --pass-env
		// hands it to its bodies.
		agent0Env: []string{"FAULT_HOLD=" + hold},
		// A grace longer than every bound here: only the second signal can
		// end f0's held bodies in time.
		agentArgs: []string{"--pass-env", "FAULT_HOLD", "--grace", "2m"},
		inject: func(e *faultEnv) (time.Time, []wire.Invocation) {
			waittest.Until(t, time.Minute, "f0 holding a full load", func() bool {
				held = e.heldBy(0)
				return len(held) == capacity
			})
			env = e
			p := e.agents[0]
			at := time.Now()
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			// The second signal counts as a second only once the first started
			// the drain: the daemon's log says when.
			p.waitLog(t, 10*time.Second, `"msg":"signal: draining"`)
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			return at, held
		}})
	if res.worstRedelivery >= 10*time.Second {
		t.Fatalf("work handed back %s after the signal; a bye must beat the 30 s stale window", res.worstRedelivery)
	}
	if res.redelivered < len(held) {
		t.Fatalf("%d invocations redelivered; want at least the %d f0 held at the signals", res.redelivered, len(held))
	}
	for _, h := range held {
		inv, err := env.op.GetInvocation(context.Background(), h.InvocationID)
		if err != nil {
			t.Fatal(err)
		}
		if inv.State != wire.StateSucceeded || inv.Attempt <= h.Attempt || inv.WorkerID == h.WorkerID {
			t.Errorf("%s held by f0 as attempt %d ended %s as attempt %d on %s; want succeeded, run again elsewhere",
				h.InvocationID, h.Attempt, inv.State, inv.Attempt, inv.WorkerID)
		}
	}
	p := env.agents[0]
	if code := p.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("f0 exit code %d after two SIGTERMs; want 0", code)
	}
	if want := fmt.Sprintf(`"inflight_abandoned":%d`, len(held)); !strings.Contains(p.logs.String(), want) {
		t.Fatalf("f0's exit does not show %s: the bye did not hand back the work it held", want)
	}
}

// TestFaultControlPlaneRestart kills `lakeshore dev --store aws` (moto keeps
// the state) mid-run and starts it again on the same address.
func TestFaultControlPlaneRestart(t *testing.T) {
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	prefix := ""
	moto := backend{"moto", func(t testing.TB) ([]string, []string) {
		args, env := backends[1].setup(t)
		if prefix == "" {
			prefix = args[len(args)-1]
		}
		return append(args[:len(args)-1:len(args)-1], prefix, "--addr", addr), env
	}}
	runFault(t, "control plane killed and restarted", moto, func(e *faultEnv) (time.Time, []wire.Invocation) {
		at := time.Now()
		_ = e.dev.cmd.Process.Signal(syscall.SIGKILL)
		<-e.dev.exited
		time.Sleep(time.Second)
		d2 := startDev(t, moto, "--stale-after", faultStaleAfter.String(),
			"--enroll-token", e.dev.EnrollToken, "--operator-token", e.dev.OperatorToken)
		e.dev, e.op = d2, d2.Operator()
		return at, nil
	})
}

// TestFaultEC2Terminate: the agents run "on" moto EC2 instances (their
// machine ids are instance ids). One instance is terminated (and its agent
// dies with it): the host poller reads the instance's state and the work is
// handed back within a host poll — the stale window is set long (30 s) so
// only the host status can explain a fast hand-back.
func TestFaultEC2Terminate(t *testing.T) {
	t.Parallel()
	endpoint := storetest.MotoEndpoint(t)
	ec2c := ec2.NewFromConfig(aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("test", "test", "")},
		func(o *ec2.Options) { o.BaseEndpoint = aws.String(endpoint) })
	ctx := context.Background()
	out, err := ec2c.RunInstances(ctx, &ec2.RunInstancesInput{ImageId: aws.String("ami-12c6146b"),
		MinCount: aws.Int32(faultAgents), MaxCount: aws.Int32(faultAgents), InstanceType: ec2types.InstanceTypeT3Micro})
	if err != nil {
		t.Fatalf("moto RunInstances: %v", err)
	}
	var instances []string
	for _, in := range out.Instances {
		instances = append(instances, aws.ToString(in.InstanceId))
	}
	res := runFaultSpec(t, faultSpec{name: "EC2 instance terminated (moto)", backend: backends[1], machines: instances,
		devArgs: []string{"--stale-after", "30s", "--host-poll-interval", "1s"}, heldEnds: []string{"gone"},
		inject: func(e *faultEnv) (time.Time, []wire.Invocation) {
			v, held := e.victim()
			at := time.Now()
			if _, err := ec2c.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{instances[v]}}); err != nil {
				t.Fatalf("terminate: %v", err)
			}
			_ = e.agents[v].cmd.Process.Signal(syscall.SIGKILL) // the power is gone
			return at, held
		}})
	if res.worstRedelivery >= 10*time.Second {
		t.Fatalf("work handed back %s after the terminate; the host poll (1 s) should beat the 30 s stale window", res.worstRedelivery)
	}
}

// testNetns is a network namespace this test made, joined to the host by a
// veth pair: the agent inside reaches the control plane only through it.
type testNetns struct {
	name, hostLink, hostIP string
}

// newTestNetns makes one (root only; skipped elsewhere) and removes it when
// the test ends. Its addresses are the project's own test hosts: a /30 of
// 10.231.0.0/16 on links that exist only for this test.
func newTestNetns(t *testing.T) testNetns {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a partition needs root to create network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("a partition needs iproute2 (ip)")
	}
	var b [2]byte
	_, _ = rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	n := testNetns{name: "lsf" + suffix, hostLink: "lsh" + suffix, hostIP: fmt.Sprintf("10.231.%d.%d", b[0], b[1]&0xfc|1)}
	peerIP := fmt.Sprintf("10.231.%d.%d", b[0], b[1]&0xfc|2)
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run("netns", "add", n.name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", n.name).Run() })
	run("link", "add", n.hostLink, "type", "veth", "peer", "name", "lsp"+suffix, "netns", n.name)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", n.hostLink).Run() })
	run("addr", "add", n.hostIP+"/30", "dev", n.hostLink)
	run("link", "set", n.hostLink, "up")
	run("netns", "exec", n.name, "ip", "addr", "add", peerIP+"/30", "dev", "lsp"+suffix)
	run("netns", "exec", n.name, "ip", "link", "set", "lsp"+suffix, "up")
	run("netns", "exec", n.name, "ip", "link", "set", "lo", "up")
	return n
}

// setLink takes the host end of the namespace's link down or up.
func (n testNetns) setLink(t *testing.T, state string) {
	if out, err := exec.Command("ip", "link", "set", n.hostLink, state).CombinedOutput(); err != nil {
		t.Errorf("ip link set %s %s: %v\n%s", n.hostLink, state, err, out)
	}
}

// TestFaultPartition: agent f0 runs in its own network namespace. Its link
// to the control plane is cut for two stale windows (its polls and acks time
// out; its work is swept and handed out), then healed (its late acks are
// no-ops or count if first; it is told to cancel what it no longer holds).
func TestFaultPartition(t *testing.T) {
	t.Parallel()
	n := newTestNetns(t)
	runFaultSpec(t, faultSpec{name: "network partition past stale_after, healed", backend: backends[0],
		devArgs:    []string{"--addr", n.hostIP + ":0"},
		agent0Wrap: []string{"ip", "netns", "exec", n.name},
		// Plain http to a veth address, not loopback: nymph refuses that
		// unless told the network is trusted.
		agentArgs: []string{"--insecure"},
		inject: func(e *faultEnv) (time.Time, []wire.Invocation) {
			held := e.heldBy(0)
			at := time.Now()
			n.setLink(t, "down")
			return at, held
		},
		heal: func(e *faultEnv, at time.Time) {
			time.Sleep(time.Until(at.Add(2 * faultStaleAfter)))
			n.setLink(t, "up")
		}})
}

// imdsFake is an IMDSv2 endpoint whose spot notice a test can switch on.
type imdsFake struct {
	mu     sync.Mutex
	notice string // the instance-action JSON, "" for none (404)
}

func (f *imdsFake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodPut && r.URL.Path == "/latest/api/token":
		// As IMDS answers: the token and the lifetime it was given.
		w.Header().Set("X-aws-ec2-metadata-token-ttl-seconds", r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds"))
		_, _ = w.Write([]byte("token"))
	case r.Header.Get("X-aws-ec2-metadata-token") != "token":
		w.WriteHeader(http.StatusUnauthorized)
	case r.URL.Path == "/latest/meta-data/spot/instance-action":
		f.mu.Lock()
		notice := f.notice
		f.mu.Unlock()
		if notice == "" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(notice))
	default:
		http.NotFound(w, r)
	}
}

// TestFaultSpotNotice: agent f0 sees a spot interruption notice two minutes
// before its (simulated) reclaim: it drains, says bye{spot_interruption},
// and its work finishes or is handed back; nothing is lost.
func TestFaultSpotNotice(t *testing.T) {
	t.Parallel()
	fake := &imdsFake{}
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	runFaultSpec(t, faultSpec{name: "spot interruption notice", backend: backends[0],
		agent0Env: []string{"AWS_EC2_METADATA_SERVICE_ENDPOINT=" + srv.URL},
		inject: func(e *faultEnv) (time.Time, []wire.Invocation) {
			at := time.Now()
			fake.mu.Lock()
			fake.notice = fmt.Sprintf(`{"action":"terminate","time":%q}`, at.Add(2*time.Minute).UTC().Format(time.RFC3339))
			fake.mu.Unlock()
			code := e.agents[0].wait(t, time.Minute) // notices are read every 5 s
			if code != 0 {
				t.Fatalf("spot-drained agent exit code %d", code)
			}
			if w, _ := workerNamed(context.Background(), e.op, "f0"); w.State != "gone" || w.RetiredWhy != "bye: spot_interruption" {
				t.Fatalf("spot-drained worker: %+v", w)
			}
			return at, nil
		}})
}

// writeFaultReport writes the fault table where LAKESHORE_FAULT_REPORT
// says (make test prints it). TestMain calls it after every test ran.
func writeFaultReport() error {
	path := os.Getenv("LAKESHORE_FAULT_REPORT")
	reportMu.Lock()
	defer reportMu.Unlock()
	if path == "" {
		return nil
	}
	var b strings.Builder
	if len(report) == 0 {
		b.WriteString("no fault ran (tests/faults_test.go)\n")
	} else {
		fmt.Fprintf(&b, "%-50s %5s %5s %7s %9s %12s %18s %8s\n", "fault", "invs", "lost", "double", "wrongly", "redelivered", "handed back after", "re-ran")
		fmt.Fprintf(&b, "%-50s %5s %5s %7s %9s\n", "", "", "", "", "cancelled")
	}
	// The faults run in parallel: the table is in their names' order.
	slices.SortFunc(report, func(a, b faultResult) int { return strings.Compare(a.fault, b.fault) })
	for _, r := range report {
		fmt.Fprintf(&b, "%-50s %5d %5d %7d %9d %12d %17.1fs %8d\n", r.fault, r.invocations, r.lost, r.doubleCounted,
			r.wronglyCancelled, r.redelivered, r.worstRedelivery.Seconds(), r.executionsRepeated)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("fault report: %w", err)
	}
	return nil
}
