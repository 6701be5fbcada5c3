package publish

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/lifecycle"
	"github.com/dreamlake/lakeshore/shared/artifacttest"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// rig is one run's directories, a file outside them, a publisher and a
// fake control plane.
type rig struct {
	plane   *artifacttest.Plane
	pub     *Publisher
	target  Target
	outside string // a directory beside the run's, holding secret.txt
	tmp     string // the publisher's TempDir
}

func newRig(t *testing.T) *rig {
	t.Helper()
	base := t.TempDir()
	runDir := filepath.Join(base, "work", "inv_1", "2")
	bodyDir := filepath.Join(runDir, "sub")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{bodyDir, outside} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(outside, "secret.txt"), "not the body's")
	plane := artifacttest.New(t)
	plane.Token = workerToken
	tmp := filepath.Join(base, "state", "publish")
	pub, err := New(Config{TempDir: tmp, CallTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return &rig{plane: plane, pub: pub, outside: outside, tmp: tmp, target: Target{
		API: client.New(plane.URL, workerToken), WorkerID: "wrk_1", InvocationID: "inv_1", Attempt: 2,
		RunDir: runDir, BodyDir: bodyDir,
	}}
}

const workerToken = "worker-token"

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(s), 0o640); err != nil {
		t.Fatal(err)
	}
}

func (r *rig) publish(path, name string) (wire.Artifact, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return r.pub.Publish(ctx, r.target, path, name)
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// statusOf is a publish error's status (0: none, or not a refusal).
func statusOf(err error) int {
	var pe *lifecycle.PublishError
	if errors.As(err, &pe) {
		return pe.Status
	}
	return 0
}

// TestPublishFile: a regular file, named by a path relative to the body's
// directory, by its absolute path, and through a symbolic link that stays
// inside the run directory, arrives byte for byte with its sha256, size
// and content type recorded.
func TestPublishFile(t *testing.T) {
	r := newRig(t)
	content := strings.Repeat("prediction\n", 1000)
	write(t, filepath.Join(r.target.BodyDir, "preds.txt"), content)
	write(t, filepath.Join(r.target.RunDir, "model.bin"), "\x00\x01weights")
	write(t, filepath.Join(r.target.BodyDir, "empty.json"), "")
	if err := os.Symlink("../model.bin", filepath.Join(r.target.BodyDir, "latest")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, name, want, wantBytes, wantType string }{
		{"preds.txt", "", "preds.txt", content, "text/plain; charset=utf-8"},
		{"./preds.txt", "predictions", "predictions", content, "application/octet-stream"},
		{filepath.Join(r.target.RunDir, "model.bin"), "", "model.bin", "\x00\x01weights", "application/octet-stream"},
		{"latest", "model", "model", "\x00\x01weights", "application/octet-stream"},
		{"../model.bin", "m2", "m2", "\x00\x01weights", "application/octet-stream"},
		{"empty.json", "", "empty.json", "", "application/json"},
	} {
		a, err := r.publish(c.path, c.name)
		if err != nil {
			t.Fatalf("publish %q: %v", c.path, err)
		}
		got, rec, ok := r.plane.Got(c.want)
		if !ok || string(got) != c.wantBytes || a != rec || a.Name != c.want || a.Attempt != 2 ||
			a.Size != int64(len(c.wantBytes)) || a.SHA256 != sum([]byte(c.wantBytes)) || a.ContentType != c.wantType {
			t.Errorf("publish %q as %q: answered %+v, stored %d bytes (%v) recorded %+v", c.path, c.name, a, len(got), ok, rec)
		}
	}
}

// TestPublishDirectory: a directory arrives as a tar.gz that unpacks to
// the same tree (files, empty directories, modes), without the links and
// special files inside it; nothing is left in the temporary directory.
func TestPublishDirectory(t *testing.T) {
	r := newRig(t)
	out := filepath.Join(r.target.BodyDir, "out")
	want := map[string]string{
		"a.txt":            "alpha",
		"nested/b.json":    `{"b": 1}`,
		"nested/deep/c":    strings.Repeat("c", 100_000),
		"nested/empty.txt": "",
	}
	for name, s := range want {
		write(t, filepath.Join(out, name), s)
	}
	if err := os.MkdirAll(filepath.Join(out, "emptydir"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(r.outside, "secret.txt"), filepath.Join(out, "leak")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a.txt", filepath.Join(out, "inner-link")); err != nil {
		t.Fatal(err)
	}
	a, err := r.publish("./out/", "")
	if err != nil {
		t.Fatal(err)
	}
	got, _, ok := r.plane.Got("out")
	if !ok || a.Name != "out" || a.ContentType != wire.ContentTypeDir || a.Size != int64(len(got)) || a.SHA256 != sum(got) {
		t.Fatalf("answered %+v; stored %d bytes (%v)", a, len(got), ok)
	}
	files, dirs := untar(t, got)
	if !maps.Equal(files, want) {
		t.Errorf("the archive holds files %v, want %v", keys(files), keys(want))
	}
	if !maps.Equal(dirs, map[string]bool{"nested/": true, "nested/deep/": true, "emptydir/": true}) {
		t.Errorf("the archive holds directories %v", dirs)
	}
	if left, _ := os.ReadDir(r.tmp); len(left) != 0 {
		t.Errorf("packed files left behind: %v", left)
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// untar reads a tar.gz: its regular files' contents and its directories.
// Any other entry fails the test.
func untar(t *testing.T, b []byte) (map[string]string, map[string]bool) {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	files, dirs := map[string]string{}, map[string]bool{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files, dirs
		}
		if err != nil {
			t.Fatal(err)
		}
		switch h.Typeflag {
		case tar.TypeReg:
			c, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[h.Name] = string(c)
			if h.Mode != 0o640 || h.Uid != 0 || h.Uname != "" {
				t.Errorf("%s: mode %o uid %d uname %q", h.Name, h.Mode, h.Uid, h.Uname)
			}
		case tar.TypeDir:
			dirs[h.Name] = true
		default:
			t.Errorf("the archive holds %s of type %c", h.Name, h.Typeflag)
		}
	}
}

// TestPublishRefusals: what may not be published is refused with a clear
// status before the control plane is asked anything.
func TestPublishRefusals(t *testing.T) {
	r := newRig(t)
	write(t, filepath.Join(r.target.BodyDir, "ok.txt"), "ok")
	for _, link := range []struct{ name, to string }{
		{"out-file", filepath.Join(r.outside, "secret.txt")},
		{"out-dir", r.outside},
		{"out-rel", "../../../../outside/secret.txt"},
	} {
		if err := os.Symlink(link.to, filepath.Join(r.target.BodyDir, link.name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		what, path, name string
		status           int
	}{
		{"a symlink to a file outside", "out-file", "", http.StatusBadRequest},
		{"a symlink to a directory outside", "out-dir", "", http.StatusBadRequest},
		{"a relative symlink climbing out", "out-rel", "", http.StatusBadRequest},
		{"a path through a symlink out", "out-dir/secret.txt", "x", http.StatusBadRequest},
		{"a relative path climbing out", "../../../../outside/secret.txt", "", http.StatusBadRequest},
		{"an absolute path outside", filepath.Join(r.outside, "secret.txt"), "", http.StatusBadRequest},
		{"an absolute path with ..", filepath.Join(r.target.RunDir, "..", "..", "..", "outside", "secret.txt"), "", http.StatusBadRequest},
		{"a missing path", "nope.txt", "", http.StatusNotFound},
		{"a name with /", "ok.txt", "a/b", http.StatusBadRequest},
		{"a name ..", "ok.txt", "..", http.StatusBadRequest},
		{"a name with a control character", "ok.txt", "a\nb", http.StatusBadRequest},
		{"a name over 128 bytes", "ok.txt", strings.Repeat("n", 129), http.StatusBadRequest},
		{"a path whose base is no name", "/", "", http.StatusBadRequest},
		{"an empty path", "", "x", http.StatusBadRequest},
		{"a path with NUL", "ok\x00.txt", "x", http.StatusBadRequest},
		{"not a file or directory", "/dev/null", "x", http.StatusBadRequest},
	} {
		a, err := r.publish(c.path, c.name)
		if got := statusOf(err); got != c.status {
			t.Errorf("%s: answered %+v, %v (status %d), want %d", c.what, a, err, got, c.status)
		}
		if err != nil && strings.Contains(err.Error(), "not the body's") {
			t.Errorf("%s: the error shows the outside file's content", c.what)
		}
	}
	if n := r.plane.Presigns(); n != 0 {
		t.Fatalf("the control plane was asked %d times", n)
	}
	if _, err := r.publish("ok.txt", ""); err != nil {
		t.Fatalf("a good publish after the refusals: %v", err)
	}
}

// TestPublishControlPlaneRefusals: the control plane's refusals reach the
// body with their meaning (409 the attempt is not this worker's any more,
// 413 a limit), and a refused complete records nothing.
func TestPublishControlPlaneRefusals(t *testing.T) {
	r := newRig(t)
	write(t, filepath.Join(r.target.BodyDir, "ok.txt"), "ok")
	for _, c := range []struct {
		presign, complete *wire.Error
		status            int
	}{
		{presign: wire.Errorf(wire.CodeConflict, "attempt 2 is not held by wrk_1"), status: http.StatusConflict},
		{presign: wire.Errorf(wire.CodeTooLarge, "over the per-attempt count"), status: http.StatusRequestEntityTooLarge},
		{presign: wire.Errorf(wire.CodeForbidden, "not your attempt"), status: http.StatusConflict},
		{presign: wire.Errorf(wire.CodeUnavailable, "store down"), status: http.StatusBadGateway},
		{complete: wire.Errorf(wire.CodeConflict, "the attempt ended"), status: http.StatusConflict},
	} {
		r.plane.Lock()
		r.plane.RefusePresign, r.plane.RefuseComplete = c.presign, c.complete
		r.plane.Unlock()
		_, err := r.publish("ok.txt", "")
		if got := statusOf(err); got != c.status {
			t.Errorf("presign %v, complete %v: %v (status %d), want %d", c.presign, c.complete, err, got, c.status)
		}
		if _, _, ok := r.plane.Got("ok.txt"); ok {
			t.Fatalf("recorded despite %v %v", c.presign, c.complete)
		}
	}
}

// TestPublishMultipart: past the control plane's threshold the bytes go
// in parts, each its own range of the file, handed out in any order, and
// are assembled to the same bytes; a directory too.
func TestPublishMultipart(t *testing.T) {
	r := newRig(t)
	r.plane.Threshold, r.plane.PartSize = 1000, 1000
	var b bytes.Buffer
	for i := range 3500 {
		b.WriteByte(byte(i * 7))
	}
	write(t, filepath.Join(r.target.BodyDir, "big.bin"), b.String())
	write(t, filepath.Join(r.target.BodyDir, "exact.bin"), b.String()[:2000])
	for _, name := range []string{"big.bin", "exact.bin"} {
		a, err := r.publish(name, "")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, _, _ := r.plane.Got(name)
		want, _ := os.ReadFile(filepath.Join(r.target.BodyDir, name))
		if !bytes.Equal(got, want) || a.SHA256 != sum(want) {
			t.Fatalf("%s: stored %d bytes, want %d", name, len(got), len(want))
		}
	}
	if parts := r.plane.Parts("up1"); parts != 4 {
		t.Fatalf("3500 bytes went in %d parts, want 4", parts)
	}
	for i := range 20 {
		write(t, filepath.Join(r.target.BodyDir, "dir", strings.Repeat("x", i+1)), b.String()[i*100:])
	}
	if _, err := r.publish("dir", ""); err != nil {
		t.Fatal(err)
	}
	got, _, _ := r.plane.Got("dir")
	if files, _ := untar(t, got); len(files) != 20 || len(got) <= 1000 {
		t.Fatalf("the directory packed to %d bytes holding %d files", len(got), len(files))
	}
}

// TestPublishChangedFile: a file rewritten between its digest and its
// upload is not recorded: what was sent does not match what was
// announced.
func TestPublishChangedFile(t *testing.T) {
	r := newRig(t)
	path := filepath.Join(r.target.BodyDir, "ckpt")
	write(t, path, "version one")
	r.plane.OnPresign = func() { write(t, path, "version two") }
	_, err := r.publish("ckpt", "")
	if statusOf(err) != http.StatusConflict || !strings.Contains(err.Error(), "changed") {
		t.Fatalf("a file changed during its upload: %v", err)
	}
	if _, _, ok := r.plane.Got("ckpt"); ok {
		t.Fatal("recorded a changed file")
	}
}

// TestPublishSizeLimit: a directory that packs past the limit is refused
// (413) before the control plane is asked, and its partial archive is
// removed.
func TestPublishSizeLimit(t *testing.T) {
	r := newRig(t)
	r.pub.cfg.MaxBytes = 4096
	write(t, filepath.Join(r.target.BodyDir, "dir", "rand"), string(randomBytes(64<<10)))
	_, err := r.publish("dir", "")
	if statusOf(err) != http.StatusRequestEntityTooLarge {
		t.Fatalf("an oversized directory: %v", err)
	}
	write(t, filepath.Join(r.target.BodyDir, "file"), string(randomBytes(5000)))
	if _, err := r.publish("file", ""); statusOf(err) != http.StatusRequestEntityTooLarge {
		t.Fatalf("an oversized file: %v", err)
	}
	if n := r.plane.Presigns(); n != 0 {
		t.Fatalf("the control plane was asked %d times", n)
	}
	left, _ := os.ReadDir(r.tmp)
	if len(left) != 0 {
		t.Fatalf("left behind: %v", left)
	}
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	x := uint32(2463534242)
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}

// TestPublishOwner: under --run-as (Target.Owner) only the account's own
// files are sent: another's file is refused, and left out of a directory.
func TestPublishOwner(t *testing.T) {
	r := newRig(t)
	write(t, filepath.Join(r.target.BodyDir, "dir", "mine.txt"), "mine")
	write(t, filepath.Join(r.target.BodyDir, "f.txt"), "mine")
	me := uint32(os.Getuid())
	other := me + 1
	r.target.Owner = &other
	if _, err := r.publish("f.txt", ""); statusOf(err) != http.StatusBadRequest {
		t.Fatalf("another account's file: %v", err)
	}
	if _, err := r.publish("dir", "d1"); err != nil {
		t.Fatal(err)
	}
	got, _, _ := r.plane.Got("d1")
	if files, _ := untar(t, got); len(files) != 0 {
		t.Fatalf("another account's files were packed: %v", files)
	}
	r.target.Owner = &me
	if _, err := r.publish("f.txt", ""); err != nil {
		t.Fatalf("the account's own file: %v", err)
	}
	if _, err := r.publish("dir", "d2"); err != nil {
		t.Fatal(err)
	}
	got, _, _ = r.plane.Got("d2")
	if files, _ := untar(t, got); files["mine.txt"] != "mine" {
		t.Fatalf("the account's own files: %v", files)
	}
}

// TestPublishPutRefused: a storage refusal of a PUT fails the publish
// (502) with the store's error code and nothing else of its answer (S3
// quotes the signature back), and nothing is recorded.
func TestPublishPutRefused(t *testing.T) {
	r := newRig(t)
	write(t, filepath.Join(r.target.BodyDir, "ok.txt"), "ok")
	store := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusForbidden)
		io.WriteString(w, `<?xml version="1.0"?><Error><Code>SignatureDoesNotMatch</Code><SignatureProvided>s3cr3tsig</SignatureProvided></Error>`)
	}))
	t.Cleanup(store.Close)
	r.target.API = redirectPuts{ControlPlane: r.target.API, url: store.URL + "/put?X-Amz-Signature=s3cr3tsig"}
	_, err := r.publish("ok.txt", "")
	if statusOf(err) != http.StatusBadGateway || !strings.Contains(err.Error(), "403 (SignatureDoesNotMatch)") || strings.Contains(err.Error(), "s3cr3tsig") {
		t.Fatalf("a refused PUT: %v", err)
	}
	if _, _, ok := r.plane.Got("ok.txt"); ok {
		t.Fatal("recorded")
	}
}

// redirectPuts answers presigns with url as the upload's.
type redirectPuts struct {
	ControlPlane
	url string
}

func (p redirectPuts) PresignArtifact(ctx context.Context, req wire.ArtifactUploadRequest) (wire.ArtifactUpload, error) {
	up, err := p.ControlPlane.PresignArtifact(ctx, req)
	up.URL = p.url
	return up, err
}
