package domain

import "time"

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
}

// The two streams of an attempt's output.
const (
	LogStdout = "stdout"
	LogStderr = "stderr"
)

// Bounds of shipped output: a chunk holds at most LogChunkBytes, and an
// attempt at most MaxLogChunks chunks, whatever a worker sends. Chunks of a
// chatty body are small (what it wrote in a second), so the count is
// generous: two a second for 9 hours. nymph's own cap (head and tail) is
// what bounds the bytes.
const (
	LogChunkBytes = 32 << 10
	MaxLogChunks  = 1 << 16
)

// DefaultLogRetention is how long shipped output is kept (then DynamoDB's
// time to live deletes it).
const DefaultLogRetention = 7 * 24 * time.Hour
