package ui_test

import (
	"net/url"
	"strings"
	"testing"

	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// submit submits argv to queue through the operator API.
func (s served) submit(t *testing.T, queue string, argv ...string) wire.Invocation {
	t.Helper()
	inv, _, err := s.op.Submit(t.Context(), wire.SubmitRequest{Queue: queue, Argv: argv})
	if err != nil {
		t.Fatalf("submit to %s: %v", queue, err)
	}
	return inv
}

// TestFleetShowsLiveWorkPastTheListLimit: with 1,200 finished invocations
// stored (more than one listing page of 500), the fleet page and its live
// parts show the running and queued ones submitted last, and filtered by
// queue and state the oldest queued invocation, submitted first.
func TestFleetShowsLiveWorkPastTheListLimit(t *testing.T) {
	s := serve(t)
	ctx := t.Context()
	oldest := s.submit(t, "slow", "first")
	for i := range 1200 {
		inv := s.submit(t, "q", "done", strings.Repeat("x", i%7))
		if _, err := s.op.CancelInvocation(ctx, inv.InvocationID); err != nil {
			t.Fatalf("cancel %d: %v", i, err)
		}
	}
	running := s.submit(t, "q", "sleep", "20")
	w, err := client.New(s.url, enrollToken).Hello(ctx, wire.HelloRequest{MachineID: "m-1", BootID: "b", Lanes: []string{"q"}})
	if err != nil {
		t.Fatal(err)
	}
	poll, err := client.New(s.url, w.Token).Poll(ctx, wire.PollRequest{WorkerID: w.WorkerID, Queue: "q", Phase: wire.PhaseReady})
	if err != nil || len(poll.Commands) != 1 || poll.Commands[0].Invocation.InvocationID != running.InvocationID {
		t.Fatalf("the worker's poll: %+v, %v; want it to run %s", poll, err, running.InvocationID)
	}
	queued := s.submit(t, "q", "last")

	s.do(t, "POST", "/ui/login", url.Values{"token": {operatorToken}})
	// The list, newest first, shows the running and the last queued; its
	// state and queue filters read the oldest queued by index.
	for _, c := range []struct {
		query string
		want  []wire.Invocation
	}{{"", []wire.Invocation{running, queued}}, {"?queue=slow&state=queued", []wire.Invocation{oldest}}, {"?state=running", []wire.Invocation{running}}} {
		for _, path := range []string{"/ui/", "/ui/live"} {
			resp, body := s.do(t, "GET", path+c.query, nil)
			if resp.StatusCode != 200 {
				t.Fatalf("%s%s: %d %s", path, c.query, resp.StatusCode, body)
			}
			for _, inv := range c.want {
				row := `data-invocation=` + attr(path, `"`+inv.InvocationID+`"`)
				if !strings.Contains(body, row) {
					t.Errorf("%s%s does not list %s (%s)", path, c.query, inv.InvocationID, inv.Argv[0])
				}
			}
			if len(body) > 100<<10 {
				t.Errorf("%s weighs %d bytes; the budget is 100 KB", path, len(body))
			}
		}
	}
}

// attr is s as it reads in the page at path: the live parts are HTML in
// JSON strings, whose quotes are escaped.
func attr(path, s string) string {
	if strings.HasSuffix(path, "/live") {
		return strings.ReplaceAll(s, `"`, `\"`)
	}
	return s
}

// TestLabelBidiControlsShowEscaped: a worker label holding a right-to-left
// override (U+202E) shows it as the escape \u202e, in the fleet page and
// its live parts, never as the character that would reorder the text.
func TestLabelBidiControlsShowEscaped(t *testing.T) {
	s := serve(t)
	label := "build-\u202egnp.exe"
	if _, err := client.New(s.url, enrollToken).Hello(t.Context(), wire.HelloRequest{MachineID: "m-1", BootID: "b", Label: label,
		Lanes: []string{"q"}}); err != nil {
		t.Fatal(err)
	}
	s.do(t, "POST", "/ui/login", url.Values{"token": {operatorToken}})
	for _, path := range []string{"/ui/", "/ui/live"} {
		_, body := s.do(t, "GET", path, nil)
		if strings.ContainsRune(body, '\u202e') {
			t.Errorf("%s keeps the U+202E of the label", path)
		}
		if want := attrEscaped(path, `build-\u202egnp.exe`); !strings.Contains(body, want) {
			t.Errorf("%s does not show the label as %s", path, want)
		}
	}
}

// attrEscaped is text holding backslashes as it reads in the page at path
// (the live parts are JSON strings: a backslash is doubled).
func attrEscaped(path, s string) string {
	if strings.HasSuffix(path, "/live") {
		return strings.ReplaceAll(s, `\`, `\\`)
	}
	return s
}

// TestOldestQueuedOfEveryQueue: a queue whose queued work is past the
// first page of queued work (other queues' older work fills it) still
// shows its oldest queued one's age.
func TestOldestQueuedOfEveryQueue(t *testing.T) {
	s := serve(t)
	for range 501 {
		s.submit(t, "a", "older")
	}
	s.submit(t, "b", "newer")
	s.do(t, "POST", "/ui/login", url.Values{"token": {operatorToken}})
	_, body := s.do(t, "GET", "/ui/", nil)
	for _, q := range []string{"a", "b"} {
		row := `<tr class="queue" data-queue="` + q + `">`
		i := strings.Index(body, row)
		if i < 0 {
			t.Fatalf("no row for queue %s", q)
		}
		if cells := body[i : i+strings.Index(body[i:], "</tr>")]; strings.Contains(cells, "—") {
			t.Errorf("queue %s shows no oldest queued age: %s", q, cells)
		}
	}
}
