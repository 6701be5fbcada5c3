package logship

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// sink is a Sender that keeps what it was sent the way the control plane
// stores it (domain.LogTotals): a chunk is written once (one sent again
// the same is taken as stored, any other is refused), only after the one
// before it, and no stream past its cap. fail, while set, answers every
// request with that error.
type sink struct {
	mu       sync.Mutex
	chunks   map[int]wire.LogChunk // of testInv1 attempt 1, by seq
	totals   map[sinkKey]domain.LogTotals
	requests int
	fail     error
	closed   string // an invocation whose output the sink refuses (409)
}

type sinkKey struct {
	invocation string
	seq        int
}

func newSink() *sink {
	return &sink{chunks: map[int]wire.LogChunk{}, totals: map[sinkKey]domain.LogTotals{}}
}

func (s *sink) ShipLogs(_ context.Context, req wire.LogsRequest) (wire.LogsAccepted, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests++
	if s.fail != nil {
		return wire.LogsAccepted{}, s.fail
	}
	if err := req.Validate(); err != nil {
		return wire.LogsAccepted{}, err
	}
	n := 0
	for _, b := range req.Logs {
		if b.InvocationID == s.closed {
			return wire.LogsAccepted{}, wire.Errorf(wire.CodeConflict, "attempt %d of %s ended; its output is closed", b.Attempt, b.InvocationID)
		}
		for _, c := range b.Chunks {
			if err := s.store(b.InvocationID, c); err != nil {
				return wire.LogsAccepted{}, err
			}
			n++
		}
	}
	return wire.LogsAccepted{Stored: n}, nil
}

// store keeps chunk c of invocation id as the control plane would, or
// refuses it (409).
func (s *sink) store(id string, c wire.LogChunk) error {
	k := sinkKey{id, c.Seq}
	before, ok := s.totals[sinkKey{id, c.Seq - 1}]
	if c.Seq > 0 && !ok {
		return wire.Errorf(wire.CodeConflict, "chunk %d before chunk %d", c.Seq, c.Seq-1)
	}
	after, err := before.Add(domain.LogChunk(c))
	if err != nil {
		return wire.Errorf(wire.CodeConflict, "%v", err)
	}
	if _, ok := s.totals[k]; ok {
		if id == testInv1 && !domain.LogChunk(s.chunks[c.Seq]).Same(domain.LogChunk(c)) {
			return wire.Errorf(wire.CodeConflict, "chunk %d rewritten", c.Seq)
		}
		return nil
	}
	s.totals[k] = after
	if id == testInv1 {
		s.chunks[c.Seq] = c
	}
	return nil
}

// streams reassembles what was stored: each stream's bytes, the bytes
// reported dropped, and whether the eof came last with no gap before it.
func (s *sink) streams(t *testing.T) (out, errs []byte, dropped int64, eof bool) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for seq := 0; seq < len(s.chunks); seq++ {
		c, ok := s.chunks[seq]
		if !ok {
			t.Fatalf("seq %d missing of %d", seq, len(s.chunks))
		}
		if eof {
			t.Fatalf("chunk %d after the eof", seq)
		}
		dropped += c.Dropped
		if c.Stream == "stderr" {
			errs = append(errs, c.Data...)
		} else {
			out = append(out, c.Data...)
		}
		eof = c.EOF
	}
	return out, errs, dropped, eof
}

type runFiles struct{ dir, stdout, stderr string }

func newRunFiles(t *testing.T) runFiles {
	dir := t.TempDir()
	return runFiles{dir, filepath.Join(dir, "stdout.log"), filepath.Join(dir, "stderr.log")}
}

func appendFile(t *testing.T, path string, data []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
}

// shipAll calls Ship until it has nothing more to do (bounded).
func shipAll(t *testing.T, s *Shipper) {
	t.Helper()
	for range 1000 {
		more, err := s.Ship(context.Background())
		if err != nil {
			t.Fatalf("ship: %v", err)
		}
		if !more {
			return
		}
	}
	t.Fatal("Ship kept reporting more")
}

// TestShipsOutputAsItGrows: output written between ships arrives in order,
// both streams, and the eof comes once the run is finished and read.
func TestShipsOutputAsItGrows(t *testing.T) {
	snk, f := newSink(), newRunFiles(t)
	s := New(Config{})
	s.Track(snk, testWorker, testInv1, 1, f.stdout, f.stderr)
	shipAll(t, s) // no files yet: nothing, and no error
	appendFile(t, f.stdout, []byte("one\n"))
	appendFile(t, f.stderr, []byte("warn\n"))
	shipAll(t, s)
	appendFile(t, f.stdout, []byte("two\n"))
	shipAll(t, s)
	if _, _, _, eof := snk.streams(t); eof {
		t.Fatal("eof before the run finished")
	}
	s.Finish(testInv1, 1)
	shipAll(t, s)
	out, errs, dropped, eof := snk.streams(t)
	if string(out) != "one\ntwo\n" || string(errs) != "warn\n" || dropped != 0 || !eof {
		t.Fatalf("stored stdout %q stderr %q dropped %d eof %v", out, errs, dropped, eof)
	}
	if s.Pending() != 0 {
		t.Fatalf("%d runs still tracked after their eof", s.Pending())
	}
}

// TestCapKeepsHeadAndTail: past HeadBytes+TailBytes a stream keeps its head
// (live) and its tail (at the end), and one chunk says how much was left
// out between them.
func TestCapKeepsHeadAndTail(t *testing.T) {
	snk, f := newSink(), newRunFiles(t)
	s := New(Config{HeadBytes: 100 << 10, TailBytes: 40 << 10})
	s.Track(snk, testWorker, testInv1, 1, f.stdout, f.stderr)
	var all bytes.Buffer
	for i := range 300 { // 300 × 1 KiB, shipped as it grows
		line := []byte(strings.Repeat(string(rune('a'+i%26)), 1023) + "\n")
		all.Write(line)
		appendFile(t, f.stdout, line)
		if i%50 == 0 {
			shipAll(t, s)
		}
	}
	shipAll(t, s)
	if out, _, _, _ := snk.streams(t); len(out) != 100<<10 {
		t.Fatalf("shipped %d bytes live, want the head, %d", len(out), 100<<10)
	}
	s.Finish(testInv1, 1)
	shipAll(t, s)
	out, _, dropped, eof := snk.streams(t)
	want := append(append([]byte{}, all.Bytes()[:100<<10]...), all.Bytes()[all.Len()-40<<10:]...)
	if !bytes.Equal(out, want) || dropped != int64(all.Len()-140<<10) || !eof {
		t.Fatalf("stored %d bytes (head+tail match: %v), dropped %d (want %d), eof %v",
			len(out), bytes.Equal(out, want), dropped, all.Len()-140<<10, eof)
	}
}

// TestRetrySendsTheSameChunks: a failed request is sent again with the
// same seqs and bytes, also when more output came meanwhile; a request
// refused for good drops its runs.
func TestRetrySendsTheSameChunks(t *testing.T) {
	snk, f := newSink(), newRunFiles(t)
	s := New(Config{Retryable: func(err error) bool { return !errors.Is(err, errRefused) }})
	s.Track(snk, testWorker, testInv1, 1, f.stdout, f.stderr)
	appendFile(t, f.stdout, []byte("first\n"))
	snk.fail = errors.New("connection refused")
	if _, err := s.Ship(context.Background()); err == nil {
		t.Fatal("Ship hid a failed request")
	}
	appendFile(t, f.stdout, []byte("second\n"))
	snk.fail = nil
	shipAll(t, s)
	if got := snk.chunks[0]; string(got.Data) != "first\n" {
		t.Fatalf("retried chunk 0 = %q, want the same bytes as the failed try", got.Data)
	}
	shipAll(t, s)
	if out, _, _, _ := snk.streams(t); string(out) != "first\nsecond\n" {
		t.Fatalf("stored %q", out)
	}

	s.Track(snk, testWorker, testInv2, 1, f.stdout+"2", f.stderr+"2")
	appendFile(t, f.stdout+"2", []byte("x"))
	snk.fail = errRefused
	if _, err := s.Ship(context.Background()); err != nil {
		t.Fatalf("a refused request is not an error to retry: %v", err)
	}
	if s.Pending() != 1 {
		t.Fatalf("%d runs tracked; want inv_2 dropped, inv_1 kept", s.Pending())
	}
}

var errRefused = errors.New("403 forbidden")

// Well-formed ids (the sink validates requests as the control plane does).
const (
	testWorker = "wrk_01J00000000000000000000000"
	testInv1   = "inv_01J00000000000000000000001"
	testInv2   = "inv_01J00000000000000000000002"
)

// TestDoesNotFollowSymlinks: a body that replaces its log with a symlink
// does not get the daemon to ship the target.
func TestDoesNotFollowSymlinks(t *testing.T) {
	snk, f := newSink(), newRunFiles(t)
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("root's secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, f.stdout); err != nil {
		t.Fatal(err)
	}
	s := New(Config{})
	s.Track(snk, testWorker, testInv1, 1, f.stdout, f.stderr)
	s.Finish(testInv1, 1)
	shipAll(t, s)
	out, _, _, eof := snk.streams(t)
	if len(out) != 0 || !eof {
		t.Fatalf("shipped %q through a symlink (eof %v)", out, eof)
	}
}

// TestNeverShipsPastTheCap: whatever its head and tail are set to, and
// however a stream grows after its run ended, nymph ships no more of a
// stream than the control plane stores (domain.MaxLogStreamBytes): the
// rest is left out, said by a chunk with dropped, and the eof still goes.
func TestNeverShipsPastTheCap(t *testing.T) {
	snk, f := newSink(), newRunFiles(t)
	s := New(Config{HeadBytes: domain.LogHeadBytes, TailBytes: 2 * domain.LogTailBytes})
	s.Track(snk, testWorker, testInv1, 1, f.stdout, f.stderr)
	size := domain.MaxLogStreamBytes + 2*domain.LogTailBytes
	appendFile(t, f.stdout, bytes.Repeat([]byte("o"), size))
	shipAll(t, s)
	s.Finish(testInv1, 1)
	shipAll(t, s)
	out, _, dropped, eof := snk.streams(t)
	if len(out) != domain.MaxLogStreamBytes || int64(len(out))+dropped != int64(size) || !eof {
		t.Fatalf("shipped %d bytes, %d reported left out, eof %v; want the cap, %d, the rest left out, and the eof",
			len(out), dropped, eof, domain.MaxLogStreamBytes)
	}
}

// TestRefusedRunIsDropped: the control plane's 409 (the attempt's output
// closed, rewritten or at its cap) is not retried: the run is dropped and
// the shipper goes on.
func TestRefusedRunIsDropped(t *testing.T) {
	snk, f := newSink(), newRunFiles(t)
	s := New(Config{Retryable: client.Retryable})
	s.Track(snk, testWorker, testInv1, 1, f.stdout, f.stderr)
	appendFile(t, f.stdout, []byte("late\n"))
	snk.fail = wire.Errorf(wire.CodeConflict, "attempt 1 of %s ended; its output is closed", testInv1)
	if _, err := s.Ship(context.Background()); err != nil {
		t.Fatalf("a 409 is not an error to retry: %v", err)
	}
	if s.Pending() != 0 || snk.requests != 1 {
		t.Fatalf("%d runs tracked after %d requests; want the refused run dropped after one", s.Pending(), snk.requests)
	}
}

// TestRefusalDropsOnlyTheRefusedRun: a request that carried two runs is
// refused for one of them (its attempt's output is closed); the other is
// not dropped with it: each goes alone, and only the refused one is
// dropped.
func TestRefusalDropsOnlyTheRefusedRun(t *testing.T) {
	snk, f := newSink(), newRunFiles(t)
	s := New(Config{Retryable: client.Retryable})
	s.Track(snk, testWorker, testInv1, 1, f.stdout, f.stderr)
	s.Track(snk, testWorker, testInv2, 1, f.stdout+"2", f.stderr+"2")
	appendFile(t, f.stdout, []byte("kept\n"))
	appendFile(t, f.stdout+"2", []byte("late\n"))
	snk.closed = testInv2
	shipAll(t, s)
	if s.Pending() != 1 {
		t.Fatalf("%d runs tracked; want inv_1 only", s.Pending())
	}
	appendFile(t, f.stdout, []byte("more\n"))
	s.Finish(testInv1, 1)
	shipAll(t, s)
	if out, _, _, eof := snk.streams(t); string(out) != "kept\nmore\n" || !eof {
		t.Fatalf("inv_1 stored %q (eof %v); want all of it", out, eof)
	}
}
