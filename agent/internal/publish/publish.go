// Package publish does the agent's half of a body's publish
// (docs/artifacts.md, "Publishing: nymph's side"): it finds the file or directory inside the
// run directory, packs a directory as a tar.gz, digests it, asks the
// control plane where the bytes go, streams them there with PUT (in parts
// past the control plane's threshold) and has the artifact recorded on the
// attempt. Memory stays bounded: every byte is streamed, never held whole.
package publish

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/lifecycle"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// Defaults of Config's bounds.
const (
	// DefaultCallTimeout bounds each control-plane call (presign,
	// complete).
	DefaultCallTimeout = 30 * time.Second
	// DefaultPutTimeout is each PUT's fixed allowance; on top of it a PUT
	// gets a second per MiB it carries (so at least 1 MiB/s), and is cut
	// off past that.
	DefaultPutTimeout = 2 * time.Minute
	// maxEntries bounds the files and directories one directory artifact
	// packs.
	maxEntries = 1_000_000
)

// ControlPlane is what a publish asks of the control plane: a
// *client.Client holding the worker token.
type ControlPlane interface {
	PresignArtifact(ctx context.Context, req wire.ArtifactUploadRequest) (wire.ArtifactUpload, error)
	CompleteArtifact(ctx context.Context, req wire.ArtifactCompleteRequest) (wire.Artifact, error)
}

// Config configures a Publisher.
type Config struct {
	// HTTP sends the PUTs of the bytes (nil: a client of its own). It must
	// not add credentials: the presigned URLs carry their own.
	HTTP *http.Client
	// TempDir holds a directory's tar.gz while it is uploaded: a place no
	// body can see (the daemon's state directory). Required.
	TempDir string
	// MaxBytes bounds what a directory packs to (0:
	// wire.DefaultMaxArtifactBytes); the control plane enforces its own
	// limit when it presigns.
	MaxBytes int64
	// CallTimeout bounds each control-plane call, PutTimeout each PUT's
	// fixed allowance (0: the defaults).
	CallTimeout, PutTimeout time.Duration
	Logger                  *slog.Logger
}

// Publisher publishes artifacts of runs.
type Publisher struct {
	cfg Config
	log *slog.Logger
}

// New reports a Publisher with cfg's zero fields defaulted.
func New(cfg Config) (*Publisher, error) {
	if cfg.TempDir == "" {
		return nil, errors.New("publish: no directory for packed artifacts (Config.TempDir)")
	}
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{}
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = wire.DefaultMaxArtifactBytes
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.PutTimeout <= 0 {
		cfg.PutTimeout = DefaultPutTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Publisher{cfg: cfg, log: cfg.Logger}, nil
}

// Target is the attempt a publish records into and where its run's files
// are.
type Target struct {
	API          ControlPlane
	WorkerID     string
	InvocationID string
	Attempt      int
	// RunDir is the run directory: nothing outside it is published.
	// BodyDir is the body's working directory, inside RunDir: a relative
	// path is read from there.
	RunDir, BodyDir string
	// Owner, when set, is the uid of the --run-as account bodies run as:
	// nymph reads as root then, so only files that account owns are sent
	// (a hard link to another account's file is not the body's to
	// publish, whatever directory it sits in).
	Owner *uint32
}

// owned reports whether info is of a file t's body may publish.
func (t Target) owned(info fs.FileInfo) bool {
	if t.Owner == nil {
		return true
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	return ok && st.Uid == *t.Owner
}

// refuse is a publish refused with status.
func refuse(status int, format string, args ...any) *lifecycle.PublishError {
	return &lifecycle.PublishError{Status: status, Message: fmt.Sprintf(format, args...)}
}

// Publish publishes path (absolute, or relative to t.BodyDir) as artifact
// name ("" means path's base name) of t's attempt, and reports it as the
// control plane recorded it. Its refusals are *lifecycle.PublishError.
//
// A regular file is sent as it is, its content type read from its name's
// extension (else application/octet-stream); a directory is sent as a
// tar.gz of its regular files and directories (wire.ContentTypeDir):
// symbolic links and special files inside it are skipped, so the archive
// never holds a link that points anywhere once unpacked. The path itself
// may be a symbolic link as long as it resolves inside the run directory.
func (p *Publisher) Publish(ctx context.Context, t Target, path, name string) (wire.Artifact, error) {
	if path == "" {
		return wire.Artifact{}, refuse(http.StatusBadRequest, "path is empty")
	}
	if name == "" {
		name = filepath.Base(filepath.Clean(path))
	}
	if err := wire.CheckArtifactName(name); err != nil {
		return wire.Artifact{}, refuse(http.StatusBadRequest, "%v (name it with name)", err)
	}
	rel, err := t.inside(path)
	if err != nil {
		return wire.Artifact{}, err
	}
	root, err := os.OpenRoot(t.RunDir)
	if err != nil {
		return wire.Artifact{}, fmt.Errorf("open the run directory: %w", err)
	}
	defer root.Close()
	// O_NONBLOCK: a FIFO opens at once (and is then refused) instead of
	// waiting for a writer.
	f, err := root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return wire.Artifact{}, refuse(http.StatusNotFound, "%q does not exist in the run directory", path)
	case err != nil:
		return wire.Artifact{}, refuse(http.StatusBadRequest, "%q cannot be published: %v (it must lie inside the run directory)", path, unquote(err))
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return wire.Artifact{}, fmt.Errorf("stat %q: %w", path, err)
	}
	var c content
	switch {
	case st.Mode().IsRegular() && !t.owned(st):
		return wire.Artifact{}, refuse(http.StatusBadRequest, "%q is not the body's own file", path)
	case st.Mode().IsRegular():
		c = content{f: f, size: st.Size(), contentType: typeOf(name)}
		if c.size > p.cfg.MaxBytes {
			return wire.Artifact{}, refuse(http.StatusRequestEntityTooLarge, "%q is %d bytes; an artifact is at most %d", path, c.size, p.cfg.MaxBytes)
		}
		if c.sha256, err = digest(f, c.size); err != nil {
			return wire.Artifact{}, refuse(http.StatusConflict, "read %q: %v", path, err)
		}
	case st.IsDir():
		tmp, err := p.pack(root, rel, path, t.owned)
		if err != nil {
			return wire.Artifact{}, err
		}
		defer func() {
			tmp.f.Close()
			_ = os.Remove(tmp.f.Name())
		}()
		c = tmp
	default:
		return wire.Artifact{}, refuse(http.StatusBadRequest, "%q is neither a regular file nor a directory", path)
	}
	return p.upload(ctx, t, name, c)
}

// content is what an artifact uploads: size bytes of f from its start,
// whose digest is sha256.
type content struct {
	f           *os.File
	size        int64
	sha256      string
	contentType string
}

// inside reports path as a path relative to t.RunDir: a relative path is
// taken from the body's directory, an absolute one must name a place under
// the run directory. The result is only ever opened through an os.Root of
// the run directory, which refuses whatever resolves outside it, symbolic
// links included.
func (t Target) inside(path string) (string, error) {
	if strings.IndexByte(path, 0) >= 0 {
		return "", refuse(http.StatusBadRequest, "path holds a NUL byte")
	}
	if !filepath.IsAbs(path) {
		body, err := filepath.Rel(t.RunDir, t.BodyDir)
		if err != nil || !filepath.IsLocal(body) {
			return "", fmt.Errorf("the body's directory is not inside the run directory")
		}
		// Not joined: Join would settle ".." by the names alone, where
		// the root settles it as the file system does.
		return body + string(filepath.Separator) + path, nil
	}
	bases := []string{t.RunDir}
	if real, err := filepath.EvalSymlinks(t.RunDir); err == nil && real != t.RunDir {
		bases = append(bases, real) // the body's getcwd names the real directory
	}
	for _, base := range bases {
		if rel, err := filepath.Rel(base, filepath.Clean(path)); err == nil && filepath.IsLocal(rel) {
			return rel, nil
		}
	}
	return "", refuse(http.StatusBadRequest, "%q is outside the run directory", path)
}

// unquote is a root's error without the path it quotes twice.
func unquote(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// typeOf is the content type of a file named name.
func typeOf(name string) string {
	if t := mime.TypeByExtension(filepath.Ext(name)); t != "" {
		return t
	}
	return "application/octet-stream"
}

// digest is the lower-case hex SHA-256 of f's first size bytes.
func digest(f *os.File, size int64) (string, error) {
	h := sha256.New()
	n, err := io.Copy(h, io.NewSectionReader(f, 0, size))
	if err != nil {
		return "", err
	}
	if n != size {
		return "", fmt.Errorf("it shrank to %d bytes while it was read", n)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// upload asks where c goes, sends it, checks that what was sent is what
// was announced, and has it recorded.
func (p *Publisher) upload(ctx context.Context, t Target, name string, c content) (wire.Artifact, error) {
	req := wire.ArtifactUploadRequest{WorkerID: t.WorkerID, InvocationID: t.InvocationID, Attempt: t.Attempt,
		Name: name, Size: c.size, SHA256: c.sha256, ContentType: c.contentType}
	cctx, cancel := context.WithTimeout(ctx, p.cfg.CallTimeout)
	up, err := t.API.PresignArtifact(cctx, req)
	cancel()
	if err != nil {
		return wire.Artifact{}, controlPlaneRefusal("ask where to upload", err)
	}
	sent := sha256.New()
	var parts []wire.ArtifactPart
	switch {
	case up.Method != "" && up.Method != http.MethodPut:
		return wire.Artifact{}, refuse(http.StatusBadGateway, "the control plane asked for an upload by %q; only PUT is known", up.Method)
	case len(up.Parts) > 0:
		parts, err = p.putParts(ctx, up, c, sent)
	case up.URL != "":
		_, err = p.put(ctx, up.URL, up.Headers, c.f, 0, c.size, sent)
	default:
		err = errors.New("the control plane gave no upload URL")
	}
	if err != nil {
		return wire.Artifact{}, &lifecycle.PublishError{Status: http.StatusBadGateway, Message: "upload " + name, Err: err}
	}
	if got := hex.EncodeToString(sent.Sum(nil)); got != c.sha256 {
		return wire.Artifact{}, refuse(http.StatusConflict, "%s changed while it was uploaded (sha256 %s, then %s); nothing recorded: publish it once it is written", name, c.sha256, got)
	}
	cctx, cancel = context.WithTimeout(ctx, p.cfg.CallTimeout)
	defer cancel()
	a, err := t.API.CompleteArtifact(cctx, wire.ArtifactCompleteRequest{WorkerID: t.WorkerID, InvocationID: t.InvocationID,
		Attempt: t.Attempt, Name: name, UploadID: up.UploadID, Parts: parts})
	if err != nil {
		return wire.Artifact{}, controlPlaneRefusal("record the upload", err)
	}
	p.log.Info("published an artifact", "invocation_id", t.InvocationID, "attempt", t.Attempt, "artifact", name,
		"size", c.size, "parts", len(parts))
	return a, nil
}

// putParts sends each part of a multipart upload, in order, and reports
// the parts with the ETags their PUTs answered.
func (p *Publisher) putParts(ctx context.Context, up wire.ArtifactUpload, c content, sent hash.Hash) ([]wire.ArtifactPart, error) {
	if up.PartSize <= 0 {
		return nil, fmt.Errorf("a multipart upload with part size %d", up.PartSize)
	}
	if want := (c.size + up.PartSize - 1) / up.PartSize; int64(len(up.Parts)) != max(want, 1) {
		return nil, fmt.Errorf("%d parts of %d bytes for %d bytes", len(up.Parts), up.PartSize, c.size)
	}
	parts := slices.Clone(up.Parts)
	slices.SortFunc(parts, func(a, b wire.ArtifactPart) int { return a.Number - b.Number })
	out := make([]wire.ArtifactPart, 0, len(parts))
	for i, part := range parts {
		if part.Number != i+1 {
			return nil, fmt.Errorf("parts numbered %d where %d was due", part.Number, i+1)
		}
		off := int64(i) * up.PartSize
		etag, err := p.put(ctx, part.URL, nil, c.f, off, min(up.PartSize, c.size-off), sent)
		if err != nil {
			return nil, fmt.Errorf("part %d: %w", part.Number, err)
		}
		if etag == "" {
			return nil, fmt.Errorf("part %d: the PUT answered no ETag", part.Number)
		}
		out = append(out, wire.ArtifactPart{Number: part.Number, ETag: etag})
	}
	return out, nil
}

// put sends n bytes of f from off to rawURL, writing them to sent too, and
// reports the answer's ETag.
func (p *Publisher) put(ctx context.Context, rawURL string, headers map[string]string, f *os.File, off, n int64, sent io.Writer) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", errors.New("the upload URL is not an http(s) URL") // never quoted: it carries a signature
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.PutTimeout+time.Duration(n>>20)*time.Second)
	defer cancel()
	var body io.Reader = http.NoBody
	if n > 0 {
		body = io.TeeReader(io.NewSectionReader(f, off, n), sent)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, rawURL, body)
	if err != nil {
		return "", errors.New("the upload URL cannot be requested")
	}
	req.ContentLength = n
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := p.cfg.HTTP.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // a url.Error quotes the presigned URL
		}
		return "", fmt.Errorf("PUT: %w", err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return "", fmt.Errorf("PUT answered %d%s", resp.StatusCode, storeCode(msg))
	}
	return resp.Header.Get("ETag"), nil
}

// storeCode is the error code of a storage error answer (S3's
// <Code>…</Code>) as " (Code)", or "". Nothing else of the answer is
// kept: S3 quotes the request's signature and canonical form back, and
// the error reaches the body and the log.
func storeCode(answer []byte) string {
	_, rest, ok := strings.Cut(string(answer), "<Code>")
	code, _, ok2 := strings.Cut(rest, "</Code>")
	if !ok || !ok2 || len(code) > 64 || strings.IndexFunc(code, func(r rune) bool {
		return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9')
	}) >= 0 {
		return ""
	}
	return " (" + code + ")"
}

// controlPlaneRefusal is the control plane's answer as the body hears it:
// its refusals keep their meaning (400 a bad request, 409 the attempt is
// not this worker's to publish into, 413 over a limit), anything else is
// a failed upload (502).
func controlPlaneRefusal(op string, err error) error {
	status := http.StatusBadGateway
	var we *wire.Error
	if errors.As(err, &we) {
		switch we.Code {
		case wire.CodeInvalid:
			status = http.StatusBadRequest
		case wire.CodeTooLarge:
			status = http.StatusRequestEntityTooLarge
		case wire.CodeConflict, wire.CodeNotFound, wire.CodeForbidden, wire.CodeWorkerGone:
			status = http.StatusConflict
		}
	}
	return &lifecycle.PublishError{Status: status, Message: "the control plane: " + op, Err: err}
}
