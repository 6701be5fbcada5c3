package tests

import (
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"
)

// Submit-rate scenario: the dispatch fleet (three idle nymphs) through
// `lakeshore dev --lambdas`, submits at 50 a second for 10 seconds after
// the warm-ups. It measures what an operator's submit call costs through
// the real bootstraps under the emulator while work also flows through
// poll and ack, and how soon each body starts.
const (
	submitRateEvery = 20 * time.Millisecond // 50 submits a second
	submitRateN     = 500                   // 10 seconds of them
)

// BenchmarkLambdaSubmitRate reports the submit call's p50/p99 (ms) and
// dispatch's (submit call → the body's first instruction) at 50 submits a
// second through `lakeshore dev --lambdas`. Run it once: -benchtime 1x.
func BenchmarkLambdaSubmitRate(b *testing.B) {
	for b.Loop() {
		d, _ := startFleet(b, lambdasBackend)
		op := d.Operator()
		marks := b.TempDir()
		warm, _ := submitMarked(b, op, marks, dispatchWarmups, 0)
		waitMarks(b, marks, warm)
		sent, calls := submitMarked(b, op, marks, submitRateN, submitRateEvery)
		got := waitMarks(b, marks, sent)
		var dispatch []float64
		for id, at := range sent {
			dispatch = append(dispatch, float64(got[id].Sub(at).Microseconds())/1000)
		}
		slices.Sort(dispatch)
		b.ReportMetric(percentile(calls, 50), "submit-p50-ms")
		b.ReportMetric(percentile(calls, 99), "submit-p99-ms")
		b.ReportMetric(percentile(dispatch, 50), "dispatch-p50-ms")
		b.ReportMetric(percentile(dispatch, 99), "dispatch-p99-ms")
		b.ReportMetric(float64(emulators(d.logText(), "api")), "api-emulators")
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
