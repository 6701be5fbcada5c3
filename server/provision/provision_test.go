package provision_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"

	"github.com/dreamlake/lakeshore/server/metrics"
	"github.com/dreamlake/lakeshore/server/provision"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/schema"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/ids"
	"github.com/dreamlake/lakeshore/shared/wire"
)

func TestMain(m *testing.M) { storetest.Main(m) }

// templateUserData is the test launch template's own user data.
const templateUserData = "#!/bin/bash\necho from the launch template\n"

// world is moto's EC2 and DynamoDB (or another DynamoDB: newWorldOn), one
// launch template, fresh tables.
type world struct {
	t        *testing.T
	ctx      context.Context
	ec2      *ec2.Client
	db       store.DB
	prefix   string
	clock    *clock.Fake
	template string
	st       *store.Store
}

func newWorld(t *testing.T) *world {
	t.Helper()
	return newWorldOn(t, storetest.Client(storetest.MotoEndpoint(t)))
}

// newWorldOn is a world whose tables are in db, EC2 still moto's.
func newWorldOn(t *testing.T, db *dynamodb.Client) *world {
	t.Helper()
	endpoint := storetest.MotoEndpoint(t)
	ctx := context.Background()
	ec2c := ec2.NewFromConfig(aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("test", "test", "")},
		func(o *ec2.Options) { o.BaseEndpoint = aws.String(endpoint) })
	name := "lakeshore-test-" + strings.ToLower(storetest.Prefix(t))
	name = strings.NewReplacer("_", "-", "/", "-").Replace(name)
	if _, err := ec2c.CreateLaunchTemplate(ctx, &ec2.CreateLaunchTemplateInput{
		LaunchTemplateName: aws.String(name),
		LaunchTemplateData: &ec2types.RequestLaunchTemplateData{ImageId: aws.String("ami-12c6146b"), InstanceType: ec2types.InstanceTypeT3Micro,
			UserData: aws.String(base64.StdEncoding.EncodeToString([]byte(templateUserData)))},
	}); err != nil {
		t.Fatalf("moto CreateLaunchTemplate: %v", err)
	}
	prefix := storetest.Prefix(t)
	if err := schema.EnsureTables(ctx, db, prefix); err != nil {
		t.Fatal(err)
	}
	c := clock.NewFake(time.Now().UTC().Truncate(time.Second))
	w := &world{t: t, ctx: ctx, ec2: ec2c, db: db, prefix: prefix, clock: c, template: name}
	w.st = w.store()
	return w
}

// store is a fresh store over the world's tables (its own caches: a second
// Lambda instance).
func (w *world) store() *store.Store {
	s := store.New(w.db, w.prefix)
	s.Clock, s.IDs = w.clock.Clock(), &ids.Generator{Clock: w.clock.Clock()}
	return s
}

func (w *world) provisioner(s provision.Store, lim domain.ProvisionLimits) *provision.Provisioner {
	return provision.New(provision.Config{Store: s, EC2: w.ec2, LaunchTemplate: w.template, Limits: lim,
		Clock: w.clock.Clock(), HostSetup: func(ctx context.Context, q, hk string) ([]string, error) { return []string{"echo warm"}, nil }})
}

// submit queues n invocations of queue q with host setup.
func (w *world) submit(q string, n int, hostSetup ...string) {
	w.t.Helper()
	svc := storetest.Control(w.st)
	for range n {
		if _, _, err := svc.Submit(w.ctx, wire.SubmitRequest{Queue: q, Argv: []string{"true"}, MaxAttempts: 3,
			RunConfig: wire.RunConfig{HostSetup: hostSetup}}.Spec()); err != nil {
			w.t.Fatal(err)
		}
	}
}

// instances lists the running instances tagged with one of hostIDs.
func (w *world) instances(hosts []domain.Host) []ec2types.Instance {
	w.t.Helper()
	var want []string
	for _, h := range hosts {
		if h.InstanceID != "" {
			want = append(want, h.InstanceID)
		}
	}
	if len(want) == 0 {
		return nil
	}
	return w.describe(&ec2.DescribeInstancesInput{InstanceIds: want})
}

// describe lists the instances in moto that in asks for.
func (w *world) describe(in *ec2.DescribeInstancesInput) []ec2types.Instance {
	w.t.Helper()
	out, err := w.ec2.DescribeInstances(w.ctx, in)
	if err != nil {
		w.t.Fatalf("DescribeInstances: %v", err)
	}
	var got []ec2types.Instance
	for _, r := range out.Reservations {
		got = append(got, r.Instances...)
	}
	return got
}

func (w *world) alive() []domain.Host {
	w.t.Helper()
	_, hosts, err := w.st.Fleet(w.ctx)
	if err != nil {
		w.t.Fatal(err)
	}
	for _, h := range hosts {
		if !h.Alive() {
			w.t.Fatalf("the fleet read a host that ended: %+v", h)
		}
	}
	return hosts
}

func tag(in ec2types.Instance, k string) string {
	for _, t := range in.Tags {
		if aws.ToString(t.Key) == k {
			return aws.ToString(t.Value)
		}
	}
	return ""
}

// TestPassLaunchesWhatTheWorkNeeds: 20 invocations of one key, 4 a host →
// 5 instances from the launch template, tagged with queue, key and host
// id; a second pass launches none (they are pending); a queue with no
// queued work gets nothing.
func TestPassLaunchesWhatTheWorkNeeds(t *testing.T) {
	w := newWorld(t)
	w.submit("gpu", 20, "echo warm")
	p := w.provisioner(w.st, domain.ProvisionLimits{MaxHosts: 50, SlotsPerHost: 4})
	res, err := p.Pass(w.ctx)
	if err != nil || res.Launched != 5 || res.Failed != 0 {
		t.Fatalf("first pass: %+v %v; want 5 launched", res, err)
	}
	hosts := w.alive()
	insts := w.instances(hosts)
	if len(hosts) != 5 || len(insts) != 5 {
		t.Fatalf("%d hosts alive, %d instances; want 5 and 5", len(hosts), len(insts))
	}
	for _, h := range hosts {
		if h.State != domain.LaunchRunning || h.Key.Queue != "gpu" || h.Key.HostKey == "" || len(h.HostSetup) != 1 {
			t.Errorf("host %+v", h)
		}
	}
	for _, in := range insts {
		if tag(in, provision.TagQueue) != "gpu" || !strings.HasPrefix(tag(in, provision.TagHostKey), "hk1_") || !ids.Valid(ids.Host, tag(in, provision.TagHostID)) {
			t.Errorf("instance %s tags %v", aws.ToString(in.InstanceId), in.Tags)
		}
	}
	if res, err := p.Pass(w.ctx); err != nil || res.Launched != 0 {
		t.Fatalf("second pass: %+v %v; want nothing more (5 pending hosts cover the work)", res, err)
	}

	// Its user data: the host's settings first (queue, capacity, its exact
	// host setup), then the launch template's own.
	raw := w.userData(aws.ToString(insts[0].InstanceId))
	settings, setup := provision.ReadUserData(t, raw)
	if !strings.Contains(string(raw), "echo from the launch template") || !strings.Contains(settings, "QUEUE=gpu\n") ||
		!strings.Contains(settings, "CAPACITY=4\n") || !strings.Contains(settings, "NYMPH_HOST_SETUP_FILE=/etc/lakeshore/host-setup.json") ||
		setup != `["echo warm"]` {
		t.Fatalf("user data:\n%s\nsettings:\n%s\nhost setup %s", raw, settings, setup)
	}
}

// userData is the user data instance was launched with, decoded.
func (w *world) userData(instance string) string {
	w.t.Helper()
	attr, err := w.ec2.DescribeInstanceAttribute(w.ctx, &ec2.DescribeInstanceAttributeInput{
		InstanceId: aws.String(instance), Attribute: ec2types.InstanceAttributeNameUserData})
	if err != nil || attr.UserData == nil {
		w.t.Fatalf("user data of %s: %v", instance, err)
	}
	raw, err := base64.StdEncoding.DecodeString(aws.ToString(attr.UserData.Value))
	if err != nil {
		w.t.Fatalf("user data of %s: %v", instance, err)
	}
	return string(raw)
}

// TestPassKeepsToTheCap: with at most 2 hosts, exactly 2.
func TestPassKeepsToTheCap(t *testing.T) {
	w := newWorld(t)
	w.submit("gpu", 20, "echo warm")
	p := w.provisioner(w.st, domain.ProvisionLimits{MaxHosts: 2, SlotsPerHost: 4})
	for range 3 {
		if _, err := p.Pass(w.ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(w.alive()); n != 2 {
		t.Fatalf("%d hosts alive under a cap of 2", n)
	}
}

// TestRacingPassesNeverLaunchTwice: two provisioners (two Lambda instances,
// each with its own store) pass at once, 20 rounds, over demand that needs
// 5 hosts: never more than 5 hosts, and the instances are the hosts.
//
// The tables are the embedded store's, where a transaction is atomic as on
// DynamoDB. On the shared moto_server two racing reservations can both pass
// their condition on the ledger (it serves requests on threads and its
// backend takes no lock; see storetest.MotoEndpoint), and this test failed
// there once in CI with 10 hosts for 5, the emulator's race, not ours.
func TestRacingPassesNeverLaunchTwice(t *testing.T) {
	w := newWorldOn(t, storetest.Embedded(t))
	w.submit("gpu", 20, "echo warm")
	lim := domain.ProvisionLimits{MaxHosts: 50, SlotsPerHost: 4}
	// Both passes' first reservations meet before either is sent, so both
	// plan on the same read of the fleet and only the ledger's condition
	// stands between them and 10 hosts.
	meet := newBarrier(2)
	ps := []*provision.Provisioner{
		w.provisioner(meetingStore{w.store(), meet}, lim),
		w.provisioner(meetingStore{w.store(), meet}, lim),
	}
	for round := range 20 {
		var wg sync.WaitGroup
		errs := make([]error, len(ps))
		for i, p := range ps {
			wg.Go(func() { _, errs[i] = p.Pass(w.ctx) })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if n := len(w.alive()); n > 5 {
			t.Fatalf("round %d: %d hosts for demand that needs 5", round, n)
		}
	}
	hosts := w.alive()
	if len(hosts) != 5 || len(w.instances(hosts)) != 5 {
		t.Fatalf("%d hosts, %d instances after the race; want 5 and 5", len(hosts), len(w.instances(hosts)))
	}
}

// meetingStore holds each pass's first reservation until the other pass's
// first one arrives (or a while passes: a pass that plans nothing never
// comes).
type meetingStore struct {
	*store.Store
	meet *barrier
}

func (m meetingStore) ReserveHosts(ctx context.Context, version int64, hosts []domain.Host) error {
	m.meet.wait(5 * time.Second)
	return m.Store.ReserveHosts(ctx, version, hosts)
}

// barrier lets its first n waiters go together; later waiters pass at once.
type barrier struct {
	mu      sync.Mutex
	left    int
	arrived chan struct{}
}

func newBarrier(n int) *barrier { return &barrier{left: n, arrived: make(chan struct{})} }

// wait blocks until n waiters have come, or for at most d.
func (b *barrier) wait(d time.Duration) {
	b.mu.Lock()
	if b.left > 0 {
		if b.left--; b.left == 0 {
			close(b.arrived)
		}
	}
	b.mu.Unlock()
	select {
	case <-b.arrived:
	case <-time.After(d):
	}
}

// TestRefusedLaunchIsKeptAndRetried: a launch template that does not exist
// is refused: the reason is on the host, nothing is counted against the
// cap, no second try inside the backoff, and a try after it.
func TestRefusedLaunchIsKeptAndRetried(t *testing.T) {
	w := newWorld(t)
	p := w.provisioner(w.st, domain.ProvisionLimits{MaxHosts: 5, SlotsPerHost: 4})
	w.templateGone(p)
	w.submit("gpu", 4, "echo warm")
	res, err := p.Pass(w.ctx)
	if err != nil || res.Failed != 1 || res.Launched != 0 {
		t.Fatalf("pass with a missing template: %+v %v; want one refused launch", res, err)
	}
	hosts, _ := w.st.Hosts(w.ctx)
	if len(hosts) != 1 || hosts[0].State != domain.LaunchFailed || hosts[0].Reason == "" {
		t.Fatalf("hosts %+v; want one failed with its reason", hosts)
	}
	t.Logf("refusal kept: %s", hosts[0].Reason)
	if len(w.alive()) != 0 {
		t.Fatal("a refused launch counts against the cap")
	}
	if res, _ := p.Pass(w.ctx); res.Reserved != 0 {
		t.Fatalf("retried inside the backoff: %+v", res)
	}
	w.clock.Advance(31 * time.Second)
	if res, _ := p.Pass(w.ctx); res.Reserved != 1 || res.Failed != 1 {
		t.Fatalf("after the backoff: %+v; want one more try (refused again)", res)
	}
	w.clock.Advance(31 * time.Second)
	if res, _ := p.Pass(w.ctx); res.Reserved != 0 {
		t.Fatalf("the second refusal's backoff is 60s, not 30s: %+v", res)
	}
}

// templateGone lets p find the launch template (a pass with nothing
// queued), then deletes it: p's launches from it are refused.
func (w *world) templateGone(p *provision.Provisioner) {
	w.t.Helper()
	if res, err := p.Pass(w.ctx); err != nil || res != (provision.Result{}) {
		w.t.Fatalf("pass with nothing queued: %+v %v", res, err)
	}
	if _, err := w.ec2.DeleteLaunchTemplate(w.ctx, &ec2.DeleteLaunchTemplateInput{LaunchTemplateName: aws.String(w.template)}); err != nil {
		w.t.Fatalf("moto DeleteLaunchTemplate: %v", err)
	}
}

// launchOne queues 4 invocations of one key and runs the pass that
// launches their host (caps 5 hosts, 4 slots a host).
func (w *world) launchOne() (*provision.Provisioner, domain.Host) {
	w.t.Helper()
	w.submit("gpu", 4, "echo warm")
	p := w.provisioner(w.st, domain.ProvisionLimits{MaxHosts: 5, SlotsPerHost: 4})
	if res, err := p.Pass(w.ctx); err != nil || res.Launched != 1 {
		w.t.Fatalf("launch: %+v %v", res, err)
	}
	return p, w.alive()[0]
}

// TestHostThatNeverSaysHelloIsTerminated: a launched host with no worker
// after the hello timeout is terminated in EC2 and its demand counts again.
func TestHostThatNeverSaysHelloIsTerminated(t *testing.T) {
	w := newWorld(t)
	p, first := w.launchOne()
	w.clock.Advance(provision.DefaultHelloTimeout + time.Minute)
	res, err := p.Pass(w.ctx)
	if err != nil || res.Ended != 1 || res.Launched != 0 || res.Held != 1 {
		t.Fatalf("after the hello timeout: %+v %v; want the silent host let go and its key held back", res, err)
	}
	w.clock.Advance(provision.DefaultBackoff.Min + time.Second)
	if res, err := p.Pass(w.ctx); err != nil || res.Launched != 1 {
		t.Fatalf("after the backoff: %+v %v; want one launched in its place", res, err)
	}
	insts := w.instances([]domain.Host{first})
	if len(insts) != 1 || insts[0].State == nil || (insts[0].State.Name != ec2types.InstanceStateNameTerminated && insts[0].State.Name != ec2types.InstanceStateNameShuttingDown) {
		t.Fatalf("the silent instance: %+v", insts)
	}
	hosts, _ := w.st.Hosts(w.ctx)
	for _, h := range hosts {
		if h.ID == first.ID && (h.State != domain.LaunchEnded || !strings.Contains(h.Reason, "never said hello")) {
			t.Fatalf("the silent host: %+v", h)
		}
	}
	if err := w.st.EachWorker(w.ctx, "test", func(wk domain.Worker) error {
		if wk.MachineID == first.InstanceID && (wk.State != domain.WorkerGone || !strings.Contains(wk.GoneWhy, "never said hello")) {
			t.Errorf("the silent host's pending worker: %s %q; want gone, saying why", wk.State, wk.GoneWhy)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestLateHelloOfALetGoHostIsANewWorker: a launched host that never said
// hello in time is let go, its pending row gone. A hello its daemon still
// sends after that does not adopt the gone row (a retired worker never
// comes back): it makes a new worker, and the old row stays gone.
func TestLateHelloOfALetGoHostIsANewWorker(t *testing.T) {
	w := newWorld(t)
	p, host := w.launchOne()
	var pendingID string
	if err := w.st.EachWorker(w.ctx, "test", func(wk domain.Worker) error {
		if wk.Pending() && wk.MachineID == host.InstanceID {
			pendingID = wk.ID
		}
		return nil
	}); err != nil || pendingID == "" {
		t.Fatalf("no pending row for instance %s after the launch (%v)", host.InstanceID, err)
	}
	w.clock.Advance(provision.DefaultHelloTimeout + time.Minute)
	if res, err := p.Pass(w.ctx); err != nil || res.Ended != 1 {
		t.Fatalf("after the hello timeout: %+v %v; want the silent host let go", res, err)
	}
	reg, err := storetest.Control(w.st).Register(w.ctx, wire.HelloRequest{MachineID: host.InstanceID, BootID: "boot-late",
		Lanes: []string{"gpu"}, HostKey: host.Key.HostKey}.Registration(), func(string) (string, error) { return "hash", nil })
	if err != nil || reg.Worker.ID == pendingID || reg.Worker.State != domain.WorkerJoining {
		t.Fatalf("late hello from the let-go host: %+v %v; want a new joining worker, not %s", reg.Worker, err, pendingID)
	}
	if old, err := w.st.GetWorker(w.ctx, pendingID); err != nil || old.State != domain.WorkerGone {
		t.Fatalf("the let-go pending row after the late hello: %s %v; want still gone", old.State, err)
	}
}

// TestHelloAdoptsTheLaunchedHost: a launch writes a pending worker row for
// its instance; the host's hello (machine id = instance id) adopts that
// row instead of making a new worker, and from then on its free slots, not
// the pending launch, cover the work.
func TestHelloAdoptsTheLaunchedHost(t *testing.T) {
	w := newWorld(t)
	p, host := w.launchOne()
	var pending []domain.Worker
	if err := w.st.EachWorker(w.ctx, "test", func(wk domain.Worker) error {
		pending = append(pending, wk)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(pending) != 1 || !pending[0].Pending() || pending[0].MachineID != host.InstanceID || !strings.Contains(pending[0].Label, host.ID) {
		t.Fatalf("workers after the launch: %+v; want one pending row for instance %s", pending, host.InstanceID)
	}
	four := 4
	reg, err := storetest.Control(w.st).Register(w.ctx, wire.HelloRequest{MachineID: host.InstanceID, BootID: "boot-1",
		Lanes: []string{"gpu"}, HostKey: host.Key.HostKey, Capabilities: wire.Capabilities{MaxConcurrency: &four}}.Registration(),
		func(string) (string, error) { return "hash", nil })
	if err != nil || reg.Worker.ID != pending[0].ID || reg.Worker.State != domain.WorkerJoining || reg.Retired != "" {
		t.Fatalf("hello from the launched host: %+v %v; want worker %s adopted, nothing retired", reg, err, pending[0].ID)
	}
	w.clock.Advance(provision.DefaultHelloTimeout + time.Minute)
	if _, err := storetest.Control(w.st).Heartbeat(w.ctx, wire.PollRequest{WorkerID: reg.Worker.ID, Phase: wire.PhaseReady}.Poll(), nil); err != nil {
		t.Fatal(err)
	}
	if res, err := p.Pass(w.ctx); err != nil || res.Launched != 0 || res.Ended != 0 {
		t.Fatalf("pass after the hello: %+v %v; want the adopted host kept and nothing launched", res, err)
	}

	// Its worker goes silent past the stale window: it may come back, so
	// the host is neither let go nor replaced.
	w.clock.Advance(2 * time.Minute)
	if res, err := p.Pass(w.ctx); err != nil || res.Launched != 0 || res.Ended != 0 {
		t.Fatalf("pass with the host's worker stale: %+v %v; want it kept, nothing launched", res, err)
	}

	// The queue drains, the worker leaves by its keep-alive: the host is
	// let go, nothing is launched, and the fleet is empty.
	svc := storetest.Control(w.st)
	invs, _, err := w.st.ListInvocations(w.ctx, "gpu", domain.StateQueued, 100, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, inv := range invs {
		if _, err := svc.Cancel(w.ctx, inv.ID); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := svc.Bye(w.ctx, wire.ByeRequest{WorkerID: reg.Worker.ID, Reason: wire.ByeIdle}.Bye(), nil); err != nil {
		t.Fatal(err)
	}
	res, err := p.Pass(w.ctx)
	if err != nil || res.Ended != 1 || res.Launched != 0 || len(w.alive()) != 0 {
		t.Fatalf("pass after the drain: %+v %v, %d hosts alive; want the host let go, nothing launched, none alive", res, err, len(w.alive()))
	}
	// Its instance is terminated too (it powers itself off; this makes sure).
	for _, in := range w.instances([]domain.Host{host}) {
		if st := in.State.Name; st != ec2types.InstanceStateNameTerminated && st != ec2types.InstanceStateNameShuttingDown {
			t.Fatalf("instance %s of the host let go is %s, want terminated", host.InstanceID, st)
		}
	}
	if res, _ := p.Pass(w.ctx); res != (provision.Result{}) {
		t.Fatalf("a pass over an empty queue did something: %+v", res)
	}
}

// TestIdleGenericWorkerIsAskedToAdopt: an idle generic worker that said
// hello with adopt_host_setup is asked to take on the key of queued work
// nothing serves before anything is launched for it, and its slots count:
// 6 queued, 4 a host → one asked, one host launched. Its polls carry the
// adopt command (and claim nothing) until it advertises the key; a failed
// adoption is kept, never asked again, and its slots are launched for.
func TestIdleGenericWorkerIsAskedToAdopt(t *testing.T) {
	w := newWorld(t)
	svc := storetest.Control(w.st)
	four := 4
	hello := func(boot string) string {
		reg, err := svc.Register(w.ctx, wire.HelloRequest{MachineID: "m-" + boot, BootID: boot, Lanes: []string{"gpu"},
			AdoptHostSetup: true, Capabilities: wire.Capabilities{MaxConcurrency: &four}}.Registration(), func(string) (string, error) { return "hash", nil })
		if err != nil {
			t.Fatal(err)
		}
		if _, err := svc.Heartbeat(w.ctx, wire.PollRequest{WorkerID: reg.Worker.ID, Phase: wire.PhaseReady}.Poll(), nil); err != nil {
			t.Fatal(err)
		}
		return reg.Worker.ID
	}
	generic := hello("boot-1")
	w.submit("gpu", 6, "echo warm")
	key := domain.ProvisionKey{Queue: "gpu", HostKey: hostKeyOf(t, w)}
	p := w.provisioner(w.st, domain.ProvisionLimits{MaxHosts: 5, SlotsPerHost: 4})
	if res, err := p.Pass(w.ctx); err != nil || res.Asked != 1 || res.Launched != 1 {
		t.Fatalf("first pass: %+v %v; want one worker asked, one host for the other 2", res, err)
	}
	ans, err := svc.Poll(w.ctx, wire.PollRequest{WorkerID: generic, Phase: wire.PhaseReady, Invocations: []string{}}.Poll(), nil)
	if err != nil || len(ans) != 1 || ans[0].Type != wire.CommandAdopt || ans[0].HostKey != key.HostKey ||
		!slices.Equal(ans[0].HostSetup, []string{"echo warm"}) {
		t.Fatalf("the asked worker's poll: %+v %v; want one adopt command for %s and no work", ans, err, key.HostKey)
	}
	if res, err := p.Pass(w.ctx); err != nil || res.Asked != 0 || res.Launched != 0 {
		t.Fatalf("second pass: %+v %v; want nothing more", res, err)
	}
	// It advertises the key: the adoption is over and it claims that work.
	ans, err = svc.Poll(w.ctx, wire.PollRequest{WorkerID: generic, Phase: wire.PhaseReady, HostKey: key.HostKey, Invocations: []string{}}.Poll(), nil)
	var runs []string
	for _, c := range ans {
		if c.Type == wire.CommandRun {
			runs = append(runs, c.Run.ID)
		} else {
			t.Fatalf("after adopting: command %+v", c)
		}
	}
	if err != nil || len(runs) != 4 {
		t.Fatalf("after adopting: %d runs, %v; want 4 of the key's work", len(runs), err)
	}
	if _, err := svc.Heartbeat(w.ctx, wire.PollRequest{WorkerID: generic, Phase: wire.PhaseReady, Invocations: runs}.Poll(), nil); err != nil {
		t.Fatal(err) // it runs them: no free slot
	}
	if got, _ := w.st.GetWorker(w.ctx, generic); got.Adoption != nil || got.HostKey != key.HostKey {
		t.Fatalf("adopted worker: key %q adoption %+v", got.HostKey, got.Adoption)
	}

	// A second generic worker is asked for the rest, and its host setup
	// fails: it stays generic, is not asked again, and a host is launched.
	w.submit("gpu", 8, "echo warm")
	second := hello("boot-2")
	if res, err := p.Pass(w.ctx); err != nil || res.Asked != 1 || res.Launched != 1 {
		t.Fatalf("pass with a second generic worker: %+v %v; want it asked, and a host for the 2 that leaves (10 queued, 4 pending slots)", res, err)
	}
	if _, err := svc.Poll(w.ctx, wire.PollRequest{WorkerID: second, Phase: wire.PhaseReady, AdoptFailed: key.HostKey,
		SetupResults: []wire.SetupResult{{Command: "echo warm", Status: wire.SetupFailed, ExitCode: 1}}, Invocations: []string{}}.Poll(), nil); err != nil {
		t.Fatal(err)
	}
	got, _ := w.st.GetWorker(w.ctx, second)
	if got.Adoption == nil || got.Adoption.Failed == "" || got.HostKey != "" {
		t.Fatalf("after its host setup failed: key %q adoption %+v; want generic, the failure kept", got.HostKey, got.Adoption)
	}
	res, err := p.Pass(w.ctx)
	if err != nil || res.Asked != 0 || res.Launched != 1 {
		t.Fatalf("pass after the failed adoption: %+v %v; want it not asked again, and one more host (10 queued, 8 pending slots)", res, err)
	}
}

// hostKeyOf is the host key of the world's queued work.
func hostKeyOf(t *testing.T, w *world) string {
	t.Helper()
	invs, _, err := w.st.ListInvocations(w.ctx, "gpu", domain.StateQueued, 1, "")
	if err != nil || len(invs) == 0 {
		t.Fatalf("queued work: %v", err)
	}
	return invs[0].HostKey
}

// lossyEC2 is an EC2 client for the world's moto whose requests pass
// through t. It makes one attempt a call: moto does not honour ClientToken
// (EC2 answers a repeated token with the first launch), so an SDK retry
// would be a second instance there and nowhere else.
func (w *world) lossyEC2(t *storetest.FaultyTransport) *ec2.Client {
	return ec2.NewFromConfig(aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("test", "test", "")},
		func(o *ec2.Options) {
			o.BaseEndpoint = w.ec2.Options().BaseEndpoint
			o.HTTPClient = &http.Client{Transport: t}
			o.RetryMaxAttempts = 1
		})
}

// tagged lists every instance tagged with host id, in any state.
func (w *world) tagged(hostID string) []ec2types.Instance {
	w.t.Helper()
	return w.describe(&ec2.DescribeInstancesInput{
		Filters: []ec2types.Filter{{Name: aws.String("tag:" + provision.TagHostID), Values: []string{hostID}}}})
}

// TestLostLaunchAnswerIsTracked: RunInstances reaches EC2 and launches,
// and its answer is lost (the connection drops): the pass finds the
// instance by its host-id tag and records it (the host row has its id),
// it counts against the cap, and no second instance is launched for the
// host, then or at later passes.
func TestLostLaunchAnswerIsTracked(t *testing.T) {
	w := newWorld(t)
	w.submit("gpu", 8, "echo warm") // two hosts' worth, under a cap of one
	faults := storetest.NewFaultyTransport(nil)
	p := provision.New(provision.Config{Store: w.st, EC2: w.lossyEC2(faults), LaunchTemplate: w.template, Stack: "lakeshore-test",
		Limits: domain.ProvisionLimits{MaxHosts: 1, SlotsPerHost: 4}, Clock: w.clock.Clock()})
	faults.Next("RunInstances", storetest.DropAfter)
	res, err := p.Pass(w.ctx)
	if got := faults.Injected(); len(got) != 1 {
		t.Fatalf("faults injected: %v; want the one RunInstances answer dropped", got)
	}
	if err != nil || res.Launched != 1 || res.Failed != 0 || res.Unconfirmed != 0 {
		t.Fatalf("pass with the answer lost: %+v %v; want the launch found and recorded", res, err)
	}
	hosts := w.alive()
	if len(hosts) != 1 || hosts[0].State != domain.LaunchRunning || hosts[0].InstanceID == "" {
		t.Fatalf("hosts %+v; want one launched, its instance recorded", hosts)
	}
	insts := w.tagged(hosts[0].ID)
	if len(insts) != 1 || aws.ToString(insts[0].InstanceId) != hosts[0].InstanceID || tag(insts[0], provision.TagStack) != "lakeshore-test" {
		t.Fatalf("instances of host %s: %+v; want exactly %s, tagged with the stack", hosts[0].ID, insts, hosts[0].InstanceID)
	}
	for range 2 {
		w.clock.Advance(2 * time.Minute)
		if res, err := p.Pass(w.ctx); err != nil || res.Reserved != 0 || res.Launched != 0 {
			t.Fatalf("later pass: %+v %v; want nothing (the found host fills the cap)", res, err)
		}
	}
	if n := len(w.tagged(hosts[0].ID)); n != 1 {
		t.Fatalf("%d instances for host %s after later passes; want 1", n, hosts[0].ID)
	}
}

// TestUnconfirmedLaunchStaysReserved: RunInstances never reaches EC2 and
// the client cannot tell (the connection is lost): no instance is found,
// so the host stays reserved (counted against the cap, not failed), and
// the next pass launches it, once.
func TestUnconfirmedLaunchStaysReserved(t *testing.T) {
	w := newWorld(t)
	w.submit("gpu", 8, "echo warm")
	faults := storetest.NewFaultyTransport(nil)
	p := provision.New(provision.Config{Store: w.st, EC2: w.lossyEC2(faults), LaunchTemplate: w.template,
		Limits: domain.ProvisionLimits{MaxHosts: 1, SlotsPerHost: 4}, Clock: w.clock.Clock()})
	faults.Next("RunInstances", storetest.FailBefore)
	res, err := p.Pass(w.ctx)
	if err != nil || res.Unconfirmed != 1 || res.Failed != 0 || res.Launched != 0 {
		t.Fatalf("pass with the call lost: %+v %v; want one unconfirmed launch", res, err)
	}
	hosts := w.alive()
	if len(hosts) != 1 || hosts[0].State != domain.LaunchReserved || len(w.tagged(hosts[0].ID)) != 0 {
		t.Fatalf("hosts %+v; want one still reserved, no instance", hosts)
	}
	if res, err := p.Pass(w.ctx); err != nil || res.Reserved != 0 || res.Launched != 0 {
		t.Fatalf("pass within the minute: %+v %v; want nothing (the reservation fills the cap)", res, err)
	}
	w.clock.Advance(2 * time.Minute)
	if res, err := p.Pass(w.ctx); err != nil || res.Launched != 1 || res.Reserved != 0 {
		t.Fatalf("next pass: %+v %v; want the reserved host launched", res, err)
	}
	hosts = w.alive()
	if len(hosts) != 1 || hosts[0].State != domain.LaunchRunning || len(w.tagged(hosts[0].ID)) != 1 {
		t.Fatalf("hosts %+v; want the one host launched, one instance", hosts)
	}
}

// TestRefusedLaunchAnswerIsAFailure: EC2's error answer is a refusal, not
// a lost answer: the launch is recorded failed, with EC2's code.
func TestRefusedLaunchAnswerIsAFailure(t *testing.T) {
	w := newWorld(t)
	faults := storetest.NewFaultyTransport(nil)
	p := provision.New(provision.Config{Store: w.st, EC2: w.lossyEC2(faults), LaunchTemplate: w.template,
		Limits: domain.ProvisionLimits{MaxHosts: 1, SlotsPerHost: 4}, Clock: w.clock.Clock(), HostSetup: func(context.Context, string, string) ([]string, error) { return nil, nil }})
	w.templateGone(p)
	w.submit("gpu", 4, "echo warm")
	res, err := p.Pass(w.ctx)
	if err != nil || res.Failed != 1 || res.Unconfirmed != 0 || res.Launched != 0 {
		t.Fatalf("pass with a refused launch: %+v %v; want one failed", res, err)
	}
	hosts, _ := w.st.Hosts(w.ctx)
	if len(hosts) != 1 || hosts[0].State != domain.LaunchFailed || hosts[0].Reason == "" || len(w.alive()) != 0 {
		t.Fatalf("hosts %+v; want one failed with EC2's reason, none alive", hosts)
	}
	t.Logf("refusal kept: %s", hosts[0].Reason)
}

// TestAnswerLost: what leaves a launch unknown (no answer; EC2 failing on
// its side) and what is a refusal (any other error answer, capacity
// refusals included, though EC2 sends those with a 5xx status).
func TestAnswerLost(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		lost bool
	}{
		{"connection reset", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, true},
		{"timeout", fmt.Errorf("operation error EC2: RunInstances: %w", context.DeadlineExceeded), true},
		{"internal error", &smithy.GenericAPIError{Code: "InternalError", Message: "An internal error has occurred"}, true},
		{"unavailable", &smithy.GenericAPIError{Code: "Unavailable", Message: "The server is overloaded"}, true},
		{"capacity", &smithy.GenericAPIError{Code: "InsufficientInstanceCapacity", Message: "no capacity"}, false},
		{"unauthorized", &smithy.GenericAPIError{Code: "UnauthorizedOperation", Message: "not allowed"}, false},
		{"no such template", &smithy.GenericAPIError{Code: "InvalidLaunchTemplateId.NotFound", Message: "not found"}, false},
	} {
		if got := provision.AnswerLost(c.err); got != c.lost {
			t.Errorf("%s: lost %v, want %v", c.name, got, c.lost)
		}
	}
}

// failSetup plays each launched host's nymph whose host setup fails: it
// says hello, reports its failed --host-setup command, and leaves idle
// after its keep-alive (nymph exits 4). It reports how many hosts it played.
func (w *world) failSetup(played map[string]bool) int {
	w.t.Helper()
	svc := storetest.Control(w.st)
	four := 4
	n := 0
	for _, h := range w.alive() {
		if h.InstanceID == "" || played[h.InstanceID] {
			continue
		}
		played[h.InstanceID] = true
		n++
		reg, err := svc.Register(w.ctx, wire.HelloRequest{MachineID: h.InstanceID, BootID: "boot-" + h.ID,
			Lanes: []string{h.Key.Queue}, HostKey: h.Key.HostKey, Capabilities: wire.Capabilities{MaxConcurrency: &four}}.Registration(),
			func(string) (string, error) { return "hash", nil })
		if err != nil {
			w.t.Fatal(err)
		}
		wk, err := svc.Heartbeat(w.ctx, wire.PollRequest{WorkerID: reg.Worker.ID, Phase: wire.PhaseSetup}.Poll(), nil)
		if err != nil {
			w.t.Fatal(err)
		}
		if _, err := w.st.RecordSetupResults(w.ctx, wk, []domain.SetupResult{
			{Command: "echo trying; exit 1", Status: wire.SetupFailed, ExitCode: 1, OutputTail: "trying\n"}}); err != nil {
			w.t.Fatal(err)
		}
		if _, err := svc.Bye(w.ctx, wire.ByeRequest{WorkerID: reg.Worker.ID, Reason: wire.ByeIdle}.Bye(), nil); err != nil {
			w.t.Fatal(err)
		}
	}
	return n
}

// TestFailedHostSetupBacksOffAndStops: every host launched for a key fails
// its host setup and leaves. Over a simulated hour of passes (one a
// minute) the key launches at most Backoff.MaxFailures hosts, one at a
// time after the first failure, then stops; the key's hold says why its
// queued work waits (the command and its output), and the invocation stays
// queued. Another key (another host setup) is not held back.
func TestFailedHostSetupBacksOffAndStops(t *testing.T) {
	w := newWorld(t)
	w.submit("gpu", 3, "echo trying; exit 1")
	var emf bytes.Buffer
	p := provision.New(provision.Config{Store: w.st, EC2: w.ec2, LaunchTemplate: w.template, Clock: w.clock.Clock(),
		Limits: domain.ProvisionLimits{MaxHosts: 3, SlotsPerHost: 4}, Metrics: &metrics.EMF{W: &emf, Clock: w.clock.Clock()},
		HostSetup: func(ctx context.Context, q, hk string) ([]string, error) { return []string{"echo trying; exit 1"}, nil }})
	played := map[string]bool{}
	launched, held := 0, 0
	for range 60 {
		res, err := p.Pass(w.ctx)
		if err != nil {
			t.Fatal(err)
		}
		launched += res.Launched
		held += res.Held
		w.failSetup(played)
		w.clock.Advance(time.Minute)
	}
	if launched > provision.DefaultBackoff.MaxFailures || launched == 0 {
		t.Fatalf("%d hosts launched in an hour for a key whose host setup fails; want 1-%d", launched, provision.DefaultBackoff.MaxFailures)
	}
	if held == 0 {
		t.Fatal("no pass held the key back")
	}
	t.Logf("an hour of passes: %d launches, %d passes held the key", launched, held)
	if n := strings.Count(emf.String(), `"ProvisionHeld":1`); n != held {
		t.Fatalf("%d ProvisionHeld metric lines; want one a held key a pass (%d)", n, held)
	}
	hk := hostKeyOf(t, w)
	hold, ok, err := w.st.KeyHold(w.ctx, domain.ProvisionKey{Queue: "gpu", HostKey: hk})
	if err != nil || !ok || !hold.Stopped || !hold.Waiting(w.clock.Now()) ||
		!strings.Contains(hold.Last.Reason, "host setup failed") || !strings.Contains(hold.Last.Reason, "trying") {
		t.Fatalf("the key's hold: %+v %v %v; want it stopped, saying its host setup failed with its output", hold, ok, err)
	}
	invs, _, err := w.st.ListInvocations(w.ctx, "gpu", domain.StateQueued, 100, "")
	if err != nil || len(invs) != 3 {
		t.Fatalf("queued work: %d %v; want the 3 still queued", len(invs), err)
	}

	// A new submit with another host setup is another key: it launches.
	w.submit("gpu", 1, "echo fixed")
	if res, err := p.Pass(w.ctx); err != nil || res.Launched != 1 {
		t.Fatalf("pass after a submit with another host setup: %+v %v; want one launch", res, err)
	}

	// An operator releases the stopped key (lakeshore release-hold): the
	// next pass launches for its queued work at once, hours before its
	// stop would end.
	if res, err := p.Pass(w.ctx); err != nil || res.Launched != 0 || res.Held != 1 {
		t.Fatalf("pass before the release: %+v %v; want the key held, nothing launched", res, err)
	}
	was, err := storetest.Control(w.st).ReleaseHold(w.ctx, domain.ProvisionKey{Queue: "gpu", HostKey: hk})
	if err != nil || !was.Stopped {
		t.Fatalf("release: %+v %v; want the stopped hold released", was, err)
	}
	if res, err := p.Pass(w.ctx); err != nil || res.Launched != 1 || res.Held != 0 {
		t.Fatalf("pass after the release: %+v %v; want one launch for the released key's 3 queued", res, err)
	}
}

// TestSilentHostsBackOffAndStop: 10 hosts launched for generic work never
// say hello (a broken image). Over a simulated hour of passes (one a
// minute) they are let go at the hello timeout and the queue is held
// back, not refilled with 10 more each time: at most the first batch is
// launched, the queue's hold says they never said hello, and the
// instance-time spent is within the bound docs/provision.md gives.
func TestSilentHostsBackOffAndStop(t *testing.T) {
	w := newWorld(t)
	w.submit("cpu", 40)
	p := w.provisioner(w.st, domain.ProvisionLimits{MaxHosts: 10, SlotsPerHost: 4})
	launched := 0
	for range 60 {
		res, err := p.Pass(w.ctx)
		if err != nil {
			t.Fatal(err)
		}
		launched += res.Launched
		w.clock.Advance(time.Minute)
	}
	if launched != 10 {
		t.Fatalf("%d hosts launched in an hour for a queue whose hosts never say hello; want the first 10 only", launched)
	}
	hold, ok, err := w.st.KeyHold(w.ctx, domain.ProvisionKey{Queue: "cpu"})
	if err != nil || !ok || !hold.Stopped || !strings.Contains(hold.Last.Reason, "never said hello") {
		t.Fatalf("the queue's hold: %+v %v %v; want it stopped, saying its hosts never said hello", hold, ok, err)
	}
	hosts, _ := w.st.Hosts(w.ctx)
	var spent time.Duration
	for _, h := range hosts {
		if h.State != domain.LaunchEnded || h.Failure != domain.NoHello {
			t.Fatalf("host %+v; want ended, never said hello", h)
		}
		spent += h.EndedAt.Sub(h.LaunchedAt)
	}
	if bound := 10 * (provision.DefaultHelloTimeout + time.Minute); spent > bound {
		t.Fatalf("%s of instance time spent; the bound is %s", spent, bound)
	}
	t.Logf("an hour of passes: %d launches, %s instance time", launched, spent)

	// The stop lasts 6 hours from the last failure; then one host is tried.
	w.clock.Advance(provision.DefaultBackoff.StopFor)
	if res, err := p.Pass(w.ctx); err != nil || res.Launched != 1 {
		t.Fatalf("after the stop: %+v %v; want one host tried", res, err)
	}
}

// TestMissingLaunchTemplateIsRefused: a launch template that does not
// exist refuses the pass with the error (nothing reserved or launched, a
// ProvisionRefusals metric line); once it exists, passes launch.
func TestMissingLaunchTemplateIsRefused(t *testing.T) {
	w := newWorld(t)
	w.submit("gpu", 4, "echo warm")
	var emf bytes.Buffer
	cfg := provision.Config{Store: w.st, EC2: w.ec2, LaunchTemplate: w.template + "-missing", Clock: w.clock.Clock(),
		Limits: domain.ProvisionLimits{MaxHosts: 5, SlotsPerHost: 4}, Metrics: &metrics.EMF{W: &emf, Clock: w.clock.Clock()}}
	res, err := provision.New(cfg).Pass(w.ctx)
	if !errors.Is(err, provision.ErrNoLaunchTemplate) || !strings.Contains(err.Error(), w.template+"-missing") || res != (provision.Result{}) {
		t.Fatalf("pass with a missing template: %+v %v; want refused, naming it, nothing done", res, err)
	}
	t.Logf("refused: %v", err)
	if !strings.Contains(emf.String(), `"ProvisionRefusals":1`) || !strings.Contains(emf.String(), `"Reason":"launch_template"`) {
		t.Fatalf("metric lines %q; want a ProvisionRefusals line", emf.String())
	}
	if hosts, _ := w.st.Hosts(w.ctx); len(hosts) != 0 {
		t.Fatalf("hosts %+v after a refused pass; want none", hosts)
	}
	cfg.LaunchTemplate = w.template
	if res, err := provision.New(cfg).Pass(w.ctx); err != nil || res.Launched != 1 {
		t.Fatalf("pass with the template: %+v %v; want one launch", res, err)
	}
}

// TestFairSharesAcrossPasses: a burst of 5 keys × 10 under caps of 10
// hosts / 4 a key, whose first pass saw only 8 of one key's work: the
// second pass gives the others first, and every key ends with 2 hosts.
func TestFairSharesAcrossPasses(t *testing.T) {
	w := newWorld(t)
	p := w.provisioner(w.st, domain.ProvisionLimits{MaxHosts: 10, MaxHostsPerKey: 4, SlotsPerHost: 4})
	w.submit("gpu", 8, "echo k0")
	if res, err := p.Pass(w.ctx); err != nil || res.Launched != 2 {
		t.Fatalf("first pass: %+v %v; want 2 launched", res, err)
	}
	w.submit("gpu", 2, "echo k0")
	for i := 1; i < 5; i++ {
		w.submit("gpu", 10, fmt.Sprintf("echo k%d", i))
	}
	if res, err := p.Pass(w.ctx); err != nil || res.Launched != 8 {
		t.Fatalf("second pass: %+v %v; want 8 launched", res, err)
	}
	per := map[string]int{}
	for _, h := range w.alive() {
		per[h.Key.HostKey]++
	}
	if len(per) != 5 {
		t.Fatalf("hosts by key %v; want 5 keys", per)
	}
	for hk, n := range per {
		if n != 2 {
			t.Fatalf("hosts by key %v; want 2 each (%s has %d)", per, hk, n)
		}
	}
}

// TestEndedHostsExpire: a host let go carries the table's TTL attribute,
// HostRetention after its end (a host alive carries none), and a pass
// reads past it once it has expired, before DynamoDB deletes it.
func TestEndedHostsExpire(t *testing.T) {
	w := newWorld(t)
	p, host := w.launchOne()
	expiresAt := func() types.AttributeValue {
		out, err := w.db.GetItem(w.ctx, &dynamodb.GetItemInput{TableName: aws.String(store.NamesFor(w.prefix).Hosts),
			Key: map[string]types.AttributeValue{"host_id": &types.AttributeValueMemberS{Value: host.ID}}})
		if err != nil {
			t.Fatal(err)
		}
		return out.Item["expires_at"]
	}
	if v := expiresAt(); v != nil {
		t.Fatalf("a host alive expires: %v", v)
	}
	w.clock.Advance(provision.DefaultHelloTimeout + time.Minute)
	if res, err := p.Pass(w.ctx); err != nil || res.Ended != 1 {
		t.Fatalf("let go: %+v %v", res, err)
	}
	want := fmt.Sprint(w.clock.Now().Add(store.HostRetention).Unix())
	if v, ok := expiresAt().(*types.AttributeValueMemberN); !ok || v.Value != want {
		t.Fatalf("the ended host's expires_at %v; want %s (a day after its end)", expiresAt(), want)
	}
	w.clock.Advance(store.HostRetention + time.Second)
	hosts, err := w.st.Hosts(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hosts {
		if h.ID == host.ID {
			t.Fatalf("the expired host is still read: %+v", h)
		}
	}
}
