package statedir

import (
	"os"
	"path/filepath"
	"testing"
)

func TestPrivate(t *testing.T) {
	parent := t.TempDir()
	if err := os.Mkdir(filepath.Join(parent, "loose"), 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := Private(parent, "loose")
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o700 {
		t.Errorf("mode %v, want 0700", fi.Mode().Perm())
	}
	if err := os.Symlink(t.TempDir(), filepath.Join(parent, "link")); err != nil {
		t.Fatal(err)
	}
	if _, err := Private(parent, "link"); err == nil {
		t.Error("a symlink was taken for the directory")
	}
}

func TestReadJSON(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	if err := os.WriteFile(good, []byte(`{"a":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	var v struct{ A int }
	if err := ReadJSON(good, 100, &v); err != nil || v.A != 1 {
		t.Fatalf("ReadJSON = %+v, %v", v, err)
	}
	if err := ReadJSON(good, 3, &v); err == nil {
		t.Error("a file over the limit was read")
	}
	link := filepath.Join(dir, "link.json")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	if err := ReadJSON(link, 100, &v); err == nil {
		t.Error("ReadJSON followed a symlink")
	}
}
