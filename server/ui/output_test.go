package ui_test

import (
	"fmt"
	"html"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestInvocationOutputIsTheTail: an attempt that shipped 1,000 one-line
// chunks shows its last line at the end of the invocation page's output,
// in the page and in its live part.
func TestInvocationOutputIsTheTail(t *testing.T) {
	s := serve(t)
	ctx := t.Context()
	inv := s.submit(t, "q", "seq", "1000")
	w, err := client.New(s.url, enrollToken).Hello(ctx, wire.HelloRequest{MachineID: "m-1", BootID: "b", Lanes: []string{"q"}})
	if err != nil {
		t.Fatal(err)
	}
	daemon := client.New(s.url, w.Token)
	if poll, err := daemon.Poll(ctx, wire.PollRequest{WorkerID: w.WorkerID, Queue: "q", Phase: wire.PhaseReady}); err != nil || len(poll.Commands) != 1 {
		t.Fatalf("poll: %+v, %v", poll, err)
	}
	at := time.Now().UTC()
	for from := 0; from < 1000; from += 100 {
		var chunks []wire.LogChunk
		for seq := from; seq < from+100; seq++ {
			chunks = append(chunks, wire.LogChunk{Seq: seq, Stream: domain.LogStdout, Data: fmt.Appendf(nil, "line %d\n", seq), At: at})
		}
		if _, err := daemon.ShipLogs(ctx, wire.LogsRequest{WorkerID: w.WorkerID,
			Logs: []wire.LogBatch{{InvocationID: inv.InvocationID, Attempt: 1, Chunks: chunks}}}); err != nil {
			t.Fatalf("ship chunks %d-%d: %v", from, from+99, err)
		}
	}

	s.do(t, "POST", "/ui/login", url.Values{"token": {operatorToken}})
	for _, path := range []string{"/ui/invocations/" + inv.InvocationID, "/ui/invocations/" + inv.InvocationID + "/live"} {
		resp, body := s.do(t, "GET", path, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, body)
		}
		body = strings.ReplaceAll(body, `\n`, "\n")
		if !strings.Contains(body, "line 998\nline 999\n") {
			i := strings.LastIndex(body, "line ")
			t.Errorf("%s does not end its output at line 999; its last line: %q", path, html.UnescapeString(body[max(i, 0):min(i+12, len(body))]))
		}
	}
}
