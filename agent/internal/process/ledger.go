package process

import (
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
	"syscall"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/statedir"
)

// LedgerDirName is the directory under --state-dir that holds a record of
// each run's process group while it runs.
const LedgerDirName = "bodies"

// ledgerTempPrefix starts the name of a record still being written.
const ledgerTempPrefix = ".tmp-"

// ledgerMaxFile bounds how much of one record Sweep reads: a record is
// a hundred bytes or so.
const ledgerMaxFile = 64 << 10

// bootIDPath holds the kernel's id of the current boot.
const bootIDPath = "/proc/sys/kernel/random/boot_id"

// bodyRecord is what the ledger keeps of a run's process group: enough to
// find it again from another process and to tell it from a process that
// got the same pid later.
type bodyRecord struct {
	InvocationID string `json:"invocation_id"`
	Attempt      int    `json:"attempt"`
	Pid          int    `json:"pid"`  // the group's leader
	Pgid         int    `json:"pgid"` // the same number: the leader leads its group
	// StartTime is field 22 of /proc/<pid>/stat: when the leader started,
	// in clock ticks after boot. A pid reused by another process has
	// another.
	StartTime uint64 `json:"start_time"`
	// BootID is the kernel's boot id when the record was written; after a
	// reboot nothing of that boot runs, and start times begin again.
	BootID string `json:"boot_id,omitempty"`
}

// Ledger keeps, in <state-dir>/bodies, one file per run whose process
// group is running (<invocation_id>-<attempt>.json), so that a daemon
// that was SIGKILLed (the OOM killer, no service manager to clean up) and
// started again can kill what it left running before the control plane
// hands the same work out again (Sweep). The runner writes a record as
// each process group of a run starts and removes it once the run's groups
// are confirmed gone. A nil *Ledger keeps nothing.
type Ledger struct {
	dir    string
	bootID string
	log    *slog.Logger
	// liveMembers reports the running members of a group (tests make a
	// group outlive its SIGKILL); nil: liveGroupMembers.
	liveMembers func(pgid int) []int
}

// OpenLedger opens the ledger under stateDir, creating its directory (mode
// 0700). An entry there that is not a plain directory is refused.
func OpenLedger(stateDir string, log *slog.Logger) (*Ledger, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	dir, err := statedir.Private(stateDir, LedgerDirName)
	if err != nil {
		return nil, fmt.Errorf("body ledger: %w", err)
	}
	b, _ := os.ReadFile(bootIDPath) // no boot id: start times alone tell processes apart
	return &Ledger{dir: dir, bootID: strings.TrimSpace(string(b)), log: log}, nil
}

// Dir reports the directory the ledger keeps its records in.
func (l *Ledger) Dir() string { return l.dir }

// record notes that pid, the leader of a new process group, runs for
// attempt of invocationID, replacing what the run recorded before (its
// previous run_setup command). It is written to a temporary file and
// renamed into place, so a record is whole or absent. It is not synced:
// what it guards against, a killed daemon, keeps the page cache, and a
// power cut keeps no process either.
func (l *Ledger) record(invocationID string, attempt, pid int) error {
	if l == nil {
		return nil
	}
	if err := checkLedgerKey(invocationID, attempt); err != nil {
		return fmt.Errorf("body ledger: %w", err)
	}
	info, err := readProcInfo(pid)
	if err != nil {
		return fmt.Errorf("body ledger: %w", err)
	}
	b, err := json.Marshal(bodyRecord{InvocationID: invocationID, Attempt: attempt, Pid: pid, Pgid: pid, StartTime: info.start, BootID: l.bootID})
	if err != nil {
		return fmt.Errorf("body ledger: %w", err)
	}
	f, err := os.CreateTemp(l.dir, ledgerTempPrefix+"*")
	if err != nil {
		return fmt.Errorf("body ledger: %w", err)
	}
	tmp := f.Name()
	_, werr := f.Write(b)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp, filepath.Join(l.dir, ledgerFileName(invocationID, attempt)))
	}
	if werr != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("body ledger: %w", werr)
	}
	return nil
}

// forget removes the record of attempt of invocationID; one that is not
// there is not an error.
func (l *Ledger) forget(invocationID string, attempt int) error {
	if l == nil || checkLedgerKey(invocationID, attempt) != nil {
		return nil
	}
	err := os.Remove(filepath.Join(l.dir, ledgerFileName(invocationID, attempt)))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("body ledger: %w", err)
	}
	return nil
}

// Leftover is a process group of an earlier daemon that Sweep found
// running and killed.
type Leftover struct {
	InvocationID string
	Attempt      int
	Pid, Pgid    int
	// Survivors are the members still running after SIGKILL and
	// killConfirmWait (nil: confirmed gone); their record is kept, so the
	// next start tries again.
	Survivors []int
}

// Sweep kills what an earlier daemon on this state dir left running, and
// reports it. Call it at start, before hello, while this process runs
// nothing yet: every record then is an earlier process's.
//
// A record is that process's run only if it is of this boot and its
// leader still runs with the recorded start time — or, the leader gone
// (Pdeathsig killed it), its group still has members; a pid a new process
// got since never matches. (The kernel does not hand out a number still
// in use as a process group's id, so the group is the run's unless the
// whole group died, the number came round again and a new group leader
// got it and died in turn.) Each matching group gets SIGTERM, then, after
// killAfter, SIGKILL, all groups at once, so the sweep lasts at most
// killAfter and killConfirmWait whatever their number. Each is logged at
// warn with its invocation id, attempt and pid; its record is then
// removed, as is every record that matched nothing.
func (l *Ledger) Sweep(killAfter time.Duration) []Leftover {
	if l == nil {
		return nil
	}
	liveMembers := l.liveMembers
	if liveMembers == nil {
		liveMembers = liveGroupMembers
	}
	entries, err := os.ReadDir(l.dir)
	if err != nil {
		l.log.Error("body ledger: cannot read it; bodies of an earlier process may still run", "dir", l.dir, "error", err.Error())
		return nil
	}
	type target struct {
		rec  bodyRecord
		file string
	}
	var targets []target
	for _, e := range entries {
		name := e.Name()
		path := filepath.Join(l.dir, name)
		if strings.HasPrefix(name, ledgerTempPrefix) {
			_ = os.Remove(path) // a record a killed daemon was writing
			continue
		}
		if !strings.HasSuffix(name, ".json") || !e.Type().IsRegular() {
			continue
		}
		rec, err := readBodyRecord(path)
		if err != nil {
			l.log.Warn("body ledger: unreadable record removed", "file", name, "error", err.Error())
			_ = os.Remove(path)
			continue
		}
		if why := l.stale(rec, liveMembers); why != "" {
			l.log.Debug("body ledger: nothing of an earlier process left for this record", "invocation_id", rec.InvocationID, "attempt", rec.Attempt, "pid", rec.Pid, "why", why)
			_ = os.Remove(path)
			continue
		}
		targets = append(targets, target{rec, path})
	}
	if len(targets) == 0 {
		return nil
	}
	for _, t := range targets {
		l.signal(t.rec, syscall.SIGTERM)
	}
	gone := func() bool {
		return !slices.ContainsFunc(targets, func(t target) bool { return l.alive(t.rec, liveMembers) })
	}
	waitUntil(killAfter, gone)
	for _, t := range targets {
		if l.alive(t.rec, liveMembers) {
			l.signal(t.rec, syscall.SIGKILL)
		}
	}
	waitUntil(killConfirmWait, gone)
	out := make([]Leftover, 0, len(targets))
	for _, t := range targets {
		left := Leftover{InvocationID: t.rec.InvocationID, Attempt: t.rec.Attempt, Pid: t.rec.Pid, Pgid: t.rec.Pgid}
		if l.alive(t.rec, liveMembers) {
			left.Survivors = l.members(t.rec, liveMembers)
			l.log.Error("body of an earlier process still running after SIGKILL; its record is kept for the next start",
				"invocation_id", left.InvocationID, "attempt", left.Attempt, "pid", left.Pid, "pgid", left.Pgid, "pids", left.Survivors)
		} else {
			l.log.Warn("killed a body an earlier process left running, before hello hands its work out again",
				"invocation_id", left.InvocationID, "attempt", left.Attempt, "pid", left.Pid, "pgid", left.Pgid)
			_ = os.Remove(t.file)
		}
		out = append(out, left)
	}
	return out
}

// SweepBudget reports the longest Sweep takes with the given kill-after:
// the grace after SIGTERM, then killConfirmWait after SIGKILL.
func SweepBudget(killAfter time.Duration) time.Duration { return killAfter + killConfirmWait }

// stale reports why nothing of rec's run can still be running ("" if
// something is).
func (l *Ledger) stale(rec bodyRecord, liveMembers func(int) []int) string {
	switch {
	case rec.BootID != "" && l.bootID != "" && rec.BootID != l.bootID:
		return "another boot"
	case rec.Pid <= 1 || rec.Pgid <= 1:
		return "no pid"
	}
	leader, err := readProcInfo(rec.Pid)
	switch {
	case err == nil && leader.start != rec.StartTime:
		return "pid reused"
	case err == nil && leader.state != 'Z' && leader.state != 'X':
		return ""
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return "unreadable: " + err.Error()
	}
	// The leader is gone, or a zombie (Pdeathsig killed it): its group
	// may not be.
	if len(liveMembers(rec.Pgid)) > 0 {
		return ""
	}
	return "exited"
}

// alive reports whether rec's leader (the same process) or any member of
// its group still runs.
func (l *Ledger) alive(rec bodyRecord, liveMembers func(int) []int) bool {
	return len(l.members(rec, liveMembers)) > 0
}

// members reports rec's leader, if it is still the same process and runs,
// and the live members of its group.
func (l *Ledger) members(rec bodyRecord, liveMembers func(int) []int) []int {
	pids := liveMembers(rec.Pgid)
	if l.leaderRuns(rec) && !slices.Contains(pids, rec.Pid) {
		pids = append(pids, rec.Pid)
	}
	return pids
}

// leaderRuns reports whether rec's leader is the recorded process and not
// a zombie (it may have left its group).
func (l *Ledger) leaderRuns(rec bodyRecord) bool {
	info, err := readProcInfo(rec.Pid)
	return err == nil && info.start == rec.StartTime && info.state != 'Z' && info.state != 'X'
}

// signal sends sig to rec's group, and to its leader if that left the
// group; ones already gone are not an error.
func (l *Ledger) signal(rec bodyRecord, sig syscall.Signal) {
	if err := syscall.Kill(-rec.Pgid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		l.log.Warn("body ledger: cannot signal a process group", "pgid", rec.Pgid, "signal", signalName(sig), "error", err.Error())
	}
	if l.leaderRuns(rec) {
		if info, err := readProcInfo(rec.Pid); err == nil && info.pgrp != rec.Pgid {
			_ = syscall.Kill(rec.Pid, sig)
		}
	}
}

// waitUntil polls done every groupPollInterval until it holds or d passes.
func waitUntil(d time.Duration, done func() bool) {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(groupPollInterval)
	defer tick.Stop()
	for !done() {
		select {
		case <-deadline.C:
			return
		case <-tick.C:
		}
	}
}

// readBodyRecord reads and checks one record.
func readBodyRecord(path string) (bodyRecord, error) {
	var rec bodyRecord
	if err := statedir.ReadJSON(path, ledgerMaxFile, &rec); err != nil {
		return bodyRecord{}, err
	}
	if err := checkLedgerKey(rec.InvocationID, rec.Attempt); err != nil {
		return bodyRecord{}, err
	}
	if filepath.Base(path) != ledgerFileName(rec.InvocationID, rec.Attempt) {
		return bodyRecord{}, fmt.Errorf("holds the record of %s", ledgerFileName(rec.InvocationID, rec.Attempt))
	}
	return rec, nil
}

// ledgerFileName is the file holding the record of attempt of invocationID.
func ledgerFileName(invocationID string, attempt int) string {
	return invocationID + "-" + strconv.Itoa(attempt) + ".json"
}

// checkLedgerKey reports whether an invocation id and attempt make a safe
// file name: letters, digits and _ (real ids are inv_<ULID>).
func checkLedgerKey(invocationID string, attempt int) error {
	if invocationID == "" || len(invocationID) > 128 {
		return fmt.Errorf("invocation id %q is not 1-128 bytes", ClipString(invocationID, 200))
	}
	for _, r := range invocationID {
		if r != '_' && (r < '0' || r > '9') && (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') {
			return fmt.Errorf("invocation id %q has a character other than letters, digits and _", ClipString(invocationID, 200))
		}
	}
	if attempt < 0 {
		return fmt.Errorf("attempt %d is negative", attempt)
	}
	return nil
}
