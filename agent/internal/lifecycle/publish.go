package lifecycle

// POST <url>/publish: a body publishes a file or a directory of its run
// as an artifact of its attempt (docs/lifecycle.md, docs/artifacts.md).
// This package answers HTTP only; the work (resolving the path inside the
// run directory, packing, uploading, recording) is the PublishFunc the
// agent attaches to the run.

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// maxPublishRequest bounds the body of a publish request: a path and a
// name.
const maxPublishRequest = 64 << 10

// PublishRequest is the body of POST <url>/publish.
type PublishRequest struct {
	// Path names the file or directory: absolute, or relative to the
	// body's working directory. It must lie inside the run directory.
	Path string `json:"path"`
	// Name is the artifact's name; "" means the base name of Path.
	Name string `json:"name,omitempty"`
}

// PublishFunc publishes one artifact of the run and reports it as
// recorded. A refusal is a *PublishError, whose Status the endpoint
// answers; any other error answers 502.
type PublishFunc func(ctx context.Context, req PublishRequest) (wire.Artifact, error)

// PublishError is a publish's refusal with the HTTP status the endpoint
// answers: 400 a bad name or path, 404 no such path, 409 the attempt is
// not this worker's any more, 413 over a limit, 502 the upload failed.
type PublishError struct {
	Status  int
	Message string
	Err     error
}

func (e *PublishError) Error() string {
	if e.Err != nil {
		return e.Message + ": " + e.Err.Error()
	}
	return e.Message
}

func (e *PublishError) Unwrap() error { return e.Err }

// AttachPublish ties the run's publish route to publish: until it is
// attached a publish is refused (503), and once the run has ended too
// (409; 404 once its handle is closed).
func (h *Handle) AttachPublish(publish PublishFunc) {
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	h.e.publish = publish
}

// publish answers POST <url>/publish: the recorded artifact (201), or the
// refusal's status and message. It works while the daemon drains (a
// shutdown hook flushes its checkpoint this way).
func (s *Server) publish(w http.ResponseWriter, r *http.Request, e *entry) {
	var req PublishRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxPublishRequest))
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "the body must be a JSON object {\"path\": ..., \"name\": ...}: "+wire.ClipString(err.Error(), 200))
		return
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		writeError(w, http.StatusBadRequest, "the body must be one JSON object")
		return
	}
	if req.Path == "" {
		writeError(w, http.StatusBadRequest, "path is required")
		return
	}
	s.mu.Lock()
	publish := e.publish
	s.mu.Unlock()
	switch {
	case isClosed(e.ended):
		writeError(w, http.StatusConflict, "this run cannot publish: its attempt has ended")
		return
	case publish == nil:
		writeError(w, http.StatusServiceUnavailable, "this nymph cannot publish artifacts")
		return
	}
	a, err := publish(r.Context(), req)
	if err != nil {
		status := http.StatusBadGateway
		var pe *PublishError
		if errors.As(err, &pe) {
			status = pe.Status
		}
		s.log.Warn("publish refused", "invocation_id", e.run.InvocationID, "attempt", e.run.Attempt, "status", status, "error", err.Error())
		writeError(w, status, wire.ClipString(err.Error(), 1000))
		return
	}
	s.log.Info("published an artifact", "invocation_id", e.run.InvocationID, "attempt", e.run.Attempt,
		"artifact", a.Name, "size", a.Size, "sha256", a.SHA256)
	writeJSON(w, http.StatusCreated, a)
}
