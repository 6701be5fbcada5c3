package domain

import (
	"testing"
	"time"
)

// TestLogTotalsAdd: each stream counts apart up to MaxLogStreamBytes; a
// chunk past it, or after the eof, is refused and leaves the totals.
func TestLogTotalsAdd(t *testing.T) {
	full := make([]byte, LogChunkBytes)
	at := LogTotals{Stdout: MaxLogStreamBytes - LogChunkBytes, Stderr: 5}
	for _, tc := range []struct {
		name string
		from LogTotals
		c    LogChunk
		want LogTotals
		kind Kind
	}{
		{"stdout to its cap", at, LogChunk{Stream: LogStdout, Data: full}, LogTotals{Stdout: MaxLogStreamBytes, Stderr: 5}, 0},
		{"stdout past its cap", at, LogChunk{Stream: LogStdout, Data: append(full, 'x')}, at, KindConflict},
		{"stderr apart", at, LogChunk{Stream: LogStderr, Data: full}, LogTotals{Stdout: at.Stdout, Stderr: 5 + LogChunkBytes}, 0},
		{"a marker at the cap", LogTotals{Stdout: MaxLogStreamBytes}, LogChunk{Stream: LogStdout, Dropped: 9}, LogTotals{Stdout: MaxLogStreamBytes, StdoutDropped: 9}, 0},
		{"the eof", at, LogChunk{Stream: LogStdout, EOF: true}, LogTotals{Stdout: at.Stdout, Stderr: 5, EOF: true}, 0},
		{"after the eof", LogTotals{EOF: true}, LogChunk{Stream: LogStdout}, LogTotals{EOF: true}, KindConflict},
		{"no such stream", at, LogChunk{Stream: "stdin"}, at, KindInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.from.Add(tc.c)
			if got != tc.want || KindOf(err) != tc.kind {
				t.Fatalf("Add = %+v, %v; want %+v, kind %d", got, err, tc.want, tc.kind)
			}
		})
	}
}

// TestTakesLogs: the attempt's own worker ships while it runs and for
// LogGrace after it ended; no other worker ever.
func TestTakesLogs(t *testing.T) {
	end := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	inv := Invocation{ID: "inv_1", Attempts: []Attempt{{Attempt: 1, WorkerID: "a", EndedAt: end}, {Attempt: 2, WorkerID: "b"}}}
	for _, tc := range []struct {
		name   string
		worker string
		n      int
		now    time.Time
		kind   Kind
	}{
		{"running", "b", 2, end.Add(time.Hour), 0},
		{"ended, within the grace", "a", 1, end.Add(LogGrace), 0},
		{"ended, past the grace", "a", 1, end.Add(LogGrace + time.Nanosecond), KindConflict},
		{"another worker's attempt", "a", 2, end, KindForbidden},
		{"an attempt never run", "a", 3, end, KindForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := inv.TakesLogs(tc.worker, tc.n, tc.now); KindOf(err) != tc.kind {
				t.Fatalf("TakesLogs = %v; want kind %d", err, tc.kind)
			}
		})
	}
}
