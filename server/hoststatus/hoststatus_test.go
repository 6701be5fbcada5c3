package hoststatus_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/hoststatus"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/schema"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

func TestMain(m *testing.M) { storetest.Main(m) }

func TestHostStatusOf(t *testing.T) {
	for _, tc := range []struct {
		state string
		want  domain.HostStatus
		ok    bool
	}{
		{"pending", domain.HostPending, true},
		{"running", domain.HostRunning, true},
		{"stopping", domain.HostStopped, true},
		{"stopped", domain.HostStopped, true},
		{"shutting-down", domain.HostTerminated, true},
		{"terminated", domain.HostTerminated, true},
		{"rebooting", "", false},
		{"", "", false},
	} {
		got, ok := hoststatus.HostStatusOf(tc.state)
		if got != tc.want || ok != tc.ok {
			t.Errorf("HostStatusOf(%q) = %q %v, want %q %v", tc.state, got, ok, tc.want, tc.ok)
		}
	}
}

func TestHostIsInstanceID(t *testing.T) {
	for id, want := range map[string]bool{
		"i-0123456789abcdef0":  true,
		"i-12345678":           true,
		"i-1234567":            false,
		"i-0123456789ABCDEF0":  false,
		"laptop":               false,
		"i-0123456789abcdef01": false,
	} {
		if got := hoststatus.IsInstanceID(id); got != want {
			t.Errorf("IsInstanceID(%q) = %v, want %v", id, got, want)
		}
	}
}

// fixture is a store on the embedded DynamoDB (its writes counted) and an
// EC2 client on moto.
type fixture struct {
	ctx    context.Context
	store  *store.Store
	svc    *control.Service
	ec2    *ec2.Client
	writes *storetest.Counter
	poller *hoststatus.Poller
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	db := storetest.Embedded(t)
	prefix := storetest.Prefix(t)
	if err := schema.EnsureTables(ctx, db, prefix); err != nil {
		t.Fatal(err)
	}
	var c storetest.Counter
	s := store.New(storetest.CountingClient(db, &c), prefix)
	e := ec2.New(ec2.Options{
		Region:       storetest.Region,
		BaseEndpoint: aws.String(storetest.MotoEndpoint(t)),
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
	})
	svc := storetest.Control(s)
	return &fixture{ctx: ctx, store: s, svc: svc, ec2: e, writes: &c, poller: &hoststatus.Poller{Store: s, Control: svc, EC2: e}}
}

// run starts n instances in moto. ami-12c6146b is one of the AMIs moto
// loads by default.
func (f *fixture) run(t *testing.T, n int) []string {
	t.Helper()
	out, err := f.ec2.RunInstances(f.ctx, &ec2.RunInstancesInput{
		ImageId: aws.String("ami-12c6146b"), MinCount: aws.Int32(int32(n)), MaxCount: aws.Int32(int32(n)),
	})
	if err != nil {
		t.Fatalf("RunInstances: %v", err)
	}
	var ids []string
	for _, inst := range out.Instances {
		ids = append(ids, aws.ToString(inst.InstanceId))
	}
	return ids
}

func (f *fixture) hello(t *testing.T, machine string) domain.Worker {
	t.Helper()
	res, err := f.svc.Register(f.ctx, wire.HelloRequest{MachineID: machine, BootID: "b"}.Registration(), func(string) (string, error) { return "h", nil })
	if err != nil {
		t.Fatal(err)
	}
	return res.Worker
}

func (f *fixture) hostStatus(t *testing.T, id string) domain.Worker {
	t.Helper()
	w, err := f.store.GetWorker(f.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func (f *fixture) poll(t *testing.T) hoststatus.Result {
	t.Helper()
	res, err := f.poller.Poll(f.ctx)
	if err != nil {
		t.Fatalf("Poll: %v", err)
	}
	return res
}

// TestHostPoll walks instances through moto's EC2: running, stopped (the
// worker reads gone and its claimed work is queued again), terminated, and
// ids EC2 never heard of (NotFound, found by splitting the batch).
func TestHostPoll(t *testing.T) {
	f := newFixture(t)
	inst := f.run(t, 3)
	a, b, c := f.hello(t, inst[0]), f.hello(t, inst[1]), f.hello(t, inst[2])
	// Unknown to moto: they make the whole batch fail with NotFound.
	ghost1, ghost2 := f.hello(t, "i-0000000000000dead"), f.hello(t, "i-00000000000000bee")
	laptop := f.hello(t, "laptop")

	if _, _, err := f.svc.Submit(f.ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"x"}, MaxAttempts: 3}.Spec()); err != nil {
		t.Fatal(err)
	}
	claim, err := f.store.Claim(f.ctx, b, "q", 1)
	if err != nil || len(claim.Claimed) != 1 {
		t.Fatalf("claim: %+v %v", claim, err)
	}
	held := claim.Claimed[0]

	res := f.poll(t)
	if res != (hoststatus.Result{Workers: 5, Instances: 5, Changed: 5}) {
		t.Fatalf("first poll: %+v", res)
	}
	for _, w := range []domain.Worker{a, b, c} {
		if got := f.hostStatus(t, w.ID).HostStatus; got != domain.HostRunning {
			t.Fatalf("worker on %s: host %q, want running", w.MachineID, got)
		}
	}
	for _, w := range []domain.Worker{ghost1, ghost2} {
		if got := f.hostStatus(t, w.ID).HostStatus; got != domain.HostTerminated {
			t.Fatalf("worker on unknown instance %s: host %q, want terminated", w.MachineID, got)
		}
	}
	if got := f.hostStatus(t, laptop.ID).HostStatus; got != "" {
		t.Fatalf("worker on a non-EC2 machine got host status %q", got)
	}

	// Nothing changed: the poll reads, and writes nothing.
	f.writes.Reset()
	if res := f.poll(t); res.Changed != 0 || res.Instances != 3 {
		t.Fatalf("unchanged poll: %+v (terminated hosts are no longer asked about)", res)
	}
	for _, op := range []string{"PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems", "BatchWriteItem"} {
		if n := f.writes.Get(op); n != 0 {
			t.Fatalf("unchanged poll made %d %s calls: %v", n, op, f.writes.Snapshot())
		}
	}

	if _, err := f.ec2.StopInstances(f.ctx, &ec2.StopInstancesInput{InstanceIds: []string{inst[1]}}); err != nil {
		t.Fatal(err)
	}
	if res := f.poll(t); res.Changed != 1 {
		t.Fatalf("poll after stop: %+v", res)
	}
	wb := f.hostStatus(t, b.ID)
	if wb.HostStatus != domain.HostStopped || domain.Project(wb, time.Now(), time.Minute) != domain.WorkerGone {
		t.Fatalf("worker on the stopped instance: host %q, reads %s", wb.HostStatus, domain.Project(wb, time.Now(), time.Minute))
	}
	if got, _ := f.store.GetInvocation(f.ctx, held.ID); got.State != domain.StateQueued {
		t.Fatalf("its claimed invocation: %s, want queued again", got.State)
	}

	if _, err := f.ec2.TerminateInstances(f.ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{inst[1], inst[2]}}); err != nil {
		t.Fatal(err)
	}
	if res := f.poll(t); res.Changed != 2 {
		t.Fatalf("poll after terminate: %+v", res)
	}
	for _, w := range []domain.Worker{b, c} {
		if got := f.hostStatus(t, w.ID).HostStatus; got != domain.HostTerminated {
			t.Fatalf("worker on terminated %s: host %q", w.MachineID, got)
		}
	}
	if got := f.hostStatus(t, a.ID).HostStatus; got != domain.HostRunning {
		t.Fatalf("worker on still-running %s: host %q", a.MachineID, got)
	}
}

func stateChange(id, state string) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{
  "version": "0",
  "id": "7bf73129-1428-4cd3-a780-95db273d1602",
  "detail-type": "EC2 Instance State-change Notification",
  "source": "aws.ec2",
  "account": "123456789012",
  "time": "2026-11-29T12:00:00Z",
  "region": "us-east-1",
  "resources": ["arn:aws:ec2:us-east-1:123456789012:instance/%[1]s"],
  "detail": {"instance-id": "%[1]s", "state": "%[2]s"}
}`, id, state))
}

// TestHostEvent: the one Lambda handler applies an EventBridge state change
// to the instance's worker without a poll, and runs a poll for a scheduled
// event.
func TestHostEvent(t *testing.T) {
	f := newFixture(t)
	inst := f.run(t, 1)
	w := f.hello(t, inst[0])
	if _, _, err := f.svc.Submit(f.ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"x"}, MaxAttempts: 3}.Spec()); err != nil {
		t.Fatal(err)
	}
	claim, err := f.store.Claim(f.ctx, w, "q", 1)
	if err != nil || len(claim.Claimed) != 1 {
		t.Fatalf("claim: %+v %v", claim, err)
	}

	scheduled := json.RawMessage(`{"version":"0","id":"x","detail-type":"Scheduled Event","source":"aws.events",
		"account":"123456789012","time":"2026-11-29T12:00:00Z","region":"us-east-1","resources":[],"detail":{}}`)
	if res, err := f.poller.Handle(f.ctx, scheduled); err != nil || res.Changed != 1 {
		t.Fatalf("scheduled event: %+v %v, want a poll that wrote running", res, err)
	}
	if got := f.hostStatus(t, w.ID).HostStatus; got != domain.HostRunning {
		t.Fatalf("after the poll: host %q", got)
	}

	// EC2 still says running; the event alone moves the worker.
	res, err := f.poller.Handle(f.ctx, stateChange(inst[0], "shutting-down"))
	if err != nil || res != (hoststatus.Result{Workers: 1, Instances: 1, Changed: 1}) {
		t.Fatalf("state-change event: %+v %v", res, err)
	}
	if got := f.hostStatus(t, w.ID).HostStatus; got != domain.HostTerminated {
		t.Fatalf("after the event: host %q, want terminated", got)
	}
	if got, _ := f.store.GetInvocation(f.ctx, claim.Claimed[0].ID); got.State != domain.StateQueued {
		t.Fatalf("claimed invocation after the event: %s, want queued", got.State)
	}
	// A repeat is a no-op; so is an instance no worker runs on.
	if res, err := f.poller.Handle(f.ctx, stateChange(inst[0], "terminated")); err != nil || res.Changed != 0 {
		t.Fatalf("repeated event: %+v %v", res, err)
	}
	if res, err := f.poller.Handle(f.ctx, stateChange("i-0123456789abcdef0", "running")); err != nil || res.Workers != 0 {
		t.Fatalf("event for an unknown instance: %+v %v", res, err)
	}
	// Other detail types given to HandleEvent are ignored.
	var other events.CloudWatchEvent
	if err := json.Unmarshal(stateChange(inst[0], "running"), &other); err != nil {
		t.Fatal(err)
	}
	other.DetailType = "EC2 Spot Instance Interruption Warning"
	if res, err := f.poller.HandleEvent(f.ctx, other); err != nil || res != (hoststatus.Result{}) {
		t.Fatalf("other detail type: %+v %v", res, err)
	}
	if _, err := f.poller.Handle(f.ctx, json.RawMessage(`{"detail-type":`)); err == nil {
		t.Fatal("malformed event: no error")
	}
}
