package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/server/blobs"
	"github.com/dreamlake/lakeshore/server/blobs/blobstest"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// newArtifactPlane is newTestPlane with a loopback blob store.
func newArtifactPlane(t *testing.T) (testPlane, *blobstest.Store) {
	t.Helper()
	t.Setenv(envURL, "")
	t.Setenv(envToken, "")
	b := blobstest.New(t)
	plane := apitest.New(t, func(cfg *apitest.Config) { cfg.Control.Blobs = blobs.UseCases{Store: b} })
	return testPlane{url: plane.URL, op: client.New(plane.URL, testOperatorToken), plane: plane}, b
}

// claim polls until the worker holds a run command, and reports it.
func claim(t *testing.T, c *client.Client, workerID string) wire.RunInvocation {
	t.Helper()
	for range 20 {
		res, err := c.Poll(t.Context(), wire.PollRequest{WorkerID: workerID, Queue: "default", Phase: wire.PhaseReady, TimeoutS: 1})
		if err != nil {
			t.Fatal(err)
		}
		for _, cmd := range res.Commands {
			if cmd.Type == wire.CommandRun {
				return *cmd.Invocation
			}
		}
	}
	t.Fatal("no run command in 20 polls")
	return wire.RunInvocation{}
}

// publishBytes publishes body as artifact name of the attempt, as nymph does.
func publishBytes(t *testing.T, c *client.Client, workerID string, run wire.RunInvocation, name, contentType string, body []byte) {
	t.Helper()
	ctx := t.Context()
	sum := sha256.Sum256(body)
	up, err := c.PresignArtifact(ctx, wire.ArtifactUploadRequest{WorkerID: workerID, InvocationID: run.InvocationID,
		Attempt: run.Attempt, Name: name, Size: int64(len(body)), SHA256: hex.EncodeToString(sum[:]), ContentType: contentType})
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, up.Method, up.URL, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("PUT: %v %v", resp, err)
	}
	resp.Body.Close()
	if _, err := c.CompleteArtifact(ctx, wire.ArtifactCompleteRequest{WorkerID: workerID, InvocationID: run.InvocationID,
		Attempt: run.Attempt, Name: name, UploadID: up.UploadID}); err != nil {
		t.Fatal(err)
	}
}

func ack(t *testing.T, c *client.Client, workerID string, run wire.RunInvocation, state, phase string) {
	t.Helper()
	zero := 0
	if _, err := c.Ack(t.Context(), wire.AckRequest{WorkerID: workerID, InvocationID: run.InvocationID,
		Attempt: run.Attempt, State: state, ExitCode: &zero, Phase: phase}); err != nil {
		t.Fatal(err)
	}
}

// tarEntry is one entry of a test archive.
type tarEntry struct {
	name, body, link string
	kind             byte
}

func tarGz(t *testing.T, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.kind, Mode: 0o644, Linkname: e.link, Size: int64(len(e.body))}
		if e.kind == tar.TypeDir {
			h.Mode = 0o755
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestArtifactsLsAndGet: ls shows an invocation's artifacts with counted;
// get downloads a file byte for byte, unpacks a directory artifact (--raw
// keeps its tar.gz), and refuses content whose sha256 is not what was
// published, leaving nothing at the path.
func TestArtifactsLsAndGet(t *testing.T) {
	p, b := newArtifactPlane(t)
	w, wid := p.worker(t, "m1")
	id := strings.TrimSpace(p.mustRun(t, "submit", "--", "eval"))
	run := claim(t, w, wid)
	file := []byte("line 1\nline 2\n")
	dir := tarGz(t, tarEntry{name: "ckpt/", kind: tar.TypeDir}, tarEntry{name: "ckpt/weights.bin", body: "w", kind: tar.TypeReg},
		tarEntry{name: "ckpt/sub/meta.json", body: "{}", kind: tar.TypeReg}, tarEntry{name: "latest", link: "ckpt/weights.bin", kind: tar.TypeSymlink})
	publishBytes(t, w, wid, run, "preds.txt", "text/plain", file)
	publishBytes(t, w, wid, run, "checkpoint", wire.ContentTypeDir, dir)
	ack(t, w, wid, run, wire.StateSucceeded, "")

	out := p.mustRun(t, "artifacts", "ls", id)
	sum := sha256.Sum256(file)
	for _, want := range []string{"NAME", "preds.txt", "checkpoint", "yes", hex.EncodeToString(sum[:])[:12]} {
		if !strings.Contains(out, want) {
			t.Errorf("ls output lacks %q:\n%s", want, out)
		}
	}
	tmp := t.TempDir()
	p.mustRun(t, "artifacts", "get", id, "preds.txt", "-o", filepath.Join(tmp, "p.txt"))
	if got := readFile(t, filepath.Join(tmp, "p.txt")); got != string(file) {
		t.Errorf("get wrote %q, want %q", got, file)
	}
	p.mustRun(t, "artifacts", "get", id, "checkpoint", "-o", filepath.Join(tmp, "ck"))
	if got := readFile(t, filepath.Join(tmp, "ck", "ckpt", "sub", "meta.json")); got != "{}" {
		t.Errorf("unpacked meta.json %q", got)
	}
	if got := readFile(t, filepath.Join(tmp, "ck", "latest")); got != "w" {
		t.Errorf("unpacked link reads %q", got)
	}
	p.mustRun(t, "artifacts", "get", id, "checkpoint", "--raw", "-o", filepath.Join(tmp, "ck.tar.gz"))
	if got := readFile(t, filepath.Join(tmp, "ck.tar.gz")); got != string(dir) {
		t.Errorf("--raw did not keep the archive as published")
	}

	b.Tamper(blobs.Key(id, 1, "preds.txt"), []byte("line 1\nline X\n"))
	_, _, err := p.run(t, "artifacts", "get", id, "preds.txt", "-o", filepath.Join(tmp, "bad.txt"))
	if err == nil || !strings.Contains(err.Error(), "sha256") {
		t.Errorf("get of tampered content: %v, want a sha256 error", err)
	}
	if _, err := os.Stat(filepath.Join(tmp, "bad.txt")); !os.IsNotExist(err) {
		t.Errorf("tampered content landed at the path: %v", err)
	}
}

// TestArtifactsGetRunAll: a run's counted artifacts are laid out by job
// index; an artifact of a handed-back attempt is not among them, and
// getting it by name from its invocation says so.
func TestArtifactsGetRunAll(t *testing.T) {
	p, _ := newArtifactPlane(t)
	w1, wid1 := p.worker(t, "m1")
	runID := strings.TrimSpace(p.mustRun(t, "run", "submit", "--max-attempts", "2", "--matrix", "x=a,b", "--", "eval", "{x}"))
	first := claim(t, w1, wid1)
	publishBytes(t, w1, wid1, first, "out.txt", "", []byte("handed back"))
	ack(t, w1, wid1, first, wire.AckRequeued, wire.PhaseDraining)
	w2, wid2 := p.worker(t, "m2")
	for range 2 { // both jobs, the handed-back one's second attempt included
		r := claim(t, w2, wid2)
		publishBytes(t, w2, wid2, r, "out.txt", "", []byte("job "+r.InvocationID))
		ack(t, w2, wid2, r, wire.StateSucceeded, "")
	}

	dir := t.TempDir()
	p.mustRun(t, "artifacts", "get", runID, "--all", "-o", dir)
	for _, i := range []string{"0", "1"} {
		got := readFile(t, filepath.Join(dir, i, "out.txt"))
		if !strings.HasPrefix(got, "job inv_") {
			t.Errorf("job %s: %q, want the counted attempt's", i, got)
		}
	}
	out := p.mustRun(t, "artifacts", "ls", runID)
	if !strings.Contains(out, "no (requeued)") || !strings.Contains(out, "INDEX") {
		t.Errorf("run ls does not show the handed-back attempt apart:\n%s", out)
	}
	_, _, err := p.run(t, "artifacts", "get", first.InvocationID, "nope")
	if err == nil {
		t.Error("get of a missing name succeeded")
	}
}

// TestUnpackRefusesEscapes: an archive entry that is absolute, steps up,
// is a hard link, or links out of the directory is refused, and nothing
// lands outside it.
func TestUnpackRefusesEscapes(t *testing.T) {
	for name, entries := range map[string][]tarEntry{
		"dot dot":           {{name: "../evil", body: "x", kind: tar.TypeReg}},
		"dot dot inside":    {{name: "a/../../evil", body: "x", kind: tar.TypeReg}},
		"absolute":          {{name: "/tmp/evil", body: "x", kind: tar.TypeReg}},
		"link up":           {{name: "l", link: "..", kind: tar.TypeSymlink}},
		"link absolute":     {{name: "l", link: "/etc", kind: tar.TypeSymlink}},
		"link down then up": {{name: "a/l", link: "b/../..", kind: tar.TypeSymlink}},
		"hard link":         {{name: "h", link: "../evil", kind: tar.TypeLink}},
	} {
		t.Run(name, func(t *testing.T) {
			parent := t.TempDir()
			target := filepath.Join(parent, "out")
			err := unpackDir(bytes.NewReader(tarGz(t, entries...)), target)
			if err == nil {
				t.Fatal("unpacked")
			}
			// Refused by name, before any write, and saying why.
			if msg := err.Error(); !strings.Contains(msg, "outside") && !strings.Contains(msg, "stay inside") && !strings.Contains(msg, "not unpacked") {
				t.Errorf("refused with %q, which does not say the entry escapes", msg)
			}
			list, _ := os.ReadDir(parent)
			if len(list) != 1 || list[0].Name() != "out" {
				t.Errorf("something landed beside the target: %v", list)
			}
		})
	}
	t.Run("a write through a link out", func(t *testing.T) {
		// A link out placed in the target before the unpack cannot carry
		// a write out: the target must be empty, and every write goes
		// through an os.Root, which follows no link out (either guard
		// alone keeps the file in).
		parent := t.TempDir()
		target := filepath.Join(parent, "out")
		if err := os.MkdirAll(target, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(parent, filepath.Join(target, "up")); err != nil {
			t.Fatal(err)
		}
		if err := unpackDir(bytes.NewReader(tarGz(t, tarEntry{name: "up/evil", body: "x", kind: tar.TypeReg})), target); err == nil {
			t.Error("unpacked into a directory holding a link out")
		}
		if _, err := os.Stat(filepath.Join(parent, "evil")); !os.IsNotExist(err) {
			t.Errorf("a file landed outside: %v", err)
		}
	})
}
