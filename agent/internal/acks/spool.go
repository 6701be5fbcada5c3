// Package acks delivers nymph's outcomes: each ack is spooled to disk
// (0600, atomic rename, in a 0700 directory) before it is sent, and retried
// with jittered backoff until the control plane answers, across restarts of
// the daemon; the first outcome of an attempt is the one that counts, so a
// resend is always safe.
package acks

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/statedir"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// spoolDirName is the directory under --state-dir that holds pending acks.
const spoolDirName = "acks"

// spoolTempPrefix starts the name of a file Put is still writing. List never
// reads such files; OpenSpool removes old ones (a crash mid-Put).
const spoolTempPrefix = ".tmp-"

// spoolCorruptSuffix is appended to a spool file List could not read, so
// the next List does not trip over it again and an operator can look at it.
const spoolCorruptSuffix = ".corrupt"

// spoolStaleTemp is how old a temp file must be before OpenSpool removes
// it: old enough that no Put can still be writing it.
const spoolStaleTemp = time.Minute

// spoolStaleCorrupt is how long a file moved aside as corrupt stays for an
// operator to look at before OpenSpool removes it: it may hold a worker
// token, and nothing ever reads it again.
const spoolStaleCorrupt = 7 * 24 * time.Hour

// spoolMaxFile bounds how much of one spool file List reads. An ack is at
// most a 256 KiB body; anything far bigger is not one of ours.
const spoolMaxFile = 4 << 20

// SpooledAck is one ack waiting for the control plane's answer, as kept on
// disk. It carries everything needed to send it again from a later process:
// where to send it and with which token.
type SpooledAck struct {
	// ControlPlane is the URL of the control plane the ack is for.
	ControlPlane string `json:"control_plane"`
	// WorkerID is the worker that ran the attempt.
	WorkerID string `json:"worker_id"`
	// Token is the worker token of the process that ran the attempt. A
	// restarted daemon is a new worker, but the old worker's token still
	// acks the old worker's attempt, so the token travels with the ack.
	Token string `json:"token"`
	// Ack is the request body.
	Ack wire.AckRequest `json:"ack"`
	// SpooledAt is when the ack was first spooled; List orders by it.
	SpooledAt time.Time `json:"spooled_at"`
}

// Spool keeps pending acks durably in <state-dir>/acks, one file per
// attempt, so an ack survives a daemon restart. A Spool is safe for
// concurrent use; each file is written whole or not at all.
type Spool struct {
	dir    string
	logger *slog.Logger
}

// SpoolOption configures a Spool opened by OpenSpool.
type SpoolOption func(*Spool)

// WithSpoolLogger makes the spool log (corrupt files) to l instead of
// slog.Default().
func WithSpoolLogger(l *slog.Logger) SpoolOption {
	return func(s *Spool) {
		if l != nil {
			s.logger = l
		}
	}
}

// OpenSpool opens the ack spool under stateDir, creating stateDir and its
// acks directory as needed. The acks directory holds worker tokens, so it
// is made (or tightened to) mode 0700. A stateDir that exists but is not a
// directory is refused, as is an acks entry that is not a plain directory.
func OpenSpool(stateDir string, opts ...SpoolOption) (*Spool, error) {
	if stateDir == "" {
		return nil, errors.New("ack spool: no state directory")
	}
	if fi, err := os.Stat(stateDir); err == nil {
		if !fi.IsDir() {
			return nil, fmt.Errorf("ack spool: state directory %s is not a directory", stateDir)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("ack spool: %w", err)
	}
	dir, err := statedir.Private(stateDir, spoolDirName) // worker tokens: owner-only, no symlink
	if err != nil {
		return nil, fmt.Errorf("ack spool: %w", err)
	}
	s := &Spool{dir: dir, logger: slog.Default()}
	for _, o := range opts {
		o(s)
	}
	s.removeLeftovers()
	return s, nil
}

// Dir reports the directory the spool keeps its files in.
func (s *Spool) Dir() string { return s.dir }

// Put stores a durably, replacing any spooled ack for the same invocation
// and attempt. The file appears whole or not at all: it is written to a
// temporary file (mode 0600) in the same directory, synced, renamed into
// place, and the directory is synced so the rename survives a power cut.
// A zero SpooledAt is set to now.
func (s *Spool) Put(a SpooledAck) error {
	if err := checkSpooledAck(a); err != nil {
		return fmt.Errorf("ack spool: %w", err)
	}
	if a.SpooledAt.IsZero() {
		a.SpooledAt = time.Now().UTC()
	}
	b, err := json.Marshal(a)
	if err != nil {
		return fmt.Errorf("ack spool: encode: %w", err)
	}
	name := spoolFileName(a.Ack.InvocationID, a.Ack.Attempt)
	// CreateTemp makes the file 0600 whatever the umask.
	f, err := os.CreateTemp(s.dir, spoolTempPrefix+"*")
	if err != nil {
		return fmt.Errorf("ack spool: %w", err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	if _, err := f.Write(b); err != nil {
		return fmt.Errorf("ack spool: write %s: %w", name, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("ack spool: sync %s: %w", name, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("ack spool: close %s: %w", name, err)
	}
	if err := os.Rename(tmp, filepath.Join(s.dir, name)); err != nil {
		return fmt.Errorf("ack spool: %w", err)
	}
	ok = true
	if err := s.syncDir(); err != nil {
		return fmt.Errorf("ack spool: sync directory after writing %s: %w", name, err)
	}
	return nil
}

// Remove forgets the spooled ack of attempt of invocationID. One that is
// not there is not an error: an answered ack may be removed twice.
func (s *Spool) Remove(invocationID string, attempt int) error {
	if err := checkSpoolKey(invocationID, attempt); err != nil {
		return fmt.Errorf("ack spool: %w", err)
	}
	err := os.Remove(filepath.Join(s.dir, spoolFileName(invocationID, attempt)))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("ack spool: %w", err)
	}
	// Losing the removal in a crash only means one resend answered
	// recorded:false, but a sync is cheap next to the round trip before it.
	if err := s.syncDir(); err != nil {
		return fmt.Errorf("ack spool: sync directory: %w", err)
	}
	return nil
}

// List reports every spooled ack, oldest first. A file that cannot be read
// as an ack, or whose content does not match its name, is moved aside to
// <name>.corrupt with a warning and left out: one bad file must not stop the
// others from being sent.
func (s *Spool) List() ([]SpooledAck, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("ack spool: %w", err)
	}
	type named struct {
		name string
		ack  SpooledAck
	}
	var found []named
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !strings.HasSuffix(name, ".json") || !e.Type().IsRegular() {
			continue
		}
		a, err := s.read(name)
		if errors.Is(err, fs.ErrNotExist) {
			continue // answered and removed while we listed
		}
		if err != nil {
			s.moveAside(name, err)
			continue
		}
		found = append(found, named{name, a})
	}
	slices.SortFunc(found, func(x, y named) int {
		return cmp.Or(x.ack.SpooledAt.Compare(y.ack.SpooledAt), strings.Compare(x.name, y.name))
	})
	out := make([]SpooledAck, len(found))
	for i, n := range found {
		out[i] = n.ack
	}
	return out, nil
}

// read decodes one spool file. Errors other than fs.ErrNotExist mean the
// file is corrupt.
func (s *Spool) read(name string) (SpooledAck, error) {
	var a SpooledAck
	if err := statedir.ReadJSON(filepath.Join(s.dir, name), spoolMaxFile, &a); err != nil {
		return SpooledAck{}, err
	}
	if err := checkSpooledAck(a); err != nil {
		return SpooledAck{}, err
	}
	if want := spoolFileName(a.Ack.InvocationID, a.Ack.Attempt); want != name {
		return SpooledAck{}, fmt.Errorf("holds the ack of %s", want)
	}
	return a, nil
}

// moveAside renames a corrupt spool file out of List's way.
func (s *Spool) moveAside(name string, cause error) {
	err := os.Rename(filepath.Join(s.dir, name), filepath.Join(s.dir, name+spoolCorruptSuffix))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.logger.Error("ack spool: corrupt file could not be moved aside",
			"file", name, "reason", cause.Error(), "error", err.Error())
		return
	}
	s.logger.Warn("ack spool: corrupt file moved aside",
		"file", name, "moved_to", name+spoolCorruptSuffix, "reason", cause.Error())
}

// removeLeftovers deletes temp files left by a Put that crashed, and
// corrupt files moved aside over spoolStaleCorrupt ago. Only old temp
// files: another Spool over the same directory may be writing a fresh one.
// (An answered ack's own file is removed as it is answered: Remove.)
func (s *Spool) removeLeftovers() {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		name := e.Name()
		var bound time.Duration
		switch {
		case strings.HasPrefix(name, spoolTempPrefix):
			bound = spoolStaleTemp
		case strings.HasSuffix(name, spoolCorruptSuffix):
			bound = spoolStaleCorrupt
		default:
			continue
		}
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() && time.Since(fi.ModTime()) > bound {
			if os.Remove(filepath.Join(s.dir, name)) == nil {
				s.logger.Info("ack spool: leftover removed", "file", name, "age", time.Since(fi.ModTime()).Round(time.Second).String())
			}
		}
	}
}

// syncDir makes the directory's entries (a rename, a removal) durable.
func (s *Spool) syncDir() error {
	d, err := os.Open(s.dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// spoolFileName is the file holding attempt of invocationID.
func spoolFileName(invocationID string, attempt int) string {
	return invocationID + "-" + strconv.Itoa(attempt) + ".json"
}

// checkSpooledAck reports why a cannot be spooled or sent, if it cannot.
func checkSpooledAck(a SpooledAck) error {
	if err := checkSpoolKey(a.Ack.InvocationID, a.Ack.Attempt); err != nil {
		return err
	}
	switch {
	case a.ControlPlane == "":
		return errors.New("ack has no control plane URL")
	case a.Token == "":
		return errors.New("ack has no worker token")
	case a.WorkerID == "" && a.Ack.WorkerID == "":
		return errors.New("ack has no worker id")
	}
	return nil
}

// checkSpoolKey reports whether an invocation id and attempt make a safe
// file name. Real ids are inv_<ulid>; anything with a separator, a dot or
// odd bytes would let a bad id write outside the spool.
func checkSpoolKey(invocationID string, attempt int) error {
	if invocationID == "" || len(invocationID) > 128 {
		return fmt.Errorf("invocation id %q is not 1-128 bytes", invocationID)
	}
	for _, r := range invocationID {
		ok := r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
		if !ok {
			return fmt.Errorf("invocation id %q has a character other than letters, digits and _", invocationID)
		}
	}
	if attempt < 0 {
		return fmt.Errorf("attempt %d is negative", attempt)
	}
	return nil
}
