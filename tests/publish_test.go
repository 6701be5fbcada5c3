package tests

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/pythontest"
	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestArtifactsEndToEnd: real nymph processes publish into a real control
// plane, on each plane (the embedded store with the dev server's
// artifacts directory; moto's DynamoDB and S3, the presigned PUTs and GETs
// really used; the Lambda bootstraps). A shell body publishes a file and a
// directory with `nymph publish` and is refused a path outside its run
// directory, a symlink out of it and a bad name; a Python body publishes a
// checkpoint from its on_shutdown hook during a drain and is handed back,
// and its second attempt publishes its final output. The operator then
// fetches each artifact byte for byte (`lakeshore artifacts get`, the
// directory unpacked), and the handed-back attempt's checkpoint is listed
// apart, not counted as the invocation's.
func TestArtifactsEndToEnd(t *testing.T) {
	pythontest.Python3(t)
	for _, b := range []backend{backends[0], backends[1], lambdasBackend} {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			d := startDev(t, b)
			op := d.Operator()
			ctx := context.Background()
			startNymph(t, d, "publisher-"+b.name)

			// A shell body: a file, a directory, and three refusals.
			script := `set -u
printf hello > out.txt
mkdir -p d/sub && printf x > d/sub/y && printf z > d/top
ln -s /etc/passwd leak
"$NYMPH" publish out.txt
"$NYMPH" publish ./d --name dir
"$NYMPH" publish /etc/passwd; echo "outside: $?"
"$NYMPH" publish leak; echo "leak: $?"
"$NYMPH" publish out.txt --name 'a/b'; echo "bad name: $?"`
			inv, _, err := op.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"/bin/sh", "-c", script},
				Env: map[string]string{"NYMPH": bin(t, "nymph")}})
			if err != nil {
				t.Fatal(err)
			}
			got := waitTerminal(t, op, inv.InvocationID, 2*time.Minute)
			if got.State != wire.StateSucceeded {
				t.Fatalf("the shell body: %s; stdout %q stderr %q", got.State, got.StdoutTail, got.StderrTail)
			}
			for _, want := range []string{"published out.txt: 5 bytes", "published dir: ", "outside: 1", "leak: 1", "bad name: 1"} {
				if !strings.Contains(got.StdoutTail, want) {
					t.Errorf("the body's output lacks %q: %q (stderr %q)", want, got.StdoutTail, got.StderrTail)
				}
			}
			list, err := op.InvocationArtifacts(ctx, inv.InvocationID)
			if err != nil {
				t.Fatal(err)
			}
			if names := artifactNames(list); names != "dir,out.txt" {
				t.Fatalf("artifacts %s, want dir,out.txt: the refusals stored nothing", names)
			}
			out := filepath.Join(t.TempDir(), "out.txt")
			runCLI(t, d, "artifacts", "get", inv.InvocationID, "out.txt", "-o", out)
			if b, err := os.ReadFile(out); err != nil || string(b) != "hello" {
				t.Fatalf("artifacts get out.txt: %q %v", b, err)
			}
			dir := filepath.Join(t.TempDir(), "dir")
			runCLI(t, d, "artifacts", "get", inv.InvocationID, "dir", "-o", dir)
			for name, want := range map[string]string{"sub/y": "x", "top": "z"} {
				if b, err := os.ReadFile(filepath.Join(dir, name)); err != nil || string(b) != want {
					t.Errorf("the unpacked directory's %s: %q %v", name, b, err)
				}
			}

			// Another invocation's body, told a running body's lifecycle URL,
			// cannot publish into that attempt (403), and neither can a process
			// outside every run.
			if b.name == "embedded" {
				publishIntoAnother(t, d)
			}

			// A Python body publishes from on_shutdown while it drains and is
			// handed back; its next attempt, on another nymph, publishes its
			// final output.
			mark := filepath.Join(t.TempDir(), "mark")
			env := warmPythonEnv(t)
			env["MARK"] = mark
			drainer, _, err := op.Submit(ctx, wire.SubmitRequest{Queue: "drain",
				Argv: []string{"python3", warmScript(t, "testdata/artifacts/drain.py")}, Env: env})
			if err != nil {
				t.Fatal(err)
			}
			first := startNymph(t, d, "drained-"+b.name, "--queue", "drain", "--grace", "30s")
			readPid(t, mark)
			if err := first.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if code := first.wait(t, time.Minute); code != 0 {
				t.Fatalf("the drained nymph exited %d", code)
			}
			startNymph(t, d, "second-"+b.name, "--queue", "drain")
			if got := waitTerminal(t, op, drainer.InvocationID, 2*time.Minute); got.State != wire.StateSucceeded || got.Attempt != 2 {
				t.Fatalf("the drained body: %s at attempt %d (%+v); want succeeded at attempt 2", got.State, got.Attempt, got.Error)
			}
			list, err = op.InvocationArtifacts(ctx, drainer.InvocationID)
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range list.Artifacts {
				var buf bytes.Buffer
				if err := op.DownloadArtifact(ctx, a, &buf); err != nil {
					t.Fatalf("download %s: %v", a.Name, err)
				}
				switch a.Name {
				case "checkpoint":
					if a.Attempt != 1 || a.Counted || a.AttemptOutcome != wire.AckRequeued || buf.String() != `{"step": 3}` {
						t.Errorf("the handed-back checkpoint: %+v %q; want attempt 1, not counted, requeued", a, buf.String())
					}
				case "final.txt":
					if a.Attempt != 2 || !a.Counted || buf.String() != "final of attempt 2" {
						t.Errorf("the final output: %+v %q; want attempt 2, counted", a, buf.String())
					}
				default:
					t.Errorf("unexpected artifact %+v", a)
				}
			}
			if len(list.Artifacts) != 2 {
				t.Fatalf("artifacts of the drained body: %s, want checkpoint and final.txt", artifactNames(list))
			}
		})
	}
}

// artifactNames lists a list's names, sorted, comma-separated.
func artifactNames(l wire.ArtifactList) string {
	var names []string
	for _, a := range l.Artifacts {
		names = append(names, a.Name)
	}
	slices.Sort(names)
	return strings.Join(names, ",")
}

// publishIntoAnother: a body that sleeps, its lifecycle URL written to a
// file, and a second body on the same nymph that runs `nymph publish`
// against that URL: refused, and nothing is recorded on the first.
func publishIntoAnother(t *testing.T, d *devServer) {
	t.Helper()
	op := d.Operator()
	ctx := context.Background()
	startNymph(t, d, "pair", "--queue", "pair", "--capacity", "2")
	shared := t.TempDir()
	victim, _, err := op.Submit(ctx, wire.SubmitRequest{Queue: "pair", Argv: []string{"/bin/sh", "-c",
		`echo x > mine; echo "$NYMPH_LIFECYCLE_URL" > "$D/url.tmp" && mv "$D/url.tmp" "$D/url"; while [ ! -f "$D/done" ]; do sleep 0.1; done`},
		Env: map[string]string{"D": shared}})
	if err != nil {
		t.Fatal(err)
	}
	readLinesUntil(t, filepath.Join(shared, "url"))
	thief, _, err := op.Submit(ctx, wire.SubmitRequest{Queue: "pair", Argv: []string{"/bin/sh", "-c",
		`echo stolen > loot; NYMPH_LIFECYCLE_URL=$(cat "$D/url") "$NYMPH" publish loot; echo "exit: $?"`},
		Env: map[string]string{"D": shared, "NYMPH": bin(t, "nymph")}})
	if err != nil {
		t.Fatal(err)
	}
	got := waitTerminal(t, op, thief.InvocationID, time.Minute)
	if !strings.Contains(got.StdoutTail, "exit: 1") || !strings.Contains(got.StderrTail, "403") {
		t.Errorf("another invocation's publish into a running attempt: stdout %q stderr %q; want refused with 403", got.StdoutTail, got.StderrTail)
	}
	url := readLinesUntil(t, filepath.Join(shared, "url"))[0]
	if code := httpDo(t, http.MethodPost, url+"/publish", `{"path":"mine"}`); code != 403 {
		t.Errorf("a process outside every run publishing: %d, want 403", code)
	}
	if err := os.WriteFile(filepath.Join(shared, "done"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitTerminal(t, op, victim.InvocationID, time.Minute)
	list, err := op.InvocationArtifacts(ctx, victim.InvocationID)
	if err != nil || len(list.Artifacts) != 0 {
		t.Errorf("the first body's artifacts: %s (%v), want none", artifactNames(list), err)
	}
}

// readLinesUntil waits for path to exist and reports its lines.
func readLinesUntil(t *testing.T, path string) []string {
	t.Helper()
	var lines []string
	waittest.Until(t, time.Minute, filepath.Base(path)+" written", func() bool {
		lines = readLines(t, path)
		return len(lines) > 0
	})
	return lines
}
