package tests

import (
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"
)

// Submit-rate scenario: submits at 50 a second for 10 seconds, after the
// warm-ups, through `lakeshore dev --lambdas` (the real bootstraps under
// the emulator) and in process for comparison. "submit-only" has no
// daemon, so the submit path alone is measured; "fleet" has the dispatch
// fleet (three idle nymphs, eight bodies at once each), so the submits
// share the store and the machine with the polls, claims and acks they
// cause, and dispatch (submit call → the body's first instruction) is
// measured too.
const (
	submitRateEvery = 20 * time.Millisecond // 50 submits a second
	submitRateN     = 500                   // 10 seconds of them
	// submitRateCapacity is each nymph's --capacity: at one body each, a
	// poll → run → ack turn per body through the emulator bounds three
	// nymphs below 50 a second, and the backlog, not the path, would be
	// measured.
	submitRateCapacity = 8
)

// BenchmarkLambdaSubmitRate reports the submit call's p50/p99 (ms) at 50
// submits a second, dispatch's p50/p99 with a fleet, and how many api
// emulators the run started. Run it once: -benchtime 1x.
func BenchmarkLambdaSubmitRate(b *testing.B) {
	for _, c := range []struct {
		name  string
		plane backend
		fleet bool
	}{
		{"lambdas/submit-only", lambdasBackend, false},
		{"lambdas/fleet", lambdasBackend, true},
		{"in-process/fleet", backends[0], true},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				var d *devServer
				if c.fleet {
					d, _ = startFleet(b, c.plane, submitRateCapacity)
				} else {
					d = startDev(b, c.plane)
				}
				op := d.Operator()
				marks := b.TempDir()
				warm, _ := submitMarked(b, op, marks, dispatchWarmups, 0)
				if c.fleet {
					waitMarks(b, marks, warm)
				}
				sent, calls := submitMarked(b, op, marks, submitRateN, submitRateEvery)
				b.ReportMetric(percentile(calls, 50), "submit-p50-ms")
				b.ReportMetric(percentile(calls, 99), "submit-p99-ms")
				if c.plane.name == lambdasBackend.name {
					b.ReportMetric(float64(emulators(d.logText(), "api")), "api-emulators")
				}
				if !c.fleet {
					continue
				}
				got := waitMarks(b, marks, sent)
				var dispatch []float64
				for id, at := range sent {
					dispatch = append(dispatch, float64(got[id].Sub(at).Microseconds())/1000)
				}
				slices.Sort(dispatch)
				b.ReportMetric(percentile(dispatch, 50), "dispatch-p50-ms")
				b.ReportMetric(percentile(dispatch, 99), "dispatch-p99-ms")
			}
		})
	}
}

// emulators counts the emulators `lakeshore dev --lambdas` started for
// function fn: its log lines carry "[fn#instance] ".
func emulators(log, fn string) int {
	n := 0
	for _, m := range regexp.MustCompile(`\[`+regexp.QuoteMeta(fn)+`#([0-9]+)\] `).FindAllStringSubmatch(log, -1) {
		if i, err := strconv.Atoi(m[1]); err == nil {
			n = max(n, i)
		}
	}
	return n
}
