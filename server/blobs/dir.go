package blobs

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// Prefix is the path Dir.Handler serves under: the URLs Dir signs are
// <baseURL>/v1/blobs/<key>?…. Mount the handler at Prefix without
// stripping it (the signature covers the key the path names).
const Prefix = "/v1/blobs/"

// A staged upload untouched for stagingMaxAge is abandoned: older than
// any URL that could still add to it. pruneStaging looks for them at most
// every pruneEvery, as S3's lifecycle rule aborts incomplete multipart
// uploads.
const (
	stagingMaxAge = MaxTTL + 24*time.Hour
	pruneEvery    = time.Hour
)

// stagingDir, at the top of a Dir's root, holds uploads until they are
// complete; no key may name it.
const stagingDir = ".uploads"

// Dir is a Store in a local directory (`lakeshore dev --artifacts-dir`):
// key k is the file <root>/k. Uploads and downloads go through URLs on the
// dev server itself (Handler) that Dir signs with an HMAC, so they need no
// other credential, as S3's presigned URLs do: a PUT URL names the key,
// the upload, the part, the size and, for a single upload, the SHA-256 it
// accepts; a GET URL the key and the file name it downloads as; both an
// expiry. An upload lands in a staging directory and reaches its key only
// when Complete finds it whole, so a half-written or refused upload never
// replaces an artifact.
type Dir struct {
	root   *os.Root
	base   string
	secret []byte
	cfg    config

	mu     sync.Mutex
	pruned time.Time // when pruneStaging last looked
}

var _ Store = (*Dir)(nil)

// NewDir returns a Dir over the directory root (created if missing) whose
// URLs start with baseURL (the dev server's, such as http://127.0.0.1:8080)
// and are signed with secret; an empty secret is replaced by a random one,
// so the URLs of an earlier process stop working.
func NewDir(root, baseURL string, secret []byte, opts ...Option) (*Dir, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("blobs: base URL %q: want http(s)://host[:port]", baseURL)
	}
	if len(secret) == 0 {
		secret = make([]byte, 32)
		if _, err := rand.Read(secret); err != nil {
			return nil, fmt.Errorf("blobs: signing secret: %w", err)
		}
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("blobs: artifacts directory: %w", err)
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, fmt.Errorf("blobs: artifacts directory: %w", err)
	}
	return &Dir{root: r, base: strings.TrimSuffix(baseURL, "/"), secret: secret, cfg: newConfig(opts)}, nil
}

// Close releases the directory.
func (d *Dir) Close() error { return d.root.Close() }

// PresignPut reports a single PUT, or one PUT per part, to Handler.
func (d *Dir) PresignPut(ctx context.Context, key string, size int64, sha256Hex, contentType string, ttl time.Duration) (wire.ArtifactUpload, error) {
	n, err := d.cfg.checkPut(key, size, sha256Hex, ttl)
	if err != nil {
		return wire.ArtifactUpload{}, err
	}
	upload, err := randomID()
	if err != nil {
		return wire.ArtifactUpload{}, err
	}
	now := d.cfg.clock.Now()
	d.pruneStaging(now)
	expires := now.Add(ttl).Truncate(time.Second)
	out := wire.ArtifactUpload{UploadID: upload, Method: http.MethodPut, ExpiresAt: expires}
	if contentType != "" {
		out.Headers = map[string]string{"Content-Type": contentType}
	}
	if n == 0 {
		out.URL = d.putURL(key, upload, "", size, sha256Hex, expires)
		return out, nil
	}
	out.PartSize = d.cfg.partSize
	out.Parts = make([]wire.ArtifactPart, n)
	for i := range n {
		out.Parts[i] = wire.ArtifactPart{Number: i + 1, URL: d.putURL(key, upload, strconv.Itoa(i+1), d.cfg.partLen(size, i+1), "", expires)}
	}
	return out, nil
}

// Complete moves the upload's content to key: a single upload's file, or
// the parts assembled in order, each checked against the ETag its PUT
// answered (its SHA-256). Content that is missing, of another size, or
// whose parts do not match fails with a wire.CodeInvalid error and key is
// left as it was. A completed upload cannot be completed again.
func (d *Dir) Complete(ctx context.Context, key, uploadID string, parts []wire.ArtifactPart, size int64) error {
	if err := checkKey(key); err != nil {
		return err
	}
	stage := d.stage(key, uploadID)
	if len(parts) == 0 {
		fi, err := d.root.Stat(stage + "/whole")
		if errors.Is(err, fs.ErrNotExist) {
			return incomplete("nothing was uploaded to %s as %s", key, uploadID)
		} else if err != nil {
			return fmt.Errorf("blobs: complete %s: %w", key, err)
		}
		if fi.Size() != size {
			return incomplete("%s holds %d bytes, not %d", key, fi.Size(), size)
		}
		return d.publish(stage, stage+"/whole", key)
	}
	if err := d.cfg.checkParts(parts, size); err != nil {
		return err
	}
	if _, err := d.root.Stat(stage); errors.Is(err, fs.ErrNotExist) {
		return incomplete("nothing was uploaded to %s as %s", key, uploadID)
	}
	tmp, f, err := d.tempFile(stage)
	if err != nil {
		return fmt.Errorf("blobs: complete %s: %w", key, err)
	}
	defer func() { _ = f.Close(); _ = d.root.Remove(tmp) }()
	var total int64
	for _, p := range parts {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("blobs: complete %s: %w", key, err)
		}
		etag := strings.Trim(p.ETag, `"`)
		if !isSHA256Hex(etag) {
			return incomplete("part %d of %s: etag %s is not one this store answered", p.Number, key, p.ETag)
		}
		n, err := appendFile(f, d.root, partFile(stage, p.Number, etag))
		if errors.Is(err, fs.ErrNotExist) {
			return incomplete("no part %d of %s with etag %s was uploaded", p.Number, key, p.ETag)
		} else if err != nil {
			return fmt.Errorf("blobs: complete %s: part %d: %w", key, p.Number, err)
		}
		total += n
	}
	if total != size {
		return incomplete("%s's parts hold %d bytes, not %d", key, total, size)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("blobs: complete %s: %w", key, err)
	}
	return d.publish(stage, tmp, key)
}

// appendFile appends the file name in root to f (file to file, so the
// kernel copies it) and reports its length.
func appendFile(f *os.File, root *os.Root, name string) (int64, error) {
	src, err := root.Open(name)
	if err != nil {
		return 0, err
	}
	defer func() { _ = src.Close() }()
	return f.ReadFrom(src)
}

// publish moves the finished file from to key, on disk first since the
// artifact is recorded once Complete returns, and drops the upload's
// staging directory.
func (d *Dir) publish(stage, from, key string) error {
	if err := d.syncFile(from); err != nil {
		return fmt.Errorf("blobs: complete %s: %w", key, err)
	}
	if err := d.root.MkdirAll(path.Dir(key), 0o700); err != nil {
		return fmt.Errorf("blobs: complete %s: %w", key, err)
	}
	if err := d.root.Rename(from, key); err != nil {
		return fmt.Errorf("blobs: complete %s: %w", key, err)
	}
	if err := d.root.RemoveAll(stage); err != nil {
		return fmt.Errorf("blobs: complete %s: drop staging: %w", key, err)
	}
	return nil
}

func (d *Dir) syncFile(name string) error {
	f, err := d.root.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	err = f.Sync()
	return errors.Join(err, f.Close())
}

// PresignGet reports a GET of key from Handler.
func (d *Dir) PresignGet(ctx context.Context, key, filename string, ttl time.Duration) (string, error) {
	if err := checkKey(key); err != nil {
		return "", err
	}
	if err := checkTTL(key, ttl); err != nil {
		return "", err
	}
	exp := strconv.FormatInt(d.cfg.clock.Now().Add(ttl).Unix(), 10)
	q := url.Values{"filename": {filename}, "expires": {exp}}
	q.Set("sig", d.sign(http.MethodGet, key, filename, exp))
	return d.base + Prefix + escapeKey(key) + "?" + q.Encode(), nil
}

func (d *Dir) putURL(key, upload, part string, size int64, sha256Hex string, expires time.Time) string {
	exp := strconv.FormatInt(expires.Unix(), 10)
	sz := strconv.FormatInt(size, 10)
	q := url.Values{"upload": {upload}, "size": {sz}, "expires": {exp}}
	if part != "" {
		q.Set("part", part)
	}
	if sha256Hex != "" {
		q.Set("sha256", sha256Hex)
	}
	q.Set("sig", d.sign(http.MethodPut, key, upload, part, sz, sha256Hex, exp))
	return d.base + Prefix + escapeKey(key) + "?" + q.Encode()
}

// sign reports the HMAC-SHA256 of fields, each length-prefixed so no two
// lists of fields sign alike. The method comes first: a GET URL does not
// allow a PUT, nor the other way round.
func (d *Dir) sign(fields ...string) string {
	m := hmac.New(sha256.New, d.secret)
	for _, f := range fields {
		_ = binary.Write(m, binary.BigEndian, uint64(len(f)))
		m.Write([]byte(f))
	}
	return hex.EncodeToString(m.Sum(nil))
}

// stage reports the staging directory of upload of key. It is named by
// an HMAC of both, so a complete call that names another key's upload
// finds nothing.
func (d *Dir) stage(key, upload string) string {
	return stagingDir + "/" + d.sign("stage", key, upload)
}

// pruneStaging drops the staged uploads last touched before now less
// stagingMaxAge. It is best effort: what it cannot remove it finds again.
func (d *Dir) pruneStaging(now time.Time) {
	d.mu.Lock()
	due := now.Sub(d.pruned) >= pruneEvery
	if due {
		d.pruned = now
	}
	d.mu.Unlock()
	if !due {
		return
	}
	entries, err := fs.ReadDir(d.root.FS(), stagingDir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if info, err := e.Info(); err == nil && now.Sub(info.ModTime()) > stagingMaxAge {
			_ = d.root.RemoveAll(stagingDir + "/" + e.Name())
		}
	}
}

// partFile names part n of the upload staged at stage by the SHA-256 of
// its content, which is its ETag: Complete finds the part a list names
// by it, and a part PUT again with other content is another file, so a
// name always matches its content.
func partFile(stage string, n int, sha256Hex string) string {
	return fmt.Sprintf("%s/part-%05d.%s", stage, n, sha256Hex)
}

// tempFile creates a new file in stage (created if missing).
func (d *Dir) tempFile(stage string) (string, *os.File, error) {
	if err := d.root.MkdirAll(stage, 0o700); err != nil {
		return "", nil, err
	}
	id, err := randomID()
	if err != nil {
		return "", nil, err
	}
	name := stage + "/tmp-" + id
	f, err := d.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	return name, f, err
}

// Handler serves the URLs Dir signs: PUT of an upload or a part, GET of an
// artifact. A URL whose signature does not hold, or that has expired, is
// refused with 403; a PUT whose body is not the size (and for a single
// upload the SHA-256) signed is refused with 400 and nothing is kept.
func (d *Dir) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, ok := strings.CutPrefix(r.URL.Path, Prefix)
		if !ok {
			http.NotFound(w, r)
			return
		}
		if err := checkKey(key); err != nil {
			http.Error(w, "bad key", http.StatusBadRequest)
			return
		}
		switch r.Method {
		case http.MethodPut:
			d.servePut(w, r, key)
		case http.MethodGet:
			d.serveGet(w, r, key)
		default:
			w.Header().Set("Allow", "GET, PUT")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		}
	})
}

// authorized reports whether sig signs fields and exp (the last field) is
// not past.
func (d *Dir) authorized(sig string, fields ...string) bool {
	if !hmac.Equal([]byte(sig), []byte(d.sign(fields...))) {
		return false
	}
	exp, err := strconv.ParseInt(fields[len(fields)-1], 10, 64)
	return err == nil && d.cfg.clock.Now().Unix() <= exp
}

func (d *Dir) servePut(w http.ResponseWriter, r *http.Request, key string) {
	q := r.URL.Query()
	upload, part, sz, sum, exp := q.Get("upload"), q.Get("part"), q.Get("size"), q.Get("sha256"), q.Get("expires")
	if !d.authorized(q.Get("sig"), http.MethodPut, key, upload, part, sz, sum, exp) {
		http.Error(w, "signature invalid or expired", http.StatusForbidden)
		return
	}
	size, err := strconv.ParseInt(sz, 10, 64)
	if err != nil || size < 0 {
		http.Error(w, "bad size", http.StatusBadRequest)
		return
	}
	stage := d.stage(key, upload)
	target := func(string) string { return stage + "/whole" }
	if part != "" {
		n, err := strconv.Atoi(part)
		if err != nil || n < 1 || n > maxParts {
			http.Error(w, "bad part", http.StatusBadRequest)
			return
		}
		target = func(sum string) string { return partFile(stage, n, sum) }
	}
	if r.ContentLength >= 0 && r.ContentLength != size {
		http.Error(w, fmt.Sprintf("body is %d bytes; the upload is %d", r.ContentLength, size), http.StatusBadRequest)
		return
	}
	got, status, err := d.receive(r.Body, stage, target, size, sum)
	if err != nil {
		http.Error(w, err.Error(), status)
		return
	}
	w.Header().Set("ETag", `"`+got+`"`)
	w.WriteHeader(http.StatusOK)
}

// receive streams body to a new file in stage, and when it is size bytes
// and (if want is set) has SHA-256 want, moves it to target(its SHA-256).
// It reports the content's SHA-256, or the status to answer and why.
func (d *Dir) receive(body io.Reader, stage string, target func(sha256Hex string) string, size int64, want string) (string, int, error) {
	tmp, f, err := d.tempFile(stage)
	if err != nil {
		return "", http.StatusInternalServerError, errors.New("cannot store the upload")
	}
	kept := false
	defer func() {
		_ = f.Close()
		if !kept {
			_ = d.root.Remove(tmp)
		}
	}()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(body, size+1))
	if err != nil {
		return "", http.StatusBadRequest, fmt.Errorf("reading the body: %w", err)
	}
	if n != size {
		return "", http.StatusBadRequest, fmt.Errorf("body is not %d bytes", size)
	}
	got := hexSum(h)
	if want != "" && got != want {
		return "", http.StatusBadRequest, errors.New("body's sha256 is not the one presigned")
	}
	if err := f.Close(); err != nil {
		return "", http.StatusInternalServerError, errors.New("cannot store the upload")
	}
	if err := d.root.Rename(tmp, target(got)); err != nil {
		return "", http.StatusInternalServerError, errors.New("cannot store the upload")
	}
	kept = true
	return got, 0, nil
}

func (d *Dir) serveGet(w http.ResponseWriter, r *http.Request, key string) {
	q := r.URL.Query()
	filename := q.Get("filename")
	if !d.authorized(q.Get("sig"), http.MethodGet, key, filename, q.Get("expires")) {
		http.Error(w, "signature invalid or expired", http.StatusForbidden)
		return
	}
	f, err := d.root.Open(key)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		http.NotFound(w, r)
		return
	}
	if filename == "" {
		filename = path.Base(key)
	}
	// The content is whatever a body published, served from the dev
	// server's own origin: it downloads, and never runs as a page there.
	w.Header().Set("Content-Disposition", attachment(filename))
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Security-Policy", "sandbox; default-src 'none'")
	http.ServeContent(w, r, "", fi.ModTime(), f)
}

// checkKey refuses a key that is not a plain relative slash path inside
// the store: empty, absolute, with a backslash, NUL, empty, "." or ".."
// segment, or naming the staging directory.
func checkKey(key string) error {
	bad := key == "" || len(key) > 1024 || strings.ContainsAny(key, "\\\x00") ||
		strings.HasPrefix(key, "/") || !filepath.IsLocal(key)
	for i, seg := range strings.Split(key, "/") {
		bad = bad || seg == "" || seg == "." || seg == ".." || (i == 0 && seg == stagingDir)
	}
	if bad {
		return wire.Errorf(wire.CodeInvalid, "blob key %q is not a relative path inside the store", key)
	}
	return nil
}

// escapeKey escapes each segment of key for a URL path.
func escapeKey(key string) string {
	segs := strings.Split(key, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return strings.Join(segs, "/")
}

// attachment reports a Content-Disposition that downloads as filename
// (RFC 2231-encoded when it is not plain ASCII).
func attachment(filename string) string {
	if d := mime.FormatMediaType("attachment", map[string]string{"filename": filename}); d != "" {
		return d
	}
	return "attachment"
}

func randomID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("blobs: random id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// isUploadID reports whether s is an upload id randomID made.
func isUploadID(s string) bool { return len(s) == 32 && isHex(s) }

func hexSum(h hash.Hash) string { return hex.EncodeToString(h.Sum(nil)) }

func isSHA256Hex(s string) bool { return len(s) == 64 && isHex(s) }

// isHex reports whether s is lower-case hex digits.
func isHex(s string) bool {
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
