// Package blobstest is a small blob store for tests of the artifact
// routes: blobs.Store's shape over a loopback HTTP server, with single
// PUT uploads only (no multipart), so a test uploads and downloads real
// bytes through the URLs the control plane hands out.
package blobstest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/blobs"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// Store is a blobs.Store kept in memory behind a loopback server.
type Store struct {
	URL string

	mu       sync.Mutex
	next     int
	pending  map[string]upload // by upload id
	objects  map[string][]byte // by key, once completed
	presigns int
}

type upload struct {
	key    string
	sha256 string
	body   []byte
	put    bool
}

var _ blobs.Store = (*Store)(nil)

// New starts a Store for the length of the test.
func New(t testing.TB) *Store {
	t.Helper()
	s, stop := Start()
	t.Cleanup(stop)
	return s
}

// Start starts a Store and reports it and what stops it (for a fixture
// that outlives one test). Upload ids count from "up1", so a fixture
// that presigns in a fixed order knows them.
func Start() (*Store, func()) {
	s := &Store{pending: map[string]upload{}, objects: map[string][]byte{}}
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /put/{id}", s.put)
	mux.HandleFunc("GET /get", s.get)
	srv := httptest.NewServer(mux)
	s.URL = srv.URL
	return s, srv.Close
}

// Presigns reports how many uploads were presigned.
func (s *Store) Presigns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.presigns
}

// Object reports the content stored at key, and whether there is any.
func (s *Store) Object(key string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.objects[key]
	return b, ok
}

// PresignPut answers one PUT to this server; the PUT's body must have
// sha256Hex as its digest.
func (s *Store) PresignPut(_ context.Context, key string, size int64, sha256Hex, _ string, ttl time.Duration) (wire.ArtifactUpload, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	s.presigns++
	id := "up" + strconv.Itoa(s.next)
	s.pending[id] = upload{key: key, sha256: sha256Hex}
	return wire.ArtifactUpload{UploadID: id, Method: http.MethodPut, URL: s.URL + "/put/" + id,
		ExpiresAt: time.Now().Add(ttl)}, nil
}

// Complete copies upload uploadID's content to key: it must have been
// put, with size bytes. The upload stays completable, so a fixture whose
// tables are put back can complete it again.
func (s *Store) Complete(_ context.Context, key, uploadID string, _ []wire.ArtifactPart, size int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	u, ok := s.pending[uploadID]
	switch {
	case !ok || u.key != key:
		return fmt.Errorf("no upload %s of %s", uploadID, key)
	case !u.put:
		return fmt.Errorf("upload %s of %s: nothing was put", uploadID, key)
	case int64(len(u.body)) != size:
		return fmt.Errorf("upload %s of %s: %d bytes, want %d", uploadID, key, len(u.body), size)
	}
	s.objects[key] = u.body
	return nil
}

// PresignGet answers a GET of key from this server.
func (s *Store) PresignGet(_ context.Context, key, _ string, _ time.Duration) (string, error) {
	return s.URL + "/get?key=" + url.QueryEscape(key), nil
}

func (s *Store) put(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	sum := sha256.Sum256(body)
	s.mu.Lock()
	defer s.mu.Unlock()
	u, ok := s.pending[r.PathValue("id")]
	switch {
	case !ok:
		http.Error(w, "no such upload", http.StatusNotFound)
	case hex.EncodeToString(sum[:]) != u.sha256:
		http.Error(w, "sha256 mismatch", http.StatusBadRequest)
	default:
		u.body, u.put = body, true
		s.pending[r.PathValue("id")] = u
		w.Header().Set("ETag", `"`+hex.EncodeToString(sum[:8])+`"`)
	}
}

func (s *Store) get(w http.ResponseWriter, r *http.Request) {
	b, ok := s.Object(r.URL.Query().Get("key"))
	if !ok {
		http.Error(w, "no such object", http.StatusNotFound)
		return
	}
	_, _ = w.Write(b)
}

// Tamper replaces the content stored at key, as a store that lost or
// corrupted it would serve it.
func (s *Store) Tamper(key string, b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.objects[key] = b
}
