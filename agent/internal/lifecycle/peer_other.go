//go:build !linux

package lifecycle

import "net/netip"

// inGroup cannot look the caller up without /proc: every caller that
// knows the run's secret URL is let in.
func inGroup(netip.AddrPort, netip.AddrPort, int, func(int) []int) error { return nil }
