package acks

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/syncbuf"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// spoolTestLog is a concurrency-safe buffer a JSON slog handler writes to.
type spoolTestLog struct{ syncbuf.Buffer }

// lines reports every logged record, decoded.
func (l *spoolTestLog) lines(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

func (l *spoolTestLog) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// spoolTestAck is a complete spooled ack of attempt of id.
func spoolTestAck(id string, attempt int, at time.Time) SpooledAck {
	code := 3
	return SpooledAck{
		ControlPlane: "http://127.0.0.1:1",
		WorkerID:     "wrk_01TEST",
		Token:        "secret-worker-token",
		Ack: wire.AckRequest{
			WorkerID: "wrk_01TEST", InvocationID: id, Attempt: attempt,
			State: wire.StateFailed, ExitCode: &code, ResultBlob: json.RawMessage(`{"n":1}`),
			Error: &wire.ErrorInfo{Type: "exit", Message: "exit 3"}, StdoutTail: "out\n", StderrTail: "err\n",
		},
		SpooledAt: at,
	}
}

func spoolTestOpen(t *testing.T, stateDir string, opts ...SpoolOption) *Spool {
	t.Helper()
	s, err := OpenSpool(stateDir, opts...)
	if err != nil {
		t.Fatalf("OpenSpool(%s): %v", stateDir, err)
	}
	return s
}

func spoolTestMode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func TestSpoolPutListRemove(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state", "nested")
	s := spoolTestOpen(t, state)
	if got := spoolTestMode(t, s.Dir()); got != 0o700 {
		t.Errorf("acks dir mode %o, want 700", got)
	}
	if s.Dir() != filepath.Join(state, "acks") {
		t.Errorf("spool dir %s, want %s", s.Dir(), filepath.Join(state, "acks"))
	}

	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	newer := spoolTestAck("inv_01NEWER", 2, t0.Add(time.Minute))
	older := spoolTestAck("inv_01OLDER", 1, t0)
	for _, a := range []SpooledAck{newer, older} {
		if err := s.Put(a); err != nil {
			t.Fatalf("Put: %v", err)
		}
	}
	for _, name := range []string{"inv_01NEWER-2.json", "inv_01OLDER-1.json"} {
		if got := spoolTestMode(t, filepath.Join(s.Dir(), name)); got != 0o600 {
			t.Errorf("%s mode %o, want 600", name, got)
		}
	}
	entries, _ := os.ReadDir(s.Dir())
	if len(entries) != 2 {
		t.Errorf("spool holds %d entries, want 2 (no temp files left)", len(entries))
	}

	got, err := s.List()
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if want := []SpooledAck{older, newer}; !reflect.DeepEqual(got, want) {
		t.Errorf("List = %+v\nwant oldest first %+v", got, want)
	}

	// A reopened spool over the same directory sees the same acks.
	again, err := spoolTestOpen(t, state).List()
	if err != nil || len(again) != 2 {
		t.Errorf("reopened List = %d acks, %v; want 2", len(again), err)
	}

	if err := s.Remove("inv_01OLDER", 1); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if err := s.Remove("inv_01OLDER", 1); err != nil {
		t.Errorf("Remove of a missing ack: %v, want nil", err)
	}
	got, _ = s.List()
	if len(got) != 1 || got[0].Ack.InvocationID != "inv_01NEWER" {
		t.Errorf("after Remove, List = %+v", got)
	}
}

func TestSpoolPutReplacesAndStamps(t *testing.T) {
	s := spoolTestOpen(t, t.TempDir())
	a := spoolTestAck("inv_01A", 1, time.Time{})
	if err := s.Put(a); err != nil {
		t.Fatal(err)
	}
	a.Ack.State = wire.StateSucceeded
	a.SpooledAt = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := s.Put(a); err != nil {
		t.Fatal(err)
	}
	got, err := s.List()
	if err != nil || len(got) != 1 {
		t.Fatalf("List = %+v, %v; want one ack", got, err)
	}
	if got[0].Ack.State != wire.StateSucceeded || !got[0].SpooledAt.Equal(a.SpooledAt) {
		t.Errorf("List = %+v, want the second Put", got[0])
	}

	b := spoolTestAck("inv_01B", 1, time.Time{})
	before := time.Now().Add(-time.Second)
	if err := s.Put(b); err != nil {
		t.Fatal(err)
	}
	got, _ = s.List()
	for _, g := range got {
		if g.Ack.InvocationID == "inv_01B" && g.SpooledAt.Before(before) {
			t.Errorf("zero SpooledAt was stored as %v, want now", g.SpooledAt)
		}
	}
}

func TestSpoolRefusesUnsafeOrIncompleteAcks(t *testing.T) {
	s := spoolTestOpen(t, t.TempDir())
	cases := map[string]func(*SpooledAck){
		"parent dir":       func(a *SpooledAck) { a.Ack.InvocationID = "../escape" },
		"separator":        func(a *SpooledAck) { a.Ack.InvocationID = "inv/x" },
		"hidden":           func(a *SpooledAck) { a.Ack.InvocationID = ".inv" },
		"empty id":         func(a *SpooledAck) { a.Ack.InvocationID = "" },
		"negative":         func(a *SpooledAck) { a.Ack.Attempt = -1 },
		"no token":         func(a *SpooledAck) { a.Token = "" },
		"no url":           func(a *SpooledAck) { a.ControlPlane = "" },
		"no worker at all": func(a *SpooledAck) { a.WorkerID, a.Ack.WorkerID = "", "" },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			a := spoolTestAck("inv_01OK", 1, time.Now())
			mutate(&a)
			if err := s.Put(a); err == nil {
				t.Errorf("Put accepted %+v", a)
			}
		})
	}
	entries, _ := os.ReadDir(s.Dir())
	if len(entries) != 0 {
		t.Errorf("refused Puts left %d files", len(entries))
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(s.Dir()), "escape-1.json")); err == nil {
		t.Error("a bad id wrote outside the spool")
	}
	if err := s.Remove("../escape", 1); err == nil {
		t.Error("Remove accepted an unsafe id")
	}
}

func TestSpoolCorruptFileMovedAside(t *testing.T) {
	var log spoolTestLog
	s := spoolTestOpen(t, t.TempDir(), WithSpoolLogger(log.logger()))
	good := spoolTestAck("inv_01GOOD", 1, time.Now().UTC())
	if err := s.Put(good); err != nil {
		t.Fatal(err)
	}
	wrongName, _ := json.Marshal(spoolTestAck("inv_01OTHER", 1, time.Now()))
	noToken := spoolTestAck("inv_01NOTOKEN", 1, time.Now())
	noToken.Token = ""
	noTokenJSON, _ := json.Marshal(noToken)
	bad := map[string][]byte{
		"inv_01TRUNC-1.json":   []byte(`{"control_plane":"http://x","token":"secret-worker-token","ack":{`),
		"inv_01EMPTY-1.json":   nil,
		"inv_01RENAMED-1.json": wrongName,
		"inv_01NOTOKEN-1.json": noTokenJSON,
	}
	for name, b := range bad {
		if err := os.WriteFile(filepath.Join(s.Dir(), name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// Not spool files at all: left alone and not warned about.
	_ = os.WriteFile(filepath.Join(s.Dir(), "README"), []byte("hi"), 0o600)
	_ = os.WriteFile(filepath.Join(s.Dir(), ".tmp-123"), []byte("{"), 0o600)

	got, err := s.List()
	if err != nil {
		t.Fatalf("List: %v (a corrupt file must not be fatal)", err)
	}
	if len(got) != 1 || got[0].Ack.InvocationID != "inv_01GOOD" {
		t.Fatalf("List = %+v, want only the good ack", got)
	}
	for name := range bad {
		if _, err := os.Stat(filepath.Join(s.Dir(), name)); err == nil {
			t.Errorf("%s still in place", name)
		}
		if _, err := os.Stat(filepath.Join(s.Dir(), name+".corrupt")); err != nil {
			t.Errorf("%s not moved aside: %v", name, err)
		}
	}
	warned := 0
	for _, l := range log.lines(t) {
		if l["level"] == "WARN" && strings.Contains(l["msg"].(string), "corrupt") {
			warned++
		}
	}
	if warned != len(bad) {
		t.Errorf("%d corrupt-file warnings, want %d:\n%s", warned, len(bad), log.String())
	}
	if strings.Contains(log.String(), "secret-worker-token") {
		t.Errorf("log holds a token:\n%s", log.String())
	}

	// Moved aside means the next List is quiet.
	before := len(log.lines(t))
	if got, err := s.List(); err != nil || len(got) != 1 {
		t.Errorf("second List = %+v, %v", got, err)
	}
	if after := len(log.lines(t)); after != before {
		t.Errorf("second List logged %d more lines", after-before)
	}
}

func TestOpenSpoolStateDir(t *testing.T) {
	t.Run("state dir is a file", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "state")
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := OpenSpool(f); err == nil {
			t.Error("OpenSpool accepted a file as the state dir")
		}
	})
	t.Run("acks is a file", func(t *testing.T) {
		state := t.TempDir()
		if err := os.WriteFile(filepath.Join(state, "acks"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := OpenSpool(state); err == nil {
			t.Error("OpenSpool accepted a file as the acks dir")
		}
	})
	t.Run("acks is a symlink", func(t *testing.T) {
		state, elsewhere := t.TempDir(), t.TempDir()
		if err := os.Symlink(elsewhere, filepath.Join(state, "acks")); err != nil {
			t.Fatal(err)
		}
		if _, err := OpenSpool(state); err == nil {
			t.Error("OpenSpool followed a symlinked acks dir")
		}
	})
	t.Run("empty", func(t *testing.T) {
		if _, err := OpenSpool(""); err == nil {
			t.Error("OpenSpool accepted an empty state dir")
		}
	})
	t.Run("loose perms tightened", func(t *testing.T) {
		state := t.TempDir()
		dir := filepath.Join(state, "acks")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		spoolTestOpen(t, state)
		if got := spoolTestMode(t, dir); got != 0o700 {
			t.Errorf("acks dir mode %o after OpenSpool, want 700", got)
		}
	})
	t.Run("stale temp files removed", func(t *testing.T) {
		state := t.TempDir()
		dir := filepath.Join(state, "acks")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		stale, fresh := filepath.Join(dir, ".tmp-old"), filepath.Join(dir, ".tmp-new")
		for _, p := range []string{stale, fresh} {
			if err := os.WriteFile(p, []byte("{"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		old := time.Now().Add(-time.Hour)
		if err := os.Chtimes(stale, old, old); err != nil {
			t.Fatal(err)
		}
		spoolTestOpen(t, state)
		if _, err := os.Stat(stale); err == nil {
			t.Error("a crashed Put's old temp file survived OpenSpool")
		}
		if _, err := os.Stat(fresh); err != nil {
			t.Error("OpenSpool removed a temp file another Put may be writing")
		}
	})
	t.Run("old corrupt files removed", func(t *testing.T) {
		state := t.TempDir()
		dir := filepath.Join(state, "acks")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		stale, recent := filepath.Join(dir, "inv_01OLD-1.json.corrupt"), filepath.Join(dir, "inv_01NEW-1.json.corrupt")
		for _, p := range []string{stale, recent} {
			if err := os.WriteFile(p, []byte("{"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		old := time.Now().Add(-spoolStaleCorrupt - time.Hour)
		if err := os.Chtimes(stale, old, old); err != nil {
			t.Fatal(err)
		}
		spoolTestOpen(t, state)
		if _, err := os.Stat(stale); err == nil {
			t.Error("a corrupt file older than spoolStaleCorrupt survived OpenSpool")
		}
		if _, err := os.Stat(recent); err != nil {
			t.Error("OpenSpool removed a corrupt file an operator may still want to look at")
		}
	})
}

// TestSpoolLeavesNothingBehind: once every ack is answered and removed,
// the spool directory is empty: no ack file, no temp file of a Put.
func TestSpoolLeavesNothingBehind(t *testing.T) {
	s := spoolTestOpen(t, t.TempDir())
	for i := range 5 {
		a := spoolTestAck(fmt.Sprintf("inv_01LEFT%d", i), 1, time.Now().UTC())
		if err := s.Put(a); err != nil {
			t.Fatal(err)
		}
		if err := s.Put(a); err != nil { // a replacement leaves no temp file either
			t.Fatal(err)
		}
	}
	for i := range 5 {
		if err := s.Remove(fmt.Sprintf("inv_01LEFT%d", i), 1); err != nil {
			t.Fatal(err)
		}
	}
	entries, err := os.ReadDir(s.Dir())
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("spool directory holds %v after every ack was removed", names)
	}
}
