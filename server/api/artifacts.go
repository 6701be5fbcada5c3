package api

import (
	"context"
	"net/http"

	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/shared/ids"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// Artifacts (docs/artifacts.md): nymph asks for an upload of an attempt
// its worker holds and says when it is done; operators list them with a
// presigned GET each. A control plane without a blob store answers 501.

// errNoArtifacts answers every artifact route of a control plane whose
// Service has no blob store.
var errNoArtifacts = wire.Errorf(wire.CodeNotImplemented, "artifacts are not configured on this control plane (it has no blob store)")

func (s *Server) presignArtifact(r *http.Request) (int, any, error) {
	var req wire.ArtifactUploadRequest
	authorize, err := s.core.WorkerRequest(r, &req)
	if err != nil {
		return 0, nil, err
	}
	if !s.svc.ArtifactsEnabled() {
		return 0, nil, errNoArtifacts
	}
	up, err := s.svc.PresignArtifact(r.Context(), req.Request(), authorize)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.ArtifactUploadOf(up), nil
}

func (s *Server) completeArtifact(r *http.Request) (int, any, error) {
	var req wire.ArtifactCompleteRequest
	authorize, err := s.core.WorkerRequest(r, &req)
	if err != nil {
		return 0, nil, err
	}
	if !s.svc.ArtifactsEnabled() {
		return 0, nil, errNoArtifacts
	}
	a, err := s.svc.CompleteArtifact(r.Context(), req.Completion(), authorize)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.Artifact{Name: a.Name, Attempt: req.Attempt, Size: a.Size, SHA256: a.SHA256,
		ContentType: a.ContentType, CreatedAt: a.CreatedAt}, nil
}

func (s *Server) invocationArtifacts(r *http.Request) (int, any, error) {
	return s.artifactList(r, ids.Invocation, s.svc.InvocationArtifacts, false)
}

func (s *Server) runArtifacts(r *http.Request) (int, any, error) {
	from, limit, err := runPageParams(r, defaultRunArtifactJobs)
	if err != nil {
		return 0, nil, err
	}
	next := 0
	status, out, err := s.artifactList(r, ids.Run, func(ctx context.Context, id string) (l []control.ListedArtifact, err error) {
		l, next, err = s.svc.RunArtifacts(ctx, id, from, limit)
		return l, err
	}, true)
	if list, ok := out.(wire.ArtifactList); ok {
		list.NextIndex = next
		out = list
	}
	return status, out, err
}

// defaultRunArtifactJobs is how many jobs a page of a run's artifacts
// reads unless ?limit= says otherwise.
const defaultRunArtifactJobs = 100

// artifactList answers the artifacts list reads for the id in the path
// (of kind prefix); a run's carry each job's index and invocation.
func (s *Server) artifactList(r *http.Request, prefix string, list func(context.Context, string) ([]control.ListedArtifact, error), run bool) (int, any, error) {
	id, err := pathID(r, prefix)
	if err != nil {
		return 0, nil, err
	}
	if !s.svc.ArtifactsEnabled() {
		return 0, nil, errNoArtifacts
	}
	listed, err := list(r.Context(), id)
	if err != nil {
		return 0, nil, err
	}
	out := wire.ArtifactList{Artifacts: make([]wire.Artifact, 0, len(listed))}
	for _, l := range listed {
		a := wire.Artifact{Name: l.Name, Attempt: l.Attempt, Size: l.Size, SHA256: l.SHA256, ContentType: l.ContentType,
			CreatedAt: l.CreatedAt, Counted: l.Counted, AttemptOutcome: l.AttemptOutcome, URL: l.URL}
		if run {
			a.Index, a.InvocationID = &l.RunIndex, l.InvocationID
		}
		out.Artifacts = append(out.Artifacts, a)
	}
	return http.StatusOK, out, nil
}
