package process

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestRunInputFile: a run command's input is the file NYMPH_INPUT_FILE
// names (an absolute path in the run directory), byte for byte; a body
// without input has no NYMPH_INPUT_FILE; a stale input.json a body left,
// even a symlink, is replaced, never written through.
func TestRunInputFile(t *testing.T) {
	t.Parallel()
	r := runnerTestNew(t)
	const input = `{"prompt":"hi there","n":[1,2.5,null],"s":"é"}`
	inv := wire.RunInvocation{InvocationID: "inv_in", Input: json.RawMessage(input), Argv: runnerTestSh(
		`case "$NYMPH_INPUT_FILE" in /*) ;; *) exit 9;; esac; cat "$NYMPH_INPUT_FILE" > "$NYMPH_RESULT_FILE"`)}
	dir := runnerTestDir(r, inv)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "target")
	if err := os.WriteFile(target, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, InputFileName)); err != nil {
		t.Fatal(err)
	}
	o := runnerTestOutcome(t, runnerTestStart(t, r, inv))
	if o.State != wire.StateSucceeded || string(o.ResultBlob) != input {
		t.Fatalf("outcome %+v, want succeeded with the input %s as its result", o, input)
	}
	if b, err := os.ReadFile(filepath.Join(dir, InputFileName)); err != nil || string(b) != input {
		t.Errorf("input.json = %q (err %v), want %q", b, err, input)
	}
	if b, _ := os.ReadFile(target); string(b) != "keep" {
		t.Errorf("a stale symlink's target was written: %q", b)
	}

	none := wire.RunInvocation{InvocationID: "inv_none", Argv: runnerTestSh(
		`if [ -n "${NYMPH_INPUT_FILE+set}" ]; then exit 7; fi; echo '"none"' > "$NYMPH_RESULT_FILE"`)}
	o = runnerTestOutcome(t, runnerTestStart(t, r, none))
	if o.State != wire.StateSucceeded || string(o.ResultBlob) != `"none"` {
		t.Fatalf("a body without input: outcome %+v, want succeeded and no NYMPH_INPUT_FILE", o)
	}
	if _, err := os.Lstat(filepath.Join(runnerTestDir(r, none), InputFileName)); err == nil {
		t.Errorf("a run without input has an input.json")
	}
}

// TestRunInputFileRunAs: under --run-as the input file is the account's,
// so its body can read it.
func TestRunInputFileRunAs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("--run-as needs root")
	}
	ra, err := LookupRunAs("nobody", 0)
	if err != nil {
		t.Skipf("no nobody account here: %v", err)
	}
	r := runnerTestNew(t, func(c *Config) { c.RunAs = ra })
	// The test's own directories above the workdir (never the system's
	// temporary directory itself) become searchable by the account.
	for p := filepath.Dir(r.cfg.Workdir); strings.HasPrefix(p, os.TempDir()+string(filepath.Separator)); p = filepath.Dir(p) {
		if err := os.Chmod(p, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	const input = `{"as":"nobody"}`
	inv := wire.RunInvocation{InvocationID: "inv_runas", Input: json.RawMessage(input),
		Argv: runnerTestSh(`cat "$NYMPH_INPUT_FILE" > "$NYMPH_RESULT_FILE"`)}
	o := runnerTestOutcome(t, runnerTestStart(t, r, inv))
	if o.State != wire.StateSucceeded || string(o.ResultBlob) != input {
		t.Fatalf("outcome %+v (stderr %q), want succeeded with the input %s as its result", o, o.StderrTail, input)
	}
}
