package main

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/dreamlake/lakeshore/agent"
	"github.com/dreamlake/lakeshore/agent/internal/lifecycle"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestPublishCommand: `nymph publish` against a real lifecycle endpoint
// whose run this test process belongs to: a relative path goes out made
// absolute against the working directory, the recorded artifact is
// printed and the exit is 0; a refusal prints the endpoint's message and
// exits 1; usage errors exit 2; outside a body it says so.
func TestPublishCommand(t *testing.T) {
	self := os.Getpid()
	s, err := lifecycle.Listen("127.0.0.1:0", lifecycle.Config{Members: func(int) []int { return []int{self} }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	h, err := s.Add(lifecycle.Run{InvocationID: "inv_1", Attempt: 1})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	close(started)
	h.Attach(started, func() int { return 77 }, func() {})
	var mu sync.Mutex
	var seen []lifecycle.PublishRequest
	h.AttachPublish(func(_ context.Context, req lifecycle.PublishRequest) (wire.Artifact, error) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, req)
		if strings.HasSuffix(req.Path, "missing") {
			return wire.Artifact{}, &lifecycle.PublishError{Status: http.StatusNotFound, Message: `"missing" does not exist in the run directory`}
		}
		return wire.Artifact{Name: "ckpt", Attempt: 1, Size: 42, SHA256: strings.Repeat("a", 64)}, nil
	})
	t.Setenv("NYMPH_LIFECYCLE_URL", h.URL())
	dir := t.TempDir()
	t.Chdir(dir)
	wd, _ := os.Getwd()

	runCmd := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := runIO(append([]string{"publish"}, args...), os.Getenv, &out, &errOut)
		return code, out.String(), errOut.String()
	}
	if code, out, _ := runCmd("out", "--name", "ckpt"); code != agent.ExitOK || out != "published ckpt: 42 bytes, sha256 "+strings.Repeat("a", 64)+" (attempt 1)\n" {
		t.Fatalf("publish: exit %d, %q", code, out)
	}
	if code, _, errOut := runCmd("missing"); code != agent.ExitFailure || !strings.Contains(errOut, "404") || !strings.Contains(errOut, "does not exist") || strings.Contains(errOut, h.URL()) {
		t.Fatalf("a refused publish: exit %d, %q", code, errOut)
	}
	for _, args := range [][]string{{}, {"a", "b"}, {"--nope", "a"}} {
		if code, _, _ := runCmd(args...); code != agent.ExitUsage {
			t.Errorf("nymph publish %q: exit %d, want %d", args, code, agent.ExitUsage)
		}
	}
	mu.Lock()
	if len(seen) != 2 || seen[0] != (lifecycle.PublishRequest{Path: filepath.Join(wd, "out"), Name: "ckpt"}) || seen[1].Name != "" {
		t.Errorf("the endpoint saw %+v", seen)
	}
	mu.Unlock()
	t.Setenv("NYMPH_LIFECYCLE_URL", "")
	if code, _, errOut := runCmd("out"); code != agent.ExitFailure || !strings.Contains(errOut, "not running under nymph") {
		t.Fatalf("outside a body: exit %d, %q", code, errOut)
	}
}
