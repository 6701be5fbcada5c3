package api_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"

	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/server/blobs"
	"github.com/dreamlake/lakeshore/server/blobs/blobstest"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// withBlobs gives the plane blob store b, within limits.
func withBlobs(b *blobstest.Store, limits domain.ArtifactLimits) option {
	return func(cfg *apitest.Config) {
		cfg.Control.Blobs = blobs.UseCases{Store: b}
		cfg.Control.ArtifactLimits = limits
	}
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// claimOne submits argv (with submit's options) and has w claim it.
func (h *harness) claimOne(w worker, req wire.SubmitRequest) wire.Invocation {
	h.t.Helper()
	inv := h.submitReq(req)
	if got := runIDs(h.poll(w, wire.PollRequest{Phase: wire.PhaseReady})); len(got) != 1 || got[0] != inv.InvocationID {
		h.t.Fatalf("claimed %v, want %s", got, inv.InvocationID)
	}
	return inv
}

func uploadReq(w worker, inv string, attempt int, name string, body []byte) wire.ArtifactUploadRequest {
	return wire.ArtifactUploadRequest{WorkerID: w.id, InvocationID: inv, Attempt: attempt, Name: name,
		Size: int64(len(body)), SHA256: digest(body), ContentType: "text/plain"}
}

// publish uploads body as artifact name of attempt of inv, as nymph does:
// presign, PUT, complete.
func (h *harness) publish(w worker, inv string, attempt int, name string, body []byte) wire.Artifact {
	h.t.Helper()
	var up wire.ArtifactUpload
	h.do("POST", "/v1/daemon/artifacts", w.token, uploadReq(w, inv, attempt, name, body)).want(h.t, 200, &up)
	h.putBytes(up, body)
	var a wire.Artifact
	h.do("POST", "/v1/daemon/artifacts/complete", w.token, wire.ArtifactCompleteRequest{WorkerID: w.id,
		InvocationID: inv, Attempt: attempt, Name: name, UploadID: up.UploadID}).want(h.t, 200, &a)
	return a
}

func (h *harness) putBytes(up wire.ArtifactUpload, body []byte) {
	h.t.Helper()
	req, err := http.NewRequest(up.Method, up.URL, bytes.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		h.t.Fatalf("PUT %s: %d", up.URL, resp.StatusCode)
	}
}

func (h *harness) artifacts(path string) []wire.Artifact {
	h.t.Helper()
	var l wire.ArtifactList
	h.do("GET", path, operatorToken, nil).want(h.t, 200, &l)
	return l.Artifacts
}

// fetch downloads a listed artifact through its URL.
func fetch(t *testing.T, a wire.Artifact) []byte {
	t.Helper()
	resp, err := http.Get(a.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	if _, err := b.ReadFrom(resp.Body); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %v", a.URL, resp.StatusCode, err)
	}
	return b.Bytes()
}

// TestArtifactPublishRecordsAndReplaces: a published artifact is recorded
// on its attempt with its size and digest, and listed with a GET of its
// bytes; the same name published again replaces it (one record, the new
// content); once the attempt's outcome is the invocation's, its artifacts
// are counted.
func TestArtifactPublishRecordsAndReplaces(t *testing.T) {
	b := blobstest.New(t)
	h := newHarness(t, withBlobs(b, domain.ArtifactLimits{}))
	w := h.hello("m1", "b1")
	inv := h.claimOne(w, wire.SubmitRequest{Queue: "default", Argv: []string{"eval"}})

	first := []byte("predictions v1\n")
	a := h.publish(w, inv.InvocationID, 1, "preds.txt", first)
	if a.Name != "preds.txt" || a.Size != int64(len(first)) || a.SHA256 != digest(first) || a.CreatedAt.IsZero() {
		t.Errorf("complete answered %+v", a)
	}
	got := h.artifacts("/v1/invocations/" + inv.InvocationID + "/artifacts")
	if len(got) != 1 || got[0].Counted || got[0].Attempt != 1 || got[0].AttemptOutcome != "" {
		t.Fatalf("while running: %+v, want one uncounted artifact of running attempt 1", got)
	}
	if !bytes.Equal(fetch(t, got[0]), first) {
		t.Errorf("download is not what was published")
	}

	second := []byte("predictions v2, longer\n")
	h.publish(w, inv.InvocationID, 1, "preds.txt", second)
	h.ack(w, wire.AckRequest{InvocationID: inv.InvocationID, Attempt: 1, State: "succeeded", ExitCode: new(int)})
	got = h.artifacts("/v1/invocations/" + inv.InvocationID + "/artifacts")
	if len(got) != 1 || !got[0].Counted || got[0].SHA256 != digest(second) || got[0].Size != int64(len(second)) {
		t.Fatalf("after a second publish and success: %+v, want one counted record of the second content", got)
	}
	if !bytes.Equal(fetch(t, got[0]), second) {
		t.Errorf("download after replace is not the second content")
	}
}

// TestArtifactPresignRefused: a worker that does not hold the attempt, an
// attempt that ended, a size past the limit and a name past the count
// limit are each refused with their code, nothing presigned and nothing
// stored; and an attempt that ends between presign and complete records
// nothing.
func TestArtifactPresignRefused(t *testing.T) {
	b := blobstest.New(t)
	h := newHarness(t, withBlobs(b, domain.ArtifactLimits{MaxBytes: 100, MaxPerAttempt: 2}))
	w := h.hello("m1", "b1")
	other := h.hello("m2", "b2")
	inv := h.claimOne(w, wire.SubmitRequest{Queue: "default", Argv: []string{"eval"}})
	id := inv.InvocationID
	h.publish(w, id, 1, "a", []byte("a"))
	h.publish(w, id, 1, "b", []byte("b"))

	refused := func(name string, tok worker, req wire.ArtifactUploadRequest, status int, code wire.Code) {
		t.Run(name, func(t *testing.T) {
			n := b.Presigns()
			h.unchanged(t, func() {
				h.do("POST", "/v1/daemon/artifacts", tok.token, req).wantError(t, status, code)
			})
			if b.Presigns() != n {
				t.Errorf("a refused request was presigned")
			}
		})
	}
	refused("another worker", other, uploadReq(other, id, 1, "c", []byte("c")), 403, wire.CodeForbidden)
	refused("an attempt never run", w, uploadReq(w, id, 2, "c", []byte("c")), 403, wire.CodeForbidden)
	refused("past the size limit", w, uploadReq(w, id, 1, "a", bytes.Repeat([]byte("x"), 101)), 400, wire.CodeInvalid)
	refused("past the count limit", w, uploadReq(w, id, 1, "c", []byte("c")), 409, wire.CodeConflict)
	refused("a bad name", w, uploadReq(w, id, 1, "../x", []byte("c")), 400, wire.CodeInvalid)
	// A name already recorded is within the count: it replaces.
	var up wire.ArtifactUpload
	h.do("POST", "/v1/daemon/artifacts", w.token, uploadReq(w, id, 1, "b", []byte("b2"))).want(t, 200, &up)
	h.putBytes(up, []byte("b2"))

	h.ack(w, wire.AckRequest{InvocationID: id, Attempt: 1, State: "failed", ExitCode: new(int)})
	refused("an ended attempt", w, uploadReq(w, id, 1, "a", []byte("a")), 409, wire.CodeConflict)
	t.Run("complete after the attempt ended", func(t *testing.T) {
		h.unchanged(t, func() {
			h.do("POST", "/v1/daemon/artifacts/complete", w.token, wire.ArtifactCompleteRequest{WorkerID: w.id,
				InvocationID: id, Attempt: 1, Name: "b", UploadID: up.UploadID}).wantError(t, 409, wire.CodeConflict)
		})
		if got, _ := b.Object(blobs.Key(id, 1, "b")); string(got) != "b" {
			t.Errorf("the refused upload was completed over the recorded content: %q", got)
		}
	})
}

// TestArtifactCompleteNeedsItsUpload: a complete of an upload the control
// plane did not presign, or of bytes never put, records nothing.
func TestArtifactCompleteNeedsItsUpload(t *testing.T) {
	b := blobstest.New(t)
	h := newHarness(t, withBlobs(b, domain.ArtifactLimits{}))
	w := h.hello("m1", "b1")
	id := h.claimOne(w, wire.SubmitRequest{Queue: "default", Argv: []string{"eval"}}).InvocationID
	var up wire.ArtifactUpload
	h.do("POST", "/v1/daemon/artifacts", w.token, uploadReq(w, id, 1, "a", []byte("a"))).want(t, 200, &up)
	for name, c := range map[string]wire.ArtifactCompleteRequest{
		"another upload id": {WorkerID: w.id, InvocationID: id, Attempt: 1, Name: "a", UploadID: "forged"},
		"nothing put":       {WorkerID: w.id, InvocationID: id, Attempt: 1, Name: "a", UploadID: up.UploadID},
	} {
		t.Run(name, func(t *testing.T) {
			h.unchanged(t, func() {
				h.do("POST", "/v1/daemon/artifacts/complete", w.token, c).wantError(t, 409, wire.CodeConflict)
			})
		})
	}
	if got := h.artifacts("/v1/invocations/" + id + "/artifacts"); len(got) != 0 {
		t.Errorf("a pending upload is listed: %+v", got)
	}
}

// TestArtifactsOfAHandedBackAttemptAreNotCounted: an attempt handed back
// as its worker drained keeps its artifacts, listed apart (counted false,
// attempt_outcome requeued); the later attempt that succeeded is the
// invocation's, and only its artifacts are counted. The run's list says
// the same with the job's index and invocation.
func TestArtifactsOfAHandedBackAttemptAreNotCounted(t *testing.T) {
	b := blobstest.New(t)
	h := newHarness(t, withBlobs(b, domain.ArtifactLimits{}))
	first := h.hello("m1", "b1")
	var run wire.Run
	h.do("POST", "/v1/runs", operatorToken, wire.RunRequest{Queue: "default", MaxAttempts: 2,
		Jobs: []wire.RunJob{{Argv: []string{"eval", "0"}}}}).want(t, 201, &run)
	cmds := ofType(h.poll(first, wire.PollRequest{Phase: wire.PhaseReady}), wire.CommandRun)
	if len(cmds) != 1 {
		t.Fatalf("claimed %d, want the run's job", len(cmds))
	}
	id := cmds[0].Invocation.InvocationID
	h.publish(first, id, 1, "checkpoint", []byte("half done"))
	if r := h.ack(first, wire.AckRequest{InvocationID: id, Attempt: 1, State: "requeued", Phase: wire.PhaseDraining}); !r.Recorded {
		t.Fatalf("hand-back not recorded: %+v", r)
	}
	second := h.hello("m2", "b2")
	if got := runIDs(h.poll(second, wire.PollRequest{Phase: wire.PhaseReady})); len(got) != 1 {
		t.Fatalf("second worker claimed %v", got)
	}
	h.publish(second, id, 2, "checkpoint", []byte("all done"))
	h.ack(second, wire.AckRequest{InvocationID: id, Attempt: 2, State: "succeeded", ExitCode: new(int)})

	for _, path := range []string{"/v1/invocations/" + id + "/artifacts", "/v1/runs/" + run.RunID + "/artifacts"} {
		got := h.artifacts(path)
		if len(got) != 2 {
			t.Fatalf("%s: %+v, want both attempts' checkpoints", path, got)
		}
		byAttempt := map[int]wire.Artifact{got[0].Attempt: got[0], got[1].Attempt: got[1]}
		if a := byAttempt[1]; a.Counted || a.AttemptOutcome != string(domain.EndRequeued) || string(fetch(t, a)) != "half done" {
			t.Errorf("%s: handed-back attempt's artifact %+v, want counted false, attempt_outcome requeued", path, a)
		}
		if a := byAttempt[2]; !a.Counted || a.AttemptOutcome != "" || string(fetch(t, a)) != "all done" {
			t.Errorf("%s: counted attempt's artifact %+v", path, a)
		}
		run := path != "/v1/invocations/"+id+"/artifacts"
		for _, a := range got {
			if hasIndex := a.Index != nil && *a.Index == 0 && a.InvocationID == id; hasIndex != run {
				t.Errorf("%s: index %v invocation %q", path, a.Index, a.InvocationID)
			}
		}
	}
}

// TestArtifactRoutesTokens: the lists need the operator token; the daemon
// routes a worker token of the worker named.
func TestArtifactRoutesTokens(t *testing.T) {
	b := blobstest.New(t)
	h := newHarness(t, withBlobs(b, domain.ArtifactLimits{}))
	w := h.hello("m1", "b1")
	id := h.claimOne(w, wire.SubmitRequest{Queue: "default", Argv: []string{"eval"}}).InvocationID
	for _, path := range []string{"/v1/invocations/" + id + "/artifacts", "/v1/runs/run_01J00000000000000000000000/artifacts"} {
		for _, tok := range []string{"", w.token, enrollToken} {
			h.do("GET", path, tok, nil).wantError(t, 401, wire.CodeUnauthorized)
		}
	}
	last := "a"
	if strings.HasSuffix(w.token, last) {
		last = "b"
	}
	wrongSecret := w.token[:len(w.token)-1] + last
	for path, body := range map[string]any{
		"/v1/daemon/artifacts": uploadReq(w, id, 1, "a", []byte("a")),
		"/v1/daemon/artifacts/complete": wire.ArtifactCompleteRequest{WorkerID: w.id, InvocationID: id, Attempt: 1,
			Name: "a", UploadID: "up1"},
	} {
		for _, tok := range []string{"", operatorToken, enrollToken, wrongSecret} {
			h.unchanged(t, func() {
				h.do("POST", path, tok, body).wantError(t, 401, wire.CodeUnauthorized)
			})
		}
	}
	if b.Presigns() != 0 {
		t.Errorf("%d presigns for refused tokens", b.Presigns())
	}
}

// TestArtifactsNotConfigured: without a blob store every artifact route
// says so (501), after its token check.
func TestArtifactsNotConfigured(t *testing.T) {
	h := newHarness(t)
	w := h.hello("m1", "b1")
	id := h.claimOne(w, wire.SubmitRequest{Queue: "default", Argv: []string{"eval"}}).InvocationID
	h.do("POST", "/v1/daemon/artifacts", w.token, uploadReq(w, id, 1, "a", []byte("a"))).wantError(t, 501, wire.CodeNotImplemented)
	h.do("GET", "/v1/invocations/"+id+"/artifacts", operatorToken, nil).wantError(t, 501, wire.CodeNotImplemented)
	h.do("GET", "/v1/invocations/"+id+"/artifacts", "", nil).wantError(t, 401, wire.CodeUnauthorized)
}
