package domain

import (
	"bytes"
	"time"
)

// LogChunk is one piece of an attempt's output as its worker shipped it
// (docs/logs.md). Seq numbers an attempt's chunks from 0, across both
// streams, in the order the worker read them; a reader follows an attempt
// by asking for the chunks after the last seq it has.
type LogChunk struct {
	Seq    int
	Stream string // LogStdout or LogStderr
	Data   []byte
	At     time.Time
	// Dropped, on a chunk, says how many bytes of its stream were left out
	// just before it: the stream passed its worker's per-attempt cap, and
	// only its head and its tail are kept.
	Dropped int64
	// EOF marks the attempt's last chunk: its output is complete.
	EOF bool
	// End, on a chunk read back, is where it ends in its stream: the bytes
	// of that stream the body wrote up to and including this chunk, those
	// left out (Dropped) counted. The store sets it on reads; a worker's is
	// ignored. A chunk stored without the dropped counts reads its stored
	// bytes only, so past the cap it runs short by what was left out.
	End int64
}

// Same reports whether c and o are the same chunk, byte for byte: a chunk
// shipped again after a lost answer is, and is taken as stored; any other
// chunk under a stored seq is a rewrite, refused.
func (c LogChunk) Same(o LogChunk) bool {
	return c.Seq == o.Seq && c.Stream == o.Stream && bytes.Equal(c.Data, o.Data) && c.At.Equal(o.At) &&
		c.Dropped == o.Dropped && c.EOF == o.EOF
}

// The two streams of an attempt's output.
const (
	LogStdout = "stdout"
	LogStderr = "stderr"
)

// Bounds of shipped output. A chunk holds at most LogChunkBytes, and an
// attempt at most MaxLogChunks chunks: chunks of a chatty body are small
// (what it wrote in a second), so the count is generous, two a second for
// 9 hours. What bounds the bytes is the per-stream cap: a stream is kept
// whole up to LogHeadBytes + LogTailBytes; past that nymph ships its first
// LogHeadBytes live and its last LogTailBytes when the run ends, with a
// chunk that says how much it left out between them. Either way an honest
// worker ships at most MaxLogStreamBytes of a stream, and the control plane
// stores no more (LogTotals.Add), whatever a worker sends.
const (
	LogChunkBytes     = 32 << 10
	MaxLogChunks      = 1 << 16
	LogHeadBytes      = 4 << 20
	LogTailBytes      = 1 << 20
	MaxLogStreamBytes = LogHeadBytes + LogTailBytes
)

// LogGrace is how long after an attempt ended its worker may still ship
// its output. nymph ships the rest of a finished run at once after its
// ack (and spends up to 5 s on it at exit); a failed request is retried
// after at most 30 s of backoff. A minute covers that, and past it an
// attempt's output is closed: nothing can be added to it later.
const LogGrace = time.Minute

// DefaultLogRetention is how long shipped output is kept (then DynamoDB's
// time to live deletes it).
const DefaultLogRetention = 7 * 24 * time.Hour

// LogTotals is what an attempt's chunks hold up to and including one seq:
// the bytes of each stream, and whether its eof is among them. Every stored
// chunk carries the totals through itself, so the next chunk is checked
// against the one before it, and the cap holds however a worker splits,
// orders or races its requests.
type LogTotals struct {
	Stdout, Stderr int64
	// StdoutDropped and StderrDropped count the bytes of each stream left
	// out (the chunks' Dropped): not stored, so not held to the cap, but
	// part of where each later chunk ends in its stream (LogChunk.End).
	StdoutDropped, StderrDropped int64
	EOF                          bool
}

// End reports where the stream's output through these totals ends: its
// stored bytes and those left out.
func (t LogTotals) End(stream string) int64 {
	if stream == LogStderr {
		return t.Stderr + t.StderrDropped
	}
	return t.Stdout + t.StdoutDropped
}

// Add reports the totals through chunk c, t being those through the chunk
// before it, or refuses c (a conflict): nothing follows an attempt's eof,
// and no stream grows past MaxLogStreamBytes.
func (t LogTotals) Add(c LogChunk) (LogTotals, error) {
	if t.EOF {
		return t, refuse(KindConflict, "chunk %d follows the attempt's eof: its output is complete", c.Seq)
	}
	next := t
	total, dropped := &next.Stdout, &next.StdoutDropped
	switch c.Stream {
	case LogStdout:
	case LogStderr:
		total, dropped = &next.Stderr, &next.StderrDropped
	default:
		return t, refuse(KindInvalid, "chunk %d: stream %q is not stdout or stderr", c.Seq, c.Stream)
	}
	*total += int64(len(c.Data))
	*dropped += max(c.Dropped, 0)
	if *total > MaxLogStreamBytes {
		return t, refuse(KindConflict, "chunk %d would take %s of the attempt to %d bytes; the cap is %d (the head and tail nymph keeps)",
			c.Seq, c.Stream, *total, MaxLogStreamBytes)
	}
	next.EOF = c.EOF
	return next, nil
}

// TakesLogs refuses output of attempt n of inv from worker at now, or
// reports nil: only the worker that ran the attempt may ship it (forbidden),
// and only until LogGrace after the attempt ended (a conflict: its output
// is closed).
func (inv Invocation) TakesLogs(workerID string, n int, now time.Time) error {
	if !inv.HeldBy(workerID, n) {
		return refuse(KindForbidden, "attempt %d of %s was not run by %s", n, inv.ID, workerID)
	}
	a := inv.Attempts[inv.attemptIndex(n)]
	if !a.EndedAt.IsZero() && now.After(a.EndedAt.Add(LogGrace)) {
		return refuse(KindConflict, "attempt %d of %s ended at %s; its output is closed %s after that",
			n, inv.ID, a.EndedAt.UTC().Format(time.RFC3339), LogGrace)
	}
	return nil
}

// LogBatch is the new output of one attempt, as a worker ships it.
type LogBatch struct {
	InvocationID string
	Attempt      int
	Chunks       []LogChunk
}

// LogPage is a read of one attempt's output: its chunks after a seq, in
// order. Next is the seq the following read starts after; EOF says the
// attempt's last chunk is in.
type LogPage struct {
	InvocationID string
	Attempt      int
	Chunks       []LogChunk
	Next         int
	EOF          bool
}
