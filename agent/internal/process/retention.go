package process

import (
	"cmp"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/ids"
)

// Retention's bounds.
const (
	// retentionMaxRemovals bounds how many run directories one sweep
	// removes; the next sweep goes on where it stopped.
	retentionMaxRemovals = 100
	// retentionMaxWalk bounds how many entries one sweep looks at to size
	// the run directories; past it the rest count as empty this time.
	retentionMaxWalk = 200_000
	// retentionMinInterval and retentionMaxInterval bound the timer between
	// sweeps (half the retention).
	retentionMinInterval = time.Second
	retentionMaxInterval = 10 * time.Minute
	// trashPrefix starts the name a run directory is renamed to before it
	// is removed: a run directory that vanishes at once from its name can
	// never be one the runner is about to use again.
	trashPrefix = ".nymph-removing-"
)

// RetentionConfig configures a Retention.
type RetentionConfig struct {
	// Workdir is the runner's root (Config.Workdir).
	Workdir string
	// Keep is how long a finished run's directory stays after the run
	// ended (nymph --keep-runs); 0: none, it goes once its ack is answered.
	Keep time.Duration
	// MaxBytes caps the run directories' total size (--keep-runs-size):
	// while it is exceeded, finished ones go, oldest first. 0: no cap.
	MaxBytes int64
	// Interval is the time between sweeps on the timer (zero: half of
	// Keep, between 1 s and 10 min).
	Interval time.Duration
	// Clock reads now, against which finish times are compared (zero: real
	// time).
	Clock  clock.Clock
	Logger *slog.Logger
	// Swept, when set, is called after each sweep with what it did (tests).
	Swept func(SweepResult)
}

// Retention removes the run directories (<workdir>/<invocation_id>/<attempt>)
// of runs that are over: once a run ended more than Keep ago, or, oldest
// first, while all of them together hold more than MaxBytes. A run is
// over once nobody holds it: the daemon holds each run from before it
// starts until its ack is answered (Hold, Release), and at start every
// ack still spooled, so neither a run in progress nor one whose outcome
// the control plane has not heard is ever removed. A directory no one
// holds at start is an earlier process's finished run.
//
// A run's finish time is the modification time of its stdout.log, which
// the runner stamps as the run ends (else the directory's own). Only
// directories named like an invocation id (inv_<ULID>) holding attempt
// directories named by a number are touched; everything is read with
// Lstat and removed through an os.Root on the workdir, so neither a
// symlink a body planted nor a workdir shared with other files can make
// it remove anything else. An invocation directory left empty goes too.
//
// A nil *Retention holds nothing and removes nothing.
type Retention struct {
	cfg RetentionConfig
	log *slog.Logger

	mu       sync.Mutex
	holds    map[runKey]bool
	byInv    map[string]int  // holds per invocation id
	failed   map[string]bool // removals that failed, warned about once
	kick     chan struct{}
	trashSeq int
}

// runKey names one attempt's run directory.
type runKey struct {
	invocationID string
	attempt      int
}

// SweepResult is what one sweep did.
type SweepResult struct {
	// Removed lists the run directories removed, as "<invocation_id>/<attempt>".
	Removed []string
	// Kept is how many finished run directories stayed; Held how many were
	// held (running, or their ack not answered).
	Kept, Held int
	// Bytes is the run directories' total size before the sweep removed
	// any (0 without a cap: they are not sized then).
	Bytes int64
}

// NewRetention returns a Retention for cfg; Run sweeps.
func NewRetention(cfg RetentionConfig) *Retention {
	if cfg.Interval <= 0 {
		cfg.Interval = min(max(cfg.Keep/2, retentionMinInterval), retentionMaxInterval)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Retention{
		cfg: cfg, log: log,
		holds: map[runKey]bool{}, byInv: map[string]int{}, failed: map[string]bool{},
		kick: make(chan struct{}, 1),
	}
}

// Hold keeps attempt of invocationID's run directory until Release.
func (r *Retention) Hold(invocationID string, attempt int) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	k := runKey{invocationID, attempt}
	if !r.holds[k] {
		r.holds[k] = true
		r.byInv[invocationID]++
	}
}

// Release lets attempt of invocationID's run directory go once retention
// says so, and asks for a sweep.
func (r *Retention) Release(invocationID string, attempt int) {
	if r == nil {
		return
	}
	r.mu.Lock()
	k := runKey{invocationID, attempt}
	if r.holds[k] {
		delete(r.holds, k)
		if r.byInv[invocationID]--; r.byInv[invocationID] <= 0 {
			delete(r.byInv, invocationID)
		}
	}
	r.mu.Unlock()
	r.Kick()
}

// Kick asks for a sweep soon (a run ended: the size cap may be exceeded).
func (r *Retention) Kick() {
	if r == nil {
		return
	}
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Run sweeps at once, then after each Kick or Release and every Interval,
// until ctx ends. A sweep under way finishes the directory it is removing.
func (r *Retention) Run(ctx context.Context) {
	if r == nil {
		return
	}
	tick := time.NewTicker(r.cfg.Interval)
	defer tick.Stop()
	for {
		if res := r.Sweep(ctx); len(res.Removed) >= retentionMaxRemovals {
			r.Kick() // bounded per sweep, not in all: go on at once
		}
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		case <-tick.C:
		}
	}
}

// runDir is one run directory a sweep found.
type runDir struct {
	key      runKey
	finished time.Time
	bytes    int64
}

// Sweep removes what retention says may go, and reports it.
func (r *Retention) Sweep(ctx context.Context) SweepResult {
	var res SweepResult
	if r == nil {
		return res
	}
	defer func() {
		if r.cfg.Swept != nil {
			r.cfg.Swept(res)
		}
	}()
	root, err := os.OpenRoot(r.cfg.Workdir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			r.log.Warn("run-directory retention: cannot open the workdir", "workdir", r.cfg.Workdir, "error", err.Error())
		}
		return res
	}
	defer root.Close()
	now := r.cfg.Clock.Now()
	dirs, invs := r.scan(root)
	walked := 0
	if r.cfg.MaxBytes > 0 {
		for i := range dirs {
			dirs[i].bytes = dirSize(root, dirs[i].key.path(), &walked)
			res.Bytes += dirs[i].bytes
		}
	}
	// Oldest first: the size cap takes from the front.
	slices.SortFunc(dirs, func(a, b runDir) int {
		return cmp.Or(a.finished.Compare(b.finished), strings.Compare(a.key.path(), b.key.path()))
	})
	total := res.Bytes
	for _, d := range dirs {
		if ctx.Err() != nil {
			break
		}
		if r.held(d.key) {
			res.Held++
			continue
		}
		age := now.Sub(d.finished)
		reason := ""
		switch {
		case r.cfg.Keep == 0:
			reason = "--keep-runs 0"
		case age >= r.cfg.Keep:
			reason = "older than --keep-runs"
		case r.cfg.MaxBytes > 0 && total > r.cfg.MaxBytes:
			reason = "over --keep-runs-size"
		}
		if reason == "" || len(res.Removed) >= retentionMaxRemovals {
			res.Kept++
			continue
		}
		if !r.remove(root, d.key) {
			res.Kept++
			continue
		}
		total -= d.bytes
		res.Removed = append(res.Removed, d.key.path())
		r.log.Info("run directory removed", "invocation_id", d.key.invocationID, "attempt", d.key.attempt,
			"reason", reason, "age", age.Round(time.Second).String(), "bytes", d.bytes)
	}
	for _, inv := range invs {
		r.removeIfEmpty(root, inv)
	}
	r.log.Debug("run-directory retention swept", "removed", len(res.Removed), "kept", res.Kept, "held", res.Held, "bytes", res.Bytes)
	return res
}

// path reports k's run directory relative to the workdir.
func (k runKey) path() string { return k.invocationID + "/" + strconv.Itoa(k.attempt) }

// scan lists the run directories under root and the invocation
// directories it looked in, and removes what an interrupted removal left
// behind. Anything that is not a plain directory with the right name is
// skipped.
func (r *Retention) scan(root *os.Root) ([]runDir, []string) {
	top, err := readDirIn(root, ".")
	if err != nil {
		r.log.Warn("run-directory retention: cannot list the workdir", "workdir", r.cfg.Workdir, "error", err.Error())
		return nil, nil
	}
	var dirs []runDir
	var invs []string
	for _, e := range top {
		inv := e.Name()
		if !e.IsDir() || !ids.Valid(ids.Invocation, inv) || !isPlainDir(root, inv) {
			continue
		}
		invs = append(invs, inv)
		entries, err := readDirIn(root, inv)
		if err != nil {
			continue
		}
		for _, a := range entries {
			name := a.Name()
			if !a.IsDir() {
				continue
			}
			if strings.HasPrefix(name, trashPrefix) && isPlainDir(root, inv+"/"+name) {
				_ = root.RemoveAll(inv + "/" + name) // a sweep stopped while removing it
				continue
			}
			attempt, err := strconv.Atoi(name)
			if err != nil || attempt < 0 || strconv.Itoa(attempt) != name {
				continue
			}
			k := runKey{inv, attempt}
			if !isPlainDir(root, k.path()) {
				continue
			}
			dirs = append(dirs, runDir{key: k, finished: finishTime(root, k.path())})
		}
	}
	return dirs, invs
}

// held reports whether k is held.
func (r *Retention) held(k runKey) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.holds[k]
}

// remove removes k's run directory unless it is held, and reports whether
// it did. The hold check and the rename out of the run's name happen
// under the lock, so a run Held meanwhile never loses its directory; the
// slow part, removing the renamed tree, does not hold it up.
func (r *Retention) remove(root *os.Root, k runKey) bool {
	r.mu.Lock()
	if r.holds[k] {
		r.mu.Unlock()
		return false
	}
	r.trashSeq++
	trash := k.invocationID + "/" + trashPrefix + strconv.Itoa(k.attempt) + "-" + strconv.Itoa(r.trashSeq)
	err := root.Rename(k.path(), trash)
	r.mu.Unlock()
	if err == nil {
		err = root.RemoveAll(trash)
	}
	if err != nil {
		r.mu.Lock()
		first := !r.failed[k.path()]
		r.failed[k.path()] = true
		r.mu.Unlock()
		if first {
			r.log.Warn("run-directory retention: cannot remove a run directory", "invocation_id", k.invocationID, "attempt", k.attempt, "error", err.Error())
		}
		return false
	}
	return true
}

// removeIfEmpty removes invocation directory inv if it is empty and no run
// of it is held (one about to start would create its run directory there).
func (r *Retention) removeIfEmpty(root *os.Root, inv string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byInv[inv] > 0 {
		return
	}
	if entries, err := readDirIn(root, inv); err != nil || len(entries) > 0 {
		return
	}
	if err := root.Remove(inv); err == nil {
		r.log.Debug("invocation directory removed", "invocation_id", inv)
	}
}

// isPlainDir reports whether name, under root, is a directory and not a
// symlink to one.
func isPlainDir(root *os.Root, name string) bool {
	fi, err := root.Lstat(name)
	return err == nil && fi.IsDir()
}

// readDirIn lists directory name under root without following a symlink
// in its place.
func readDirIn(root *os.Root, name string) ([]fs.DirEntry, error) {
	if name != "." && !isPlainDir(root, name) {
		return nil, errors.New("not a directory")
	}
	f, err := root.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.ReadDir(-1)
}

// finishTime reports when the run in dir ended: its stdout.log's
// modification time (stampFinished), else the directory's.
func finishTime(root *os.Root, dir string) time.Time {
	if fi, err := root.Lstat(dir + "/" + StdoutFileName); err == nil && fi.Mode().IsRegular() {
		return fi.ModTime()
	}
	if fi, err := root.Lstat(dir); err == nil {
		return fi.ModTime()
	}
	return time.Time{}
}

// dirSize reports the bytes the regular files under dir hold, never
// following a symlink, counting the entries it looks at in walked and
// stopping at retentionMaxWalk of them.
func dirSize(root *os.Root, dir string, walked *int) int64 {
	var total int64
	_ = fs.WalkDir(root.FS(), dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // gone meanwhile, or unreadable: count what can be
		}
		if *walked++; *walked > retentionMaxWalk {
			return fs.SkipAll
		}
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				total += fi.Size()
			}
		}
		return nil
	})
	return total
}
