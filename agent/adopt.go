package agent

import (
	"github.com/dreamlake/lakeshore/agent/internal/process"
	"github.com/dreamlake/lakeshore/shared/hostkey"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// Adopting a host key (docs/provision.md, "Adopting a host key"): a
// generic daemon started with --adopt-host-setup may be asked, by an adopt
// command, to run a queued invocation's host_setup. It does so in phase
// setup (heartbeat yes, claim no), exactly as a --host-setup at boot, and
// advertises the derived key from then on. If a command fails, the daemon
// stays generic, tells the control plane (adopt_failed) and never tries
// that key again.

// adoptCommand takes up adopt command c, or leaves it for a later poll:
// the control plane repeats it on every poll until the daemon advertises
// the key or says it failed. It is refused (reported failed) when the
// daemon may not adopt at all, or the key is not the host setup's.
func (a *Agent) adoptCommand(st *state, c wire.Command) {
	switch {
	case c.HostKey == st.hostKey || c.HostKey == st.adopting:
		return // done, or under way
	case !a.cfg.AdoptHostSetup || st.hostKey != "":
		a.log.Warn("adopt command refused: this daemon has a host key of its own or was not started with --adopt-host-setup",
			"host_key", c.HostKey, "own_host_key", st.hostKey)
		st.adoptFailed = c.HostKey
	case st.adoptRefused[c.HostKey]:
		st.adoptFailed = c.HostKey // failed before: say so again
	case len(c.HostSetup) == 0 || hostkey.Of(c.HostSetup) != c.HostKey:
		a.log.Warn("adopt command refused: its host key is not its host setup's", "host_key", c.HostKey,
			"commands", len(c.HostSetup))
		a.refuseAdoption(st, c.HostKey)
	case a.claimGate(st) != claimIdle || len(st.setupQueue) > 0:
		// Busy now (only an idle daemon adopts, and a setup command this
		// poll brought goes first): the command comes again with a later
		// poll.
		a.log.Debug("adopt command deferred: the daemon is busy", "host_key", c.HostKey, "phase", st.phase, "inflight", len(st.runs))
	default:
		a.log.Info("adopting a host key: running its host setup", "host_key", c.HostKey, "commands", len(c.HostSetup))
		st.hostSetup = c.HostSetup
		st.adoptionStarted(c.HostKey)
		a.enter(st, phaseSetup)
		a.startHostSetup(st, 0)
	}
}

// adopted ends an adoption whose host setup all succeeded: the daemon
// advertises the key from its next poll (and hello), and its wake socket
// listens for that key's work.
func (a *Agent) adopted(st *state) {
	if st.adopting == "" {
		return
	}
	a.log.Info("adopted a host key", "host_key", st.adopting)
	st.hostKey, st.rewake = st.adoptionEnded(false), true
	a.health.Registered(st.sess.workerID, st.hostKey, a.cfg.Queue)
}

// adoptionFailed ends an adoption whose host setup command ev failed: the
// daemon goes back to generic work (ready again once nothing else runs)
// and the next poll reports the key.
func (a *Agent) adoptionFailed(st *state, ev setupDone) {
	a.log.Error("adopted host setup failed; staying generic and not taking this key again", "host_key", st.adopting,
		"index", ev.index, "command", process.ClipString(ev.result.Command, 200), "exit_code", ev.result.ExitCode)
	key := st.adoptionEnded(true)
	st.hostSetup = nil
	a.refuseAdoption(st, key)
}

// refuseAdoption remembers key as one this daemon does not adopt and
// reports it with the next poll.
func (a *Agent) refuseAdoption(st *state, key string) {
	if st.adoptRefused == nil {
		st.adoptRefused = map[string]bool{}
	}
	st.adoptRefused[key] = true
	st.adoptFailed = key
}
