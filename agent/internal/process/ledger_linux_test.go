package process

import (
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/process/proctest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

func ledgerTestOpen(t *testing.T) (*Ledger, *lockedBuffer) {
	t.Helper()
	log := &lockedBuffer{}
	l, err := OpenLedger(t.TempDir(), slog.New(slog.NewJSONHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	return l, log
}

// ledgerTestGroup starts script as the leader of a new process group, as
// an earlier daemon's body, and reports it; the test reaps it at the end.
func ledgerTestGroup(t *testing.T, script string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Dir = t.TempDir()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	})
	return cmd
}

func ledgerTestRecords(t *testing.T, l *Ledger) []string {
	t.Helper()
	entries, err := os.ReadDir(l.Dir())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// TestLedgerSweepKillsWhatAnEarlierProcessLeft: a body that ignores
// SIGTERM and a child it started (both of the recorded group) are killed
// by the escalation to SIGKILL; the sweep logs it at warn with the
// invocation id, attempt and pid, and removes the record.
func TestLedgerSweepKillsWhatAnEarlierProcessLeft(t *testing.T) {
	t.Parallel()
	l, log := ledgerTestOpen(t)
	cmd := ledgerTestGroup(t, `trap "" TERM; sleep 300 & echo $! > child; wait`)
	child := proctest.Pid(t, filepath.Join(cmd.Dir, "child"))
	if err := l.record("inv_A", 2, cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if got := ledgerTestRecords(t, l); len(got) != 1 || got[0] != "inv_A-2.json" {
		t.Fatalf("ledger holds %v; want inv_A-2.json", got)
	}
	left := l.Sweep(200 * time.Millisecond)
	if len(left) != 1 || left[0].InvocationID != "inv_A" || left[0].Attempt != 2 || left[0].Pid != cmd.Process.Pid || left[0].Survivors != nil {
		t.Fatalf("Sweep = %+v; want the one group, confirmed gone", left)
	}
	proctest.AssertGone(t, "the leader", cmd.Process.Pid)
	proctest.AssertGone(t, "its child", child)
	if got := ledgerTestRecords(t, l); len(got) != 0 {
		t.Errorf("ledger still holds %v after the sweep", got)
	}
	recs := log.records("killed a body")
	if len(recs) != 1 || recs[0]["level"] != "WARN" || recs[0]["invocation_id"] != "inv_A" || recs[0]["attempt"] != float64(2) || recs[0]["pid"] != float64(cmd.Process.Pid) {
		t.Errorf("warn records %v; want one naming inv_A attempt 2 pid %d", recs, cmd.Process.Pid)
	}
}

// TestLedgerSweepKillsAnOrphanedGroup: the leader is gone (Pdeathsig
// killed it with the daemon) but a process it started still runs in its
// group: that one is killed.
func TestLedgerSweepKillsAnOrphanedGroup(t *testing.T) {
	t.Parallel()
	l, _ := ledgerTestOpen(t)
	cmd := ledgerTestGroup(t, `sleep 300 & echo $! > child; wait`)
	child := proctest.Pid(t, filepath.Join(cmd.Dir, "child"))
	if err := l.record("inv_B", 1, cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	_ = syscall.Kill(cmd.Process.Pid, syscall.SIGKILL) // the leader alone
	proctest.AssertGone(t, "the leader", cmd.Process.Pid)
	if proctest.Gone(child) {
		t.Fatal("the child died with its leader; nothing to test")
	}
	if left := l.Sweep(time.Second); len(left) != 1 || left[0].Survivors != nil {
		t.Fatalf("Sweep = %+v; want the orphaned group, confirmed gone", left)
	}
	proctest.AssertGone(t, "the orphaned child", child)
}

// TestLedgerSweepSparesOthers: a record whose pid now names another
// process (another start time), one of another boot and one whose group
// is gone kill nothing, and are removed; so are a half-written record and
// one that does not parse.
func TestLedgerSweepSparesOthers(t *testing.T) {
	t.Parallel()
	l, _ := ledgerTestOpen(t)
	other := ledgerTestGroup(t, `exec sleep 300`)
	write := func(name string, rec bodyRecord) {
		b, _ := json.Marshal(rec)
		if err := os.WriteFile(filepath.Join(l.Dir(), name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	info, err := readProcInfo(other.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	pid := other.Process.Pid
	write("inv_REUSED-1.json", bodyRecord{InvocationID: "inv_REUSED", Attempt: 1, Pid: pid, Pgid: pid, StartTime: info.start - 1, BootID: l.bootID})
	write("inv_REBOOT-1.json", bodyRecord{InvocationID: "inv_REBOOT", Attempt: 1, Pid: pid, Pgid: pid, StartTime: info.start, BootID: "another-boot"})
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	write("inv_GONE-1.json", bodyRecord{InvocationID: "inv_GONE", Attempt: 1, Pid: gone.Process.Pid, Pgid: gone.Process.Pid, StartTime: 1, BootID: l.bootID})
	write("inv_RENAMED-1.json", bodyRecord{InvocationID: "inv_OTHER", Attempt: 1, Pid: pid, Pgid: pid, StartTime: info.start})
	_ = os.WriteFile(filepath.Join(l.Dir(), "inv_BAD-1.json"), []byte("{"), 0o600)
	_ = os.WriteFile(filepath.Join(l.Dir(), ledgerTempPrefix+"123"), []byte("{"), 0o600)
	if l.bootID == "" {
		t.Log("no boot id on this host: the other-boot record is told apart by nothing but its start time")
	}

	left := l.Sweep(time.Second)
	if l.bootID == "" {
		// Without a boot id the other boot's record matches the live
		// process: only that one may be swept.
		if len(left) > 1 {
			t.Fatalf("Sweep = %+v", left)
		}
		return
	}
	if len(left) != 0 {
		t.Fatalf("Sweep = %+v; want nothing killed", left)
	}
	if proctest.Gone(pid) {
		t.Fatal("the sweep killed a process that was not the record's")
	}
	if got := ledgerTestRecords(t, l); len(got) != 0 {
		t.Errorf("ledger still holds %v", got)
	}
}

// TestLedgerSweepKeepsTheRecordOfASurvivor: a group that outlives its
// SIGKILL (a process stuck in the kernel, faked here) is reported and its
// record kept, so the next start tries again.
func TestLedgerSweepKeepsTheRecordOfASurvivor(t *testing.T) {
	t.Parallel()
	l, log := ledgerTestOpen(t)
	cmd := ledgerTestGroup(t, `exec sleep 300`)
	pid := cmd.Process.Pid
	if err := l.record("inv_STUCK", 1, pid); err != nil {
		t.Fatal(err)
	}
	l.liveMembers = func(int) []int { return []int{pid} }
	left := l.Sweep(0)
	if len(left) != 1 || len(left[0].Survivors) == 0 {
		t.Fatalf("Sweep = %+v; want the group reported with survivors", left)
	}
	if got := ledgerTestRecords(t, l); len(got) != 1 {
		t.Errorf("ledger holds %v; want the record kept", got)
	}
	if recs := log.records("still running after SIGKILL"); len(recs) != 1 || recs[0]["level"] != "ERROR" {
		t.Errorf("error records %v; want one", recs)
	}
}

// TestRunnerRecordsGroupsInTheLedger: while a body runs its group is in the
// ledger; once the run is over the record is gone.
func TestRunnerRecordsGroupsInTheLedger(t *testing.T) {
	t.Parallel()
	l, _ := ledgerTestOpen(t)
	r := runnerTestNew(t, func(c *Config) { c.Ledger = l })
	dir := t.TempDir()
	inv := wire.RunInvocation{InvocationID: "inv_LEDGER", Attempt: 3,
		Argv:      runnerTestSh(`echo go > ` + dir + `/started; while [ ! -f ` + dir + `/stop ]; do sleep 0.05; done`),
		RunConfig: wire.RunConfig{RunSetup: []string{"true"}}}
	run := runnerTestStart(t, r, inv)
	proctest.WaitFile(t, filepath.Join(dir, "started"))
	// The body can write its file before the runner, on its side of the
	// fork, has recorded it: Started is closed once it has.
	select {
	case <-run.Started():
	case <-time.After(proctest.Wait):
		t.Fatal("the run never reported its body started")
	}
	rec, err := readBodyRecord(filepath.Join(l.Dir(), "inv_LEDGER-3.json"))
	if err != nil {
		t.Fatalf("record while the body runs: %v", err)
	}
	info, _ := readProcInfo(run.Pid())
	if rec.Pid != run.Pid() || rec.Pgid != run.Pid() || rec.StartTime != info.start || rec.BootID != l.bootID {
		t.Errorf("record %+v; want pid %d, start %d", rec, run.Pid(), info.start)
	}
	if err := os.WriteFile(filepath.Join(dir, "stop"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if o := runnerTestOutcome(t, run); o.State != wire.StateSucceeded {
		t.Fatalf("outcome %+v", o)
	}
	if got := ledgerTestRecords(t, l); len(got) != 0 {
		t.Errorf("ledger still holds %v after the run", got)
	}
}
