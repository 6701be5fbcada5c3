package domain

import (
	"cmp"
	"slices"
	"time"
)

// The provisioner's rules (docs/provision.md): how many hosts to launch for
// the work no live worker can take, within the caps, shared fairly.

// ProvisionKey is what a launched host serves: one queue's work for one
// host key ("" for work any host may run).
type ProvisionKey struct {
	Queue   string
	HostKey string
}

// Compare orders keys by queue, then host key.
func (k ProvisionKey) Compare(o ProvisionKey) int {
	return cmp.Or(cmp.Compare(k.Queue, o.Queue), cmp.Compare(k.HostKey, o.HostKey))
}

// Demand is the queued work of one key.
type Demand struct {
	Key    ProvisionKey
	Queued int
}

// Fleet is what already serves each key.
type Fleet struct {
	// Free counts the free slots (max_concurrency − current_invocations) of
	// live workers that may claim the key's work.
	Free map[ProvisionKey]int
	// Pending counts hosts launched for the key that have not said hello
	// yet: each will bring SlotsPerHost slots.
	Pending map[ProvisionKey]int
	// Hosts counts the provisioned hosts alive, pending or working, by key.
	Hosts map[ProvisionKey]int
}

// ProvisionLimits are the provisioner's caps.
type ProvisionLimits struct {
	// MaxHosts caps the provisioned hosts alive in all (0: provisioning off).
	MaxHosts int
	// MaxHostsPerKey caps them per key (0: only MaxHosts).
	MaxHostsPerKey int
	// SlotsPerHost is how many invocations one launched host runs at once
	// (its nymph's --capacity).
	SlotsPerHost int
}

// PlanLaunches reports how many hosts to launch for each key: enough that
// every queued invocation has a slot (free slots of live workers first,
// then those pending hosts will bring), never past a cap. When the caps
// leave fewer hosts than the demand wants, each next host goes to the key
// with the fewest hosts (alive and planned; ties in key order), so one busy
// key cannot starve the others, and a key given hosts by an earlier pass
// does not get more before the others catch up. A
// key with no queued work gets nothing: the fleet scales to zero.
func PlanLaunches(demand []Demand, fleet Fleet, lim ProvisionLimits) map[ProvisionKey]int {
	plan := map[ProvisionKey]int{}
	if lim.MaxHosts <= 0 || lim.SlotsPerHost <= 0 {
		return plan
	}
	alive := 0
	for _, n := range fleet.Hosts {
		alive += n
	}
	budget := lim.MaxHosts - alive
	need := map[ProvisionKey]int{}
	var keys []ProvisionKey
	for _, d := range demand {
		unmet := fleet.unmet(d, lim.SlotsPerHost)
		if unmet <= 0 {
			continue
		}
		if _, seen := need[d.Key]; !seen {
			keys = append(keys, d.Key)
		}
		need[d.Key] += (unmet + lim.SlotsPerHost - 1) / lim.SlotsPerHost
	}
	slices.SortFunc(keys, ProvisionKey.Compare)
	for ; budget > 0; budget-- {
		// The key with the fewest hosts (alive and planned) that still
		// needs one gets the next, ties in key order: shares even out
		// across passes, not only within one.
		best, found := ProvisionKey{}, false
		for _, k := range keys {
			has := fleet.Hosts[k] + plan[k]
			if plan[k] >= need[k] || (lim.MaxHostsPerKey > 0 && has >= lim.MaxHostsPerKey) {
				continue
			}
			if !found || has < fleet.Hosts[best]+plan[best] {
				best, found = k, true
			}
		}
		if !found {
			break
		}
		plan[best]++
	}
	for k, n := range plan {
		if n == 0 {
			delete(plan, k)
		}
	}
	return plan
}

// unmet is how many of d's queued invocations nothing serving its key has
// a slot for: free slots of live workers first, then those its pending
// hosts will bring.
func (f Fleet) unmet(d Demand, slots int) int {
	return d.Queued - f.Free[d.Key] - f.Pending[d.Key]*slots
}

// AdoptionAsk is one generic worker to ask to take on a key.
type AdoptionAsk struct {
	WorkerID string
	Key      ProvisionKey
}

// PlanAdoptions reports which idle generic workers to ask to take on a
// host key (docs/provision.md, "Adopting a host key") before any host is
// launched for it: for each keyed demand with unmet work, workers that may
// (Worker.MayAdopt at now), round-robin one a key at a time in key order,
// until each key's unmet work has their slots. A queue with generic work
// queued keeps its generic workers for that work.
func PlanAdoptions(demand []Demand, fleet Fleet, workers []Worker, slots int, now time.Time, staleAfter time.Duration) []AdoptionAsk {
	genericQueued := map[string]bool{}
	need := map[ProvisionKey]int{}
	var keys []ProvisionKey
	for _, d := range demand {
		if d.Key.HostKey == "" {
			genericQueued[d.Key.Queue] = d.Queued > 0
			continue
		}
		if n := fleet.unmet(d, slots); n > 0 {
			if _, seen := need[d.Key]; !seen {
				keys = append(keys, d.Key)
			}
			need[d.Key] += n
		}
	}
	slices.SortFunc(keys, ProvisionKey.Compare)
	candidates := slices.SortedFunc(slices.Values(workers), func(a, b Worker) int { return cmp.Compare(a.ID, b.ID) })
	taken := map[string]bool{}
	var out []AdoptionAsk
	for {
		gave := false
		for _, k := range keys {
			if need[k] <= 0 || genericQueued[k.Queue] {
				continue
			}
			i := slices.IndexFunc(candidates, func(w Worker) bool {
				return !taken[w.ID] && w.MayAdopt(k.Queue, k.HostKey, now, staleAfter)
			})
			if i < 0 {
				continue
			}
			w := candidates[i]
			taken[w.ID] = true
			need[k] -= max(w.MaxConcurrency, 1)
			out = append(out, AdoptionAsk{WorkerID: w.ID, Key: k})
			gave = true
		}
		if !gave {
			return out
		}
	}
}

// Host is one host the provisioner launched, or tried to: its reservation
// (ID, also the EC2 client token, so a retried launch is the same launch),
// what it serves, and how it went.
type Host struct {
	ID         string
	Key        ProvisionKey
	HostSetup  []string
	State      LaunchState
	InstanceID string
	// Market is how it was bought: "spot" or "on-demand".
	Market string
	// Reason says why it was launched, refused or let go.
	Reason     string
	CreatedAt  time.Time
	LaunchedAt time.Time
	EndedAt    time.Time
	// Failure, for a host let go, says why its end counts against its key
	// (HostSetupFailed, NoHello); "" when it served or was not needed.
	Failure string
	Version int64
}

// Why a launched host's end counts against its key (Host.Failure).
const (
	HostSetupFailed = "host_setup_failed" // its worker left after its host setup failed
	NoHello         = "no_hello"          // it never said hello within the hello timeout
)

// Failed reports whether h's end counts against its key: EC2 refused it,
// its host setup failed, or it never said hello.
func (h Host) Failed() bool {
	return h.State == LaunchFailed || (h.State == LaunchEnded && h.Failure != "")
}

// BackoffPolicy is how a key's failed hosts hold its next launches back.
type BackoffPolicy struct {
	// Min is the wait after one failure; each further failure in a row
	// doubles it, up to Max.
	Min, Max time.Duration
	// MaxFailures failures in a row stop the key's launches for StopFor
	// after the last one.
	MaxFailures int
	StopFor     time.Duration
}

// KeyHold is what holds a key's launches back: how many of its hosts
// failed in a row, the newest of them, and until when nothing is launched
// for it. It is kept with the hosts (one item a key), and moves only when
// one of the key's hosts ends (After).
type KeyHold struct {
	Key      ProvisionKey
	Failures int
	// Last is the newest failed host: its Reason says why.
	Last Host
	// Until is when the key may launch again (one host at a time, until
	// one of its hosts serves).
	Until time.Time
	// Stopped: MaxFailures in a row; Until is StopFor after the last.
	Stopped bool
	// Version is the stored hold's (0: none stored yet).
	Version int64
}

// Waiting reports whether the hold keeps k's launches back at now.
func (h KeyHold) Waiting(now time.Time) bool { return h.Failures > 0 && now.Before(h.Until) }

// After reports the key's hold once its host ended: a failed host (Failed)
// is one more failure in a row, and a host that ended well (it served, or
// was let go idle) resets the count. After n failures in a row the key
// waits pol.Min × 2^(n-1), at most pol.Max, from the newest failure's end;
// pol.MaxFailures in a row stop it for pol.StopFor. A host still alive, or
// of another key, changes nothing.
func (h KeyHold) After(ended Host, pol BackoffPolicy) KeyHold {
	if ended.Alive() || ended.Key != h.Key {
		return h
	}
	if !ended.Failed() {
		return KeyHold{Key: h.Key, Version: h.Version}
	}
	next := h
	next.Failures++
	if !ended.EndedAt.Before(next.Last.EndedAt) {
		next.Last = ended
	}
	if pol.MaxFailures > 0 && next.Failures >= pol.MaxFailures {
		next.Stopped, next.Until = true, next.Last.EndedAt.Add(pol.StopFor)
		return next
	}
	wait := pol.Min
	for i := 1; i < next.Failures && wait < pol.Max; i++ {
		wait *= 2
	}
	next.Stopped, next.Until = false, next.Last.EndedAt.Add(min(wait, pol.Max))
	return next
}

// LaunchState is where a host the provisioner launched is (Host.State).
type LaunchState string

// Launch states.
const (
	LaunchReserved LaunchState = "reserved" // counted against the caps; the EC2 call is next
	LaunchRunning  LaunchState = "launched" // EC2 started the instance
	LaunchFailed   LaunchState = "failed"   // EC2 refused (Reason); its demand counts again
	LaunchEnded    LaunchState = "ended"    // let go: it never said hello in time, or its worker left
)

// Alive reports whether h counts against the caps: reserved or launched,
// not yet ended.
func (h Host) Alive() bool { return h.State == LaunchReserved || h.State == LaunchRunning }

// Launched reports h started as instance id, bought on market, at now.
func (h Host) Launched(instance, market string, now time.Time) (Host, error) {
	if h.State != LaunchReserved {
		return h, refuse(KindConflict, "host %s is %s, not reserved", h.ID, h.State)
	}
	next := h
	next.State, next.InstanceID, next.Market, next.LaunchedAt = LaunchRunning, instance, market, now
	return next, nil
}

// Ended reports h over at now in state (LaunchFailed or LaunchEnded) for
// reason, and whether that changes it.
func (h Host) Ended(state LaunchState, reason string, now time.Time) (Host, bool) {
	if !h.Alive() {
		return h, false
	}
	next := h
	next.State, next.Reason, next.EndedAt = state, reason, now
	return next, true
}
