package agent

import "time"

// The shutdown's timing, in one place: the drain, the spot watcher and the
// service-manager notice all plan around the same numbers.

// defaultFinishSlack is how much longer than --kill-after the terminate
// step waits for the bodies it killed: the runner's killConfirmWait, and
// margin.
const defaultFinishSlack = 5 * time.Second

// terminateWithin reports the longest the terminate step takes: SIGTERM to
// every body's process group, --kill-after, SIGKILL, and the slack for
// the kernel to confirm each one gone (Agent.reap).
func terminateWithin(killAfter, slack time.Duration) time.Duration {
	if slack <= 0 {
		slack = defaultFinishSlack
	}
	return killAfter + slack
}

// StopBudget reports the longest a drain takes from its start to exit with
// the given --grace and --kill-after: the grace, a poll in flight when it
// ends and the terminating poll after it, the terminate step
// (terminateWithin), the bounded ack flush (bye timeout + kill-after), bye
// itself and the introspection server's shutdown. A service manager's stop
// timeout (systemd TimeoutStopSec) must exceed it; nymph also sends it as
// EXTEND_TIMEOUT_USEC with STOPPING=1.
func StopBudget(grace, killAfter time.Duration) time.Duration {
	return grace + 2*requestTimeout + terminateWithin(killAfter, 0) + (byeTimeout + killAfter) + byeTimeout + time.Second
}

// spotGrace is how long in-flight work may still run once the instance is
// reclaimed at reclaim: enough before it that the terminate step
// (terminateWithin) ends, and bye hands the rest back, in time — at most
// grace, never negative.
func spotGrace(grace, killAfter time.Duration, reclaim, now time.Time) time.Duration {
	if reclaim.IsZero() {
		return grace
	}
	return max(min(grace, reclaim.Sub(now)-terminateWithin(killAfter, 0)), 0)
}
