package domain

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The invocation's transitions, every state × every event, the illegal ones
// included: what each answers (an error code, or whether it changes
// anything) and the state it leaves. Worker a ran attempt 1 (superseded
// where the invocation ran again); b runs or ran attempt 2.

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// invocationStates are one invocation in each state it can be in, with
// the history that state implies.
func invocationStates() map[string]Invocation {
	hist := []Attempt{{Attempt: 1, WorkerID: "a", ClaimedAt: t0}, {Attempt: 2, WorkerID: "b", ClaimedAt: t0}}
	base := Invocation{ID: "inv_1", Queue: "q", MaxAttempts: 3}
	queued := base
	queued.State = StateQueued
	requeued := base // attempt 2 was handed back; attempt 3 is next
	requeued.State, requeued.Attempt, requeued.Attempts = StateQueued, 2, hist
	running := base
	running.State, running.Attempt, running.WorkerID, running.Attempts = StateRunning, 2, "b", hist
	cancelAsked := running
	cancelAsked.CancelRequested = true
	lastAttempt := running
	lastAttempt.MaxAttempts = 2
	out := map[string]Invocation{"queued": queued, "requeued": requeued, "running": running,
		"running, cancel asked": cancelAsked, "running its last attempt": lastAttempt}
	for _, s := range []InvocationState{StateSucceeded, StateFailed, StateCancelled} {
		done := running
		done.State, done.FinishedAt = s, t0
		out[string(s)] = done
	}
	return out
}

// step is what one event did: the code of its error ("" for none), whether
// it changed the invocation, and the state it left.
type step struct {
	code    Kind
	changed bool
	state   InvocationState
}

func (s step) String() string {
	return fmt.Sprintf("{kind %d changed %v state %s}", s.code, s.changed, s.state)
}

func TestInvocationTransitions(t *testing.T) {
	now := t0.Add(time.Minute)
	worker := func(id, hk string) Worker { return Worker{ID: id, HostKey: hk} }
	events := map[string]func(Invocation) (Invocation, step){
		"claim by c": func(inv Invocation) (Invocation, step) {
			next, err := inv.Claim(worker("c", ""), now)
			return next, step{KindOf(err), err == nil, next.State}
		},
		"record succeeded by b (attempt 2)": record(Outcome{WorkerID: "b", Attempt: 2, State: StateSucceeded}, now),
		"record failed by b (attempt 2)":    record(Outcome{WorkerID: "b", Attempt: 2, State: StateFailed}, now),
		"record cancelled by b (attempt 2)": record(Outcome{WorkerID: "b", Attempt: 2, State: StateCancelled}, now),
		"record succeeded by a (attempt 1)": record(Outcome{WorkerID: "a", Attempt: 1, State: StateSucceeded}, now),
		"record cancelled by a (attempt 1)": record(Outcome{WorkerID: "a", Attempt: 1, State: StateCancelled}, now),
		"record by a for attempt 2":         record(Outcome{WorkerID: "a", Attempt: 2, State: StateSucceeded}, now),
		"record a non-terminal state":       record(Outcome{WorkerID: "b", Attempt: 2, State: StateRunning}, now),
		"cancel": func(inv Invocation) (Invocation, step) {
			next, changed, err := inv.Cancel(now)
			return next, step{KindOf(err), changed, next.State}
		},
		"requeue from b": requeue("b", now),
		"requeue from a": requeue("a", now),
	}
	const (
		conflict  = KindConflict
		forbidden = KindForbidden
		invalid   = KindInvalid
		Q, R      = StateQueued, StateRunning
		S, F, C   = StateSucceeded, StateFailed, StateCancelled
	)
	want := map[string]map[string]step{
		"queued": {
			"claim by c":                        {0, true, R},
			"record succeeded by b (attempt 2)": {forbidden, false, Q},
			"record failed by b (attempt 2)":    {forbidden, false, Q},
			"record cancelled by b (attempt 2)": {forbidden, false, Q},
			"record succeeded by a (attempt 1)": {forbidden, false, Q},
			"record cancelled by a (attempt 1)": {forbidden, false, Q},
			"record by a for attempt 2":         {forbidden, false, Q},
			"record a non-terminal state":       {invalid, false, Q},
			"cancel":                            {0, true, C},
			"requeue from b":                    {0, false, Q},
			"requeue from a":                    {0, false, Q},
		},
		"requeued": {
			"claim by c":                        {0, true, R},
			"record succeeded by b (attempt 2)": {0, true, S}, // a late outcome of a handed-back attempt counts
			"record failed by b (attempt 2)":    {0, true, F},
			"record cancelled by b (attempt 2)": {0, false, Q},
			"record succeeded by a (attempt 1)": {0, true, S},
			"record cancelled by a (attempt 1)": {0, false, Q},
			"record by a for attempt 2":         {forbidden, false, Q},
			"record a non-terminal state":       {invalid, false, Q},
			"cancel":                            {0, true, C},
			"requeue from b":                    {0, false, Q},
			"requeue from a":                    {0, false, Q},
		},
		"running": {
			"claim by c":                        {conflict, false, R},
			"record succeeded by b (attempt 2)": {0, true, S},
			"record failed by b (attempt 2)":    {0, true, F},
			"record cancelled by b (attempt 2)": {0, false, R}, // nobody cancelled it
			"record succeeded by a (attempt 1)": {0, true, S},  // superseded, but first: the work was done
			"record cancelled by a (attempt 1)": {0, false, R}, // superseded: never cancels
			"record by a for attempt 2":         {forbidden, false, R},
			"record a non-terminal state":       {invalid, false, R},
			"cancel":                            {0, true, R}, // flagged; its worker is told
			"requeue from b":                    {0, true, Q},
			"requeue from a":                    {0, false, R},
		},
		"running, cancel asked": {
			"claim by c":                        {conflict, false, R},
			"record succeeded by b (attempt 2)": {0, true, S},
			"record failed by b (attempt 2)":    {0, true, F},
			"record cancelled by b (attempt 2)": {0, true, C},
			"record succeeded by a (attempt 1)": {0, true, S},
			"record cancelled by a (attempt 1)": {0, false, R},
			"record by a for attempt 2":         {forbidden, false, R},
			"record a non-terminal state":       {invalid, false, R},
			"cancel":                            {0, false, R},
			"requeue from b":                    {0, true, C},
			"requeue from a":                    {0, false, R},
		},
		"running its last attempt": {
			"claim by c":                        {conflict, false, R},
			"record succeeded by b (attempt 2)": {0, true, S},
			"record failed by b (attempt 2)":    {0, true, F},
			"record cancelled by b (attempt 2)": {0, false, R},
			"record succeeded by a (attempt 1)": {0, true, S},
			"record cancelled by a (attempt 1)": {0, false, R},
			"record by a for attempt 2":         {forbidden, false, R},
			"record a non-terminal state":       {invalid, false, R},
			"cancel":                            {0, true, R},
			"requeue from b":                    {0, true, F}, // worker_lost
			"requeue from a":                    {0, false, R},
		},
	}
	for _, done := range []InvocationState{S, F, C} {
		want[string(done)] = map[string]step{
			"claim by c":                        {conflict, false, done},
			"record succeeded by b (attempt 2)": {0, false, done},
			"record failed by b (attempt 2)":    {0, false, done},
			"record cancelled by b (attempt 2)": {0, false, done},
			"record succeeded by a (attempt 1)": {0, false, done},
			"record cancelled by a (attempt 1)": {0, false, done},
			"record by a for attempt 2":         {forbidden, false, done},
			"record a non-terminal state":       {invalid, false, done},
			"cancel":                            {conflict, false, done},
			"requeue from b":                    {0, false, done},
			"requeue from a":                    {0, false, done},
		}
	}
	states := invocationStates()
	if len(states) != len(want) {
		t.Fatalf("%d states, %d rows of expectations", len(states), len(want))
	}
	for sname, inv := range states {
		row, ok := want[sname]
		if !ok || len(row) != len(events) {
			t.Fatalf("state %q: %d expectations for %d events", sname, len(row), len(events))
		}
		for ename, ev := range events {
			t.Run(sname+"/"+ename, func(t *testing.T) {
				before := fmt.Sprintf("%+v", inv)
				next, got := ev(inv)
				if got != row[ename] {
					t.Fatalf("got %s, want %s", got, row[ename])
				}
				if after := fmt.Sprintf("%+v", inv); after != before {
					t.Fatalf("the transition changed its receiver: %s → %s", before, after)
				}
				if !got.changed && fmt.Sprintf("%+v", next) != before {
					t.Fatalf("an unchanged answer differs from the invocation: %+v", next)
				}
				if next.Version != inv.Version {
					t.Fatalf("the transition moved the version (the store's job)")
				}
			})
		}
	}
}

func record(o Outcome, now time.Time) func(Invocation) (Invocation, step) {
	return func(inv Invocation) (Invocation, step) {
		next, recorded, err := inv.Record(o, now)
		return next, step{KindOf(err), recorded, next.State}
	}
}

func requeue(worker string, now time.Time) func(Invocation) (Invocation, step) {
	return func(inv Invocation) (Invocation, step) {
		next, changed := inv.Requeue(worker, Loss{EndStale, "lost"}, now)
		return next, step{0, changed, next.State}
	}
}

// TestInvocationTransitionDetails: what each legal transition writes
// besides the state.
func TestInvocationTransitionDetails(t *testing.T) {
	now := t0.Add(time.Minute)
	st := invocationStates()

	claimed, err := st["requeued"].Claim(Worker{ID: "c"}, now)
	if err != nil || claimed.Attempt != 3 || claimed.WorkerID != "c" || !claimed.StartedAt.Equal(now) ||
		len(claimed.Attempts) != 3 || !reflect.DeepEqual(claimed.Attempts[2], Attempt{Attempt: 3, WorkerID: "c", ClaimedAt: now}) {
		t.Errorf("claim: %+v %v", claimed, err)
	}
	if len(st["requeued"].Attempts) != 2 {
		t.Errorf("claim appended to its receiver's history")
	}
	keyed := st["queued"]
	keyed.HostKey = "hk1_x"
	if _, err := keyed.Claim(Worker{ID: "c", HostKey: "hk1_y"}, now); KindOf(err) != KindConflict {
		t.Errorf("claim by a worker with another host key: %v, want a conflict", err)
	}
	if got, err := keyed.Claim(Worker{ID: "c", HostKey: "hk1_x"}, now); err != nil || got.State != StateRunning {
		t.Errorf("claim by a worker with its host key: %+v %v", got, err)
	}
	// A worker with no key has run no host setup: it never takes keyed
	// work, whatever partitions a claim reads.
	if got, err := keyed.Claim(Worker{ID: "c"}, now); KindOf(err) != KindConflict || got.State != StateQueued || got.WorkerID != "" {
		t.Errorf("claim of keyed work by a worker with no key: %+v %v, want a conflict and the invocation still queued", got, err)
	}

	code := 3
	o := Outcome{WorkerID: "a", Attempt: 1, State: StateFailed, ExitCode: &code, ResultBlob: `{"k":1}`,
		Error: &ErrorInfo{Type: "exit", Message: "exit 3"}, StdoutTail: "out", StderrTail: "err"}
	rec, ok, err := st["running"].Record(o, now)
	if err != nil || !ok || rec.WorkerID != "a" || rec.ExitCode != &code || rec.ResultBlob != o.ResultBlob ||
		rec.Error != o.Error || rec.StdoutTail != "out" || rec.StderrTail != "err" || !rec.FinishedAt.Equal(now) {
		t.Errorf("record: %+v %v %v; want the outcome of a's attempt, a as the worker whose outcome won", rec, ok, err)
	}

	c, _, _ := st["queued"].Cancel(now)
	if !c.CancelRequested || !c.FinishedAt.Equal(now) || c.Error == nil || c.Error.Type != "cancelled" {
		t.Errorf("cancel of queued work: %+v", c)
	}
	c, _, _ = st["running"].Cancel(now)
	if !c.CancelRequested || !c.FinishedAt.IsZero() || c.WorkerID != "b" {
		t.Errorf("cancel of running work: %+v", c)
	}

	q, _ := st["running"].Requeue("b", Loss{EndBye, "bye"}, now)
	if q.WorkerID != "" || q.Attempt != 2 || !q.FinishedAt.IsZero() || q.Error != nil {
		t.Errorf("requeue: %+v; want queued, no holder, attempt kept for the next claim", q)
	}
	f, _ := st["running its last attempt"].Requeue("b", Loss{EndBye, "bye"}, now)
	if f.Error == nil || f.Error.Type != ErrorTypeWorkerLost || !f.FinishedAt.Equal(now) || f.WorkerID != "" {
		t.Errorf("requeue of the last attempt: %+v; want failed worker_lost", f)
	}
	x, _ := st["running, cancel asked"].Requeue("b", Loss{EndBye, "bye"}, now)
	if x.Error == nil || x.Error.Type != "cancelled" || !x.FinishedAt.Equal(now) {
		t.Errorf("requeue with a cancel pending: %+v; want cancelled", x)
	}
}

func TestNewInvocation(t *testing.T) {
	inv := NewInvocation("inv_1", Spec{Queue: "q", Argv: []string{"true"}, MaxAttempts: 3,
		RunConfig: RunConfig{HostSetup: []string{"apt-get install -y x"}}}, t0)
	if inv.State != StateQueued || inv.Attempt != 0 || inv.HostKey == "" || !inv.CreatedAt.Equal(t0) || inv.Version != 0 {
		t.Errorf("NewInvocation = %+v", inv)
	}
	if NewInvocation("inv_2", Spec{Queue: "q"}, t0).HostKey != "" {
		t.Error("no host setup, yet a host key")
	}
}

// TestAttemptHistory walks one invocation through a lost worker, a
// redelivery and a late outcome from the first worker, and checks what its
// history says of each attempt at every step.
func TestAttemptHistory(t *testing.T) {
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	inv := NewInvocation("inv_1", Spec{Queue: "q", Argv: []string{"true"}, MaxAttempts: 3}, t0)
	inv, err := inv.Claim(Worker{ID: "a"}, at(1))
	if err != nil {
		t.Fatal(err)
	}
	if got := inv.Attempts[0]; got.Outcome != "" || !got.EndedAt.IsZero() || got.Recorded {
		t.Fatalf("a running attempt reads ended: %+v", got)
	}

	lost, _ := inv.Requeue("a", Loss{EndStale, "worker stale: silent for 1m5s"}, at(2))
	if got := lost.Attempts[0]; got.Outcome != string(EndStale) || !got.EndedAt.Equal(at(2)) || got.Reason != "worker stale: silent for 1m5s" || got.Recorded {
		t.Fatalf("taken back from a stale worker: %+v", got)
	}
	if inv.Attempts[0].Outcome != "" {
		t.Fatal("Requeue wrote into its receiver's history")
	}

	again, _ := lost.Claim(Worker{ID: "b"}, at(3))
	zero := 0
	late, ok, err := again.Record(Outcome{WorkerID: "a", Attempt: 1, State: StateSucceeded, ExitCode: &zero}, at(4))
	if err != nil || !ok {
		t.Fatalf("a's late success: %v %v", ok, err)
	}
	first, second := late.Attempts[0], late.Attempts[1]
	if first.Outcome != string(StateSucceeded) || !first.Recorded || first.ExitCode == nil || *first.ExitCode != 0 ||
		!first.EndedAt.Equal(at(4)) || !strings.Contains(first.Reason, "taken back (stale)") {
		t.Errorf("attempt 1 after its late outcome: %+v", first)
	}
	if second.Outcome != string(EndSuperseded) || second.Recorded || !second.EndedAt.Equal(at(4)) || second.Reason != "attempt 1's outcome was recorded first" {
		t.Errorf("attempt 2, running when attempt 1's outcome won: %+v", second)
	}
	if again.Attempts[1].Outcome != "" || len(again.Attempts) != 2 {
		t.Error("Record wrote into its receiver's history")
	}

	// Attempt 2's own outcome no longer counts, and its history stays.
	if after, ok, _ := late.Record(Outcome{WorkerID: "b", Attempt: 2, State: StateCancelled}, at(5)); ok || after.Attempts[1].Outcome != string(EndSuperseded) {
		t.Errorf("b's cancelled outcome after the supersede: %v %+v", ok, after.Attempts[1])
	}

	// A failed outcome names its error; the last lost attempt shows how it
	// was lost while the invocation reads worker_lost.
	code := 3
	failed, _, _ := again.Record(Outcome{WorkerID: "b", Attempt: 2, State: StateFailed, ExitCode: &code,
		Error: &ErrorInfo{Type: "timeout", Message: "ran past timeout_s 5"}}, at(5))
	if got := failed.Attempts[1]; got.Outcome != string(StateFailed) || !got.Recorded || *got.ExitCode != 3 || got.Reason != "timeout: ran past timeout_s 5" {
		t.Errorf("a failed outcome: %+v", got)
	}
	spent := again
	spent.MaxAttempts = 2
	gone, _ := spent.Requeue("b", Loss{EndBye, "bye: drain"}, at(5))
	if gone.State != StateFailed || gone.Attempts[1].Outcome != string(EndBye) || gone.Attempts[1].Recorded {
		t.Errorf("the last attempt lost: %s %+v", gone.State, gone.Attempts[1])
	}
}

// TestRetryPolicy: a failing body runs again only when its policy names the
// failure, while attempts remain, after a doubling backoff; the history
// shows each retried attempt; the last failure, or one the policy does not
// name, is recorded as the outcome.
func TestRetryPolicy(t *testing.T) {
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	three, nine := 3, 9
	fail := func(inv Invocation, code *int, typ string, now time.Time) (Invocation, bool) {
		t.Helper()
		next, ok, err := inv.Record(Outcome{WorkerID: inv.WorkerID, Attempt: inv.Attempt, State: StateFailed, ExitCode: code,
			Error: &ErrorInfo{Type: typ, Message: "x"}}, now)
		if err != nil {
			t.Fatal(err)
		}
		return next, ok
	}
	claim := func(inv Invocation, now time.Time) Invocation {
		t.Helper()
		next, err := inv.Claim(Worker{ID: "w"}, now)
		if err != nil {
			t.Fatalf("claim: %v", err)
		}
		return next
	}
	inv := NewInvocation("inv_1", Spec{Queue: "q", MaxAttempts: 3, Retry: &RetryPolicy{ExitCodes: []int{3}, BackoffS: 10}}, t0)

	r1, ok := fail(claim(inv, at(0)), &three, ErrorTypeExitCode, at(1))
	if !ok || r1.State != StateQueued || !r1.RetryAt.Equal(at(11)) || r1.Attempts[0].Outcome != string(StateFailed) ||
		!r1.Attempts[0].Retried || r1.Attempts[0].Recorded || r1.FinishedAt != (time.Time{}) {
		t.Fatalf("first failure: %s retry at %v, %+v", r1.State, r1.RetryAt, r1.Attempts[0])
	}
	if _, err := r1.Claim(Worker{ID: "w"}, at(5)); KindOf(err) != KindConflict {
		t.Fatalf("claimed during its backoff: %v", err)
	}
	if _, changed := r1.ReleaseRetry(at(10)); changed {
		t.Fatal("released before its backoff passed")
	}
	rel, changed := r1.ReleaseRetry(at(11))
	if !changed || !rel.RetryAt.IsZero() {
		t.Fatalf("release: %v %+v", changed, rel.RetryAt)
	}
	r2, _ := fail(claim(rel, at(12)), &three, ErrorTypeSignal, at(13))
	if !r2.RetryAt.Equal(at(33)) {
		t.Fatalf("second retry at %v, want the backoff doubled (20s after %v)", r2.RetryAt, at(13))
	}
	rel2, _ := r2.ReleaseRetry(at(33))
	last, _ := fail(claim(rel2, at(34)), &three, ErrorTypeExitCode, at(35))
	if last.State != StateFailed || !last.Attempts[2].Recorded || last.Attempts[2].Retried || !last.RetryAt.IsZero() {
		t.Fatalf("the last attempt's failure: %s %+v", last.State, last.Attempts[2])
	}

	// Failures the policy does not name are the outcome at once.
	if got, _ := fail(claim(inv, at(0)), &nine, ErrorTypeExitCode, at(1)); got.State != StateFailed {
		t.Errorf("exit 9, not named: %s", got.State)
	}
	if got, _ := fail(claim(inv, at(0)), nil, ErrorTypeTimeout, at(1)); got.State != StateFailed {
		t.Errorf("timeout, not named: %s", got.State)
	}
	timeouts := inv
	timeouts.Retry = &RetryPolicy{Timeout: true, BackoffS: 1}
	if got, _ := fail(claim(timeouts, at(0)), nil, ErrorTypeTimeout, at(1)); got.State != StateQueued {
		t.Errorf("timeout, named: %s", got.State)
	}
	asked, _, _ := claim(inv, at(0)).Cancel(at(1))
	if got, _ := fail(asked, &three, ErrorTypeExitCode, at(2)); got.State != StateFailed {
		t.Errorf("a failure after an operator's cancel: %s; want it recorded, not retried", got.State)
	}
	none := claim(NewInvocation("inv_2", Spec{Queue: "q", MaxAttempts: 3}, t0), at(0))
	if got, _ := fail(none, &three, ErrorTypeExitCode, at(1)); got.State != StateFailed {
		t.Errorf("no policy: %s; the default retries only lost workers", got.State)
	}
	if d := (&RetryPolicy{BackoffS: 600}).backoff(5); d != MaxRetryBackoff {
		t.Errorf("backoff capped at %s, want %s", d, MaxRetryBackoff)
	}
}

// TestRequeuedAck: a worker's requeued report hands back the attempt
// running now (attempt + 1 at the next claim, nothing terminal, so no
// count moves); it counts only for that attempt, is forbidden to a worker
// that did not run it, gives way to an operator's cancel, and ends the
// invocation failed once max_attempts is spent.
func TestRequeuedAck(t *testing.T) {
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	inv := NewInvocation("inv_1", Spec{Queue: "q", Argv: []string{"train"}, MaxAttempts: 2}, t0)
	inv, _ = inv.Claim(Worker{ID: "a"}, at(1))
	code := 75
	req := Outcome{WorkerID: "a", Attempt: 1, State: AckRequeued, ExitCode: &code}

	back, ok, err := inv.Record(req, at(2))
	if err != nil || !ok || back.State != StateQueued || back.WorkerID != "" || !back.FinishedAt.IsZero() {
		t.Fatalf("requeued: %v %v %+v", ok, err, back)
	}
	if got := back.Attempts[0]; got.Outcome != string(EndRequeued) || got.Recorded || got.ExitCode == nil || *got.ExitCode != 75 ||
		!got.EndedAt.Equal(at(2)) || !strings.Contains(got.Reason, "asked to be handed back as worker a drained") {
		t.Errorf("the requeued attempt's history: %+v", got)
	}
	if inv.Attempts[0].Outcome != "" {
		t.Error("Record wrote into its receiver's history")
	}
	if again, ok, _ := back.Record(req, at(3)); ok || again.State != StateQueued {
		t.Errorf("a second requeued report counted: %v %s", ok, again.State)
	}
	if _, _, err := inv.Record(Outcome{WorkerID: "b", Attempt: 1, State: AckRequeued}, at(2)); KindOf(err) != KindForbidden {
		t.Errorf("another worker's requeued report: %v", err)
	}

	second, _ := back.Claim(Worker{ID: "b"}, at(3))
	if second.Attempt != 2 {
		t.Fatalf("next claim is attempt %d", second.Attempt)
	}
	if late, ok, _ := second.Record(req, at(4)); ok || late.State != StateRunning || late.WorkerID != "b" {
		t.Errorf("attempt 1's requeued report, late, moved attempt 2: %v %+v", ok, late)
	}
	spent, ok, _ := second.Record(Outcome{WorkerID: "b", Attempt: 2, State: AckRequeued}, at(4))
	if !ok || spent.State != StateFailed || spent.Error == nil || spent.Error.Type != ErrorTypeWorkerLost ||
		!strings.Contains(spent.Error.Message, "no attempt left") {
		t.Errorf("requeued on the last attempt: %v %+v", ok, spent)
	}

	cancelled, _, _ := second.Cancel(at(4))
	if c, ok, _ := cancelled.Record(Outcome{WorkerID: "b", Attempt: 2, State: AckRequeued}, at(5)); !ok || c.State != StateCancelled {
		t.Errorf("requeued after an operator's cancel: %v %s", ok, c.State)
	}
}

// TestLateRequeuedAckOfAnEarlierAttemptOfTheSameWorker: worker a's attempt
// 1 is taken back (it went stale), a claims the invocation again as
// attempt 2, and then a's spooled requeued report for attempt 1 arrives.
// It names a worker that runs the invocation now, but not the attempt it
// runs: it hands nothing back. Were it to, attempt 2 would be queued
// while a still ran it, and the work would run twice at once.
func TestLateRequeuedAckOfAnEarlierAttemptOfTheSameWorker(t *testing.T) {
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	inv := NewInvocation("inv_1", Spec{Queue: "q", Argv: []string{"train"}, MaxAttempts: 3}, t0)
	inv, _ = inv.Claim(Worker{ID: "a"}, at(1))
	inv, changed := inv.Requeue("a", Loss{Kind: EndStale, Why: "worker stale"}, at(2))
	if !changed || inv.State != StateQueued {
		t.Fatalf("attempt 1 taken back: %v %+v", changed, inv)
	}
	second, err := inv.Claim(Worker{ID: "a"}, at(3))
	if err != nil || second.Attempt != 2 || !second.Running("a") {
		t.Fatalf("a's second claim: %v %+v", err, second)
	}

	code := 75
	late, ok, err := second.Record(Outcome{WorkerID: "a", Attempt: 1, State: AckRequeued, ExitCode: &code}, at(4))
	if err != nil || ok {
		t.Errorf("a's late requeued report of attempt 1: counted %v, err %v; want a no-op", ok, err)
	}
	if late.State != StateRunning || late.Attempt != 2 || late.WorkerID != "a" || !late.RetryAt.IsZero() {
		t.Errorf("after a's late report of attempt 1: %s attempt %d on %q, want attempt 2 still running on a",
			late.State, late.Attempt, late.WorkerID)
	}
	if got := late.Attempts[1]; got.Outcome != "" || !got.EndedAt.IsZero() {
		t.Errorf("attempt 2's history after the late report: %+v, want it still running", got)
	}
	if got := late.Attempts[0]; got.Outcome != string(EndStale) {
		t.Errorf("attempt 1's history after the late report: %+v, want it still stale", got)
	}
}

// TestRerun: only a failed invocation is queued again; its failure no
// longer counts (the recorded attempt reads retried) and it gets its
// max_attempts again on top of the attempts it used.
func TestRerun(t *testing.T) {
	for name, inv := range invocationStates() {
		if inv.State == StateFailed {
			continue
		}
		if next, changed := inv.Rerun(t0); changed || next.State != inv.State {
			t.Errorf("%s: rerun changed it to %s", name, next.State)
		}
	}
	code := 1
	failed := Invocation{ID: "inv_1", State: StateFailed, Attempt: 2, MaxAttempts: 3, ExitCode: &code,
		Error: &ErrorInfo{Type: ErrorTypeExitCode}, ResultBlob: `{"x":1}`, FinishedAt: t0,
		Attempts: []Attempt{{Attempt: 1, Outcome: string(EndStale)}, {Attempt: 2, Outcome: string(StateFailed), Recorded: true}}}
	next, changed := failed.Rerun(t0.Add(time.Minute))
	if !changed || next.State != StateQueued || next.MaxAttempts != 5 || next.ExitCode != nil || next.Error != nil ||
		next.ResultBlob != "" || !next.FinishedAt.IsZero() || next.CountedAttempt() != 0 || !next.Attempts[1].Retried {
		t.Fatalf("rerun of a failed invocation: %+v", next)
	}
	if !failed.Attempts[1].Recorded {
		t.Fatal("rerun changed the invocation it was given")
	}
}

// handOut claims inv for worker w at now, failing the test on a refusal.
func handOut(t *testing.T, inv Invocation, w string, now time.Time) Invocation {
	t.Helper()
	next, err := inv.Claim(Worker{ID: w}, now)
	if err != nil {
		t.Fatalf("claim of attempt %d: %v", inv.Attempt+1, err)
	}
	return next
}

// TestAHandOutNeverReceivedIsGivenBack: an attempt its worker's poll never
// listed (the run command was lost, or the poll's answer never reached the
// daemon) does not spend one of max_attempts, so an overloaded control
// plane that loses poll answers cannot fail work that never ran. An attempt
// its worker lost after receiving it still counts.
func TestAHandOutNeverReceivedIsGivenBack(t *testing.T) {
	inv := Invocation{ID: "inv_1", State: StateQueued, MaxAttempts: 2, CreatedAt: t0}
	omitted := Loss{Kind: EndUndelivered, Why: "never received"}
	for i := range 5 {
		inv = handOut(t, inv, "a", t0)
		var changed bool
		inv, changed = inv.Requeue("a", omitted, t0)
		if !changed || inv.State != StateQueued {
			t.Fatalf("hand-out %d omitted: %s (changed %v), want queued again", i+1, inv.State, changed)
		}
	}
	if inv.MaxAttempts != 7 || inv.Attempt != 5 {
		t.Fatalf("after 5 omitted hand-outs: attempt %d of %d, want 5 of 7", inv.Attempt, inv.MaxAttempts)
	}
	for i, a := range inv.Attempts {
		if a.Outcome != string(EndUndelivered) {
			t.Fatalf("history[%d] = %+v, want it to show the omission", i, a)
		}
	}
	// Received and lost (its worker went silent, or its poll listed it
	// once and then no more): each of the two attempts left counts.
	inv = handOut(t, inv, "a", t0)
	inv, _ = inv.Requeue("a", Loss{Kind: EndOmitted, Why: "omitted from its worker's poll"}, t0)
	if inv.State != StateQueued {
		t.Fatalf("first counted loss: %s, want queued", inv.State)
	}
	inv = handOut(t, inv, "a", t0)
	inv, _ = inv.Requeue("a", Loss{Kind: EndStale, Why: "lost"}, t0)
	if inv.State != StateFailed || inv.Error == nil || inv.Error.Type != ErrorTypeWorkerLost {
		t.Fatalf("second counted loss: %s %+v, want failed worker_lost", inv.State, inv.Error)
	}
}

// TestHandOutsAreBounded: undelivered attempts are given back only up to
// FreeUndelivered, and no invocation is handed out more than MaxHandOuts
// times in all, so a daemon that drops every run command (or an ack the
// control plane refuses every time) cannot keep one invocation cycling.
func TestHandOutsAreBounded(t *testing.T) {
	omitted := Loss{Kind: EndUndelivered, Why: "never received"}
	inv := Invocation{ID: "inv_1", State: StateQueued, MaxAttempts: 1, CreatedAt: t0}
	for inv.State == StateQueued {
		inv = handOut(t, inv, "a", t0)
		inv, _ = inv.Requeue("a", omitted, t0)
		if inv.Attempt > MaxHandOuts {
			t.Fatalf("handed out %d times", inv.Attempt)
		}
	}
	if inv.State != StateFailed || inv.Attempt != FreeUndelivered+1 || !strings.Contains(inv.Error.Message, "never received") {
		t.Fatalf("after %d undelivered: %s %+v, want failed after %d", inv.Attempt, inv.State, inv.Error, FreeUndelivered+1)
	}

	// Even an attempt given back ends the invocation at MaxHandOuts, however
	// high reruns and given-back attempts took max_attempts.
	worn := handOut(t, Invocation{ID: "inv_3", State: StateQueued, Attempt: MaxHandOuts - 1, MaxAttempts: MaxHandOuts + 5, CreatedAt: t0}, "a", t0)
	if worn, _ = worn.Requeue("a", omitted, t0); worn.State != StateFailed || !strings.Contains(worn.Error.Message, "the most one invocation may be") {
		t.Fatalf("attempt %d of %d never received: %s %+v, want failed at the bound", worn.Attempt, worn.MaxAttempts, worn.State, worn.Error)
	}

	// Reruns raise max_attempts, but never past MaxHandOuts.
	failed := Invocation{ID: "inv_2", State: StateFailed, Attempt: MaxHandOuts - 1, MaxAttempts: MaxHandOuts - 1}
	next, changed := failed.Rerun(t0)
	if !changed || next.MaxAttempts != MaxHandOuts {
		t.Fatalf("rerun one short of the bound: %v, max_attempts %d, want %d", changed, next.MaxAttempts, MaxHandOuts)
	}
	failed.Attempt, failed.MaxAttempts = MaxHandOuts, MaxHandOuts
	if next, changed := failed.Rerun(t0); changed || next.State != StateFailed {
		t.Fatalf("rerun of an invocation handed out %d times: %s (changed %v), want it left failed", MaxHandOuts, next.State, changed)
	}
}

// TestUndelivered: an attempt is undelivered when the worker's poll before
// the one that omits it did not list it either.
func TestUndelivered(t *testing.T) {
	inv := handOut(t, Invocation{ID: "inv_1", State: StateQueued, MaxAttempts: 3, CreatedAt: t0}, "a", t0)
	for _, c := range []struct {
		prior []string
		want  bool
	}{
		{nil, true},                         // no list: the poll that claimed it, or an older daemon's
		{[]string{}, true},                  // the poll that claimed it ran nothing
		{[]string{"inv_2"}, true},           // ... or something else
		{[]string{"inv_0", "inv_1"}, false}, // a poll after the claim listed it: received
	} {
		if got := inv.Undelivered(c.prior); got != c.want {
			t.Errorf("prior poll listed %v: undelivered %v, want %v", c.prior, got, c.want)
		}
	}
	if (Invocation{ID: "inv_1", State: StateQueued}).Undelivered(nil) {
		t.Error("a queued invocation reads undelivered")
	}
}

// TestHeartbeatKeepsWhatThePollListed: the row keeps the poll's list, for
// the next poll's Undelivered; a poll without one leaves none.
func TestHeartbeatKeepsWhatThePollListed(t *testing.T) {
	w := Worker{ID: "a", State: WorkerActive, LastSeenAt: t0}
	listed := []string{"inv_1"}
	next, err := w.Heartbeat(Poll{Phase: PhaseReady, Inflight: listed}, t0)
	if err != nil || !reflect.DeepEqual(next.Listed, []string{"inv_1"}) {
		t.Fatalf("after a poll listing inv_1: %v %v", next.Listed, err)
	}
	listed[0] = "inv_9"
	if next.Listed[0] != "inv_1" {
		t.Fatal("the row shares the poll's slice")
	}
	if next, _ = next.Heartbeat(Poll{Phase: PhaseReady}, t0); next.Listed != nil {
		t.Fatalf("after a poll with no list: %v, want none", next.Listed)
	}
}
