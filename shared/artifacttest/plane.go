// Package artifacttest is a fake of the control plane's artifact routes,
// for tests of nymph's publish: the two daemon routes and a store behind
// presigned-PUT-shaped URLs, on loopback. It checks what it is sent (the
// worker token, the requests' own rules, each part's ETag, the assembled
// bytes' size and sha256) and keeps what it recorded.
package artifacttest

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

// Plane is the fake. Set its fields before the first request.
type Plane struct {
	t *testing.T
	// URL is where it listens.
	URL string
	// Threshold and PartSize: an upload larger than Threshold goes in
	// parts of PartSize (the wire defaults unless set).
	Threshold, PartSize int64
	// Token is the worker token the routes want ("": any bearer token).
	Token string
	// Next answers every other route (nil: 404), so the fake can stand in
	// front of a real control plane.
	Next http.Handler

	mu         sync.Mutex
	presigns   int
	uploads    map[string]*fakeUpload
	stored     map[string][]byte // by artifact name
	recorded   map[string]wire.Artifact
	uploadReqs map[string]wire.ArtifactUploadRequest // by artifact name, the last
	// RefusePresign, RefuseComplete: answer that call with this error
	// (set under Lock).
	RefusePresign, RefuseComplete *wire.Error
	// OnPresign runs as a presign is answered.
	OnPresign func()
}

type fakeUpload struct {
	req   wire.ArtifactUploadRequest
	parts map[int][]byte // part number (0: a single upload) → bytes
}

// New starts a Plane for the length of the test.
func New(t *testing.T) *Plane {
	f := &Plane{t: t, Threshold: wire.MultipartThreshold, PartSize: wire.MultipartPartBytes,
		uploads: map[string]*fakeUpload{}, stored: map[string][]byte{}, recorded: map[string]wire.Artifact{},
		uploadReqs: map[string]wire.ArtifactUploadRequest{}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	f.URL = srv.URL
	return f
}

// Lock and Unlock guard the fields a test changes while requests run.
func (f *Plane) Lock()   { f.mu.Lock() }
func (f *Plane) Unlock() { f.mu.Unlock() }

func (f *Plane) answer(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (f *Plane) refuse(w http.ResponseWriter, e *wire.Error) {
	f.answer(w, wire.Status(e.Code), wire.ErrorBody{Error: wire.ErrorDetail{Code: e.Code, Message: e.Message}})
}

func (f *Plane) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/put/") {
		f.put(w, r)
		return
	}
	if r.URL.Path != "/v1/daemon/artifacts" && r.URL.Path != "/v1/daemon/artifacts/complete" {
		if f.Next == nil {
			f.refuse(w, wire.Errorf(wire.CodeNoRoute, "no route"))
			return
		}
		f.Next.ServeHTTP(w, r)
		return
	}
	auth := r.Header.Get("Authorization")
	authorized := auth == "Bearer "+f.Token
	if f.Token == "" {
		authorized = strings.HasPrefix(auth, "Bearer ") && len(auth) > len("Bearer ")
	}
	if !authorized {
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
	}
}

func (f *Plane) presign(w http.ResponseWriter, req wire.ArtifactUploadRequest) {
	f.mu.Lock()
	f.presigns++
	refusal, hook := f.RefusePresign, f.OnPresign
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
	f.uploadReqs[req.Name] = req
	f.mu.Unlock()
	up := wire.ArtifactUpload{UploadID: id, Method: http.MethodPut, ExpiresAt: time.Now().Add(time.Hour)}
	if req.Size <= f.Threshold {
		up.URL = f.URL + "/put/" + id + "/0?X-Signature=secret"
	} else {
		up.PartSize = f.PartSize
		for n := int64(1); (n-1)*f.PartSize < req.Size; n++ {
			up.Parts = append(up.Parts, wire.ArtifactPart{Number: int(n), URL: fmt.Sprintf("%s/put/%s/%d?X-Signature=secret", f.URL, id, n)})
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

func (f *Plane) put(w http.ResponseWriter, r *http.Request) {
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

func (f *Plane) complete(w http.ResponseWriter, req wire.ArtifactCompleteRequest) {
	if err := req.Validate(); err != nil {
		f.t.Errorf("nymph sent an invalid complete request: %v", err)
		f.refuse(w, wire.Errorf(wire.CodeInvalid, "%v", err))
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.RefuseComplete != nil {
		f.refuse(w, f.RefuseComplete)
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

// Got reports what was stored and recorded under name, and whether it was.
func (f *Plane) Got(name string) ([]byte, wire.Artifact, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.stored[name]
	return bytes.Clone(b), f.recorded[name], ok
}

// Request reports the last presign request for name.
func (f *Plane) Request(name string) wire.ArtifactUploadRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.uploadReqs[name]
}

// Parts reports how many PUTs upload id received.
func (f *Plane) Parts(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if up := f.uploads[id]; up != nil {
		return len(up.parts)
	}
	return 0
}

// Presigns reports how many presign requests arrived.
func (f *Plane) Presigns() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.presigns
}
