package lifecycle

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestPublish: Publish sends the path made absolute against the working
// directory and the name as given, and reads the recorded artifact; a
// refusal is a *StatusError with the endpoint's message and no secret;
// outside nymph it is ErrNotUnderNymph.
func TestPublish(t *testing.T) {
	f := newFakeNymph(t)
	t.Setenv(EnvURL, f.url())
	dir := t.TempDir()
	t.Chdir(dir)
	wd, _ := os.Getwd()
	a, err := Publish(t.Context(), "out/preds.txt", "preds")
	want := Artifact{Name: "preds", Attempt: 2, Size: 5, SHA256: "ab12", ContentType: "text/plain", CreatedAt: time.Date(2026, 12, 3, 13, 0, 0, 0, time.UTC)}
	if err != nil || a != want {
		t.Fatalf("Publish = %+v, %v; want %+v", a, err, want)
	}
	if _, err := Publish(t.Context(), "/abs/ckpt", ""); err != nil {
		t.Fatal(err)
	}
	_, err = Publish(t.Context(), "missing", "")
	var se *StatusError
	if !errors.As(err, &se) || se.Code != http.StatusNotFound || se.Message != "does not exist in the run directory" {
		t.Fatalf("a refused publish: %v", err)
	}
	noSecret(t, err)
	if _, err := Publish(t.Context(), "", "x"); err == nil {
		t.Fatal("an empty path was sent")
	}
	f.mu.Lock()
	got := f.published
	f.mu.Unlock()
	if len(got) != 3 || got[0]["path"] != filepath.Join(wd, "out/preds.txt") || got[0]["name"] != "preds" ||
		got[1]["path"] != "/abs/ckpt" || got[1]["name"] != "" {
		t.Fatalf("the endpoint saw %v", got)
	}
	unsetEnv(t)
	if _, err := Publish(t.Context(), "x", ""); !errors.Is(err, ErrNotUnderNymph) {
		t.Fatalf("outside nymph: %v", err)
	}
}
