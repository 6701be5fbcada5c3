package tests

import (
	"context"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/artifacttest"
	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestNymphPublish: a shell body of a real nymph process runs `nymph
// publish` for a file and a directory, and is refused a path outside its
// run directory and a symbolic link out of it; the artifacts arrive
// through the presign, PUT and complete calls, made with the worker that
// holds the attempt. The artifact routes are a fake in front of a real
// `lakeshore dev`, which answers everything else.
func TestNymphPublish(t *testing.T) {
	d := startDev(t, backends[0])
	target, err := url.Parse(d.URL)
	if err != nil {
		t.Fatal(err)
	}
	plane := artifacttest.New(t)
	plane.Next = httputil.NewSingleHostReverseProxy(target)
	front := *d
	front.URL = plane.URL
	startNymph(t, &front, "publisher")

	nymph := bin(t, "nymph")
	script := `set -u
printf hello > out.txt
mkdir -p d/sub && printf x > d/sub/y && printf z > d/top
ln -s /etc/passwd leak
"$NYMPH" publish out.txt
"$NYMPH" publish ./d --name dir
"$NYMPH" publish /etc/passwd; echo "outside: $?"
"$NYMPH" publish leak; echo "leak: $?"
"$NYMPH" publish out.txt --name 'a/b'; echo "bad name: $?"`
	op := d.Operator()
	inv, _, err := op.Submit(context.Background(), wire.SubmitRequest{Queue: "q", Argv: []string{"/bin/sh", "-c", script},
		Env: map[string]string{"NYMPH": nymph}})
	if err != nil {
		t.Fatal(err)
	}
	var got wire.Invocation
	waittest.Until(t, 2*time.Minute, "the publishing body to end", func() bool {
		got, err = op.GetInvocation(context.Background(), inv.InvocationID)
		return err == nil && wire.Terminal(got.State)
	})
	if got.State != wire.StateSucceeded {
		t.Fatalf("the body: %s; stdout %q stderr %q", got.State, got.StdoutTail, got.StderrTail)
	}
	for _, want := range []string{"published out.txt: 5 bytes, sha256 2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824 (attempt 1)",
		"published dir: ", "outside: 1", "leak: 1", "bad name: 1"} {
		if !strings.Contains(got.StdoutTail, want) {
			t.Errorf("the body's output lacks %q: %q (stderr %q)", want, got.StdoutTail, got.StderrTail)
		}
	}
	for _, want := range []string{"outside the run directory", "path escapes", "a/b"} {
		if !strings.Contains(got.StderrTail, want) {
			t.Errorf("the refusals lack %q: %q", want, got.StderrTail)
		}
	}
	b, rec, ok := plane.Got("out.txt")
	if req := plane.Request("out.txt"); !ok || string(b) != "hello" || rec.Attempt != 1 || req.InvocationID != inv.InvocationID || !strings.HasPrefix(req.WorkerID, "wrk_") {
		t.Errorf("out.txt: %q %+v, asked as %+v", b, rec, req)
	}
	if _, rec, ok := plane.Got("dir"); !ok || rec.ContentType != "application/vnd.lakeshore.directory+tar+gzip" {
		t.Errorf("dir: %v %+v", ok, rec)
	}
	if n := plane.Presigns(); n != 2 {
		t.Errorf("%d presigns, want 2: nothing refused reaches the control plane", n)
	}
}
