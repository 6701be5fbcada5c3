package tests

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// processGone reports whether pid has exited; a zombie counts as gone (it
// runs nothing, and init in a container may never reap it).
func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	return len(f) > 0 && (f[0] == "Z" || f[0] == "X")
}

// readPid waits for a pid file a body writes and reports the pid in it.
func readPid(t *testing.T, path string) int {
	t.Helper()
	pid := 0
	waittest.Until(t, 30*time.Second, "pid file "+filepath.Base(path), func() bool {
		b, err := os.ReadFile(path)
		if err != nil || !strings.HasSuffix(string(b), "\n") {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && pid > 1
	})
	return pid
}

// logIndex reports where in p's log the first record with msg starts (-1:
// none yet).
func (p *nymphProc) logIndex(msg string) int {
	return strings.Index(p.logs.String(), `"msg":"`+msg+`"`)
}

// TestAgentKillsBodiesOfAKilledDaemon: nymph is SIGKILLed (as by the OOM
// killer, with no service manager to clean up) while its body runs. The
// body's shell dies with it (Pdeathsig), but the sleep it started lives on,
// orphaned in the body's process group. A new nymph on the same state dir
// kills that group before its hello, which retires the old worker and gets
// the work handed out again; the redelivered attempt runs, and the
// invocation succeeds exactly once.
func TestAgentKillsBodiesOfAKilledDaemon(t *testing.T) {
	d := startDev(t, backends[0], "--stale-after", "60s")
	op := d.Operator()
	dir, marks := t.TempDir(), t.TempDir()
	shPid, sleepPid, ran := filepath.Join(marks, "sh"), filepath.Join(marks, "sleep"), filepath.Join(marks, "ran")
	first := startNymphIn(t, d, "oom-killed", dir)
	inv := submitSh(t, op, fmt.Sprintf(`if [ "$NYMPH_ATTEMPT" = 1 ]; then echo $$ > %s; sleep 300 & echo $! > %s; wait; exit 1; fi; echo "$NYMPH_ATTEMPT" >> %s`,
		exitShQuote(shPid), exitShQuote(sleepPid), exitShQuote(ran)), 0)
	leader, orphan := readPid(t, shPid), readPid(t, sleepPid)
	t.Cleanup(func() { _ = syscall.Kill(orphan, syscall.SIGKILL) })
	record := filepath.Join(dir, "state", "bodies", inv.InvocationID+"-1.json")
	if _, err := os.Stat(record); err != nil {
		t.Fatalf("the running body's record: %v", err)
	}

	_ = first.cmd.Process.Signal(syscall.SIGKILL)
	first.wait(t, 10*time.Second)
	waittest.Until(t, 10*time.Second, "the body's shell dead with its daemon (Pdeathsig)", func() bool { return processGone(leader) })
	if processGone(orphan) {
		t.Fatal("the body's child died with the daemon: nothing is left for the restart to find")
	}

	second := startNymphIn(t, d, "oom-killed", dir)
	second.waitLog(t, 30*time.Second, `"msg":"hello"`)
	if !processGone(orphan) {
		t.Fatal("the new daemon said hello while the old body's process still ran")
	}
	killed, hello := second.logIndex("killed a body an earlier process left running, before hello hands its work out again"), second.logIndex("hello")
	if killed < 0 || killed > hello {
		t.Fatalf("log does not show the old body killed before hello (at %d, hello at %d)", killed, hello)
	}
	recs := second.logLines(t, "killed a body an earlier process left running, before hello hands its work out again")
	if len(recs) != 1 || recs[0]["level"] != "WARN" || recs[0]["invocation_id"] != inv.InvocationID || recs[0]["attempt"] != float64(1) || recs[0]["pid"] != float64(leader) {
		t.Fatalf("kill records %v; want one warning for %s attempt 1 pid %d", recs, inv.InvocationID, leader)
	}
	if _, err := os.Stat(record); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the killed body's record is still there (%v)", err)
	}

	got := waitTerminal(t, op, inv.InvocationID, 60*time.Second)
	if got.State != wire.StateSucceeded || got.Attempt != 2 {
		t.Fatalf("invocation %+v; want succeeded at attempt 2", got)
	}
	if b, err := os.ReadFile(ran); err != nil || string(b) != "2\n" {
		t.Fatalf("runs to completion %q (%v); want exactly one, attempt 2", b, err)
	}
}

// runDirs lists the run directories under workdir as "<invocation>/<attempt>".
func runDirs(t *testing.T, workdir string) []string {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(workdir, "inv_*", "*"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range matches {
		rel, _ := filepath.Rel(workdir, m)
		out = append(out, filepath.ToSlash(rel))
	}
	slices.Sort(out)
	return out
}

// TestAgentRunDirsCappedBySize: with --keep-runs-size 250KB and runs of
// 100 KB each, the oldest run directories go (with their invocation
// directories) while the two newest stay; a symlink a body planted is
// removed, never followed.
func TestAgentRunDirsCappedBySize(t *testing.T) {
	d := startDev(t, backends[0], "--stale-after", "60s")
	op := d.Operator()
	dir, outside := t.TempDir(), t.TempDir()
	canary := filepath.Join(outside, "canary")
	if err := os.WriteFile(canary, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	startNymphIn(t, d, "capped", dir, "--keep-runs", "1h", "--keep-runs-size", "250KB")
	workdir := filepath.Join(dir, "work")
	var ids []string
	for i := range 5 {
		script := `head -c 100000 /dev/zero > "$NYMPH_WORKDIR/blob"`
		if i == 0 {
			script += fmt.Sprintf(`; ln -s %s "$NYMPH_WORKDIR/dir"; ln -s %s "$NYMPH_WORKDIR/file"`, exitShQuote(outside), exitShQuote(canary))
		}
		inv := submitSh(t, op, script, 0)
		if got := waitTerminal(t, op, inv.InvocationID, 30*time.Second); got.State != wire.StateSucceeded {
			t.Fatalf("run %d: %+v", i, got)
		}
		ids = append(ids, inv.InvocationID)
	}
	want := []string{ids[3] + "/1", ids[4] + "/1"}
	slices.Sort(want)
	waittest.Until(t, 30*time.Second, fmt.Sprintf("run directories %v", want), func() bool {
		return slices.Equal(runDirs(t, workdir), want)
	})
	for _, id := range ids[:3] {
		if _, err := os.Lstat(filepath.Join(workdir, id)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("invocation directory %s left behind (%v)", id, err)
		}
	}
	if b, err := os.ReadFile(canary); err != nil || string(b) != "keep me" {
		t.Fatalf("the file a body's symlink pointed at: %q %v", b, err)
	}
}

// TestAgentRunDirsExpire: with --keep-runs 10s a finished run's directory
// goes some seconds after its end, while a run that just finished keeps
// its own.
func TestAgentRunDirsExpire(t *testing.T) {
	t.Parallel()
	d := startDev(t, backends[0], "--stale-after", "60s")
	op := d.Operator()
	dir := t.TempDir()
	startNymphIn(t, d, "expiring", dir, "--keep-runs", "10s", "--keep-runs-size", "0")
	workdir := filepath.Join(dir, "work")
	old := submitSh(t, op, `echo old`, 0)
	waitTerminal(t, op, old.InvocationID, 30*time.Second)
	if got := runDirs(t, workdir); !slices.Equal(got, []string{old.InvocationID + "/1"}) {
		t.Fatalf("run directories %v right after the run; want its own", got)
	}
	waittest.Until(t, 60*time.Second, "the old run's directory gone", func() bool {
		_, err := os.Lstat(filepath.Join(workdir, old.InvocationID))
		return errors.Is(err, os.ErrNotExist)
	})
	fresh := submitSh(t, op, `echo fresh`, 0)
	waitTerminal(t, op, fresh.InvocationID, 30*time.Second)
	if got := runDirs(t, workdir); !slices.Equal(got, []string{fresh.InvocationID + "/1"}) {
		t.Fatalf("run directories %v; want the newest run's alone", got)
	}
}
