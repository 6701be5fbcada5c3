package client_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestArtifactsNotConfiguredIsFinal: a control plane without a blob store
// answers 501 not_implemented, which no retry can change: the client
// reports the code and does not call it retryable.
func TestArtifactsNotConfiguredIsFinal(t *testing.T) {
	for name, body := range map[string]string{
		"wire error": `{"error":{"code":"not_implemented","message":"artifacts are not configured on this control plane"}}`,
		"bare 501":   "not implemented",
	} {
		t.Run(name, func(t *testing.T) {
			hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(http.StatusNotImplemented)
				_, _ = io.WriteString(w, body)
			}))
			defer hs.Close()
			_, err := client.New(hs.URL, "tok").PresignArtifact(t.Context(), wire.ArtifactUploadRequest{})
			var we *wire.Error
			if !errors.As(err, &we) || we.Code != wire.CodeNotImplemented {
				t.Fatalf("err = %v, want code not_implemented", err)
			}
			if client.Retryable(err) {
				t.Error("a 501 not_implemented is retryable")
			}
		})
	}
}

// TestDownloadArtifactChecks: a download sends no token, and refuses
// content of another size or digest than listed.
func TestDownloadArtifactChecks(t *testing.T) {
	content := []byte("the published bytes")
	sum := sha256.Sum256(content)
	serve := content
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			t.Errorf("the download sent Authorization %q", r.Header.Get("Authorization"))
		}
		_, _ = w.Write(serve)
	}))
	defer hs.Close()
	c := client.New("http://127.0.0.1:1", "operator-token")
	a := wire.Artifact{Name: "x", Size: int64(len(content)), SHA256: hex.EncodeToString(sum[:]), URL: hs.URL + "/x"}
	var got bytes.Buffer
	if err := c.DownloadArtifact(t.Context(), a, &got); err != nil || !bytes.Equal(got.Bytes(), content) {
		t.Fatalf("download: %v, %q", err, got.Bytes())
	}
	for name, body := range map[string][]byte{
		"longer":       append(append([]byte{}, content...), '!'),
		"shorter":      content[1:],
		"other digest": bytes.ToUpper(content),
	} {
		serve = body
		if err := c.DownloadArtifact(t.Context(), a, io.Discard); err == nil || !strings.Contains(err.Error(), `"x"`) {
			t.Errorf("%s: %v, want a refusal naming the artifact", name, err)
		}
	}
}

// TestArtifactCalls: the two daemon artifact calls go to their routes with
// the worker token and the request as sent, decode the answer, and bring
// back the control plane's refusal as a *wire.Error.
func TestArtifactCalls(t *testing.T) {
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization"))
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/v1/daemon/artifacts":
			var req wire.ArtifactUploadRequest
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Name != "out" || req.Size != 3 {
				t.Errorf("presign request %+v %v", req, err)
			}
			if req.Name == "out" {
				_ = json.NewEncoder(w).Encode(wire.ArtifactUpload{UploadID: "up1", Method: "PUT", URL: "http://x/put"})
			}
		case "/v1/daemon/artifacts/complete":
			var req wire.ArtifactCompleteRequest
			_ = json.NewDecoder(r.Body).Decode(&req)
			if req.UploadID != "up1" {
				w.WriteHeader(http.StatusConflict)
				_ = json.NewEncoder(w).Encode(wire.ErrorBody{Error: wire.ErrorDetail{Code: wire.CodeConflict, Message: "attempt ended"}})
				return
			}
			_ = json.NewEncoder(w).Encode(wire.Artifact{Name: req.Name, Attempt: req.Attempt, Size: 3})
		}
	}))
	t.Cleanup(srv.Close)
	c := client.New(srv.URL, "worker-token")
	up, err := c.PresignArtifact(t.Context(), wire.ArtifactUploadRequest{WorkerID: "w", InvocationID: "i", Attempt: 1, Name: "out", Size: 3})
	if err != nil || up.UploadID != "up1" || up.URL != "http://x/put" {
		t.Fatalf("PresignArtifact: %+v %v", up, err)
	}
	a, err := c.CompleteArtifact(t.Context(), wire.ArtifactCompleteRequest{WorkerID: "w", InvocationID: "i", Attempt: 2, Name: "out", UploadID: "up1"})
	if err != nil || a.Name != "out" || a.Attempt != 2 || a.Size != 3 {
		t.Fatalf("CompleteArtifact: %+v %v", a, err)
	}
	_, err = c.CompleteArtifact(t.Context(), wire.ArtifactCompleteRequest{UploadID: "other"})
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != wire.CodeConflict {
		t.Fatalf("a refused complete: %v", err)
	}
	want := []string{"POST /v1/daemon/artifacts Bearer worker-token", "POST /v1/daemon/artifacts/complete Bearer worker-token", "POST /v1/daemon/artifacts/complete Bearer worker-token"}
	if len(seen) != 3 || seen[0] != want[0] || seen[1] != want[1] || seen[2] != want[2] {
		t.Fatalf("requests %q, want %q", seen, want)
	}
}
