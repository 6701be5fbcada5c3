package tests

import (
	"context"
	"encoding/base64"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/dreamlake/lakeshore/server/provision"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/hostkey"
	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestProvisionLaunchesAHostThatRunsTheWork: `lakeshore dev`
// with provisioning on, over moto's DynamoDB and EC2. Work whose host setup
// no live worker has makes the provisioner launch one instance from the
// launch template, tagged with its queue and host key, whose user data
// carries those host setup commands, and write a pending worker for it; a
// real nymph started as that host (its instance id, the host setup file
// from its user data) adopts the pending worker, runs the setup, claims
// and finishes the work. Nothing else is launched meanwhile.
func TestProvisionLaunchesAHostThatRunsTheWork(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ec2c, template := motoLaunchTemplate(t, "lakeshore-e2e-")
	d := startDev(t, backends[1], "--provision-launch-template", template, "--provision-max-hosts", "3", "--provision-interval", "1s")
	op := d.Operator()
	setup := []string{"echo warm " + template} // its own host key: moto is shared by the package's tests
	inv, _, err := op.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"true"}, RunConfig: wire.RunConfig{HostSetup: setup}})
	if err != nil {
		t.Fatal(err)
	}

	instance := launchedFor(t, ec2c, setup)
	id := aws.ToString(instance.InstanceId)
	var pending wire.Worker
	waittest.Until(t, 30*time.Second, "a pending worker for the instance", func() bool {
		ws, err := op.ListWorkers(ctx, 100, "")
		if err != nil {
			return false
		}
		for _, w := range ws.Workers {
			if w.MachineID == id && w.State == "pending" {
				pending = w
				return true
			}
		}
		return false
	})

	// The host setup reaches the host in its user data, as the file its
	// nymph reads (--host-setup-file): start nymph as user-data.sh would.
	setupFile := hostSetupFileOf(t, ec2c, instance)
	// --keep-alive as the launched host's settings say, shortened: once the
	// queue is drained it leaves (bye idle) and the host powers off.
	n := startNymph(t, d, id, "--machine-id", id, "--host-setup-file", setupFile, "--capacity", "2", "--keep-alive", "3s")
	got := waitTerminal(t, op, inv.InvocationID, time.Minute)
	if got.State != wire.StateSucceeded || got.WorkerID != pending.WorkerID {
		t.Fatalf("the work ended %s on %s; want succeeded on the adopted worker %s", got.State, got.WorkerID, pending.WorkerID)
	}

	// The operator's view of what the provisioner did.
	lsHosts := func() string {
		cmd := exec.Command(lakeshoreBin(t), "ls", "hosts")
		cmd.Env = append(os.Environ(), "LAKESHORE_URL="+d.URL, "LAKESHORE_TOKEN="+d.OperatorToken)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("lakeshore ls hosts: %v\n%s", err, out)
		}
		return string(out)
	}
	if out := lsHosts(); !strings.Contains(out, id) || !strings.Contains(out, "launched") || !strings.Contains(out, "queued work had no free slot") {
		t.Fatalf("lakeshore ls hosts while it works:\n%s", out)
	}

	// Scale to zero: the queue is drained, the worker leaves by its
	// keep-alive, the provisioner lets the host go and terminates its
	// instance, and launches nothing more.
	if code := n.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("nymph left by its keep-alive with exit %d, want 0", code)
	}
	waittest.Until(t, 30*time.Second, "the instance terminated once its worker left", func() bool {
		out, err := ec2c.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
		return err == nil && len(out.Reservations) == 1 &&
			out.Reservations[0].Instances[0].State.Name == ec2types.InstanceStateNameTerminated
	})
	time.Sleep(3 * time.Second) // three more provisioner passes
	if launched := instancesFor(t, ec2c, setup); launched != 1 {
		t.Fatalf("%d instances launched for one invocation, want 1", launched)
	}
	if out := lsHosts(); !strings.Contains(out, "ended") || !strings.Contains(out, "its worker left") {
		t.Fatalf("lakeshore ls hosts after the queue drained:\n%s", out)
	}
}

// hostSetupFileOf writes the host setup file instance's user data carries
// (what user-data.sh hands nymph as --host-setup-file) and returns its path.
func hostSetupFileOf(t *testing.T, ec2c *ec2.Client, instance ec2types.Instance) string {
	t.Helper()
	attr, err := ec2c.DescribeInstanceAttribute(context.Background(), &ec2.DescribeInstanceAttributeInput{InstanceId: instance.InstanceId,
		Attribute: ec2types.InstanceAttributeNameUserData})
	if err != nil || attr.UserData == nil {
		t.Fatalf("the instance's user data: %v", err)
	}
	raw, err := base64.StdEncoding.DecodeString(aws.ToString(attr.UserData.Value))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`echo ([A-Za-z0-9+/=]+) \| base64 -d >/etc/lakeshore/host-setup.json`).FindStringSubmatch(string(raw))
	if m == nil {
		t.Fatalf("no host setup file in the user data:\n%s", raw)
	}
	hostSetup, err := base64.StdEncoding.DecodeString(m[1])
	if err != nil {
		t.Fatal(err)
	}
	setupFile := filepath.Join(t.TempDir(), "host-setup.json")
	if err := os.WriteFile(setupFile, hostSetup, 0o600); err != nil {
		t.Fatal(err)
	}
	return setupFile
}

// launchedFor waits for an instance launched for setup's host key.
func launchedFor(t *testing.T, ec2c *ec2.Client, setup []string) ec2types.Instance {
	t.Helper()
	var instance ec2types.Instance
	waittest.Until(t, time.Minute, "an instance launched for the work", func() bool {
		out, err := ec2c.DescribeInstances(context.Background(), &ec2.DescribeInstancesInput{Filters: []ec2types.Filter{
			{Name: aws.String("tag:" + provision.TagHostKey), Values: []string{hostkey.Of(setup)}},
			{Name: aws.String("instance-state-name"), Values: []string{"pending", "running"}},
		}})
		if err != nil || len(out.Reservations) == 0 {
			return false
		}
		instance = out.Reservations[0].Instances[0]
		return true
	})
	return instance
}

// TestProvisionFailedHostSetupIsHeldBack: the launched host's real nymph
// fails its host setup and exits 4 after its keep-alive; the provisioner
// sees the failed setup in its worker row, lets the host go and launches
// no other in its place (its key waits out a backoff), and `lakeshore get`
// of the queued work says why it waits, with the setup's output.
func TestProvisionFailedHostSetupIsHeldBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ec2c, template := motoLaunchTemplate(t, "lakeshore-e2e-")
	d := startDev(t, backends[1], "--provision-launch-template", template, "--provision-max-hosts", "3", "--provision-interval", "1s")
	op := d.Operator()
	setup := []string{"echo trying " + template + "; exit 1"}
	inv, _, err := op.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"true"}, RunConfig: wire.RunConfig{HostSetup: setup}})
	if err != nil {
		t.Fatal(err)
	}
	instance := launchedFor(t, ec2c, setup)
	id := aws.ToString(instance.InstanceId)
	n := startNymph(t, d, id, "--machine-id", id, "--host-setup-file", hostSetupFileOf(t, ec2c, instance), "--capacity", "2", "--keep-alive", "2s")
	if code := n.wait(t, 30*time.Second); code != 4 {
		t.Fatalf("nymph whose host setup failed exited %d, want 4", code)
	}
	waittest.Until(t, 30*time.Second, "the queued work saying why it waits", func() bool {
		got, err := op.GetInvocation(ctx, inv.InvocationID)
		return err == nil && strings.Contains(got.WaitingReason, "host setup failed") && strings.Contains(got.WaitingReason, "trying")
	})
	time.Sleep(3 * time.Second) // three more provisioner passes
	if launched := instancesFor(t, ec2c, setup); launched != 1 {
		t.Fatalf("%d instances launched within the backoff, want 1", launched)
	}
	got, err := op.GetInvocation(ctx, inv.InvocationID)
	if err != nil || got.State != wire.StateQueued {
		t.Fatalf("the work: %+v %v; want still queued", got, err)
	}
	t.Logf("waiting_reason: %s", got.WaitingReason)
	if m := scrape(t, d.URL+"/metrics"); m[`lakeshore_provision_held_total{queue="q",stopped="false"}`] < 1 {
		t.Fatalf("/metrics does not count the held key: %v", m)
	}

	// The operator releases the key: its work no longer says it waits,
	// and a host is launched for it again.
	r, err := op.ReleaseHold(ctx, wire.ReleaseHoldRequest{Queue: "q", HostKey: inv.HostKey})
	if err != nil || !r.Released || r.Failures != 1 {
		t.Fatalf("release: %+v %v; want the key's one failure released", r, err)
	}
	if got, err := op.GetInvocation(ctx, inv.InvocationID); err != nil || got.WaitingReason != "" {
		t.Fatalf("released work: %+v %v; want no waiting_reason", got, err)
	}
	waittest.Until(t, 30*time.Second, "a host launched for the released key", func() bool { return instancesFor(t, ec2c, setup) == 2 })
}

// TestProvisionNudgedBySubmit: a submit nudges the provisioner, so the
// host is launched within seconds, not at the next interval (an hour
// here): in process, and through the real bootstraps (--lambdas), where
// the api function invokes the provisioner function asynchronously through
// the Lambda Invoke API, as on AWS.
func TestProvisionNudgedBySubmit(t *testing.T) {
	t.Parallel()
	t.Run("in process", func(t *testing.T) { testProvisionNudged(t, backends[1]) })
	t.Run("lambdas", func(t *testing.T) {
		rieBin(t)
		testProvisionNudged(t, backend{"moto-lambdas", func(t testing.TB) ([]string, []string) {
			args, env := backends[1].setup(t)
			return append(args, "--lambdas", lambdaDist(t)), env
		}})
	})
}

func testProvisionNudged(t *testing.T, b backend) {
	ctx := context.Background()
	ec2c, template := motoLaunchTemplate(t, "lakeshore-nudge-")
	d := startDev(t, b, "--provision-launch-template", template, "--provision-max-hosts", "3", "--provision-interval", "1h")
	setup := []string{"echo nudged " + template}
	if _, _, err := d.Operator().Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"true"}, RunConfig: wire.RunConfig{HostSetup: setup}}); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 30*time.Second, "an instance launched right after the submit", func() bool { return instancesFor(t, ec2c, setup) == 1 })
}

// TestProvisionAsksAGenericWorkerToAdopt (`nymph --adopt-host-setup`):
// with provisioning on, work whose host setup no live worker has goes first
// to an idle generic worker that may adopt: the real nymph runs that host setup in phase setup, advertises the derived
// key and runs the work, and nothing is launched for it. A second generic
// nymph asked for a host setup that fails stays generic and keeps working
// (generic work still reaches it); the provisioner launches a host for
// that key instead.
func TestProvisionAsksAGenericWorkerToAdopt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ec2c, template := motoLaunchTemplate(t, "lakeshore-adopt-")
	d := startDev(t, backends[1], "--provision-launch-template", template, "--provision-max-hosts", "3", "--provision-interval", "1s")
	op := d.Operator()
	instancesOf := func(setup []string) int { return instancesFor(t, ec2c, setup) }

	generic := startNymph(t, d, "generic-1", "--adopt-host-setup", "--capacity", "2")
	waitReady(t, op, "generic-1")
	marker := filepath.Join(t.TempDir(), "warmed")
	setup := []string{"echo warm " + template + " > " + marker}
	inv, _, err := op.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"cat", marker}, RunConfig: wire.RunConfig{HostSetup: setup}})
	if err != nil {
		t.Fatal(err)
	}
	got := waitTerminal(t, op, inv.InvocationID, time.Minute)
	w, _ := workerNamed(ctx, op, "generic-1")
	if got.State != wire.StateSucceeded || got.WorkerID != w.WorkerID {
		t.Fatalf("the work ended %s on %s; want succeeded on the generic worker %s that adopted its key", got.State, got.WorkerID, w.WorkerID)
	}
	if w.HostKey != hostkey.Of(setup) || w.Adoption != nil {
		t.Fatalf("the adopting worker: key %q adoption %+v; want the work's key %s, the adoption over", w.HostKey, w.Adoption, hostkey.Of(setup))
	}
	generic.waitLog(t, 5*time.Second, "adopted a host key")
	if n := instancesOf(setup); n != 0 {
		t.Fatalf("%d instances launched for work a generic worker adopted, want 0", n)
	}

	// An adoption that fails.
	other := startNymph(t, d, "generic-2", "--adopt-host-setup")
	waitReady(t, op, "generic-2")
	bad := []string{"echo broken " + template + "; exit 3"}
	if _, _, err := op.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"true"}, RunConfig: wire.RunConfig{HostSetup: bad}}); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, time.Minute, "the failed adoption shown on the worker, and a host launched instead", func() bool {
		w, ok := workerNamed(ctx, op, "generic-2")
		return ok && w.Adoption != nil && w.Adoption.Failed != "" && w.HostKey == "" && instancesOf(bad) == 1
	})
	other.waitLog(t, 5*time.Second, "adopted host setup failed; staying generic")
	// Still generic, still ready: generic work reaches it (generic-1 is
	// keyed now but takes generic work too; either may run it).
	plain, _, err := op.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := waitTerminal(t, op, plain.InvocationID, time.Minute); got.State != wire.StateSucceeded {
		t.Fatalf("generic work after the failed adoption ended %s", got.State)
	}
	if w, _ := workerNamed(ctx, op, "generic-2"); w.State != "active" || w.Phase != wire.PhaseReady {
		t.Fatalf("the worker whose adoption failed is %s/%s, want active/ready", w.State, w.Phase)
	}
}

// waitReady waits for the worker labelled label to be active and ready.
func waitReady(t *testing.T, op *client.Client, label string) {
	t.Helper()
	waittest.Until(t, 30*time.Second, label+" ready", func() bool {
		w, ok := workerNamed(context.Background(), op, label)
		return ok && w.State == "active" && w.Phase == wire.PhaseReady
	})
}

// motoLaunchTemplate is an EC2 client of moto's and a launch template of
// this test's own there, named prefix + the test's table prefix (moto is
// shared by the package's tests).
func motoLaunchTemplate(t *testing.T, prefix string) (*ec2.Client, string) {
	t.Helper()
	endpoint := storetest.MotoEndpoint(t)
	ec2c := ec2.NewFromConfig(aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("test", "test", "")},
		func(o *ec2.Options) { o.BaseEndpoint = aws.String(endpoint) })
	template := prefix + strings.TrimSuffix(storetest.Prefix(t), "-")
	if _, err := ec2c.CreateLaunchTemplate(context.Background(), &ec2.CreateLaunchTemplateInput{LaunchTemplateName: aws.String(template),
		LaunchTemplateData: &ec2types.RequestLaunchTemplateData{ImageId: aws.String("ami-12c6146b"), InstanceType: ec2types.InstanceTypeT3Micro}}); err != nil {
		t.Fatalf("moto CreateLaunchTemplate: %v", err)
	}
	return ec2c, template
}

// instancesFor counts the instances launched for work with host setup
// (tagged with its host key), whatever their state.
func instancesFor(t *testing.T, ec2c *ec2.Client, setup []string) int {
	t.Helper()
	out, err := ec2c.DescribeInstances(context.Background(), &ec2.DescribeInstancesInput{Filters: []ec2types.Filter{
		{Name: aws.String("tag:" + provision.TagHostKey), Values: []string{hostkey.Of(setup)}}}})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range out.Reservations {
		n += len(r.Instances)
	}
	return n
}
