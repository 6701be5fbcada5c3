package client_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
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
