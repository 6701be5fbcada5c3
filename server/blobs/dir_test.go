package blobs_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/blobs"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/wire"
)

const ttl = 15 * time.Minute

// dirServer is a Dir behind a real HTTP server on 127.0.0.1.
type dirServer struct {
	dir   *blobs.Dir
	root  string
	clock *clock.Fake
}

func newDirServer(t *testing.T, opts ...blobs.Option) *dirServer {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	// Real time to start with: staged uploads' ages are their files'.
	fake := clock.NewFake(time.Now())
	root := filepath.Join(t.TempDir(), "artifacts")
	opts = append([]blobs.Option{blobs.WithClock(fake.Clock())}, opts...)
	d, err := blobs.NewDir(root, "http://"+srv.Listener.Addr().String(), []byte("test secret"), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	srv.Config.Handler = d.Handler()
	srv.Start()
	t.Cleanup(srv.Close)
	return &dirServer{dir: d, root: root, clock: fake}
}

func content(t *testing.T, n int) ([]byte, string) {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return b, hex.EncodeToString(sum[:])
}

// do sends method to url with body (chunked when chunked is set) and the
// headers, and reports the status, the ETag and the body answered.
func do(t *testing.T, method, url string, body []byte, headers map[string]string, chunked bool) (int, string, []byte) {
	t.Helper()
	var r io.Reader = bytes.NewReader(body)
	if chunked {
		r = io.MultiReader(r) // hides the length: sent chunked
	}
	if body == nil {
		r = nil
	}
	req, err := http.NewRequest(method, url, r)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get("ETag"), out
}

// files lists the regular files under root.
func files(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() {
			out = append(out, strings.TrimPrefix(p, root+"/"))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// get downloads key through a presigned GET and reports its status and body.
func (s *dirServer) get(t *testing.T, key string) (int, []byte) {
	t.Helper()
	resp, body := fetch(t, s.dir, key, "x")
	return resp.StatusCode, body
}

// publish uploads data to key as one PUT and completes it.
func (s *dirServer) publish(t *testing.T, key string, data []byte, sum string) {
	t.Helper()
	up := putSingle(t, s.dir, key, data, sum)
	if err := s.dir.Complete(context.Background(), key, up.UploadID, nil, int64(len(data))); err != nil {
		t.Fatal(err)
	}
}

// presign presigns an upload of data to key in store.
func presign(t *testing.T, store blobs.Store, key string, data []byte, sum, contentType string) wire.ArtifactUpload {
	t.Helper()
	up, err := store.PresignPut(context.Background(), key, int64(len(data)), sum, contentType, ttl)
	if err != nil {
		t.Fatal(err)
	}
	return up
}

// putSingle presigns a single upload of data to key in store and PUTs it.
func putSingle(t *testing.T, store blobs.Store, key string, data []byte, sum string) wire.ArtifactUpload {
	t.Helper()
	up := presign(t, store, key, data, sum, "")
	if status, _, body := do(t, up.Method, up.URL, data, up.Headers, false); status != http.StatusOK {
		t.Fatalf("PUT %s: %d %s", key, status, body)
	}
	return up
}

// putParts PUTs the parts of data to up's URLs, the last first, and
// reports the parts to complete with.
func putParts(t *testing.T, up wire.ArtifactUpload, data []byte) []wire.ArtifactPart {
	t.Helper()
	parts := make([]wire.ArtifactPart, len(up.Parts))
	for i := len(up.Parts) - 1; i >= 0; i-- {
		p := up.Parts[i]
		chunk := data[int64(i)*up.PartSize : min(int64(i+1)*up.PartSize, int64(len(data)))]
		status, etag, body := do(t, up.Method, p.URL, chunk, nil, false)
		if status != http.StatusOK || etag == "" {
			t.Fatalf("PUT part %d: %d etag %q %s", p.Number, status, etag, body)
		}
		parts[i] = wire.ArtifactPart{Number: p.Number, ETag: etag}
	}
	return parts
}

// fetch downloads key from store through a presigned GET.
func fetch(t *testing.T, store blobs.Store, key, filename string) (*http.Response, []byte) {
	t.Helper()
	u, err := store.PresignGet(context.Background(), key, filename, ttl)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

func TestDirSinglePutGet(t *testing.T) {
	s := newDirServer(t)
	ctx := context.Background()
	key := blobs.Key("inv-1", 1, "predictions é.jsonl")
	data, sum := content(t, 1<<20+17)
	up, err := s.dir.PresignPut(ctx, key, int64(len(data)), sum, "application/jsonl", ttl)
	if err != nil {
		t.Fatal(err)
	}
	if up.Method != http.MethodPut || len(up.Parts) != 0 || !strings.Contains(up.URL, blobs.Prefix) {
		t.Fatalf("upload = %+v, want one PUT under %s", up, blobs.Prefix)
	}
	if want := s.clock.Now().Add(ttl).Truncate(time.Second); !up.ExpiresAt.Equal(want) {
		t.Errorf("ExpiresAt = %v, want %v", up.ExpiresAt, want)
	}
	status, etag, body := do(t, up.Method, up.URL, data, up.Headers, true)
	if status != http.StatusOK || etag != `"`+sum+`"` {
		t.Fatalf("PUT: %d etag %s %s; want 200 etag %q", status, etag, body, sum)
	}
	// Uploaded but not complete: the key is not there yet.
	if status, _ := s.get(t, key); status != http.StatusNotFound {
		t.Fatalf("GET before complete: %d, want 404", status)
	}
	if err := s.dir.Complete(ctx, key, up.UploadID, nil, int64(len(data))); err != nil {
		t.Fatal(err)
	}
	resp, got := fetch(t, s.dir, key, "predictions é.jsonl")
	if resp.StatusCode != http.StatusOK || !bytes.Equal(got, data) {
		t.Fatalf("GET: %d, %d bytes; want 200 and the %d bytes put", resp.StatusCode, len(got), len(data))
	}
	if cd := resp.Header.Get("Content-Disposition"); cd != `attachment; filename*=utf-8''predictions%20%C3%A9.jsonl` {
		t.Errorf("Content-Disposition = %q", cd)
	}
	if resp.Header.Get("X-Content-Type-Options") != "nosniff" || resp.Header.Get("Content-Type") != "application/octet-stream" {
		t.Errorf("GET headers %v: want an octet-stream, nosniff", resp.Header)
	}
	if f := files(t, s.root); len(f) != 1 || f[0] != key {
		t.Errorf("files under the root: %v, want only %s (staging dropped)", f, key)
	}
	// Completing the same upload again finds nothing.
	if err := s.dir.Complete(ctx, key, up.UploadID, nil, int64(len(data))); !errors.Is(err, wire.ErrInvalid) {
		t.Errorf("second complete: %v, want invalid", err)
	}
}

func TestDirEmptyArtifact(t *testing.T) {
	s := newDirServer(t)
	data, sum := content(t, 0)
	s.publish(t, "artifacts/inv/1/empty", data, sum)
	if status, got := s.get(t, "artifacts/inv/1/empty"); status != http.StatusOK || len(got) != 0 {
		t.Fatalf("GET: %d, %d bytes", status, len(got))
	}
}

// A PUT of other content than presigned is refused, nothing of it is
// kept, and the artifact already at the key stays.
func TestDirPutRefused(t *testing.T) {
	s := newDirServer(t)
	ctx := context.Background()
	key := "artifacts/inv/1/model.bin"
	old, oldSum := content(t, 4096)
	s.publish(t, key, old, oldSum)

	data, sum := content(t, 4096)
	other, _ := content(t, 4096)
	for _, tc := range []struct {
		name    string
		body    []byte
		chunked bool
	}{
		{"other content of the same size", other, false},
		{"shorter", data[:4000], false},
		{"longer", append(bytes.Clone(data), 'x'), false},
		{"shorter chunked", data[:4000], true},
		{"longer chunked", append(bytes.Clone(data), other...), true},
		{"other content chunked", other, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up, err := s.dir.PresignPut(ctx, key, int64(len(data)), sum, "", ttl)
			if err != nil {
				t.Fatal(err)
			}
			if status, _, body := do(t, up.Method, up.URL, tc.body, nil, tc.chunked); status != http.StatusBadRequest {
				t.Fatalf("PUT: %d %s, want 400", status, body)
			}
			if err := s.dir.Complete(ctx, key, up.UploadID, nil, int64(len(data))); !errors.Is(err, wire.ErrInvalid) {
				t.Fatalf("complete after a refused PUT: %v, want invalid", err)
			}
			if f := files(t, s.root); len(f) != 1 || f[0] != key {
				t.Fatalf("files under the root: %v, want only %s", f, key)
			}
			if status, got := s.get(t, key); status != http.StatusOK || !bytes.Equal(got, old) {
				t.Fatalf("the artifact already there changed: %d, %d bytes", status, len(got))
			}
		})
	}
}

// Every URL Dir did not sign as it is used is refused with 403.
func TestDirSignatureRefused(t *testing.T) {
	s := newDirServer(t)
	ctx := context.Background()
	key := "artifacts/inv/1/a.txt"
	data, sum := content(t, 100)
	s.publish(t, key, data, sum)
	up, err := s.dir.PresignPut(ctx, key, int64(len(data)), sum, "", ttl)
	if err != nil {
		t.Fatal(err)
	}
	get, err := s.dir.PresignGet(ctx, key, "a.txt", ttl)
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := blobs.NewDir(t.TempDir(), strings.Split(up.URL, blobs.Prefix)[0], []byte("another secret"), blobs.WithClock(s.clock.Clock()))
	if err != nil {
		t.Fatal(err)
	}
	strangerPut, _ := stranger.PresignPut(ctx, key, int64(len(data)), sum, "", ttl)
	strangerGet, _ := stranger.PresignGet(ctx, key, "a.txt", ttl)
	other, otherSum := content(t, 100)
	tamperSig := func(u string) string {
		i := strings.Index(u, "sig=") + len("sig=")
		c := byte('0')
		if u[i] == '0' {
			c = '1'
		}
		return u[:i] + string(c) + u[i+1:]
	}
	for _, tc := range []struct {
		name, method, url string
		body              []byte
	}{
		{"PUT tampered signature", http.MethodPut, tamperSig(up.URL), data},
		{"PUT without signature", http.MethodPut, strings.Split(up.URL, "&sig=")[0], data},
		{"PUT other sha256", http.MethodPut, strings.Replace(up.URL, sum, otherSum, 1), other},
		{"PUT other size", http.MethodPut, strings.Replace(up.URL, "size=100", "size=99", 1), data[:99]},
		{"PUT other key", http.MethodPut, strings.Replace(up.URL, "a.txt", "b.txt", 1), data},
		{"PUT as a part", http.MethodPut, up.URL + "&part=1", data},
		{"PUT later expiry", http.MethodPut, strings.Replace(up.URL, "expires=", "expires=9", 1), data},
		{"PUT another secret", http.MethodPut, strangerPut.URL, data},
		{"GET with the PUT URL", http.MethodGet, up.URL, nil},
		{"PUT with the GET URL", http.MethodPut, get, data},
		{"GET tampered signature", http.MethodGet, tamperSig(get), nil},
		{"GET other file name", http.MethodGet, strings.Replace(get, "filename=a.txt", "filename=evil.html", 1), nil},
		{"GET other key", http.MethodGet, strings.Replace(get, "a.txt?", "b.txt?", 1), nil},
		{"GET another secret", http.MethodGet, strangerGet, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if status, _, body := do(t, tc.method, tc.url, tc.body, nil, false); status != http.StatusForbidden {
				t.Fatalf("%s: %d %s, want 403", tc.method, status, body)
			}
		})
	}
	if f := files(t, s.root); len(f) != 1 {
		t.Errorf("files under the root: %v, want only %s", f, key)
	}

	// The URLs work until they expire, and not a second later.
	s.clock.Advance(ttl)
	if status, _, body := do(t, http.MethodGet, get, nil, nil, false); status != http.StatusOK || !bytes.Equal(body, data) {
		t.Fatalf("GET at expiry: %d, want 200", status)
	}
	s.clock.Advance(time.Second)
	if status, _, _ := do(t, http.MethodGet, get, nil, nil, false); status != http.StatusForbidden {
		t.Errorf("GET after expiry: %d, want 403", status)
	}
	if status, _, _ := do(t, http.MethodPut, up.URL, data, nil, false); status != http.StatusForbidden {
		t.Errorf("PUT after expiry: %d, want 403", status)
	}
}

// No key reaches outside the root: not through the API, not through a
// path sent to the handler, not through a symlink in the root.
func TestDirKeyEscape(t *testing.T) {
	s := newDirServer(t)
	ctx := context.Background()
	_, sum := content(t, 1)
	for _, key := range []string{"", "../x", "a/../../x", "/etc/passwd", `a\..\x`, "a//b", "a/./b", "a/", ".uploads/x", "a\x00b", ".."} {
		if _, err := s.dir.PresignPut(ctx, key, 1, sum, "", ttl); !errors.Is(err, wire.ErrInvalid) {
			t.Errorf("PresignPut(%q): %v, want invalid", key, err)
		}
		if _, err := s.dir.PresignGet(ctx, key, "x", ttl); !errors.Is(err, wire.ErrInvalid) {
			t.Errorf("PresignGet(%q): %v, want invalid", key, err)
		}
		if err := s.dir.Complete(ctx, key, "u", nil, 1); !errors.Is(err, wire.ErrInvalid) {
			t.Errorf("Complete(%q): %v, want invalid", key, err)
		}
	}
	up, err := s.dir.PresignPut(ctx, "artifacts/x", 1, sum, "", ttl)
	if err != nil {
		t.Fatal(err)
	}
	query := up.URL[strings.Index(up.URL, "?"):]
	base := strings.Split(up.URL, blobs.Prefix)[0]
	for _, p := range []string{"../../../etc/passwd", "%2e%2e/%2e%2e/x", "a/%2e%2e/%2e%2e/%2e%2e/x", "%2Fetc%2Fpasswd", `a%5C..%5Cx`, ".uploads/x"} {
		for _, method := range []string{http.MethodGet, http.MethodPut} {
			if status, _, body := do(t, method, base+blobs.Prefix+p+query, []byte("x"), nil, false); status != http.StatusBadRequest {
				t.Errorf("%s %s: %d %s, want 400", method, p, status, body)
			}
		}
	}

	// A symlink in the root that points out of it is not followed.
	outside := t.TempDir()
	secret := []byte("outside the root")
	if err := os.WriteFile(filepath.Join(outside, "secret"), secret, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(s.root, "artifacts")); err != nil {
		t.Fatal(err)
	}
	if status, body := s.get(t, "artifacts/secret"); status != http.StatusNotFound || bytes.Equal(body, secret) {
		t.Errorf("GET through a symlink out of the root: %d %q, want 404", status, body)
	}
	data, sum := content(t, 10)
	up = putSingle(t, s.dir, "artifacts/inv/1/x", data, sum)
	if err := s.dir.Complete(ctx, "artifacts/inv/1/x", up.UploadID, nil, 10); err == nil {
		t.Error("complete through a symlink out of the root succeeded")
	}
	if f := files(t, outside); len(f) != 1 {
		t.Errorf("files outside the root: %v, want only the secret", f)
	}
}

// A multipart upload's parts go in any order and concurrently; Complete
// assembles them in order, and refuses a list that is not what was put.
func TestDirMultipart(t *testing.T) {
	const threshold, part = 1000, 400
	s := newDirServer(t, blobs.WithMultipart(threshold, part))
	ctx := context.Background()
	key := "artifacts/inv/2/checkpoint.tar.gz"
	data, sum := content(t, 2500)
	up, err := s.dir.PresignPut(ctx, key, int64(len(data)), sum, "application/gzip", ttl)
	if err != nil {
		t.Fatal(err)
	}
	if up.URL != "" || up.PartSize != part || len(up.Parts) != 7 {
		t.Fatalf("upload = %+v, want 7 parts of %d", up, part)
	}
	chunk := func(n int) []byte { return data[(n-1)*part : min(n*part, len(data))] }

	// A part of the wrong size is refused.
	if status, _, _ := do(t, http.MethodPut, up.Parts[0].URL, chunk(7), nil, false); status != http.StatusBadRequest {
		t.Fatalf("PUT of a short part 1: %d, want 400", status)
	}

	etags := make([]string, len(up.Parts))
	var wg sync.WaitGroup
	for i := len(up.Parts) - 1; i >= 0; i-- {
		wg.Go(func() {
			p := up.Parts[i]
			status, etag, body := do(t, up.Method, p.URL, chunk(p.Number), nil, i%2 == 0)
			if status != http.StatusOK {
				t.Errorf("PUT part %d: %d %s", p.Number, status, body)
			}
			etags[i] = etag
		})
	}
	wg.Wait()
	list := func() []wire.ArtifactPart {
		out := make([]wire.ArtifactPart, len(up.Parts))
		for i, p := range up.Parts {
			out[i] = wire.ArtifactPart{Number: p.Number, ETag: etags[i]}
		}
		return out
	}
	swapped := list()
	swapped[1], swapped[2] = swapped[2], swapped[1]
	wrongETag := list()
	wrongETag[3].ETag = etags[4]
	for _, tc := range []struct {
		name  string
		parts []wire.ArtifactPart
		size  int64
	}{
		{"parts out of order", swapped, 2500},
		{"an etag of another part", wrongETag, 2500},
		{"a part missing", list()[:6], 2500},
		{"a part too many", append(list(), wire.ArtifactPart{Number: 8, ETag: etags[0]}), 2500},
		{"another size", list(), 2499},
		{"no etag", []wire.ArtifactPart{{Number: 1}}, 2500},
	} {
		if err := s.dir.Complete(ctx, key, up.UploadID, tc.parts, tc.size); !errors.Is(err, wire.ErrInvalid) {
			t.Errorf("complete with %s: %v, want invalid", tc.name, err)
		}
		if status, _ := s.get(t, key); status != http.StatusNotFound {
			t.Errorf("after complete with %s, GET: %d, want 404", tc.name, status)
		}
	}
	if err := s.dir.Complete(ctx, key, "0123456789abcdef0123456789abcdef", list(), 2500); !errors.Is(err, wire.ErrInvalid) {
		t.Errorf("complete of an upload never made: %v, want invalid", err)
	}
	// Another key cannot complete with this upload's parts.
	if err := s.dir.Complete(ctx, "artifacts/inv/3/x", up.UploadID, list(), 2500); !errors.Is(err, wire.ErrInvalid) {
		t.Errorf("complete of another key with this upload: %v, want invalid", err)
	}
	if err := s.dir.Complete(ctx, key, up.UploadID, list(), 2500); err != nil {
		t.Fatal(err)
	}
	if status, got := s.get(t, key); status != http.StatusOK || !bytes.Equal(got, data) {
		t.Fatalf("GET: %d, %d bytes; want the %d bytes put", status, len(got), len(data))
	}
	if f := files(t, s.root); len(f) != 1 || f[0] != key {
		t.Errorf("files under the root: %v, want only %s", f, key)
	}
	if staged, err := os.ReadDir(filepath.Join(s.root, ".uploads")); err != nil || len(staged) != 0 {
		t.Errorf("staging after complete: %d entries (%v), want none", len(staged), err)
	}

	// A part listed but never uploaded.
	partial, err := s.dir.PresignPut(ctx, key, int64(len(data)), sum, "", ttl)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range partial.Parts {
		if p.Number != 4 {
			if status, _, body := do(t, partial.Method, p.URL, chunk(p.Number), nil, false); status != http.StatusOK {
				t.Fatalf("PUT part %d: %d %s", p.Number, status, body)
			}
		}
	}
	if err := s.dir.Complete(ctx, key, partial.UploadID, list(), 2500); !errors.Is(err, wire.ErrInvalid) || !strings.Contains(err.Error(), "part 4 of") {
		t.Errorf("complete with part 4 not uploaded: %v, want invalid", err)
	}
}

// A single upload cannot be completed under another key.
func TestDirCompleteOtherKey(t *testing.T) {
	s := newDirServer(t)
	ctx := context.Background()
	data, sum := content(t, 10)
	up := putSingle(t, s.dir, "artifacts/a/1/x", data, sum)
	if err := s.dir.Complete(ctx, "artifacts/b/1/x", up.UploadID, nil, 10); !errors.Is(err, wire.ErrInvalid) {
		t.Fatalf("complete of another key: %v, want invalid", err)
	}
	if err := s.dir.Complete(ctx, "artifacts/a/1/x", up.UploadID, nil, 11); !errors.Is(err, wire.ErrInvalid) {
		t.Fatalf("complete with another size: %v, want invalid", err)
	}
}

func TestDirPresignRefused(t *testing.T) {
	s := newDirServer(t, blobs.WithMultipart(10, 1))
	ctx := context.Background()
	_, sum := content(t, 1)
	for _, tc := range []struct {
		name string
		size int64
		sum  string
	}{
		{"negative size", -1, sum},
		{"too many parts", 10_001, sum},
		{"upper-case sha256", 1, strings.ToUpper(sum)},
		{"short sha256", 1, sum[:10]},
	} {
		if _, err := s.dir.PresignPut(ctx, "artifacts/x", tc.size, tc.sum, "", ttl); !errors.Is(err, wire.ErrInvalid) {
			t.Errorf("%s: %v, want invalid", tc.name, err)
		}
	}
	if _, err := blobs.NewDir(t.TempDir(), "not a url", nil); err == nil {
		t.Error("NewDir with a bad base URL succeeded")
	}
}

// An upload abandoned for longer than any URL could add to it is dropped;
// one in progress is kept.
func TestDirPrunesAbandonedUploads(t *testing.T) {
	s := newDirServer(t, blobs.WithMultipart(10, 10))
	ctx := context.Background()
	data, sum := content(t, 20)
	stage := func(key string) string {
		t.Helper()
		up, err := s.dir.PresignPut(ctx, key, 20, sum, "", ttl)
		if err != nil {
			t.Fatal(err)
		}
		if status, _, body := do(t, up.Method, up.Parts[0].URL, data[:10], nil, false); status != http.StatusOK {
			t.Fatalf("PUT: %d %s", status, body)
		}
		return up.UploadID
	}
	stage("artifacts/a/1/x")
	staged := files(t, s.root)
	if len(staged) != 1 {
		t.Fatalf("staged files: %v, want 1", staged)
	}
	old := time.Now().Add(-blobs.MaxTTL - 25*time.Hour)
	if err := os.Chtimes(filepath.Join(s.root, filepath.Dir(staged[0])), old, old); err != nil {
		t.Fatal(err)
	}
	s.clock.Advance(time.Hour)
	stage("artifacts/b/1/x")
	if f := files(t, s.root); len(f) != 1 || f[0] == staged[0] {
		t.Fatalf("staged files: %v, want only the fresh upload's", f)
	}
	if _, err := s.dir.PresignPut(ctx, "artifacts/x", 1, sum, "", blobs.MaxTTL+time.Second); err == nil {
		t.Error("PresignPut with a ttl past MaxTTL succeeded")
	}
}
