// Package agent is nymph, the on-host daemon: it says hello, heartbeats by
// polling, runs setup and invocations in their own process groups, acks
// outcomes (spooled, so they survive a restart), drains on a signal, an idle
// timeout or a command, and says bye. Its phases follow
// docs/design.md §6: booting → setup → ready → draining →
// terminating; its local run state is Starting, Polling, Backoff,
// Hibernating or Draining; ready and live follow docs/design.md §6.
package agent
