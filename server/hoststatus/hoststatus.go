// Package hoststatus keeps the host_status of workers on EC2 instances in
// step with EC2 (docs/design.md §4–5). A worker's machine id is its instance id;
// the Poller describes the live workers' instances on a schedule and takes
// EventBridge "EC2 Instance State-change Notification" events, so a stopped
// or terminated instance's worker reads gone, and its running work is
// queued again, within seconds rather than after the stale window.
package hoststatus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/smithy-go"

	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/shared/domain"
)

// EC2 is the one EC2 call the poller makes; *ec2.Client implements it.
type EC2 interface {
	DescribeInstances(ctx context.Context, in *ec2.DescribeInstancesInput, optFns ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error)
}

var _ EC2 = (*ec2.Client)(nil)

// DetailTypeStateChange is the EventBridge detail-type of an EC2 instance
// state change.
const DetailTypeStateChange = "EC2 Instance State-change Notification"

// BatchSize is how many instance ids one DescribeInstances call names.
const BatchSize = 100

// errNotFound is the EC2 error code for an instance id EC2 does not know:
// one that never existed, or one terminated so long ago (about an hour)
// that EC2 has forgotten it.
const errNotFound = "InvalidInstanceID.NotFound"

var instanceID = regexp.MustCompile(`^i-[0-9a-f]{8,17}$`)

// IsInstanceID reports whether a machine id looks like an EC2 instance id.
// Other machine ids (a laptop, a container) have no EC2 status to track.
func IsInstanceID(machineID string) bool { return instanceID.MatchString(machineID) }

// HostStatusOf reports the host status an EC2 instance state name means,
// and false for a state name it does not know (the caller writes nothing).
func HostStatusOf(state string) (domain.HostStatus, bool) {
	switch state {
	case "pending":
		return domain.HostPending, true
	case "running":
		return domain.HostRunning, true
	case "stopping", "stopped":
		return domain.HostStopped, true
	case "shutting-down", "terminated":
		return domain.HostTerminated, true
	}
	return "", false
}

// Store is what the poller reads of the workers; *store.Store implements it.
type Store interface {
	LiveWorkersByMachine(ctx context.Context) (map[string][]domain.Worker, error)
	MachineWorker(ctx context.Context, machineID string) (string, bool, error)
	GetWorker(ctx context.Context, id string) (domain.Worker, error)
}

var _ Store = (*store.Store)(nil)

// HostStatusSetter records a host status and hands back the work of a host
// that stopped; *control.Service implements it.
type HostStatusSetter interface {
	SetHostStatus(ctx context.Context, id string, status domain.HostStatus) (domain.Worker, error)
}

var _ HostStatusSetter = (*control.Service)(nil)

// Poller writes EC2 instance states onto the workers running on them.
type Poller struct {
	Store   Store
	Control HostStatusSetter
	EC2     EC2
	Logger  *slog.Logger // nil: discard
}

// Result reports what one Poll or event did.
type Result struct {
	Workers   int // live workers on EC2 instances looked at
	Instances int // distinct instance ids asked about
	Changed   int // workers whose host status was written
}

func (p *Poller) log() *slog.Logger {
	if p.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return p.Logger
}

// Poll describes the instances of every live worker whose machine id is an
// instance id and records each changed host status (store.SetHostStatus,
// which also hands a stopped or terminated host's work back). An instance
// EC2 does not know reads terminated. Workers whose status would not change
// are not written. Errors for single workers are joined; the rest go on.
func (p *Poller) Poll(ctx context.Context) (Result, error) {
	var res Result
	live, err := p.Store.LiveWorkersByMachine(ctx)
	if err != nil {
		return res, err
	}
	var ids []string
	for m := range live {
		if IsInstanceID(m) {
			ids = append(ids, m)
		}
	}
	slices.Sort(ids)
	res.Instances = len(ids)
	statuses := map[string]domain.HostStatus{}
	for batch := range slices.Chunk(ids, BatchSize) {
		if err := p.describe(ctx, batch, statuses); err != nil {
			return res, err
		}
	}
	var errs []error
	for _, id := range ids {
		status, ok := statuses[id]
		if !ok {
			continue // a state name we do not know: leave the row as it is
		}
		n, changed, err := p.apply(ctx, id, live[id], status)
		res.Workers += n
		res.Changed += changed
		errs = append(errs, err)
	}
	return res, errors.Join(errs...)
}

// describe adds the host status of every instance in ids to out. An id
// missing from the answer is terminated. A batch refused as NotFound is
// split in halves until the unknown ids stand alone: EC2 names the unknown
// ids in its message, but moto names only the first, and the message is no
// contract.
func (p *Poller) describe(ctx context.Context, ids []string, out map[string]domain.HostStatus) error {
	seen := map[string]bool{}
	pages := ec2.NewDescribeInstancesPaginator(p.EC2, &ec2.DescribeInstancesInput{InstanceIds: ids})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if isNotFound(err) {
			if len(ids) == 1 {
				out[ids[0]] = domain.HostTerminated
				return nil
			}
			half := len(ids) / 2
			if err := p.describe(ctx, ids[:half], out); err != nil {
				return err
			}
			return p.describe(ctx, ids[half:], out)
		}
		if err != nil {
			return fmt.Errorf("describe %d instances: %w", len(ids), err)
		}
		for _, r := range page.Reservations {
			for _, inst := range r.Instances {
				id := aws.ToString(inst.InstanceId)
				seen[id] = true
				if inst.State == nil {
					continue
				}
				if status, ok := HostStatusOf(string(inst.State.Name)); ok {
					out[id] = status
				} else {
					p.log().Warn("hoststatus: unknown instance state", "instance_id", id, "state", string(inst.State.Name))
				}
			}
		}
	}
	for _, id := range ids {
		if !seen[id] {
			out[id] = domain.HostTerminated
		}
	}
	return nil
}

func isNotFound(err error) bool {
	var ae smithy.APIError
	return errors.As(err, &ae) && ae.ErrorCode() == errNotFound
}

// apply records status on each of workers whose host status would move,
// reporting how many workers it looked at and how many it wrote.
func (p *Poller) apply(ctx context.Context, instance string, workers []domain.Worker, status domain.HostStatus) (n, changed int, err error) {
	var errs []error
	for _, w := range workers {
		n++
		if !domain.HostStatusMoves(w.HostStatus, status) {
			continue
		}
		next, err := p.Control.SetHostStatus(ctx, w.ID, status)
		if err != nil {
			errs = append(errs, fmt.Errorf("worker %s on %s: %w", w.ID, instance, err))
			continue
		}
		if next.Version != w.Version {
			changed++
			p.log().Info("hoststatus: host status changed", "worker_id", w.ID, "instance_id", instance, "from", w.HostStatus, "to", next.HostStatus)
		}
	}
	return n, changed, errors.Join(errs...)
}

// StateChange is the detail of an EC2 Instance State-change Notification.
type StateChange struct {
	InstanceID string `json:"instance-id"`
	State      string `json:"state"`
}

// HandleEvent records the host status an EC2 Instance State-change
// Notification carries on the instance's worker (the machines table's
// current worker of that machine id; a one-item read, no scan). Events of
// other detail types, of instances no worker runs on, and of states it
// does not know are ignored.
func (p *Poller) HandleEvent(ctx context.Context, ev events.CloudWatchEvent) (Result, error) {
	var res Result
	if ev.DetailType != DetailTypeStateChange {
		return res, nil
	}
	var d StateChange
	if err := json.Unmarshal(ev.Detail, &d); err != nil {
		return res, fmt.Errorf("decode %s detail: %w", ev.DetailType, err)
	}
	status, ok := HostStatusOf(d.State)
	if !ok || !IsInstanceID(d.InstanceID) {
		p.log().Warn("hoststatus: ignoring state change", "instance_id", d.InstanceID, "state", d.State)
		return res, nil
	}
	res.Instances = 1
	workerID, found, err := p.Store.MachineWorker(ctx, d.InstanceID)
	if err != nil || !found {
		return res, err
	}
	w, err := p.Store.GetWorker(ctx, workerID)
	if err != nil {
		return res, err
	}
	if !w.HostStatusMayChange() {
		return res, nil
	}
	res.Workers, res.Changed, err = p.apply(ctx, d.InstanceID, []domain.Worker{w}, status)
	return res, err
}

// Handle is the Lambda entry point: one function serves both the schedule
// and EventBridge. An EC2 state-change event is handled as such; any other
// event (the scheduled "Scheduled Event", an empty test event) runs Poll.
func (p *Poller) Handle(ctx context.Context, raw json.RawMessage) (Result, error) {
	var ev events.CloudWatchEvent
	if len(raw) > 0 && string(raw) != "null" {
		if err := json.Unmarshal(raw, &ev); err != nil {
			return Result{}, fmt.Errorf("decode event: %w", err)
		}
	}
	if ev.DetailType == DetailTypeStateChange {
		return p.HandleEvent(ctx, ev)
	}
	res, err := p.Poll(ctx)
	p.log().Info("hoststatus: poll", "workers", res.Workers, "instances", res.Instances, "changed", res.Changed)
	return res, err
}
