// Package logship ships the output of the daemon's runs to the control
// plane (docs/logs.md): each run's stdout.log and stderr.log are read as
// they grow and sent in chunks of at most 32 KiB, about once a second, so
// an operator's `lakeshore logs --follow` sees output within ~2 s of the
// body writing it. Past a per-stream cap only the head (shipped live) and
// the tail (shipped when the run ends) are kept, with a chunk that says how
// many bytes were left out between them. The last chunk of a run is marked
// eof.
//
// Shipping never holds up the work: it runs on its own goroutine, a failed
// request is retried with backoff, and the chunks of a retry are the same
// bytes under the same seq (the control plane writes a chunk once, and
// takes one sent again the same as stored). A request it refuses (a 4xx:
// the attempt is not the worker's, its output is closed or at its cap)
// drops the runs it carried.
package logship

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// Sender sends one request (client.Client.ShipLogs).
type Sender interface {
	ShipLogs(ctx context.Context, req wire.LogsRequest) (wire.LogsAccepted, error)
}

// Defaults of Config.
const (
	DefaultInterval  = time.Second
	DefaultHeadBytes = domain.LogHeadBytes
	DefaultTailBytes = domain.LogTailBytes
	maxBackoff       = 30 * time.Second
)

// Config configures a Shipper; zero values take the defaults.
type Config struct {
	// Interval is how often new output is looked for.
	Interval time.Duration
	// HeadBytes and TailBytes are the per-stream cap: output up to
	// HeadBytes + TailBytes is shipped whole; past it, the first HeadBytes
	// (live) and the last TailBytes (when the run ends). Whatever they
	// are, no more than domain.MaxLogStreamBytes of a stream is shipped:
	// the control plane stores no more.
	HeadBytes, TailBytes int64
	// Retryable reports whether a failed request may succeed later
	// (client.Retryable); one that may not drops the runs it carried.
	Retryable func(error) bool
	Clock     clock.Clock
	Logger    *slog.Logger
}

// Shipper ships the output of the runs it tracks. Track, Finish and Ship
// are safe for concurrent use. A nil Shipper tracks and ships nothing.
type Shipper struct {
	cfg  Config
	log  *slog.Logger
	kick chan struct{}

	shipMu sync.Mutex // one Ship at a time: it owns the runs' read state

	mu   sync.Mutex
	runs map[runKey]*run
}

type runKey struct {
	invocation string
	attempt    int
}

// run is one tracked attempt: where its output is, how far each stream was
// read, and the chunks sent but not yet answered (sent again, the same, on
// a retry).
type run struct {
	key      runKey
	sender   Sender // the client of the worker that ran it (its token)
	worker   string
	streams  [2]stream
	seq      int
	pending  []wire.LogChunk
	finished bool // the run ended: its files are complete
	eofSent  bool
	// solo: a request that carried this run with others was refused, so
	// it goes alone until one is answered: a refusal of one run (its
	// attempt's output closed, say) drops that run only.
	solo bool
}

// requestKey groups the runs one request carries: a worker's, or one solo
// run.
type requestKey struct {
	worker string
	solo   runKey
}

type stream struct {
	name, path string
	offset     int64 // bytes of the file shipped (or left out) so far
	shipped    int64 // bytes of the file shipped
}

// New returns a shipper; call Run to start it.
func New(cfg Config) *Shipper {
	cfg.Interval = cmp.Or(cfg.Interval, DefaultInterval)
	cfg.HeadBytes = cmp.Or(cfg.HeadBytes, DefaultHeadBytes)
	cfg.TailBytes = cmp.Or(cfg.TailBytes, DefaultTailBytes)
	if cfg.Retryable == nil {
		cfg.Retryable = func(error) bool { return true }
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Shipper{cfg: cfg, log: log, kick: make(chan struct{}, 1), runs: map[runKey]*run{}}
}

// Track starts shipping attempt n of invocation id, run by worker (whose
// requests go through sender), whose output goes to the files stdout and
// stderr (they may not exist yet).
func (s *Shipper) Track(sender Sender, worker, id string, n int, stdout, stderr string) {
	if s == nil {
		return
	}
	k := runKey{id, n}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.runs[k]; ok {
		return
	}
	s.runs[k] = &run{key: k, sender: sender, worker: worker, streams: [2]stream{
		{name: domain.LogStdout, path: stdout}, {name: domain.LogStderr, path: stderr},
	}}
}

// Finish says attempt n of invocation id ended: its files are complete, so
// the rest of its output (the tail, past the cap) and its eof go next.
func (s *Shipper) Finish(id string, n int) {
	if s == nil {
		return
	}
	s.mu.Lock()
	if r, ok := s.runs[runKey{id, n}]; ok {
		r.finished = true
	}
	s.mu.Unlock()
	s.Kick()
}

// Kick makes Run look for output now rather than at its next interval.
func (s *Shipper) Kick() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Pending reports how many tracked runs still have output to ship.
func (s *Shipper) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.runs)
}

// Run ships until ctx ends: every Interval, at once after a request that
// left more to send or on a Kick, and after a failure with backoff.
func (s *Shipper) Run(ctx context.Context) {
	backoff := time.Duration(0)
	for {
		wait := s.cfg.Interval
		more, err := s.Ship(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			backoff = min(max(2*backoff, s.cfg.Interval), maxBackoff)
			wait = backoff
			s.log.Warn("log shipping failed; retrying", "error", err.Error(), "retry_in", wait.String())
		case more:
			backoff = 0
			continue
		default:
			backoff = 0
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-s.kick:
			t.Stop()
		case <-t.C:
		}
	}
}

// Flush ships until every finished run's output is out, or ctx ends (the
// daemon is leaving: a bounded last effort).
func (s *Shipper) Flush(ctx context.Context) error {
	for {
		more, err := s.Ship(ctx)
		if err != nil {
			return err
		}
		if !more && s.finishedLeft() == 0 {
			return nil
		}
		if !more {
			if err := clock.Sleep(ctx, s.cfg.Interval/4); err != nil {
				return err
			}
		}
	}
}

func (s *Shipper) finishedLeft() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.runs {
		if r.finished {
			n++
		}
	}
	return n
}

// Ship sends one request of new output of every tracked run (up to
// wire.MaxLogBytesPerRequest), one request per worker, and reports whether
// more is ready right away. A run whose last chunk was answered is dropped;
// so is a run the control plane refused for good (its worker was replaced,
// its attempt is not its worker's or its output is closed). A refused
// request that carried several runs drops none: each is sent alone next.
func (s *Shipper) Ship(ctx context.Context) (more bool, err error) {
	s.shipMu.Lock()
	defer s.shipMu.Unlock()
	s.mu.Lock()
	runs := slices.SortedFunc(maps.Values(s.runs), func(a, b *run) int {
		return cmp.Or(cmp.Compare(a.key.invocation, b.key.invocation), cmp.Compare(a.key.attempt, b.key.attempt))
	})
	s.mu.Unlock()

	budget := wire.MaxLogBytesPerRequest
	byRequest := map[requestKey][]*run{}
	var order []requestKey
	for _, r := range runs {
		k := requestKey{worker: r.worker}
		if r.solo {
			k.solo = r.key
		}
		if budget <= 0 || len(byRequest[k]) >= 64 {
			more = true
			break
		}
		s.mu.Lock()
		finished := r.finished
		s.mu.Unlock()
		if len(r.pending) == 0 {
			var full bool
			r.pending, full = s.read(r, finished, budget)
			more = more || full
		}
		if len(r.pending) == 0 {
			continue
		}
		for _, c := range r.pending {
			budget -= len(c.Data)
		}
		if byRequest[k] == nil {
			order = append(order, k)
		}
		byRequest[k] = append(byRequest[k], r)
	}
	var errs []error
	for _, k := range order {
		rs, worker := byRequest[k], k.worker
		req := wire.LogsRequest{WorkerID: worker}
		for _, r := range rs {
			req.Logs = append(req.Logs, wire.LogBatch{InvocationID: r.key.invocation, Attempt: r.key.attempt, Chunks: r.pending})
		}
		_, err := rs[0].sender.ShipLogs(ctx, req)
		switch {
		case err == nil:
			s.sent(rs)
		case s.cfg.Retryable(err):
			errs = append(errs, err)
		case len(rs) > 1:
			// Which run was refused is not said: each goes alone next, at
			// once, the same chunks (those stored already are taken as such).
			for _, r := range rs {
				r.solo = true
			}
			more = true
		default:
			s.log.Warn("log shipping refused; dropping the output of these runs", "worker_id", worker,
				"runs", len(rs), "error", err.Error())
			s.drop(rs)
		}
	}
	return more && len(errs) == 0, errors.Join(errs...)
}

// sent marks rs' pending chunks answered and drops the runs that are over.
func (s *Shipper) sent(rs []*run) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range rs {
		for _, c := range r.pending {
			r.eofSent = r.eofSent || c.EOF
		}
		r.pending, r.solo = nil, false
		if r.eofSent {
			delete(s.runs, r.key)
		}
	}
}

func (s *Shipper) drop(rs []*run) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range rs {
		delete(s.runs, r.key)
	}
}

// read builds r's next chunks, at most budget bytes of output, and reports
// whether it stopped at the budget with more to read. Only Ship (under
// shipMu) touches a run's streams and seq.
//
// A stream is shipped live up to HeadBytes (and while seq numbers remain
// for its tail); past that it waits for the run's end, when what lies
// between the head and the last TailBytes is left out (one chunk with
// dropped says how much) and the tail goes.
func (s *Shipper) read(r *run, finished bool, budget int) ([]wire.LogChunk, bool) {
	var out []wire.LogChunk
	now := s.cfg.Clock.Now().UTC()
	liveSeqs := domain.MaxLogChunks - 2*int(s.cfg.TailBytes/domain.LogChunkBytes+1) - 4
	for i := range r.streams {
		st := &r.streams[i]
		size, err := fileSize(st.path)
		if err != nil {
			continue // not created yet, or not a file the runner made
		}
		headDone := st.offset >= s.cfg.HeadBytes || r.seq >= liveSeqs
		limit := size
		switch {
		case !headDone && size > s.cfg.HeadBytes && !(finished && size <= s.cfg.HeadBytes+s.cfg.TailBytes):
			limit = s.cfg.HeadBytes
		case headDone && !finished:
			limit = st.offset // the rest waits for the run's end
		case headDone && st.offset < size-s.cfg.TailBytes:
			dropped := size - s.cfg.TailBytes - st.offset
			st.offset = size - s.cfg.TailBytes
			out = append(out, wire.LogChunk{Seq: r.seq, Stream: st.name, At: now, Dropped: dropped})
			r.seq++
		}
		for st.offset < limit {
			if budget <= 0 || r.seq >= domain.MaxLogChunks-1 {
				return out, budget <= 0
			}
			if !finished && r.seq >= liveSeqs {
				break
			}
			room := domain.MaxLogStreamBytes - st.shipped
			if room <= 0 {
				// The stream grew past the cap after its run ended (or the
				// head and tail are set past it): the rest is left out.
				out = append(out, wire.LogChunk{Seq: r.seq, Stream: st.name, At: now, Dropped: limit - st.offset})
				r.seq++
				st.offset = limit
				break
			}
			n := min(limit-st.offset, domain.LogChunkBytes, int64(budget), room)
			data, err := readAt(st.path, st.offset, n)
			if err != nil || len(data) == 0 {
				if err != nil {
					s.log.Warn("read run output", "invocation_id", r.key.invocation, "attempt", r.key.attempt,
						"stream", st.name, "error", err.Error())
				}
				break
			}
			out = append(out, wire.LogChunk{Seq: r.seq, Stream: st.name, Data: data, At: now})
			r.seq++
			st.offset += int64(len(data))
			st.shipped += int64(len(data))
			budget -= len(data)
		}
	}
	if finished && !r.eofSent && s.caughtUp(r) {
		out = append(out, wire.LogChunk{Seq: r.seq, Stream: domain.LogStdout, At: now, EOF: true})
		r.seq++
	}
	return out, false
}

// caughtUp reports whether every stream of a finished run was read to its
// end.
func (s *Shipper) caughtUp(r *run) bool {
	for _, st := range r.streams {
		if size, err := fileSize(st.path); err == nil && st.offset < size {
			return false
		}
	}
	return true
}

// fileSize reports the size of the regular file at path. Lstat and
// O_NOFOLLOW: a body may replace its log with a symlink, and the daemon
// must not ship what it points to.
func fileSize(path string) (int64, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return 0, err
	}
	if !fi.Mode().IsRegular() {
		return 0, fmt.Errorf("%s is not a regular file", path)
	}
	return fi.Size(), nil
}

// readAt reads up to n bytes of path from off.
func readAt(path string, off, n int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, n)
	got, err := f.ReadAt(buf, off)
	if errors.Is(err, io.EOF) {
		err = nil
	}
	return buf[:got], err
}
