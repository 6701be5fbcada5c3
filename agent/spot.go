package agent

import (
	"github.com/dreamlake/lakeshore/agent/internal/spot"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// The loop's side of EC2's spot notices: agent/internal/spot watches the
// instance metadata for them, and the loop drains on what it sends.

// What a rebalance recommendation does (Config.OnRebalance, --on-rebalance).
const (
	OnRebalanceDrain = "drain" // drain as a drain command would: no more claims, the grace, bye drain
	OnRebalanceLog   = "log"   // log it and carry on (the default)
)

// spotNotice is the loop's handling of a notice: an interruption starts the
// drain (bye spot_interruption) and records the reclaim time, which the loop
// uses to shorten the grace (spotGrace); a rebalance recommendation starts
// the drain (bye drain: no deadline is known, so the grace is the
// configured one) with --on-rebalance drain, and is only logged with log.
func (a *Agent) spotNotice(st *state, n spot.Notice) {
	switch n.Kind {
	case spot.Rebalance:
		if a.cfg.OnRebalance != OnRebalanceDrain {
			a.log.Warn("EC2 rebalance recommendation: this spot instance is at elevated risk of interruption; carrying on (--on-rebalance log)",
				"notice_time", n.Time)
			return
		}
		a.log.Warn("EC2 rebalance recommendation: this spot instance is at elevated risk of interruption; draining (--on-rebalance drain)",
			"notice_time", n.Time, "grace", a.cfg.Grace, "inflight", len(st.runs), "already_draining", st.phase.leaving())
		a.startDrain(st, wire.ByeDrain)
	case spot.Interruption:
		if st.spotReclaim.IsZero() || n.Time.Before(st.spotReclaim) {
			st.spotReclaim = n.Time
		}
		a.log.Warn("spot interruption notice: draining before the reclaim", "action", n.Action, "time", n.Time,
			"seconds_left", int(n.Time.Sub(a.now()).Seconds()),
			"grace", spotGrace(a.cfg.Grace, a.cfg.KillAfter, st.spotReclaim, a.now()), "inflight", len(st.runs))
		a.startDrain(st, wire.ByeSpotInterruption)
	}
}
