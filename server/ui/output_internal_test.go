package ui

import (
	"testing"

	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestTailOf: the tail of a stream starts at a line's start (or, in one
// long line, a character's), keeps the cap's marker where it falls, and
// knows how much comes before it from the chunks' ends, or says it does
// not know.
func TestTailOf(t *testing.T) {
	out, errs := domain.LogStdout, domain.LogStderr
	chunk := func(seq int, stream, data string, end int64) wire.LogChunk {
		return wire.LogChunk{Seq: seq, Stream: stream, Data: []byte(data), End: end}
	}
	for _, tc := range []struct {
		name    string
		chunks  []wire.LogChunk
		limit   int
		text    string
		omitted string
	}{
		{"all of it", []wire.LogChunk{chunk(0, out, "a\nb\n", 4), chunk(1, errs, "e\n", 2), chunk(2, out, "c\n", 6)}, 100, "a\nb\nc\n", ""},
		{"cut mid-line", []wire.LogChunk{chunk(0, out, "first\nsecond\nthird\n", 19)}, 10, "third\n", "13 B of earlier output not shown"},
		{"cut at a line's start", []wire.LogChunk{chunk(0, out, "first\nsecond\n", 13)}, 7, "second\n", "6 B of earlier output not shown"},
		{"cut at a chunk's end", []wire.LogChunk{chunk(0, out, "ab\n", 3), chunk(1, out, "cd\n", 6)}, 3, "cd\n", "3 B of earlier output not shown"},
		{"one long line from a character", []wire.LogChunk{chunk(0, out, "xxé日本", 10)}, 5, "本", "7 B of earlier output not shown"},
		{"one long line cut at a character", []wire.LogChunk{chunk(0, out, "xxé日本", 10)}, 6, "日本", "4 B of earlier output not shown"},
		{"the cap's marker", []wire.LogChunk{chunk(7, out, "head\n", 5), {Seq: 8, Stream: out, Data: []byte("tail\n"), Dropped: 1000, End: 1010}}, 100,
			"head\n<span class=\"ansi-note\">[lakeshore] 1000 bytes of stdout left out here (over the per-attempt cap; its head and tail are kept)\n</span>tail\n", ""},
		{"the chunks read start later", []wire.LogChunk{chunk(40, out, "late\n", 5000)}, 100, "late\n", "4.9 KiB of earlier output not shown"},
		{"chunks stored without their end", []wire.LogChunk{chunk(40, out, "late\n", 0)}, 100, "late\n", "earlier output not shown"},
		{"from seq 0 without their end", []wire.LogChunk{chunk(0, errs, "e", 0), chunk(1, out, "all\n", 0)}, 100, "all\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tail := tailOf(tc.chunks, out, tc.limit)
			if got := string(tail.render(out)); got != tc.text {
				t.Errorf("text %q, want %q", got, tc.text)
			}
			if got := tail.omitted(); got != tc.omitted {
				t.Errorf("omitted %q, want %q", got, tc.omitted)
			}
		})
	}
}
