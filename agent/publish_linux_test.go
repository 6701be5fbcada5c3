package agent

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/shared/artifacttest"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/lifecycle"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// The body of TestAgentPublishes, run by the agent from this test binary.
const (
	publishHelperEnv = "PUBLISH_HELPER_MARKER" // where it says it is ready for the drain
	helperPreds      = "prediction 1\nprediction 2\n"
	helperLate       = "flushed during the drain"
)

// TestPublishHelperProcess is the body TestAgentPublishes runs (skipped
// otherwise): it publishes a file, a directory, and tries a symbolic link
// out of its run directory, then waits for the drain and publishes from
// there, as a shutdown hook would. Any surprise exits 3 with a message on
// stderr.
func TestPublishHelperProcess(t *testing.T) {
	marker := os.Getenv(publishHelperEnv)
	if marker == "" {
		t.Skip("the body of TestAgentPublishes")
	}
	os.Exit(publishHelper(marker))
}

func publishHelper(marker string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "publish helper: "+format+"\n", args...)
		return 3
	}
	files := map[string]string{"preds.txt": helperPreds, "out/a.txt": "alpha", "out/nested/b.bin": "\x00\x01", "late.txt": helperLate}
	for name, s := range files {
		if err := os.MkdirAll(filepath.Dir(name), 0o700); err != nil {
			return fail("%v", err)
		}
		if err := os.WriteFile(name, []byte(s), 0o600); err != nil {
			return fail("%v", err)
		}
	}
	if err := os.Symlink("/etc/passwd", "leak"); err != nil {
		return fail("%v", err)
	}
	sum := sha256.Sum256([]byte(helperPreds))
	if a, err := lifecycle.Publish(ctx, "preds.txt", ""); err != nil || a.Name != "preds.txt" || a.SHA256 != hex.EncodeToString(sum[:]) || a.Attempt != 1 {
		return fail("publish a file: %+v %v", a, err)
	}
	if _, err := lifecycle.Publish(ctx, "out", "ckpt"); err != nil {
		return fail("publish a directory: %v", err)
	}
	var se *lifecycle.StatusError
	if _, err := lifecycle.Publish(ctx, "leak", ""); !errors.As(err, &se) || se.Code != http.StatusBadRequest {
		return fail("publish a symlink out of the run directory: %v", err)
	}
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		return fail("%v", err)
	}
	if _, err := lifecycle.WaitDraining(ctx); err != nil {
		return fail("wait for the drain: %v", err)
	}
	if _, err := lifecycle.Publish(ctx, "late.txt", "on-shutdown"); err != nil {
		return fail("publish while draining: %v", err)
	}
	return 0
}

// TestAgentPublishes: a real body of a real agent (against the real
// control plane, with a fake of the artifact routes in front) publishes a
// file and a directory, is refused a symbolic link out of its run
// directory, and publishes again during the drain; the bytes arrive
// whole, recorded under the worker, invocation and attempt that ran it.
func TestAgentPublishes(t *testing.T) {
	p := apitest.New(t)
	plane := artifacttest.New(t)
	plane.Next = p.Handler
	dir := t.TempDir()
	marker := filepath.Join(dir, "ready")
	op := client.New(p.URL, apitest.OperatorToken)
	inv, _, err := op.Submit(t.Context(), wire.SubmitRequest{Queue: "q",
		Argv: []string{os.Args[0], "-test.run=^TestPublishHelperProcess$", "-test.count=1"},
		Env:  map[string]string{publishHelperEnv: marker}})
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{
		ControlPlane: plane.URL, EnrollToken: apitest.EnrollToken, Queue: "q",
		Workdir: filepath.Join(dir, "work"), StateDir: filepath.Join(dir, "state"), MachineID: "publisher",
		IntrospectAddr: "off", LifecycleAddr: "127.0.0.1:0", Grace: time.Minute, KillAfter: time.Second, KeepRuns: time.Hour,
		Logger: slog.New(slog.DiscardHandler), Notifier: nopNotifier{},
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(context.Background()) }()
	stderrLog := filepath.Join(dir, "work", inv.InvocationID, "1", "stderr.log")
	for deadline := time.Now().Add(2 * time.Minute); ; {
		if _, err := os.Stat(marker); err == nil {
			break
		}
		cur, err := op.GetInvocation(t.Context(), inv.InvocationID)
		if time.Now().After(deadline) || err == nil && wire.Terminal(cur.State) {
			b, _ := os.ReadFile(stderrLog)
			a.Stop()
			a.Stop()
			<-done
			t.Fatalf("the body never got to the drain; its stderr: %s", b)
		}
		time.Sleep(50 * time.Millisecond)
	}
	a.Stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(2 * time.Minute):
		a.Stop()
		t.Fatalf("Run still going two minutes after the drain; the body's stderr: %s", readFile(stderrLog))
	}
	got, err := op.GetInvocation(t.Context(), inv.InvocationID)
	if err != nil || got.State != wire.StateSucceeded {
		t.Fatalf("invocation %+v %v; the body's stderr: %s", got, err, readFile(stderrLog))
	}

	workerID := a.Health().Snapshot().WorkerID
	for name, want := range map[string]string{"preds.txt": helperPreds, "on-shutdown": helperLate} {
		b, rec, ok := plane.Got(name)
		req := plane.Request(name)
		if !ok || string(b) != want || rec.Attempt != 1 || req.WorkerID != workerID || req.InvocationID != inv.InvocationID {
			t.Errorf("%s: stored %q (%v) recorded %+v, asked by %s for %s", name, b, ok, rec, req.WorkerID, req.InvocationID)
		}
	}
	b, rec, ok := plane.Got("ckpt")
	if !ok || rec.ContentType != wire.ContentTypeDir {
		t.Fatalf("the directory: %v %+v", ok, rec)
	}
	tree := map[string]string{}
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	for tr := tar.NewReader(zr); ; {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		c, _ := io.ReadAll(tr)
		tree[h.Name] = string(c)
	}
	want := map[string]string{"a.txt": "alpha", "nested/": "", "nested/b.bin": "\x00\x01"}
	if fmt.Sprint(tree) != fmt.Sprint(want) {
		t.Errorf("the directory unpacks to %q, want %q", tree, want)
	}
	if _, _, ok := plane.Got("leak"); ok || plane.Presigns() != 3 {
		t.Errorf("the control plane was asked %d times, want 3 (the symlink out never)", plane.Presigns())
	}
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}
