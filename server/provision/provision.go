// Package provision is the provisioner (docs/provision.md): each pass
// reads the queued work no live worker can take, launches the hosts it
// needs through EC2 within the caps, and lets go of hosts that never said
// hello. A launch is reserved in DynamoDB before the EC2 call (one
// conditional transaction: two passes at once never launch for the same
// demand), and the call carries the reservation's id as its ClientToken, so
// a retried call is the same launch. A call whose answer is lost (a
// timeout, a dropped connection) may have launched: the pass looks the
// instance up by its host-id tag, and a reservation it cannot settle stays
// reserved (counted against the caps) for the next pass, never a failure.
package provision

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"

	"github.com/dreamlake/lakeshore/server/config"
	"github.com/dreamlake/lakeshore/server/metrics"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/ids"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// Tags every launched instance carries.
const (
	TagHostID  = "lakeshore:host-id"
	TagQueue   = "lakeshore:queue"
	TagHostKey = "lakeshore:host-key"
	// TagStack names the deployment that launched the instance
	// (Config.Stack); the deployed policy terminates only instances
	// carrying its own stack's.
	TagStack = "lakeshore:stack"
)

// Defaults of Config.
const (
	DefaultSlotsPerHost = config.DefaultProvisionHostCapacity
	DefaultHelloTimeout = 10 * time.Minute
	// queuedReadLimit bounds how many queued items a pass reads per queue.
	queuedReadLimit = 10000
	// reserveTries bounds the passes' re-plans after losing a reservation race.
	reserveTries = 8
)

// DefaultBackoff is Config.Backoff's default: 30 s after a key's first
// failed host, doubling to 10 min; three in a row stop the key for 6 h.
var DefaultBackoff = domain.BackoffPolicy{Min: 30 * time.Second, Max: 10 * time.Minute, MaxFailures: 3, StopFor: 6 * time.Hour}

// Store is what a pass reads and writes.
type Store interface {
	Fleet(ctx context.Context) (int64, []domain.Host, error)
	ReserveHosts(ctx context.Context, version int64, hosts []domain.Host) error
	SaveHost(ctx context.Context, prev int64, next *domain.Host) error
	EndHost(ctx context.Context, prev int64, next *domain.Host, hold *domain.KeyHold) error
	KeyHold(ctx context.Context, k domain.ProvisionKey) (domain.KeyHold, bool, error)
	Queues(ctx context.Context) ([]string, error)
	QueuedByHostKey(ctx context.Context, queue string, limit int) (map[string]int, bool, error)
	EachWorker(ctx context.Context, op string, fn func(domain.Worker) error) error
	MachineWorker(ctx context.Context, machineID string) (string, bool, error)
	GetWorker(ctx context.Context, id string) (domain.Worker, error)
	PutPendingWorker(ctx context.Context, w domain.Worker) (bool, error)
	AskToAdopt(ctx context.Context, id string, a domain.Adoption, staleAfter time.Duration) (domain.Worker, error)
	MarkGone(ctx context.Context, id string, auth store.Authorize, kind domain.EndKind, why string) (domain.Worker, bool, error)
}

var _ Store = (*store.Store)(nil)

// EC2 is the part of the EC2 API a pass calls.
type EC2 interface {
	RunInstances(ctx context.Context, in *ec2.RunInstancesInput, optFns ...func(*ec2.Options)) (*ec2.RunInstancesOutput, error)
	DescribeLaunchTemplates(ctx context.Context, in *ec2.DescribeLaunchTemplatesInput, optFns ...func(*ec2.Options)) (*ec2.DescribeLaunchTemplatesOutput, error)
	DescribeLaunchTemplateVersions(ctx context.Context, in *ec2.DescribeLaunchTemplateVersionsInput, optFns ...func(*ec2.Options)) (*ec2.DescribeLaunchTemplateVersionsOutput, error)
	TerminateInstances(ctx context.Context, in *ec2.TerminateInstancesInput, optFns ...func(*ec2.Options)) (*ec2.TerminateInstancesOutput, error)
	DescribeInstances(ctx context.Context, in *ec2.DescribeInstancesInput, optFns ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error)
}

// Config is a provisioner's; zero values take the defaults, and MaxHosts 0
// turns provisioning off.
type Config struct {
	Store Store
	EC2   EC2
	// LaunchTemplate names the launch template hosts start from: its id
	// ("lt-…") or its name.
	LaunchTemplate string
	// Stack, when set, is every launched instance's lakeshore:stack tag:
	// the deployment's stack name, which its policy requires to terminate.
	Stack  string
	Limits domain.ProvisionLimits
	// Market is how hosts are bought: one of config.ProvisionMarkets
	// ("": config.MarketSpotFirst).
	Market string
	// HelloTimeout is how long a launched host may take to say hello
	// before it is terminated and its demand counts again.
	HelloTimeout time.Duration
	// KeepAlive is a launched host's nymph --keep-alive: idle that long, it
	// leaves and the host powers off (default DefaultKeepAlive).
	KeepAlive time.Duration
	// StaleAfter is the control plane's stale window: a worker silent
	// longer serves nothing.
	StaleAfter time.Duration
	// HostSetup reports the host_setup commands of work with host key hk
	// on queue (what the launched host runs; nil for generic work).
	HostSetup func(ctx context.Context, queue, hk string) ([]string, error)
	// Backoff is how a key's failed hosts hold its next launches back
	// (zero: DefaultBackoff).
	Backoff domain.BackoffPolicy
	// Metrics counts held keys and refusals (nil: none).
	Metrics metrics.Provision
	Clock   clock.Clock
	IDs     *ids.Generator
	Logger  *slog.Logger
}

// ConfigOf is the part of a Config that c sets: the launch template, the
// stack, the caps, each host's capacity and the market. The caller adds
// the store, EC2 and the rest.
func ConfigOf(c config.Provision) Config {
	return Config{LaunchTemplate: c.LaunchTemplate, Stack: c.Stack, Market: c.Market,
		Limits: domain.ProvisionLimits{MaxHosts: c.MaxHosts, MaxHostsPerKey: c.MaxHostsPerKey, SlotsPerHost: c.HostCapacity}}
}

// Provisioner runs passes. Build it with New.
type Provisioner struct {
	cfg Config
	log *slog.Logger

	mu sync.Mutex
	// templateFound: the launch template was found (checkTemplate).
	templateFound bool
}

// ErrNoLaunchTemplate answers a pass whose launch template does not exist:
// it launches nothing.
var ErrNoLaunchTemplate = errors.New("provision: the launch template does not exist")

// templateMissing are EC2's error codes saying a launch template named
// does not exist (or cannot: a malformed id).
var templateMissing = []string{"InvalidLaunchTemplateName.NotFoundException", "InvalidLaunchTemplateId.NotFound",
	"InvalidLaunchTemplateId.Malformed", "InvalidLaunchTemplateName.MalformedException"}

// checkTemplate looks the launch template up (one DescribeLaunchTemplates
// call) until it is found once: a template that does not exist refuses
// the pass with ErrNoLaunchTemplate and counts a refusal, rather than
// every launch failing on it. Another error (throttled, no network) is the
// pass's error, and the next pass looks again.
func (p *Provisioner) checkTemplate(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.templateFound {
		return nil
	}
	in := &ec2.DescribeLaunchTemplatesInput{}
	if lt := launchTemplate(p.cfg.LaunchTemplate); lt.LaunchTemplateId != nil {
		in.LaunchTemplateIds = []string{*lt.LaunchTemplateId}
	} else {
		in.LaunchTemplateNames = []string{*lt.LaunchTemplateName}
	}
	out, err := p.cfg.EC2.DescribeLaunchTemplates(ctx, in)
	if err == nil && len(out.LaunchTemplates) == 0 {
		err = errors.New("DescribeLaunchTemplates answered none")
	} else if err != nil && !slices.Contains(templateMissing, errorCode(err)) {
		return fmt.Errorf("provision: look up launch template %q: %w", p.cfg.LaunchTemplate, err)
	}
	if err != nil {
		p.cfg.Metrics.ProvisionRefused("launch_template")
		p.log.Error("provision: the launch template does not exist; launching nothing", "launch_template", p.cfg.LaunchTemplate, "reason", launchReason(err))
		return fmt.Errorf("%w: %q: %s", ErrNoLaunchTemplate, p.cfg.LaunchTemplate, launchReason(err))
	}
	p.templateFound = true
	return nil
}

// New returns a provisioner for cfg.
func New(cfg Config) *Provisioner {
	cfg.Limits.SlotsPerHost = cmp.Or(cfg.Limits.SlotsPerHost, DefaultSlotsPerHost)
	cfg.Market = cmp.Or(cfg.Market, config.MarketSpotFirst)
	cfg.HelloTimeout = cmp.Or(cfg.HelloTimeout, DefaultHelloTimeout)
	cfg.KeepAlive = cmp.Or(cfg.KeepAlive, DefaultKeepAlive)
	cfg.StaleAfter = cmp.Or(cfg.StaleAfter, domain.DefaultStaleAfter)
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.Discard{}
	}
	if cfg.Backoff == (domain.BackoffPolicy{}) {
		cfg.Backoff = DefaultBackoff
	}
	if cfg.IDs == nil {
		cfg.IDs = &ids.Generator{Clock: cfg.Clock}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Provisioner{cfg: cfg, log: log}
}

// Result is what one pass did.
type Result struct {
	Launched, Failed, Ended int
	// Asked counts the generic workers asked to adopt a host key.
	Asked int
	// Reserved counts the hosts this pass reserved (launched, failed or
	// unconfirmed).
	Reserved int
	// Unconfirmed counts launches whose answer was lost and whose instance
	// was not found: they stay reserved, and the next pass settles them.
	Unconfirmed int
	// Held counts the keys with queued work whose launches this pass held
	// back, because their hosts failed lately (Config.Backoff).
	Held int
}

// Pass runs one provisioner pass: settle the hosts already launched (a
// host whose worker left, or that never said hello in time, is let go),
// then reserve and launch what the queued work needs. A lost reservation
// race re-reads and plans again. Reserved hosts a crashed pass left
// unlaunched are launched (the same ClientToken: never twice).
func (p *Provisioner) Pass(ctx context.Context) (Result, error) {
	var res Result
	if p.cfg.Limits.MaxHosts <= 0 {
		return res, nil
	}
	if err := p.checkTemplate(ctx); err != nil {
		return res, err
	}
	// The launch template's user data, read once a pass, at its first launch.
	base := sync.OnceValues(func() (string, error) { return p.templateUserData(ctx) })
	for range reserveTries {
		hs := holds{}
		version, hosts, err := p.cfg.Store.Fleet(ctx)
		if err != nil {
			return res, err
		}
		workers, err := p.readWorkers(ctx)
		if err != nil {
			return res, err
		}
		ended, err := p.settle(ctx, hs, hosts, workers)
		res.Ended += ended
		if err != nil {
			return res, err
		}
		if err := p.launchReserved(ctx, hs, hosts, base, &res, p.cfg.Clock.Now().Add(-time.Minute)); err != nil {
			return res, err
		}
		demand, err := p.demand(ctx)
		if err != nil {
			return res, err
		}
		asked, err := p.adopt(ctx, demand, hosts, workers)
		res.Asked += asked
		if err != nil {
			return res, err
		}
		fleet := fleetOf(hosts, workers, p.cfg.Limits.SlotsPerHost)
		plan := domain.PlanLaunches(demand, fleet, p.cfg.Limits)
		held, err := p.backOff(ctx, hs, plan, fleet)
		res.Held = held
		if err != nil {
			return res, err
		}
		if len(plan) == 0 {
			return res, nil
		}
		reserved, err := p.reservations(ctx, plan)
		if err != nil {
			return res, err
		}
		switch err := p.cfg.Store.ReserveHosts(ctx, version, reserved); {
		case errors.Is(err, store.ErrProvisionRaced):
			continue // another pass reserved: what it launched counts now
		case err != nil:
			return res, err
		}
		res.Reserved += len(reserved)
		for i := range reserved {
			reserved[i].Version = 1
			if err := p.launch(ctx, hs, &reserved[i], base, &res); err != nil {
				return res, err
			}
		}
		return res, nil
	}
	return res, fmt.Errorf("provision: lost the reservation race %d times in a row", reserveTries)
}

// readWorkers reads the workers the sweep is not done with
// (store.Store.EachWorker) and answers those that read live now (not stale,
// not gone).
func (p *Provisioner) readWorkers(ctx context.Context) (live []domain.Worker, err error) {
	now := p.cfg.Clock.Now()
	err = p.cfg.Store.EachWorker(ctx, "provision", func(w domain.Worker) error {
		if st := domain.Project(w, now, p.cfg.StaleAfter); st != domain.WorkerStale && st != domain.WorkerGone {
			live = append(live, w)
		}
		return nil
	})
	return live, err
}

// helloOf reports the worker of instance's current boot, when the instance
// said hello (found false: it never did; the pending row written at launch
// does not count). It reads the machines table, then the worker: what a
// host has become is read for each host that needs it, never the workers
// that ever were.
func (p *Provisioner) helloOf(ctx context.Context, instance string) (domain.Worker, bool, error) {
	id, ok, err := p.cfg.Store.MachineWorker(ctx, instance)
	if err != nil || !ok {
		return domain.Worker{}, false, err
	}
	w, err := p.cfg.Store.GetWorker(ctx, id)
	if domain.KindOf(err) == domain.KindNotFound {
		return domain.Worker{}, false, nil // expired since its machine row was read
	}
	if err != nil {
		return domain.Worker{}, false, err
	}
	return w, w.BootID != "", nil
}

// fleetOf is what serves each key: free slots of live workers (a worker
// still in setup counts its whole capacity: it is about to serve; one asked
// to adopt a key counts for that key only), hosts
// launched whose worker has not said hello (pending), and hosts alive.
func fleetOf(hosts []domain.Host, workers []domain.Worker, slots int) domain.Fleet {
	f := domain.Fleet{Free: map[domain.ProvisionKey]int{}, Pending: map[domain.ProvisionKey]int{}, Hosts: map[domain.ProvisionKey]int{}}
	hello := map[string]bool{}
	for _, w := range workers {
		if w.Pending() {
			continue // written at launch; its host has not said hello
		}
		hello[w.MachineID] = true
		free := max(w.MaxConcurrency-w.CurrentInvocations, 0)
		if hk := w.Adopting(); hk != "" {
			// Asked to take on hk: its slots serve that key's work, once
			// its host setup is done.
			f.Free[domain.ProvisionKey{Queue: w.Adoption.Queue, HostKey: hk}] += free
			continue
		}
		for _, q := range w.Lanes {
			f.Free[domain.ProvisionKey{Queue: q, HostKey: w.HostKey}] += free
			if w.HostKey != "" {
				f.Free[domain.ProvisionKey{Queue: q}] += free // it may take generic work too
			}
		}
	}
	for _, h := range hosts {
		if !h.Alive() {
			continue
		}
		f.Hosts[h.Key]++
		if h.InstanceID == "" || !hello[h.InstanceID] {
			f.Pending[h.Key]++
		}
	}
	return f
}

// adopt asks idle generic workers started with --adopt-host-setup to take
// on the host keys of queued work nothing serves (domain.PlanAdoptions),
// before anything is launched for it; workers is updated in place, so the
// plan that follows counts them. A worker that changed since it was read
// (it took work, went away) is skipped. It reports how many were asked.
func (p *Provisioner) adopt(ctx context.Context, demand []domain.Demand, hosts []domain.Host, workers []domain.Worker) (int, error) {
	now := p.cfg.Clock.Now()
	fleet := fleetOf(hosts, workers, p.cfg.Limits.SlotsPerHost)
	asked := 0
	for _, ask := range domain.PlanAdoptions(demand, fleet, workers, p.cfg.Limits.SlotsPerHost, now, p.cfg.StaleAfter) {
		setup, err := p.hostSetup(ctx, ask.Key)
		if err != nil {
			return asked, err
		}
		if len(setup) == 0 {
			continue // its work went, or its run config cannot be read
		}
		w, err := p.cfg.Store.AskToAdopt(ctx, ask.WorkerID, domain.Adoption{HostKey: ask.Key.HostKey, Queue: ask.Key.Queue, HostSetup: setup}, p.cfg.StaleAfter)
		if errors.Is(err, wire.ErrConflict) || errors.Is(err, wire.ErrNotFound) {
			p.log.Info("provision: a worker changed before it was asked to adopt; skipped", "worker_id", ask.WorkerID, "reason", err.Error())
			continue
		}
		if err != nil {
			return asked, err
		}
		for i := range workers {
			if workers[i].ID == w.ID {
				workers[i] = w
			}
		}
		p.log.Info("provision: asked a generic worker to adopt a host key", "worker_id", w.ID,
			"queue", ask.Key.Queue, "host_key", ask.Key.HostKey)
		asked++
	}
	return asked, nil
}

// hostSetup reports the host setup commands of key's work (nil for
// generic work).
func (p *Provisioner) hostSetup(ctx context.Context, k domain.ProvisionKey) ([]string, error) {
	if k.HostKey == "" || p.cfg.HostSetup == nil {
		return nil, nil
	}
	return p.cfg.HostSetup(ctx, k.Queue, k.HostKey)
}

// demand reads every queue's queued work by host key.
func (p *Provisioner) demand(ctx context.Context) ([]domain.Demand, error) {
	queues, err := p.cfg.Store.Queues(ctx)
	if err != nil {
		return nil, err
	}
	var out []domain.Demand
	for _, q := range queues {
		counts, truncated, err := p.cfg.Store.QueuedByHostKey(ctx, q, queuedReadLimit)
		if err != nil {
			return nil, err
		}
		if truncated {
			p.log.Warn("provision: queue deeper than one pass reads; planning for the part read", "queue", q, "read", queuedReadLimit)
		}
		for hk, n := range counts {
			out = append(out, domain.Demand{Key: domain.ProvisionKey{Queue: q, HostKey: hk}, Queued: n})
		}
	}
	return out, nil
}

// holds are the keys' holds a pass read or wrote.
type holds map[domain.ProvisionKey]domain.KeyHold

// holdOf reports k's hold: what hs has, or else what is stored.
func (p *Provisioner) holdOf(ctx context.Context, hs holds, k domain.ProvisionKey) (domain.KeyHold, error) {
	if h, ok := hs[k]; ok {
		return h, nil
	}
	h, _, err := p.cfg.Store.KeyHold(ctx, k)
	if err != nil {
		return h, err
	}
	hs[k] = h
	return h, nil
}

// end writes host h ended as next, with its key's hold moved by it
// (domain.KeyHold.After). It reports false when h or the hold changed
// since read (another pass ended it, or another of the key's hosts): the
// next pass reads them again.
func (p *Provisioner) end(ctx context.Context, hs holds, h *domain.Host, next domain.Host) (bool, error) {
	hold, err := p.holdOf(ctx, hs, h.Key)
	if err != nil {
		return false, err
	}
	hold = hold.After(next, p.cfg.Backoff)
	switch err := p.cfg.Store.EndHost(ctx, h.Version, &next, &hold); {
	case errors.Is(err, wire.ErrConflict):
		delete(hs, h.Key)
		p.log.Info("provision: a host or its key's hold changed since read; the next pass ends it", "host_id", h.ID, "reason", err.Error())
		return false, nil
	case err != nil:
		return false, err
	}
	*h, hs[h.Key] = next, hold
	return true, nil
}

// backOff holds back the keys in plan whose hosts failed lately (their
// hold, domain.KeyHold.After): EC2 refused them, their host setup failed,
// or they never said hello. After n failures in a row a key waits
// Backoff.Min × 2^(n-1), at most Backoff.Max, then launches one host at a
// time until one serves; after Backoff.MaxFailures in a row it launches
// nothing for Backoff.StopFor. The hold is stored with the hosts, so the
// key's queued work shows why it waits. It reports how many keys it held.
func (p *Provisioner) backOff(ctx context.Context, hs holds, plan map[domain.ProvisionKey]int, fleet domain.Fleet) (int, error) {
	now := p.cfg.Clock.Now()
	held := 0
	for _, k := range slices.SortedFunc(maps.Keys(plan), domain.ProvisionKey.Compare) {
		hold, err := p.holdOf(ctx, hs, k)
		if err != nil {
			return held, err
		}
		switch {
		case hold.Failures == 0:
			continue
		case hold.Waiting(now):
			delete(plan, k)
			held++
			p.cfg.Metrics.KeyHeld(k.Queue, hold.Stopped)
			p.log.Info("provision: holding this key's launches back", "queue", k.Queue, "host_key", k.HostKey,
				"failures", hold.Failures, "stopped", hold.Stopped, "last_reason", hold.Last.Reason,
				"retry_in", hold.Until.Sub(now).Round(time.Second).String())
		case fleet.Pending[k] > 0:
			delete(plan, k) // its probe has not said hello yet
		default:
			plan[k] = 1 // a probe: one host at a time until one serves
		}
	}
	return held, nil
}

// reservations makes the host items plan asks for, with their host setup.
func (p *Provisioner) reservations(ctx context.Context, plan map[domain.ProvisionKey]int) ([]domain.Host, error) {
	now := p.cfg.Clock.Now().UTC()
	var out []domain.Host
	for _, k := range slices.SortedFunc(maps.Keys(plan), domain.ProvisionKey.Compare) {
		setup, err := p.hostSetup(ctx, k)
		if err != nil {
			return nil, err
		}
		for range plan[k] {
			if len(out) == store.MaxReservation {
				break // one reservation's most; the next pass plans the rest
			}
			out = append(out, domain.Host{ID: p.cfg.IDs.New(ids.Host), Key: k, HostSetup: setup,
				State: domain.LaunchReserved, Reason: fmt.Sprintf("queued work had no free slot; this pass planned %d hosts for it", plan[k]),
				CreatedAt: now})
		}
	}
	return out, nil
}

// launchReserved launches the reserved hosts older than before: a pass
// that died between its reservation and its EC2 call, or whose call's
// answer was lost, left them. An instance already launched for one (found
// by its host-id tag) is recorded, not launched again.
func (p *Provisioner) launchReserved(ctx context.Context, hs holds, hosts []domain.Host, base func() (string, error), res *Result, before time.Time) error {
	for i := range hosts {
		if h := &hosts[i]; h.State == domain.LaunchReserved && h.CreatedAt.Before(before) {
			instance, market, err := p.findInstance(ctx, h.ID)
			if err != nil {
				// Launching blind could launch twice: it stays reserved.
				p.log.Warn("provision: a reserved host could not be looked up; trying again next pass", "host_id", h.ID, "reason", err.Error())
				res.Unconfirmed++
				continue
			}
			if instance != "" {
				if err := p.record(ctx, h, instance, market, res); err != nil {
					return err
				}
				continue
			}
			if err := p.launch(ctx, hs, h, base, res); err != nil {
				return err
			}
		}
	}
	return nil
}

// launch starts host h (reserved), bought as Config.Market says (spot
// first: on demand when spot capacity is refused); records the instance, or the refusal's reason.
// base reads the launch template's user data. A call whose answer was lost
// may have launched: the instance is looked up by its host-id tag, and if
// it cannot be found h stays reserved for the next pass (which looks again,
// then calls again under the same ClientToken: the same launch).
func (p *Provisioner) launch(ctx context.Context, hs holds, h *domain.Host, base func() (string, error), res *Result) error {
	instance, market, err := p.runInstance(ctx, *h, base)
	var lost *lostAnswer
	if errors.As(err, &lost) {
		instance, market, err = p.findInstance(ctx, h.ID)
		if err != nil || instance == "" {
			reason := lost.Error()
			if err != nil {
				reason += "; looking it up: " + err.Error()
			}
			p.log.Warn("provision: launch unconfirmed; the host stays reserved and the next pass settles it",
				"host_id", h.ID, "queue", h.Key.Queue, "host_key", h.Key.HostKey, "reason", reason)
			res.Unconfirmed++
			return nil
		}
		p.log.Info("provision: a launch whose answer was lost is found", "host_id", h.ID, "instance_id", instance, "reason", lost.Error())
	}
	if err != nil {
		next, _ := h.Ended(domain.LaunchFailed, launchReason(err), p.cfg.Clock.Now().UTC())
		p.log.Warn("provision: launch refused", "host_id", h.ID, "queue", h.Key.Queue, "host_key", h.Key.HostKey, "reason", next.Reason)
		res.Failed++
		_, err := p.end(ctx, hs, h, next)
		return err
	}
	return p.record(ctx, h, instance, market, res)
}

// record keeps host h (reserved) launched as instance, bought on market,
// and writes the worker row its hello adopts.
func (p *Provisioner) record(ctx context.Context, h *domain.Host, instance, market string, res *Result) error {
	now := p.cfg.Clock.Now().UTC()
	prev := h.Version
	next, err := h.Launched(instance, market, now)
	if err != nil {
		return err
	}
	p.log.Info("provision: launched", "host_id", h.ID, "instance_id", instance, "market", market,
		"queue", h.Key.Queue, "host_key", h.Key.HostKey)
	res.Launched++
	*h = next
	if err := p.cfg.Store.SaveHost(ctx, prev, h); errors.Is(err, wire.ErrConflict) {
		// Another pass launched this reservation too (the same client
		// token: the same instance) and recorded it first.
		p.log.Info("provision: another pass recorded this launch", "host_id", h.ID, "instance_id", instance)
		return nil
	} else if err != nil {
		return err
	}
	// The worker row the host's hello adopts: the fleet shows it pending
	// from now.
	_, err = p.cfg.Store.PutPendingWorker(ctx, domain.NewPendingWorker(p.cfg.IDs.New(ids.Worker), instance, h.Key, h.ID, now))
	return err
}

// spotRefusals are the EC2 error codes after which a spot launch is tried
// again on demand.
var spotRefusals = []string{"InsufficientInstanceCapacity", "MaxSpotInstanceCountExceeded", "SpotMaxPriceTooLow",
	"InsufficientCapacity", "UnfulfillableCapacity"}

// runInstance makes the EC2 call for h, reporting the instance and how it
// was bought. Config.Market decides the market: spot first asks for spot
// and, when EC2 refuses spot capacity, asks again naming no market; spot
// asks for spot only; on demand names no market, so the launch template's
// own market options apply (none: on demand).
func (p *Provisioner) runInstance(ctx context.Context, h domain.Host, base func() (string, error)) (string, string, error) {
	tmpl, err := base()
	if err != nil {
		return "", "", err
	}
	data, err := userData(tmpl, h, p.cfg.Limits.SlotsPerHost, p.cfg.KeepAlive)
	if err != nil {
		return "", "", err
	}
	in := &ec2.RunInstancesInput{
		UserData: aws.String(data),
		// Its idle bye powers it off (SHUTDOWN_WHEN_DONE): then it is gone.
		InstanceInitiatedShutdownBehavior: ec2types.ShutdownBehaviorTerminate,
		MinCount:                          aws.Int32(1), MaxCount: aws.Int32(1),
		LaunchTemplate:    launchTemplate(p.cfg.LaunchTemplate),
		ClientToken:       aws.String(h.ID),
		TagSpecifications: []ec2types.TagSpecification{{ResourceType: ec2types.ResourceTypeInstance, Tags: p.tags(h)}},
	}
	if p.cfg.Market != config.MarketOnDemand {
		in.InstanceMarketOptions = &ec2types.InstanceMarketOptionsRequest{MarketType: ec2types.MarketTypeSpot}
	}
	out, err := p.cfg.EC2.RunInstances(ctx, in)
	if err != nil && p.cfg.Market == config.MarketSpotFirst && slices.Contains(spotRefusals, errorCode(err)) {
		p.log.Info("provision: spot refused; launching on demand", "host_id", h.ID, "reason", launchReason(err))
		in.InstanceMarketOptions = nil
		in.ClientToken = aws.String(h.ID + "-od") // another request than the refused one
		out, err = p.cfg.EC2.RunInstances(ctx, in)
	}
	if err != nil && answerLost(err) {
		return "", "", &lostAnswer{err: err}
	}
	if err != nil {
		return "", "", err
	}
	if len(out.Instances) == 0 || out.Instances[0].InstanceId == nil {
		return "", "", errors.New("RunInstances answered no instance")
	}
	return aws.ToString(out.Instances[0].InstanceId), marketOf(in, out.Instances[0]), nil
}

// marketOf says how instance was bought: spot when the request asked for
// it or the instance reads spot (a launch template's own market options),
// else on demand.
func marketOf(in *ec2.RunInstancesInput, instance ec2types.Instance) string {
	if in.InstanceMarketOptions != nil || instance.InstanceLifecycle == ec2types.InstanceLifecycleTypeSpot {
		return "spot"
	}
	return "on-demand"
}

// tags are what a launched instance carries: its host, queue and key, and
// the deployment's stack when one is named.
func (p *Provisioner) tags(h domain.Host) []ec2types.Tag {
	tags := []ec2types.Tag{
		{Key: aws.String(TagHostID), Value: aws.String(h.ID)},
		{Key: aws.String(TagQueue), Value: aws.String(h.Key.Queue)},
		{Key: aws.String(TagHostKey), Value: aws.String(h.Key.HostKey)},
	}
	if p.cfg.Stack != "" {
		tags = append(tags, ec2types.Tag{Key: aws.String(TagStack), Value: aws.String(p.cfg.Stack)})
	}
	return tags
}

// lostAnswer is a RunInstances call that may have launched: no answer of
// EC2's came back (a timeout, a dropped connection), or only that it
// failed partway. A refusal (EC2's error answer) is not one.
type lostAnswer struct{ err error }

func (l *lostAnswer) Error() string {
	return "RunInstances answered nothing certain: " + launchReason(l.err)
}
func (l *lostAnswer) Unwrap() error { return l.err }

// uncertainCodes are EC2's error codes that say it failed partway, not
// that it refused: the launch may have happened. (Capacity refusals come
// with a 5xx status too, and are refusals.)
var uncertainCodes = []string{"InternalError", "InternalFailure", "ServerInternal", "ServiceUnavailable", "Unavailable"}

// answerLost reports whether err, of a RunInstances call, leaves it
// unknown whether EC2 launched: no API error answer came back, or one
// saying EC2 failed on its side.
func answerLost(err error) bool {
	var ae smithy.APIError
	return !errors.As(err, &ae) || slices.Contains(uncertainCodes, ae.ErrorCode())
}

// findInstance looks up the instance launched for host id, by its host-id
// tag: "" when there is none. One still alive is preferred to one already
// terminated (spot capacity reclaimed at once).
func (p *Provisioner) findInstance(ctx context.Context, hostID string) (instance, market string, err error) {
	out, err := p.cfg.EC2.DescribeInstances(ctx, &ec2.DescribeInstancesInput{
		Filters: []ec2types.Filter{{Name: aws.String("tag:" + TagHostID), Values: []string{hostID}}},
	})
	if err != nil {
		return "", "", fmt.Errorf("provision: look up the instance of host %s: %w", hostID, err)
	}
	var found *ec2types.Instance
	for _, r := range out.Reservations {
		for i := range r.Instances {
			in := &r.Instances[i]
			if found == nil || (gone(found) && !gone(in)) {
				found = in
			}
		}
	}
	if found == nil || found.InstanceId == nil {
		return "", "", nil
	}
	market = "on-demand"
	if found.InstanceLifecycle == ec2types.InstanceLifecycleTypeSpot {
		market = "spot"
	}
	return aws.ToString(found.InstanceId), market, nil
}

// gone reports whether in is terminated or on its way there.
func gone(in *ec2types.Instance) bool {
	return in.State != nil && (in.State.Name == ec2types.InstanceStateNameTerminated || in.State.Name == ec2types.InstanceStateNameShuttingDown)
}

// launchTemplate names the template by id ("lt-…") or by name.
func launchTemplate(s string) *ec2types.LaunchTemplateSpecification {
	if len(s) > 3 && s[:3] == "lt-" {
		return &ec2types.LaunchTemplateSpecification{LaunchTemplateId: aws.String(s)}
	}
	return &ec2types.LaunchTemplateSpecification{LaunchTemplateName: aws.String(s)}
}

// errorCode is an AWS API error's code ("" for another error).
func errorCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// launchReason is what a refused launch keeps: the API's code and message.
func launchReason(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode() + ": " + ae.ErrorMessage()
	}
	return err.Error()
}

// settle lets go of launched hosts that are over, terminating each so it
// costs nothing more: one whose worker said hello and then left (gone),
// and one that never said hello within HelloTimeout. It reports how many.
func (p *Provisioner) settle(ctx context.Context, hs holds, hosts []domain.Host, live []domain.Worker) (int, error) {
	now := p.cfg.Clock.Now().UTC()
	alive := map[string]bool{}
	pending := map[string]string{} // instance → its pending worker
	for _, w := range live {
		if w.Pending() {
			pending[w.MachineID] = w.ID
			continue
		}
		alive[w.MachineID] = true
	}
	ended := 0
	for i := range hosts {
		h := &hosts[i]
		if h.State != domain.LaunchRunning || alive[h.InstanceID] {
			continue
		}
		var why, failure string
		w, said, err := p.helloOf(ctx, h.InstanceID)
		if err != nil {
			return ended, err
		}
		switch {
		case said && !domain.Retired(w):
			continue // said hello and reads stale: it may come back, and the sweep decides
		case said && hostSetupFailed(w):
			// It left because its host setup failed: another host for
			// this key would fail the same way, so it counts against it.
			why, failure = setupFailure(w), domain.HostSetupFailed
		case said:
			// It powers itself off after its bye (instance-initiated
			// shutdown: terminate); the terminate makes sure, so a host
			// whose power-off failed costs nothing more either.
			why = "its worker left: " + w.GoneWhy
		case now.Sub(h.LaunchedAt) > p.cfg.HelloTimeout:
			why, failure = fmt.Sprintf("it never said hello within %s", p.cfg.HelloTimeout), domain.NoHello
		default:
			continue
		}
		if _, err := p.cfg.EC2.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{h.InstanceID}}); err != nil {
			p.log.Warn("provision: terminate failed; trying again next pass", "host_id", h.ID, "instance_id", h.InstanceID, "reason", launchReason(err))
			continue
		}
		next, _ := h.Ended(domain.LaunchEnded, why, now)
		next.Failure = failure
		if done, err := p.end(ctx, hs, h, next); err != nil || !done {
			if err != nil {
				return ended, err
			}
			continue
		}
		if id, ok := pending[h.InstanceID]; ok {
			if _, _, err := p.cfg.Store.MarkGone(ctx, id, nil, domain.EndGone, "launched host "+h.ID+": "+why); err != nil {
				return ended, err
			}
		}
		p.log.Info("provision: host let go", "host_id", h.ID, "instance_id", h.InstanceID, "why", why)
		ended++
	}
	return ended, nil
}

// hostSetupFailed reports whether worker w (retired) left with its host
// setup failed: the last setup result it reported is one of its own
// --host-setup commands (no command id), failed. A host setup a later
// command repaired, or that ran again and succeeded, reports another last.
func hostSetupFailed(w domain.Worker) bool {
	r := w.LastSetupResult
	return r != nil && r.CommandID == "" && r.Status == domain.SetupFailed
}

// maxShownTail bounds how much of a failed host setup's output a host's
// reason keeps.
const maxShownTail = 1000

// setupFailure says why a host whose host setup failed was let go: the
// command, its exit code and its output's tail.
func setupFailure(w domain.Worker) string {
	r := w.LastSetupResult
	tail := strings.TrimSpace(r.OutputTail)
	if len(tail) > maxShownTail {
		tail = "…" + strings.ToValidUTF8(tail[len(tail)-maxShownTail:], "")
	}
	return fmt.Sprintf("its host setup failed: %q exited %d; output: %s; its worker left: %s",
		r.Command, r.ExitCode, tail, w.GoneWhy)
}

// Handler returns the provisioner Lambda's handler: any event (its
// schedule's, or a manual invoke) runs one pass. A failed pass is returned
// as an error so the invocation is retried; what it did is logged either
// way.
func Handler(p *Provisioner, log *slog.Logger) func(context.Context, json.RawMessage) (Result, error) {
	return func(ctx context.Context, _ json.RawMessage) (Result, error) {
		start := time.Now()
		res, err := p.Pass(ctx)
		attrs := []any{"launched", res.Launched, "refused", res.Failed, "let_go", res.Ended, "held", res.Held,
			"duration_ms", time.Since(start).Milliseconds()}
		if err != nil {
			log.Error("provision pass failed", append(attrs, "error", err.Error())...)
			return res, fmt.Errorf("provision: %w", err)
		}
		log.Info("provision pass", attrs...)
		return res, nil
	}
}
