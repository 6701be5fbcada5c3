package domain

import (
	"fmt"
	"maps"
	"slices"
	"time"
)

// Worker is the stored row of one daemon process (one machine boot).
type Worker struct {
	ID                 string
	MachineID          string
	BootID             string
	Label              string
	Tags               map[string]string
	Lanes              []string
	Versions           map[string]string
	HostKey            string
	MaxConcurrency     int
	CurrentInvocations int
	State              WorkerState
	Phase              Phase
	HostStatus         HostStatus
	TokenHash          string
	// GoneWhy says why it was retired, in words: its bye, the new boot
	// that replaced it, its host, the provisioner or the sweep.
	GoneWhy string
	// GoneKind is how it was retired (Retire): EndBye when it said bye,
	// EndGone otherwise (a new boot replaced it, its host went, it was let
	// go or retired silent). Its held work is handed back as that kind.
	GoneKind        EndKind
	LastSetupResult *SetupResult
	CreatedAt       time.Time
	LastSeenAt      time.Time
	GoneAt          time.Time
	// ReplacedBy is the boot id whose hello retired this worker (a new
	// boot of its machine), "" if none did.
	ReplacedBy string
	// MachineConflict: the replaced worker polled again (ReplacedAlive).
	MachineConflict bool
	// Reaped marks a gone worker the sweep no longer needs to look at: a
	// sweep found it holding nothing after the holder index settled.
	Reaped bool
	// AdoptHostSetup: a generic worker that may be asked to take on a host
	// key (its hello said so); Adoption is the key it was last asked for.
	AdoptHostSetup bool
	Adoption       *Adoption
	// Listed is what its last poll listed in flight (its invocations; nil
	// when that poll sent no list): what it has received and not yet seen
	// answered (Invocation.Undelivered).
	Listed []string
	// SetupAdded counts the setup commands ever given to it (AddSetup),
	// so a poll reads its setup FIFO only when it may hold one; negative
	// for a row stored before the count existed, which may hold any.
	SetupAdded int
	Version    int64
}

// Clone returns a copy of w that shares no memory with it: its maps,
// slices and pointed-to values are copied too.
func (w Worker) Clone() Worker {
	c := w
	c.Tags = maps.Clone(w.Tags)
	c.Lanes = slices.Clone(w.Lanes)
	c.Versions = maps.Clone(w.Versions)
	c.Listed = slices.Clone(w.Listed)
	if w.LastSetupResult != nil {
		r := *w.LastSetupResult
		c.LastSetupResult = &r
	}
	if w.Adoption != nil {
		a := *w.Adoption
		a.HostSetup = slices.Clone(a.HostSetup)
		c.Adoption = &a
	}
	return c
}

// MayHaveSetup reports whether w may have setup commands pending: a poll
// of a worker never given one skips reading its FIFO.
func (w Worker) MayHaveSetup() bool { return w.SetupAdded != 0 }

// Adoption is a host key a generic worker is asked to take on
// (docs/provision.md, "Adopting a host key"): it runs HostSetup, the
// commands of queued work on Queue whose key is HostKey, and advertises
// that key from then on. It is over when the worker advertises the key
// (the row drops it) or its host setup failed (Failed says so, and the
// worker is not asked for that key again).
type Adoption struct {
	HostKey   string
	Queue     string
	HostSetup []string
	AskedAt   time.Time
	Failed    string
}

// Adopting reports the key w is asked to take on and has not yet: "" if
// none, or its adoption failed.
func (w Worker) Adopting() string {
	if w.Adoption == nil || w.Adoption.Failed != "" || w.HostKey == w.Adoption.HostKey {
		return ""
	}
	return w.Adoption.HostKey
}

// MayAdopt reports whether w may be asked to take on host key hk of queue
// at now: it said hello with adopt_host_setup, is generic (no key of its
// own), live and ready, runs nothing, serves queue, is not already asked,
// and did not fail that key before.
func (w Worker) MayAdopt(queue, hk string, now time.Time, staleAfter time.Duration) bool {
	switch {
	case !w.AdoptHostSetup || w.HostKey != "" || hk == "" || w.Pending():
		return false
	case Project(w, now, staleAfter) != WorkerActive || w.Phase != PhaseReady:
		return false
	case w.CurrentInvocations > 0 || !slices.Contains(w.Lanes, queue):
		return false
	case w.Adopting() != "":
		return false
	case w.Adoption != nil && w.Adoption.HostKey == hk:
		return false // it failed this key
	}
	return true
}

// AskToAdopt reports w asked to take on a (MayAdopt at now), and whether
// that changes it; a worker that may not is refused (a conflict: it
// changed since it was read).
func (w Worker) AskToAdopt(a Adoption, now time.Time, staleAfter time.Duration) (Worker, bool, error) {
	if !w.MayAdopt(a.Queue, a.HostKey, now, staleAfter) {
		return w, false, refuse(KindConflict, "worker %s may not adopt host key %s now", w.ID, a.HostKey)
	}
	next := w
	a.AskedAt, a.Failed = now, ""
	next.Adoption = &a
	return next, true, nil
}

// Project reports the state an operator (and the redelivery sweep) sees for
// w at now. Gone is never relabelled; a stopped or terminated host reads
// gone; silence longer than staleAfter reads stale; otherwise the stored
// state stands.
func Project(w Worker, now time.Time, staleAfter time.Duration) WorkerState {
	switch {
	case Retired(w):
		return WorkerGone
	case !w.LastSeenAt.IsZero() && now.Sub(w.LastSeenAt) > staleAfter:
		return WorkerStale
	default:
		return w.State
	}
}

// RunningNow reports how many invocations w counts as running at now: what
// it last said, and 0 once it reads stale or gone (the sweep hands its work
// back, and nothing it may still run counts).
func RunningNow(w Worker, now time.Time, staleAfter time.Duration) int {
	if st := Project(w, now, staleAfter); st == WorkerStale || st == WorkerGone {
		return 0
	}
	return w.CurrentInvocations
}

// StateWhy says since when and why w reads stale or gone at now (the zero
// time and "" for any other state): a stale worker since it was last heard,
// a gone one since it was retired, with its bye reason or host status.
func StateWhy(w Worker, now time.Time, staleAfter time.Duration) (time.Time, string) {
	switch Project(w, now, staleAfter) {
	case WorkerStale:
		return w.LastSeenAt, fmt.Sprintf("silent for %s; stale after %s", now.Sub(w.LastSeenAt).Round(time.Second), staleAfter)
	case WorkerGone:
		switch {
		case HostGone(w.HostStatus) && w.State != WorkerGone:
			return w.GoneSince(), "its host is " + string(w.HostStatus)
		case w.GoneWhy != "":
			return w.GoneSince(), w.GoneWhy
		default:
			return w.GoneSince(), "gone"
		}
	}
	return time.Time{}, ""
}

// Retired reports whether w is over for good: stored gone, or its host
// stopped or terminated (a stopped machine that starts again boots a new
// daemon, which says hello as a new worker). A retired worker claims
// nothing, its poll is refused (410) and a hello never returns it.
func Retired(w Worker) bool {
	return w.State == WorkerGone || HostGone(w.HostStatus)
}

// HostGone reports whether a host status makes its worker read gone: the
// instance stopped or terminated, so the daemon on it is dead.
func HostGone(status HostStatus) bool {
	return status == HostStopped || status == HostTerminated
}

// hostRank orders host statuses by how final they are: a host status only
// moves forward. A stopped instance's daemon is dead even if the instance
// starts again (it boots a new daemon, which says hello as a new worker),
// and a terminated instance never comes back.
var hostRank = map[HostStatus]int{
	"":             0,
	HostPending:    1,
	HostRunning:    1, // pending ⇄ running both mean alive
	HostStopped:    2,
	HostTerminated: 3,
}

// ValidHostStatus reports whether status is one of the host statuses a
// worker row may carry (pending, running, stopped, terminated).
func ValidHostStatus(status HostStatus) bool {
	_, ok := hostRank[status]
	return ok && status != ""
}

// HostStatusMoves reports whether a host status from may be replaced by to:
// to differs, and it does not move back from stopped or terminated (that
// would revive a worker whose work was already handed back) nor from
// terminated to stopped.
func HostStatusMoves(from, to HostStatus) bool {
	if from == to || !ValidHostStatus(to) {
		return false
	}
	rf, ok := hostRank[from]
	if !ok { // an unknown stored value: anything valid replaces it
		return true
	}
	return hostRank[to] >= rf
}

// PollTransition reports the stored state a poll carrying phase moves a
// worker in stored state cur to (phase "" means an old daemon that sends
// none). It never widens the allowed flips: draining never returns to
// active or setting_up, and a gone worker is not revived (ErrWorkerGone).
func PollTransition(cur WorkerState, phase Phase) (WorkerState, error) {
	if cur == WorkerGone {
		return "", refuse(KindGone, "worker is gone; say hello again")
	}
	switch phase {
	case "", PhaseSetup, PhaseReady, PhaseDraining, PhaseTerminating:
	default:
		return "", refuse(KindInvalid, "unknown phase %q", phase)
	}
	if cur == WorkerDraining {
		return WorkerDraining, nil
	}
	switch phase {
	case "":
		if cur == WorkerPending || cur == WorkerJoining {
			return WorkerActive, nil
		}
		return cur, nil
	case PhaseSetup:
		return WorkerSettingUp, nil
	case PhaseReady:
		return WorkerActive, nil
	default: // draining, terminating
		return WorkerDraining, nil
	}
}

// PhaseClaims reports whether a daemon in phase may claim: ready, or ""
// (an old daemon that reports no phase, whose stored state alone decides).
// Setup, draining and terminating never claim. It is the phase half of
// AcceptsWork, the one claim gate on the server.
func PhaseClaims(phase Phase) bool { return phase == PhaseReady || phase == "" }

// AcceptsWork reports whether a worker may be handed new invocations, and
// if not, why. setupPending is whether its setup FIFO holds unreported
// commands.
func AcceptsWork(w Worker, setupPending bool) (bool, string) {
	switch {
	case Retired(w):
		return false, "retired"
	case w.State != WorkerActive:
		return false, "state " + string(w.State)
	case !PhaseClaims(w.Phase):
		return false, "phase " + string(w.Phase)
	case setupPending:
		return false, "setup commands pending"
	case w.Adopting() != "":
		return false, "adopting host key " + w.Adopting()
	case w.CurrentInvocations >= w.MaxConcurrency:
		return false, "at capacity"
	default:
		return true, ""
	}
}

// Bye is a daemon's goodbye: why it leaves, and how many runs it abandoned
// (their outcomes unknown).
type Bye struct {
	WorkerID  string
	Reason    string
	Abandoned int
}

// Poll is what a daemon's poll says about itself, and how long it may wait
// for work.
type Poll struct {
	WorkerID string
	Phase    Phase  // "" from an old daemon that sends none
	Queue    string // the queue it polls ("": any of its lanes)
	HostKey  string // "" leaves the worker's key as it is
	// MaxConcurrency and CurrentInvocations are its updated capabilities;
	// nil when it sent none.
	MaxConcurrency, CurrentInvocations *int
	// Capabilities reports whether it sent updated capabilities at all: an
	// old daemon sends none, and what it lists is what it runs (Listed).
	Capabilities bool
	// Inflight lists the invocations it runs (nil: it sent no list).
	Inflight []string
	// AdoptFailed is the key whose adopted host setup failed ("": none).
	AdoptFailed string
	// SetupResults are the outcomes of its setup commands since its last
	// poll.
	SetupResults []SetupResult
	// Wait is how long the poll may wait for work (0: answer at once).
	Wait time.Duration
}

// Heartbeat reports w after a poll p at now: seen now, in the stored state
// p's phase projects to (PollTransition), with the capabilities and host
// key p reports. A retired worker's poll is refused (ErrWorkerGone: it must
// say hello again), and so is a poll of a queue that is not one of its
// lanes.
func (w Worker) Heartbeat(p Poll, now time.Time) (Worker, error) {
	switch {
	case w.ReplacedBy != "":
		return w, &Error{Kind: KindGone, Reason: GoneReplaced, Message: fmt.Sprintf(
			"worker was replaced: machine %s said hello from boot %s; only a process of that boot may say hello for it",
			w.MachineID, w.ReplacedBy)}
	case HostGone(w.HostStatus):
		return w, refuse(KindGone, "worker is gone (its host is %s); say hello again", w.HostStatus)
	case Retired(w):
		_, why := StateWhy(w, now, 0)
		return w, refuse(KindGone, "worker is gone (%s); say hello again", why)
	}
	state, err := PollTransition(w.State, p.Phase)
	if err != nil {
		return w, err
	}
	if p.Queue != "" && len(w.Lanes) > 0 && !slices.Contains(w.Lanes, p.Queue) {
		return w, refuse(KindInvalid, "queue %q is not one of the lanes %v this worker said hello with", p.Queue, w.Lanes)
	}
	next := w
	next.State = state
	next.Phase = p.Phase
	next.LastSeenAt = now
	next.Listed = slices.Clone(p.Inflight)
	if p.HostKey != "" {
		next.HostKey = p.HostKey
	}
	if a := next.Adoption; a != nil {
		switch {
		case next.HostKey == a.HostKey:
			next.Adoption = nil // taken on: it advertises the key
		case p.AdoptFailed == a.HostKey && a.Failed == "":
			failed := *a
			failed.Failed = "its host setup failed (see last_setup_result); it stays generic"
			next.Adoption = &failed
		}
	}
	switch {
	case !p.Capabilities:
		next.CurrentInvocations = len(p.Inflight)
	default:
		if p.MaxConcurrency != nil {
			next.MaxConcurrency = *p.MaxConcurrency
		}
		if p.CurrentInvocations != nil {
			next.CurrentInvocations = *p.CurrentInvocations
		}
	}
	return next, nil
}

// Leave reports w gone at now because it said bye (why), and whether that
// changes it: the bye is its last sign of life. Retire is the same for a
// worker that said nothing.
func (w Worker) Leave(why string, now time.Time) (Worker, bool) {
	next, changed := w.Retire(EndBye, why, now)
	if changed {
		next.LastSeenAt = now
	}
	return next, changed
}

// Replace reports w retired at now because a hello from boot, another boot
// of its machine, replaced it (Retire), and whether that changes it.
func (w Worker) Replace(boot, why string, now time.Time) (Worker, bool) {
	next, changed := w.Retire(EndGone, why, now)
	if changed {
		next.ReplacedBy = boot
	}
	return next, changed
}

// ReplacedAlive reports w, replaced by another boot, after it polled again
// (its refusal is GoneReplaced), and whether that changes it. A machine
// boots again only after its daemon died, so a replaced worker that still
// polls proves another process uses the same machine id: why says so, for
// the operator, once.
func (w Worker) ReplacedAlive() (Worker, bool) {
	if w.ReplacedBy == "" || w.MachineConflict {
		return w, false
	}
	next := w
	next.MachineConflict = true
	next.GoneWhy += fmt.Sprintf("; it polled again after that, so it was still running: another process uses machine id %s (two hosts from one image?)", w.MachineID)
	return next, true
}

// Retire reports w gone at now for why, retired as kind (EndBye: its own
// bye; EndGone: anything else), and whether that changes it: a gone worker
// stays as it went. Its
// last_seen_at stays when it was last heard from; GoneAt is when it was
// retired. What it held is handed back by the caller
// (Invocation.Requeue), so its count is zero from now.
func (w Worker) Retire(kind EndKind, why string, now time.Time) (Worker, bool) {
	if w.State == WorkerGone {
		return w, false
	}
	next := w
	next.State = WorkerGone
	next.CurrentInvocations = 0
	next.GoneWhy, next.GoneKind = why, kind
	next.GoneAt = now
	return next, true
}

// Drain reports w asked to drain: it claims nothing more, and its next poll
// carries a drain command. A retired worker (Retired) cannot drain (a
// conflict); a draining one is unchanged.
func (w Worker) Drain() (Worker, bool, error) {
	switch {
	case Retired(w):
		return w, false, refuse(KindConflict, "worker %s is gone", w.ID)
	case w.State == WorkerDraining:
		return w, false, nil
	}
	next := w
	next.State = WorkerDraining
	return next, true, nil
}

// SetHostStatus reports w with its host's EC2 status at now, and whether
// that changes it. A worker stored gone is left as it is, and a host status
// only moves forward (HostStatusMoves). The host going stopped or
// terminated makes the worker read gone from now: GoneAt is when the sweep
// starts counting its look for held work.
func (w Worker) SetHostStatus(status HostStatus, now time.Time) (Worker, bool) {
	if w.State == WorkerGone || !HostStatusMoves(w.HostStatus, status) {
		return w, false
	}
	next := w
	if HostGone(status) && !HostGone(w.HostStatus) && w.GoneAt.IsZero() {
		next.GoneAt = now
	}
	next.HostStatus = status
	return next, true
}

// Reap reports w marked reaped (the sweep is done with it: gone, holding
// nothing, its holder index settled), and whether that changes it.
func (w Worker) Reap() (Worker, bool) {
	if w.Reaped {
		return w, false
	}
	next := w
	next.Reaped = true
	return next, true
}

// Listed reports whether w is still in the worker list at now: a gone
// worker the sweep is done with (reaped) leaves it retention after it went
// gone (0: never). Its row expires then too, some time later.
func Listed(w Worker, now time.Time, retention time.Duration) bool {
	return retention <= 0 || !w.Reaped || now.Sub(w.GoneSince()) <= retention
}

// GoneSince reports when w went gone (its last sign of life if unrecorded).
func (w Worker) GoneSince() time.Time {
	if w.GoneAt.IsZero() {
		return w.LastSeenAt
	}
	return w.GoneAt
}

// LostWhy reports whether w's running work must be handed back at now, and
// why: it reads stale, or gone and not yet reaped.
func (w Worker) LostWhy(now time.Time, staleAfter time.Duration) (Loss, bool) {
	switch Project(w, now, staleAfter) {
	case WorkerStale:
		return Loss{EndStale, fmt.Sprintf("worker stale: silent for %s", now.Sub(w.LastSeenAt).Round(time.Second))}, true
	case WorkerGone:
		if w.Reaped {
			return Loss{}, false
		}
		if HostGone(w.HostStatus) {
			return Loss{EndGone, "worker gone: host " + string(w.HostStatus)}, true
		}
		if w.GoneKind == EndBye {
			return Loss{EndBye, "worker gone: " + w.GoneWhy}, true
		}
		if w.GoneWhy != "" {
			return Loss{EndGone, "worker gone: " + w.GoneWhy}, true
		}
		return Loss{EndGone, "worker gone"}, true
	default:
		return Loss{}, false
	}
}

// RecordSetup reports w with r as its latest setup result (what the worker
// views show as last_setup_result).
func (w Worker) RecordSetup(r *SetupResult) Worker {
	next := w
	next.LastSetupResult = r
	return next
}

// Registration is what a daemon's hello says about itself.
type Registration struct {
	MachineID, BootID string
	Label             string
	Tags              map[string]string
	Lanes             []string
	Versions          map[string]string
	HostKey           string
	// MaxConcurrency and CurrentInvocations are its capabilities; nil when
	// it sent none (capacity 1, nothing running).
	MaxConcurrency, CurrentInvocations *int
	// AdoptHostSetup: it may be asked to take on a host key.
	AdoptHostSetup bool
}

// NewPendingWorker is the row the provisioner writes for a host it
// launched (docs/provision.md): stored pending, keyed by the instance id as
// its machine id, with no boot and no token until the host's hello adopts
// it (Adopt). labels say what it was launched for.
func NewPendingWorker(id, instanceID string, key ProvisionKey, hostID string, now time.Time) Worker {
	return Worker{ID: id, MachineID: instanceID, State: WorkerPending, HostKey: key.HostKey, Lanes: []string{key.Queue},
		Label: "launched " + hostID, CreatedAt: now}
}

// Pending reports whether w is a launched host's row no hello adopted yet.
func (w Worker) Pending() bool { return w.State == WorkerPending && w.BootID == "" }

// Adopt reports pending w taken over by the first hello of its host, from
// boot: it is that daemon's worker from now (joining), with what the
// daemon says of itself.
func (w Worker) Adopt(r Registration, tokenHash string, now time.Time) Worker {
	next := w.Register(r, tokenHash, now)
	next.BootID, next.State = r.BootID, WorkerJoining
	return next
}

// NewWorker reports the worker a hello makes: joining, seen now, holding
// the hash of the token issued to it.
func NewWorker(id string, r Registration, tokenHash string, now time.Time) Worker {
	w := Worker{ID: id, MachineID: r.MachineID, BootID: r.BootID, State: WorkerJoining, CreatedAt: now}
	return w.Register(r, tokenHash, now)
}

// Register reports w after a hello of its own boot (a retry: the daemon
// never saw the first answer): what the daemon says about itself, seen
// now, with the newly issued token replacing the old.
func (w Worker) Register(r Registration, tokenHash string, now time.Time) Worker {
	next := w
	next.Label, next.Tags, next.Lanes, next.Versions, next.HostKey = r.Label, r.Tags, r.Lanes, r.Versions, r.HostKey
	next.AdoptHostSetup = r.AdoptHostSetup && r.HostKey == ""
	next.MaxConcurrency, next.CurrentInvocations = 1, 0
	if r.MaxConcurrency != nil {
		next.MaxConcurrency = *r.MaxConcurrency
	}
	if r.CurrentInvocations != nil {
		next.CurrentInvocations = *r.CurrentInvocations
	}
	next.TokenHash = tokenHash
	next.LastSeenAt = now
	return next
}

// AddSetup reports the setup command a worker is given: pending, at the
// end of its FIFO. A retired worker (Retired) takes none (a conflict).
func (w Worker) AddSetup(commandID string, argv []string, now time.Time) (SetupCommand, error) {
	if Retired(w) {
		return SetupCommand{}, refuse(KindConflict, "worker %s is gone", w.ID)
	}
	return SetupCommand{WorkerID: w.ID, CommandID: commandID, Argv: argv, Status: SetupPending, CreatedAt: now}, nil
}

// HostStatusMayChange reports whether w's host status is still worth
// asking EC2 about: not stored gone (its host no longer matters) and not on
// a terminated host (that never comes back).
func (w Worker) HostStatusMayChange() bool {
	return w.State != WorkerGone && w.HostStatus != HostTerminated
}

// MayHandBack decides a requeued ack (AckRequeued) from w, whose daemon
// reports phase with it ("" from a daemon that sends none): a worker hands
// an attempt back only while it drains. It reports w as the accepted ack
// leaves it, and whether that changes it.
//
// Stored draining, retired (Retired: a gone worker's acks are answered as
// any ack is) or no phase: accepted, w unchanged. Phase draining or
// terminating: accepted, and w is stored draining from now with that phase
// (PollTransition, as a poll reporting it would), so it claims nothing
// more although no poll has reported its drain yet. Any other phase (setup,
// ready) of a worker not stored draining: refused, a conflict; its attempt
// stays running until it is taken back as a lost run's is (a poll of the
// worker that no longer lists it, its bye, or the sweep).
func (w Worker) MayHandBack(phase Phase) (Worker, bool, error) {
	switch {
	case w.State == WorkerDraining || Retired(w) || phase == "":
		return w, false, nil
	case phase == PhaseSetup || phase == PhaseReady:
		return w, false, refuse(KindConflict,
			"worker %s is %s and reports phase %s: only a draining worker hands an attempt back", w.ID, w.State, phase)
	}
	state, err := PollTransition(w.State, phase) // draining; an unknown phase is invalid
	if err != nil {
		return w, false, err
	}
	next := w
	next.State, next.Phase = state, phase
	return next, true, nil
}

// OwesDrain reports whether a poll in phase must carry a drain command to
// w: an operator asked it to drain and the daemon is not draining yet.
func (w Worker) OwesDrain(phase Phase) bool {
	return w.State == WorkerDraining && phase != PhaseDraining && phase != PhaseTerminating
}
