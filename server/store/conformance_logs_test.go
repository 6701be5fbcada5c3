package store_test

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// The log cases of the conformance suite, run on every backend.
func init() {
	conformanceCases = append(conformanceCases, conformanceCase{"logs/put and read", testLogs})
}

// testLogs: shipped output reads back in seq order, text and bytes alike,
// from any seq on, a page at a time; a re-shipped chunk is taken as stored;
// attempts are apart; expired chunks are not served. Each chunk reads back
// with where it ends in its stream, the bytes left out before it counted.
func testLogs(t *testing.T, f *fixture) {
	at := f.clock.Now()
	chunks := []domain.LogChunk{
		{Seq: 0, Stream: domain.LogStdout, Data: []byte("hello\n"), At: at},
		{Seq: 1, Stream: domain.LogStderr, Data: []byte{0xff, 0x00, 'x'}, At: at},
		{Seq: 2, Stream: domain.LogStdout, Data: []byte("tail\n"), At: at, Dropped: 12345},
		{Seq: 3, Stream: domain.LogStdout, At: at, EOF: true},
	}
	if err := f.s.PutLogs(f.ctx, "inv_a", 1, chunks[:2]); err != nil {
		t.Fatal(err)
	}
	if err := f.s.PutLogs(f.ctx, "inv_a", 1, chunks[1:]); err != nil { // seq 1 again
		t.Fatal(err)
	}
	if err := f.s.PutLogs(f.ctx, "inv_a", 2, []domain.LogChunk{{Seq: 0, Stream: domain.LogStdout, Data: []byte("other"), At: at}}); err != nil {
		t.Fatal(err)
	}
	got, err := f.s.Logs(f.ctx, "inv_a", 1, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 {
		t.Fatalf("read %d chunks, want 4: %+v", len(got), got)
	}
	ends := []int64{6, 3, 6 + 12345 + 5, 6 + 12345 + 5}
	for i, c := range got {
		w := chunks[i]
		if c.Seq != w.Seq || c.Stream != w.Stream || !bytes.Equal(c.Data, w.Data) || !c.At.Equal(w.At) || c.Dropped != w.Dropped || c.EOF != w.EOF {
			t.Errorf("chunk %d = %+v, want %+v", i, c, w)
		}
		if c.End != ends[i] {
			t.Errorf("chunk %d ends its %s at %d, want %d", i, c.Stream, c.End, ends[i])
		}
	}
	if tail, err := f.s.LogsTail(f.ctx, "inv_a", 1, 1); err != nil || len(tail) != 1 || tail[0].End != ends[3] {
		t.Errorf("the last chunk read from the end: %+v, %v; want it ending at %d", tail, err, ends[3])
	}
	page, err := f.s.Logs(f.ctx, "inv_a", 1, 2, 1)
	if err != nil || len(page) != 1 || page[0].Seq != 2 {
		t.Fatalf("one chunk from seq 2: %+v, %v", page, err)
	}
	if other, err := f.s.Logs(f.ctx, "inv_a", 2, 0, 10); err != nil || len(other) != 1 || string(other[0].Data) != "other" {
		t.Fatalf("attempt 2: %+v, %v", other, err)
	}
	// Seqs past 9 and 99 keep their order (a number, not text, order).
	var many []domain.LogChunk
	for i := range 120 {
		many = append(many, domain.LogChunk{Seq: i, Stream: domain.LogStdout, Data: []byte(strconv.Itoa(i)), At: at})
	}
	if err := f.s.PutLogs(f.ctx, "inv_b", 1, many); err != nil {
		t.Fatal(err)
	}
	next := 0
	for range 30 {
		page, err := f.s.Logs(f.ctx, "inv_b", 1, next, 7)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, c := range page {
			if c.Seq != next || string(c.Data) != strconv.Itoa(next) {
				t.Fatalf("read seq %d (%q) where %d was next", c.Seq, c.Data, next)
			}
			next++
		}
	}
	if next != 120 {
		t.Fatalf("paged through %d chunks, want 120", next)
	}
	f.clock.Advance(f.s.LogTTL + time.Minute)
	if old, err := f.s.Logs(f.ctx, "inv_a", 1, 0, 10); err != nil || len(old) != 0 {
		t.Fatalf("after the log retention: %d chunks, %v; want none", len(old), err)
	}
}

// TestConformanceLogWrites runs the cases of how shipped output is
// written on every backend, each on tables of its own: a chunk is a put
// conditional on its seq being free, so the engines must agree on that.
func TestConformanceLogWrites(t *testing.T) {
	cases := []conformanceCase{
		{"logs/each chunk written once", testLogChunkWrittenOnce},
		{"logs/in seq order, to the cap", testLogChunkOrderAndCap},
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			db := b.client(t)
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					c.run(t, newFixture(t, b, db))
				})
			}
		})
	}
}

func wantLogConflict(t *testing.T, what string, err error) {
	t.Helper()
	if wire.CodeOf(err) != wire.CodeConflict {
		t.Fatalf("%s: %v; want a conflict", what, err)
	}
}

// testLogChunkWrittenOnce: a chunk put again the same is taken as stored
// (text and bytes alike); one with other content under a stored seq is a
// conflict, and the stored chunk stays as it was.
func testLogChunkWrittenOnce(t *testing.T, f *fixture) {
	at := f.clock.Now()
	chunks := []domain.LogChunk{
		{Seq: 0, Stream: domain.LogStdout, Data: []byte("hello\n"), At: at},
		{Seq: 1, Stream: domain.LogStderr, Data: []byte{0xff, 0x00, 'x'}, At: at},
		{Seq: 2, Stream: domain.LogStdout, At: at, Dropped: 7},
	}
	for range 2 {
		if err := f.s.PutLogs(f.ctx, "inv_a", 1, chunks); err != nil {
			t.Fatalf("put, and put again the same: %v", err)
		}
	}
	for name, c := range map[string]domain.LogChunk{
		"text":    {Seq: 0, Stream: domain.LogStdout, Data: []byte("HELLO\n"), At: at},
		"bytes":   {Seq: 1, Stream: domain.LogStderr, Data: []byte{0xff, 0x01, 'x'}, At: at},
		"time":    {Seq: 0, Stream: domain.LogStdout, Data: []byte("hello\n"), At: at.Add(1)},
		"dropped": {Seq: 2, Stream: domain.LogStdout, At: at, Dropped: 8},
	} {
		wantLogConflict(t, "a chunk with other "+name, f.s.PutLogs(f.ctx, "inv_a", 1, []domain.LogChunk{c}))
	}
	got, err := f.s.Logs(f.ctx, "inv_a", 1, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(chunks) {
		t.Fatalf("%d chunks stored, want %d", len(got), len(chunks))
	}
	for i, c := range got {
		if !c.Same(chunks[i]) {
			t.Errorf("chunk %d = %+v, want %+v", i, c, chunks[i])
		}
	}
}

// testLogChunkOrderAndCap: a chunk is stored only after the one before it
// (in the same put or an earlier one); a stream stops at
// domain.MaxLogStreamBytes, whatever the other holds; nothing follows an
// eof.
func testLogChunkOrderAndCap(t *testing.T, f *fixture) {
	at := f.clock.Now()
	full := bytes.Repeat([]byte("o"), domain.LogChunkBytes)
	wantLogConflict(t, "a first chunk past seq 0", f.s.PutLogs(f.ctx, "inv_a", 1, []domain.LogChunk{{Seq: 1, Stream: domain.LogStdout, Data: []byte("x"), At: at}}))
	perStream := domain.MaxLogStreamBytes / domain.LogChunkBytes
	seq := 0
	put := func(stream string, n int) error {
		var cs []domain.LogChunk
		for range n {
			cs = append(cs, domain.LogChunk{Seq: seq + len(cs), Stream: stream, Data: full, At: at})
		}
		err := f.s.PutLogs(f.ctx, "inv_a", 1, cs)
		if err == nil {
			seq += n
		}
		return err
	}
	for range perStream / 4 {
		if err := put(domain.LogStdout, 2); err != nil {
			t.Fatal(err)
		}
		if err := put(domain.LogStderr, 2); err != nil {
			t.Fatal(err)
		}
	}
	for _, stream := range []string{domain.LogStdout, domain.LogStderr} {
		if err := put(stream, perStream/2); err != nil {
			t.Fatalf("%s up to its cap: %v", stream, err)
		}
	}
	wantLogConflict(t, "stdout past its cap", put(domain.LogStdout, 1))
	wantLogConflict(t, "stderr past its cap", f.s.PutLogs(f.ctx, "inv_a", 1, []domain.LogChunk{
		{Seq: seq, Stream: domain.LogStderr, At: at, Dropped: 1},
		{Seq: seq + 1, Stream: domain.LogStderr, Data: []byte("x"), At: at},
	}))
	// The marker before the refused chunk was stored; a gap is not.
	wantLogConflict(t, "a chunk after a gap", f.s.PutLogs(f.ctx, "inv_a", 1, []domain.LogChunk{{Seq: seq + 5, Stream: domain.LogStdout, At: at}}))
	if err := f.s.PutLogs(f.ctx, "inv_a", 1, []domain.LogChunk{{Seq: seq + 1, Stream: domain.LogStdout, At: at, EOF: true}}); err != nil {
		t.Fatalf("the eof: %v", err)
	}
	err := f.s.PutLogs(f.ctx, "inv_a", 1, []domain.LogChunk{{Seq: seq + 2, Stream: domain.LogStdout, At: at}})
	wantLogConflict(t, "a chunk after the eof", err)
	if !strings.Contains(err.Error(), "eof") {
		t.Errorf("the refusal %q does not say the output is complete", err)
	}
	var out, errs int
	for after, pages := 0, 0; pages < domain.MaxLogChunks/64; pages++ {
		page, err := f.s.Logs(f.ctx, "inv_a", 1, after, 64)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, c := range page {
			if c.Stream == domain.LogStderr {
				errs += len(c.Data)
			} else {
				out += len(c.Data)
			}
		}
		after = page[len(page)-1].Seq + 1
	}
	if out != domain.MaxLogStreamBytes || errs != domain.MaxLogStreamBytes {
		t.Fatalf("stored %d bytes of stdout, %d of stderr; want the cap, %d, of each", out, errs, domain.MaxLogStreamBytes)
	}
}
