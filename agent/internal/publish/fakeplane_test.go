package publish

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// fakePlane is a control plane's artifact routes and a store behind
// presigned-PUT-shaped URLs, on loopback: it checks what it is sent
// (the worker token, the request's own rules, each part's ETag, the
// assembled bytes' size and sha256) and keeps what it recorded.
type fakePlane struct {
	t   *testing.T
	srv *httptest.Server
	// threshold and partSize: an upload larger than threshold goes in
	// parts of partSize.
	threshold, partSize int64

	mu       sync.Mutex
	presigns int
	uploads  map[string]*fakeUpload
	stored   map[string][]byte // by artifact name
	recorded map[string]wire.Artifact
	// refusePresign, refuseComplete: answer that call with this error.
	refusePresign, refuseComplete *wire.Error
	// onPresign runs as a presign is answered.
	onPresign func()
}

type fakeUpload struct {
	req   wire.ArtifactUploadRequest
	parts map[int][]byte // part number (0: a single upload) → bytes
}

const workerToken = "worker-token"

func newFakePlane(t *testing.T) *fakePlane {
	f := &fakePlane{t: t, threshold: wire.MultipartThreshold, partSize: wire.MultipartPartBytes,
		uploads: map[string]*fakeUpload{}, stored: map[string][]byte{}, recorded: map[string]wire.Artifact{}}
	f.srv = httptest.NewServer(f)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakePlane) answer(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (f *fakePlane) refuse(w http.ResponseWriter, e *wire.Error) {
	f.answer(w, wire.Status(e.Code), wire.ErrorBody{Error: wire.ErrorDetail{Code: e.Code, Message: e.Message}})
}

func (f *fakePlane) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/put/") {
		f.put(w, r)
		return
	}
	if r.Header.Get("Authorization") != "Bearer "+workerToken {
		f.refuse(w, wire.Errorf(wire.CodeUnauthorized, "no worker token"))
		return
	}
	switch r.URL.Path {
	case "/v1/daemon/artifacts":
		var req wire.ArtifactUploadRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			f.refuse(w, wire.Errorf(wire.CodeInvalid, "%v", err))
			return
		}
		f.presign(w, req)
	case "/v1/daemon/artifacts/complete":
		var req wire.ArtifactCompleteRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			f.refuse(w, wire.Errorf(wire.CodeInvalid, "%v", err))
			return
		}
		f.complete(w, req)
	default:
		f.refuse(w, wire.Errorf(wire.CodeNoRoute, "no route"))
	}
}

func (f *fakePlane) presign(w http.ResponseWriter, req wire.ArtifactUploadRequest) {
	f.mu.Lock()
	f.presigns++
	refusal, hook := f.refusePresign, f.onPresign
	f.mu.Unlock()
	if err := req.Validate(); err != nil {
		f.t.Errorf("nymph sent an invalid presign request: %v", err)
		f.refuse(w, wire.Errorf(wire.CodeInvalid, "%v", err))
		return
	}
	if refusal != nil {
		f.refuse(w, refusal)
		return
	}
	if hook != nil {
		hook()
	}
	f.mu.Lock()
	id := fmt.Sprintf("up%d", f.presigns)
	f.uploads[id] = &fakeUpload{req: req, parts: map[int][]byte{}}
	f.mu.Unlock()
	up := wire.ArtifactUpload{UploadID: id, Method: http.MethodPut, ExpiresAt: time.Now().Add(time.Hour)}
	if req.Size <= f.threshold {
		up.URL = f.srv.URL + "/put/" + id + "/0?X-Signature=secret"
	} else {
		up.PartSize = f.partSize
		for n := int64(1); (n-1)*f.partSize < req.Size; n++ {
			up.Parts = append(up.Parts, wire.ArtifactPart{Number: int(n), URL: fmt.Sprintf("%s/put/%s/%d?X-Signature=secret", f.srv.URL, id, n)})
		}
		// Handed out of order: nymph must not rely on the order.
		for i, j := 0, len(up.Parts)-1; i < j; i, j = i+1, j-1 {
			up.Parts[i], up.Parts[j] = up.Parts[j], up.Parts[i]
		}
	}
	f.answer(w, http.StatusOK, up)
}

func etagOf(b []byte) string {
	s := sha256.Sum256(b)
	return `"` + hex.EncodeToString(s[:8]) + `"`
}

func (f *fakePlane) put(w http.ResponseWriter, r *http.Request) {
	id, num, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/put/"), "/")
	n, err := strconv.Atoi(num)
	if r.Method != http.MethodPut || err != nil || r.URL.Query().Get("X-Signature") != "secret" || r.Header.Get("Authorization") != "" {
		http.Error(w, "bad PUT", http.StatusForbidden)
		return
	}
	b, err := io.ReadAll(r.Body)
	if err != nil || int64(len(b)) != r.ContentLength {
		http.Error(w, "short body", http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	up := f.uploads[id]
	if up == nil {
		http.Error(w, "no such upload", http.StatusNotFound)
		return
	}
	up.parts[n] = b
	w.Header().Set("ETag", etagOf(b))
}

func (f *fakePlane) complete(w http.ResponseWriter, req wire.ArtifactCompleteRequest) {
	if err := req.Validate(); err != nil {
		f.t.Errorf("nymph sent an invalid complete request: %v", err)
		f.refuse(w, wire.Errorf(wire.CodeInvalid, "%v", err))
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refuseComplete != nil {
		f.refuse(w, f.refuseComplete)
		return
	}
	up := f.uploads[req.UploadID]
	if up == nil || up.req.Name != req.Name || up.req.InvocationID != req.InvocationID || up.req.Attempt != req.Attempt {
		f.refuse(w, wire.Errorf(wire.CodeNotFound, "no such upload"))
		return
	}
	var all []byte
	if len(req.Parts) == 0 {
		all = up.parts[0]
	}
	for i, p := range req.Parts {
		b, ok := up.parts[p.Number]
		if !ok || p.Number != i+1 || p.ETag != etagOf(b) {
			f.refuse(w, wire.Errorf(wire.CodeInvalid, "part %d: wrong number or ETag", p.Number))
			return
		}
		all = append(all, b...)
	}
	sum := sha256.Sum256(all)
	if int64(len(all)) != up.req.Size || hex.EncodeToString(sum[:]) != up.req.SHA256 {
		f.refuse(w, wire.Errorf(wire.CodeInvalid, "the bytes are not the announced ones"))
		return
	}
	a := wire.Artifact{Name: req.Name, Attempt: req.Attempt, Size: up.req.Size, SHA256: up.req.SHA256, ContentType: up.req.ContentType, CreatedAt: time.Now().UTC()}
	f.stored[req.Name] = all
	f.recorded[req.Name] = a
	f.answer(w, http.StatusOK, a)
}

// got reports what was stored under name.
func (f *fakePlane) got(name string) ([]byte, wire.Artifact, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.stored[name]
	return bytes.Clone(b), f.recorded[name], ok
}

func (f *fakePlane) presignCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.presigns
}
