package process

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/ids"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// retentionTestNow is the fake clock's reading in the retention tests.
var retentionTestNow = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

var retentionTestIDs ids.Generator

// retentionTestRun makes a finished run directory under root, as the
// runner leaves one: stdout.log stamped with its finish time, and size
// bytes of output. It reports the invocation id.
func retentionTestRun(t *testing.T, root, inv string, attempt int, finished time.Time, size int) string {
	t.Helper()
	if inv == "" {
		inv = retentionTestIDs.New(ids.Invocation)
	}
	dir := filepath.Join(root, inv, fmt.Sprint(attempt))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, StdoutFileName)
	if err := os.WriteFile(out, make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(out, finished, finished); err != nil {
		t.Fatal(err)
	}
	return inv
}

func retentionTestNew(t *testing.T, root string, keep time.Duration, maxBytes int64) *Retention {
	t.Helper()
	return NewRetention(RetentionConfig{
		Workdir: root, Keep: keep, MaxBytes: maxBytes,
		Clock:  clock.NewFake(retentionTestNow).Clock(),
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
}

func retentionTestExists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// TestRetentionByAge: a run over --keep-runs ago goes, a newer one stays,
// a held one stays however old; an invocation directory left empty goes,
// one still holding a run stays.
func TestRetentionByAge(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	old := retentionTestRun(t, root, "", 1, retentionTestNow.Add(-2*time.Hour), 10)
	fresh := retentionTestRun(t, root, "", 1, retentionTestNow.Add(-10*time.Minute), 10)
	held := retentionTestRun(t, root, "", 1, retentionTestNow.Add(-48*time.Hour), 10)
	retentionTestRun(t, root, fresh, 2, retentionTestNow.Add(-3*time.Hour), 10) // fresh/2 goes, fresh/1 stays
	r := retentionTestNew(t, root, time.Hour, 0)
	r.Hold(held, 1)

	res := r.Sweep(context.Background())
	slices.Sort(res.Removed)
	want := []string{fresh + "/2", old + "/1"}
	slices.Sort(want)
	if !slices.Equal(res.Removed, want) || res.Kept != 1 || res.Held != 1 {
		t.Fatalf("Sweep = %+v; want %v removed, 1 kept, 1 held", res, want)
	}
	if retentionTestExists(filepath.Join(root, old)) {
		t.Error("the invocation directory of the removed run was left, empty")
	}
	for _, p := range []string{fresh + "/1", held + "/1"} {
		if !retentionTestExists(filepath.Join(root, p)) {
			t.Errorf("%s removed", p)
		}
	}

	r.Release(held, 1)
	if res := r.Sweep(context.Background()); !slices.Equal(res.Removed, []string{held + "/1"}) {
		t.Fatalf("after Release: Sweep = %+v; want the released run removed", res)
	}
}

// TestRetentionKeepZero: --keep-runs 0 keeps nothing once released,
// whatever its age (a future finish time included), and nothing held.
func TestRetentionKeepZero(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	done := retentionTestRun(t, root, "", 1, retentionTestNow.Add(time.Hour), 10)
	running := retentionTestRun(t, root, "", 1, retentionTestNow, 10)
	r := retentionTestNew(t, root, 0, 0)
	r.Hold(running, 1)
	if res := r.Sweep(context.Background()); !slices.Equal(res.Removed, []string{done + "/1"}) || res.Held != 1 {
		t.Fatalf("Sweep = %+v; want only %s/1 removed", res, done)
	}
	if !retentionTestExists(filepath.Join(root, running, "1", StdoutFileName)) {
		t.Error("a held run lost its directory")
	}
}

// TestRetentionBySize: over the cap, finished runs go oldest first until
// the total fits; a held run counts toward the total but stays.
func TestRetentionBySize(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	var invs []string
	for i := range 5 { // 1000 bytes each, finished 5, 4, 3, 2, 1 minutes ago
		invs = append(invs, retentionTestRun(t, root, "", 1, retentionTestNow.Add(-time.Duration(5-i)*time.Minute), 1000))
	}
	r := retentionTestNew(t, root, 24*time.Hour, 2500)
	r.Hold(invs[0], 1) // the oldest is still held: it stays, and counts
	res := r.Sweep(context.Background())
	// 5000 bytes: the held 1000 stay, so 1500 more may: only the newest.
	want := []string{invs[1] + "/1", invs[2] + "/1", invs[3] + "/1"}
	if !slices.Equal(res.Removed, want) || res.Bytes != 5000 || res.Held != 1 || res.Kept != 1 {
		t.Fatalf("Sweep = %+v; want %v removed (oldest first) of 5000 bytes", res, want)
	}
	for _, i := range []int{0, 4} {
		if !retentionTestExists(filepath.Join(root, invs[i], "1")) {
			t.Errorf("run %d removed", i)
		}
	}
}

// TestRetentionTouchesNothingElse: symlinks a body planted are removed as
// links, never followed; a symlinked invocation or run directory is left
// alone, as is anything not named like an invocation id and its attempt
// (a workdir shared with other files), and the workdir's own files.
func TestRetentionTouchesNothingElse(t *testing.T) {
	t.Parallel()
	root, outside := t.TempDir(), t.TempDir()
	canary := filepath.Join(outside, "1", "canary")
	if err := os.MkdirAll(filepath.Dir(canary), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(canary, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	long := retentionTestNow.Add(-100 * time.Hour)
	planted := retentionTestRun(t, root, "", 1, long, 10)
	for name, target := range map[string]string{"to-dir": outside, "to-file": canary, "up": "../../.."} {
		if err := os.Symlink(target, filepath.Join(root, planted, "1", name)); err != nil {
			t.Fatal(err)
		}
	}
	linkedInv := retentionTestIDs.New(ids.Invocation)
	if err := os.Symlink(outside, filepath.Join(root, linkedInv)); err != nil {
		t.Fatal(err)
	}
	linkedRun := retentionTestIDs.New(ids.Invocation)
	if err := os.MkdirAll(filepath.Join(root, linkedRun), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "1"), filepath.Join(root, linkedRun, "1")); err != nil {
		t.Fatal(err)
	}
	others := []string{"projects/2", "inv_notanid/1", strings.ToLower(retentionTestIDs.New(ids.Invocation)) + "/1", retentionTestIDs.New(ids.Invocation) + "/01"}
	for _, p := range others {
		if err := os.MkdirAll(filepath.Join(root, p), 0o700); err != nil {
			t.Fatal(err)
		}
		_ = os.Chtimes(filepath.Join(root, p), long, long)
	}
	if err := os.WriteFile(filepath.Join(root, ".nymph-probe-1"), nil, 0o600); err != nil {
		t.Fatal(err)
	}

	res := retentionTestNew(t, root, 0, 1).Sweep(context.Background())
	if !slices.Equal(res.Removed, []string{planted + "/1"}) {
		t.Fatalf("Sweep = %+v; want only %s/1 removed", res, planted)
	}
	if b, err := os.ReadFile(canary); err != nil || string(b) != "keep me" {
		t.Fatalf("the file a planted symlink pointed at: %q %v", b, err)
	}
	for _, p := range append(others, linkedInv, linkedRun+"/1", ".nymph-probe-1") {
		if !retentionTestExists(filepath.Join(root, p)) {
			t.Errorf("%s removed", p)
		}
	}
}

// TestRetentionFinishesAnInterruptedRemoval: a run directory a sweep had
// renamed for removal when the daemon died goes at the next sweep.
func TestRetentionFinishesAnInterruptedRemoval(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	inv := retentionTestRun(t, root, "", 1, retentionTestNow, 10)
	if err := os.Rename(filepath.Join(root, inv, "1"), filepath.Join(root, inv, trashPrefix+"1-7")); err != nil {
		t.Fatal(err)
	}
	retentionTestNew(t, root, time.Hour, 0).Sweep(context.Background())
	if retentionTestExists(filepath.Join(root, inv)) {
		t.Error("the half-removed run directory (and its invocation directory) survived a sweep")
	}
}

// TestRetentionRunSweepsOnRelease: Run sweeps at start and again when a
// run is released, and returns when its context ends.
func TestRetentionRunSweepsOnRelease(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	inv := retentionTestRun(t, root, "", 1, retentionTestNow, 10)
	swept := make(chan SweepResult, 10)
	r := NewRetention(RetentionConfig{Workdir: root, Keep: 0, Interval: time.Hour,
		Clock: clock.NewFake(retentionTestNow).Clock(), Swept: func(res SweepResult) { swept <- res }})
	r.Hold(inv, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	next := func() SweepResult {
		select {
		case res := <-swept:
			return res
		case <-time.After(runnerTestWait):
			t.Fatal("no sweep")
			return SweepResult{}
		}
	}
	if res := next(); res.Held != 1 || len(res.Removed) != 0 {
		t.Fatalf("first sweep %+v; want the held run kept", res)
	}
	r.Release(inv, 1)
	if res := next(); !slices.Equal(res.Removed, []string{inv + "/1"}) {
		t.Fatalf("sweep after Release %+v; want the run removed", res)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(runnerTestWait):
		t.Fatal("Run did not return when its context ended")
	}
}

// TestRunnerStampsTheFinishTime: a run's stdout.log carries when it ended,
// by the runner's clock, even when the body printed nothing.
func TestRunnerStampsTheFinishTime(t *testing.T) {
	t.Parallel()
	fake := clock.NewFake(retentionTestNow)
	r := runnerTestNew(t, func(c *Config) { c.Clock = fake.Clock() })
	inv := wire.RunInvocation{InvocationID: "inv_STAMP", Argv: []string{"true"}}
	if o := runnerTestOutcome(t, runnerTestStart(t, r, inv)); o.State != wire.StateSucceeded {
		t.Fatalf("outcome %+v", o)
	}
	fi, err := os.Lstat(filepath.Join(runnerTestDir(r, inv), StdoutFileName))
	if err != nil {
		t.Fatal(err)
	}
	if !fi.ModTime().Equal(retentionTestNow) {
		t.Errorf("stdout.log modified %s; want the run's end, %s", fi.ModTime(), retentionTestNow)
	}
}
