package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/hoststatus"
	"github.com/dreamlake/lakeshore/server/reaper"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// sfEC2 answers DescribeInstances for any instance: running unless set.
type sfEC2 struct {
	mu     sync.Mutex
	states map[string]ec2types.InstanceStateName
}

func (f *sfEC2) set(id string, s ec2types.InstanceStateName) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.states[id] = s
}

func (f *sfEC2) DescribeInstances(_ context.Context, in *ec2.DescribeInstancesInput, _ ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var insts []ec2types.Instance
	for _, id := range in.InstanceIds {
		s := f.states[id]
		if s == "" {
			s = ec2types.InstanceStateNameRunning
		}
		insts = append(insts, ec2types.Instance{InstanceId: aws.String(id), State: &ec2types.InstanceState{Name: s}})
	}
	return &ec2.DescribeInstancesOutput{Reservations: []ec2types.Reservation{{Instances: insts}}}, nil
}

// sfOps runs what the scheduled Lambdas run — the reaper's sweep and the
// host-status poller — through the control plane's faulty store, and
// counts how they fared.
type sfOps struct {
	p   *sfPlane
	ec2 *sfEC2
	log *slog.Logger

	sweeps, sweepErrs, requeued atomic.Int64
	polls, pollErrs, changed    atomic.Int64
	events                      atomic.Int64
}

func (o *sfOps) sweep(ctx context.Context) error {
	res, err := reaper.Handler(sfControl(o.p.Store), nil, nil, 0, o.log)(ctx, nil)
	o.sweeps.Add(1)
	o.requeued.Add(int64(res.Requeued))
	if err != nil {
		o.sweepErrs.Add(1)
	}
	return err
}

// sfControl is the use cases over st, on st's clock, with the rig's stale
// window.
func sfControl(st *store.Store) *control.Service {
	return control.New(control.Config{Store: st, StaleAfter: sfStaleAfter, Clock: st.Clock, Logger: slog.New(slog.DiscardHandler)})
}

func (o *sfOps) poller() *hoststatus.Poller {
	return &hoststatus.Poller{Store: o.p.Store, Control: sfControl(o.p.Store), EC2: o.ec2, Logger: o.log}
}

func (o *sfOps) poll(ctx context.Context) error {
	res, err := o.poller().Handle(ctx, json.RawMessage(`{"detail-type":"Scheduled Event","source":"aws.events","detail":{}}`))
	o.polls.Add(1)
	o.changed.Add(int64(res.Changed))
	if err != nil {
		o.pollErrs.Add(1)
	}
	return err
}

// stopEvent delivers EC2's "stopping" state change for instance, retried
// as EventBridge retries a failed Lambda invocation.
func (o *sfOps) stopEvent(ctx context.Context, instance string) error {
	ev := fmt.Sprintf(`{"detail-type":%q,"source":"aws.ec2","detail":{"instance-id":%q,"state":"stopping"}}`,
		hoststatus.DetailTypeStateChange, instance)
	_, err := sfRetry(10, func() error {
		o.events.Add(1)
		res, err := o.poller().Handle(ctx, json.RawMessage(ev))
		if err == nil && res.Instances != 1 {
			err = fmt.Errorf("event handled as %+v", res)
		}
		return err
	})
	return err
}

// holding reports the current worker of machine and how many invocations
// it holds, read without faults.
func (o *sfOps) holding(ctx context.Context, machine string) (string, int) {
	id, ok, err := o.p.Truth.MachineWorker(ctx, machine)
	if err != nil || !ok {
		return "", 0
	}
	held, err := o.p.Truth.Held(ctx, id)
	if err != nil {
		return id, 0
	}
	return id, len(held)
}

func (o *sfOps) summary() string {
	return fmt.Sprintf("sweeps %d (%d failed, %d handed back), host polls %d (%d failed, %d written), %d stop-event tries",
		o.sweeps.Load(), o.sweepErrs.Load(), o.requeued.Load(), o.polls.Load(), o.pollErrs.Load(), o.changed.Load(), o.events.Load())
}

// sfTerminal counts the queue's terminal invocations, read without faults.
func sfTerminal(ctx context.Context, p *sfPlane) (int, string) {
	st, err := p.Truth.QueueStats(ctx, sfQueue)
	if err != nil {
		return 0, err.Error()
	}
	n := 0
	for s, c := range st.Counts {
		if s.Terminal() {
			n += c
		}
	}
	return n, fmt.Sprintf("%v done_count %d", st.Counts, st.DoneCount)
}

func sfAllTerminal(ctx context.Context, p *sfPlane, want int) bool {
	n, _ := sfTerminal(ctx, p)
	return n == want
}

// sfTruth is the end state, read without faults.
type sfTruth struct {
	invs     []domain.Invocation
	workers  []domain.Worker
	counters store.QueueCounters
	stats    domain.QueueStats
}

func sfReadTruth(t *testing.T, ctx context.Context, p *sfPlane) sfTruth {
	t.Helper()
	var out sfTruth
	cursor := ""
	for {
		page, next, err := p.Truth.ListInvocations(ctx, sfQueue, "", 500, cursor)
		if err != nil {
			t.Fatalf("list invocations: %v", err)
		}
		out.invs = append(out.invs, page...)
		if cursor = next; cursor == "" {
			break
		}
	}
	for {
		page, next, err := p.Truth.ListWorkers(ctx, 500, cursor)
		if err != nil {
			t.Fatalf("list workers: %v", err)
		}
		out.workers = append(out.workers, page...)
		if cursor = next; cursor == "" {
			break
		}
	}
	var err error
	if out.counters, err = p.Truth.Counters(ctx, sfQueue); err != nil {
		t.Fatalf("read the queue's counters: %v", err)
	}
	if out.stats, err = p.Truth.QueueStats(ctx, sfQueue); err != nil {
		t.Fatalf("queue stats: %v", err)
	}
	return out
}

// sfCheckCounts checks the invariants on the end state: the invocations are
// exactly those submitted, each terminal, none cancelled (no operator
// cancelled any), a failure only for a worker lost max_attempts times, and
// done_count and every per-state count equal to what the invocations say.
func sfCheckCounts(t *testing.T, out sfTruth, submitted []string) {
	t.Helper()
	want := map[string]bool{}
	for _, id := range submitted {
		want[id] = true
	}
	byState := map[domain.InvocationState]int{}
	for _, inv := range out.invs {
		byState[inv.State]++
		switch {
		case !want[inv.ID]:
			t.Errorf("invocation %s was never answered to a submit (a retried submit made a second one?)", inv.ID)
		case !inv.State.Terminal():
			t.Errorf("invocation %s is %s (attempt %d, worker %s): lost", inv.ID, inv.State, inv.Attempt, inv.WorkerID)
		case inv.State == domain.StateCancelled:
			t.Errorf("invocation %s was cancelled, and no operator cancelled anything: %+v", inv.ID, inv.Error)
		case inv.State == domain.StateFailed && (inv.Error == nil || inv.Error.Type != wire.ErrorTypeWorkerLost):
			t.Errorf("invocation %s failed: %+v", inv.ID, inv.Error)
		}
		delete(want, inv.ID)
	}
	for id := range want {
		t.Errorf("submitted invocation %s is missing", id)
	}
	terminal := byState[domain.StateSucceeded] + byState[domain.StateFailed] + byState[domain.StateCancelled]
	c := out.counters
	if c.Done != terminal || terminal != len(submitted) {
		t.Errorf("done_count %d, terminal invocations %d, submitted %d: they must be equal (states %v)", c.Done, terminal, len(submitted), byState)
	}
	if c.Succeeded != byState[domain.StateSucceeded] || c.Failed != byState[domain.StateFailed] || c.Cancelled != byState[domain.StateCancelled] {
		t.Errorf("per-state counts %+v; the invocations say %v", c, byState)
	}
	if out.stats.DoneCount != c.Done {
		t.Errorf("queue stats done_count %d, the queue row %d", out.stats.DoneCount, c.Done)
	}
	for _, s := range domain.InvocationStates {
		if out.stats.Counts[s] != byState[s] {
			t.Errorf("queue stats count %d %s (the index), the table %d", out.stats.Counts[s], s, byState[s])
		}
	}
	if byState[domain.StateFailed] > 0 {
		t.Logf("%d invocations failed as worker_lost (max_attempts spent on lost claims): allowed", byState[domain.StateFailed])
	}
}

// sfCheckRan checks that every succeeded invocation's body ran (the bodies
// append "id attempt" to ran); a redelivered body may run more than once.
func sfCheckRan(t *testing.T, ran string, out sfTruth) {
	t.Helper()
	f, err := os.Open(ran)
	if err != nil {
		t.Fatalf("ran log: %v", err)
	}
	defer f.Close()
	runs := map[string]int{}
	lines := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		id, _, _ := strings.Cut(sc.Text(), " ")
		runs[id]++
		lines++
	}
	twice := 0
	for _, inv := range out.invs {
		if inv.State == domain.StateSucceeded && runs[inv.ID] == 0 {
			t.Errorf("invocation %s succeeded but its body never ran", inv.ID)
		}
		if runs[inv.ID] > 1 {
			twice++
		}
	}
	t.Logf("bodies ran %d times for %d invocations (%d ran more than once: at least once, recorded once)", lines, len(out.invs), twice)
}
