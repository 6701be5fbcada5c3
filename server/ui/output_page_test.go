package ui_test

import (
	"bytes"
	"fmt"
	"html"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// shipped is output an attempt ships: data of a stream, in the chunks of
// at most size bytes a worker would send.
type shipped struct {
	stream string
	data   []byte
	size   int
}

// claimAndShip has a new worker on queue claim inv (its attempt 1) and
// ship outs, in order.
func (s served) claimAndShip(t *testing.T, queue string, inv wire.Invocation, outs ...shipped) {
	t.Helper()
	ctx := t.Context()
	w, err := client.New(s.url, enrollToken).Hello(ctx, wire.HelloRequest{MachineID: "m-" + inv.InvocationID, BootID: "b", Lanes: []string{queue}})
	if err != nil {
		t.Fatal(err)
	}
	daemon := client.New(s.url, w.Token)
	if poll, err := daemon.Poll(ctx, wire.PollRequest{WorkerID: w.WorkerID, Queue: queue, Phase: wire.PhaseReady}); err != nil || len(poll.Commands) != 1 {
		t.Fatalf("poll: %+v, %v", poll, err)
	}
	at, seq := time.Now().UTC(), 0
	var chunks []wire.LogChunk
	for _, o := range outs {
		for data := o.data; len(data) > 0; {
			n := min(len(data), o.size)
			chunks = append(chunks, wire.LogChunk{Seq: seq, Stream: o.stream, Data: data[:n], At: at})
			data, seq = data[n:], seq+1
		}
	}
	for len(chunks) > 0 {
		n := min(len(chunks), 2) // under the bytes one request may carry
		if _, err := daemon.ShipLogs(ctx, wire.LogsRequest{WorkerID: w.WorkerID,
			Logs: []wire.LogBatch{{InvocationID: inv.InvocationID, Attempt: 1, Chunks: chunks[:n]}}}); err != nil {
			t.Fatalf("ship chunks %d-: %v", chunks[0].Seq, err)
		}
		chunks = chunks[n:]
	}
}

var (
	preStdout = regexp.MustCompile(`(?s)<pre class="log" id="stdout">(.*?)</pre>`)
	omitted   = regexp.MustCompile(`<p class="omitted" id="stdout-omitted">([^<]*)</p>`)
	download  = regexp.MustCompile(`id="stdout-download" href="([^"]+)"`)
)

// TestInvocationPageOutput: a 130 KiB stdout shows its last lines from a
// line's start, says how much comes before them, and links the whole
// stream, which downloads byte for byte (stderr apart); a coloured line
// is a span of its colour class, its escapes gone; another attempt than
// the invocation ran, a bad attempt or stream, and a download without a
// session are refused.
func TestInvocationPageOutput(t *testing.T) {
	s := serve(t)
	inv := s.submit(t, "q", "/bin/sh", "-c", "exec ./print")
	var out bytes.Buffer
	for i := range 3000 {
		fmt.Fprintf(&out, "line %04d %s\n", i, strings.Repeat("x", 34))
	}
	out.WriteString("\x1b[31mthe end\x1b[0m <b>bold?</b>\n")
	stdout := out.Bytes()
	// Chunks of 30,000 bytes: their borders fall mid-line.
	s.claimAndShip(t, "q", inv, shipped{domain.LogStdout, stdout[:60000], 30000}, shipped{domain.LogStderr, []byte("warn\n"), 100},
		shipped{domain.LogStdout, stdout[60000:], 30000})

	s.do(t, "POST", "/ui/login", url.Values{"token": {operatorToken}})
	for _, path := range []string{"/ui/invocations/" + inv.InvocationID, "/ui/invocations/" + inv.InvocationID + "/live"} {
		resp, body := s.do(t, "GET", path, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, body)
		}
		if strings.HasSuffix(path, "/live") {
			body = strings.NewReplacer(`\n`, "\n", `\u003c`, "<", `\u003e`, ">", `\u0026`, "&", `\"`, `"`).Replace(body)
		}
		m := preStdout.FindStringSubmatch(body)
		if m == nil {
			t.Fatalf("%s: no stdout box", path)
		}
		shown := m[1]
		if want := `<span class="ansi-fg-1">the end</span> &lt;b&gt;bold?&lt;/b&gt;` + "\n"; !strings.HasSuffix(shown, want) {
			t.Errorf("%s: stdout ends %q, want %q (the colour a span, the markup text)", path, shown[max(0, len(shown)-80):], want)
		}
		if strings.Contains(shown, "[31m") || strings.Contains(shown, `\x1b`) {
			t.Errorf("%s: the escape shows as text", path)
		}
		if !regexp.MustCompile(`^line \d{4} x{34}\n`).MatchString(shown) {
			t.Errorf("%s: stdout starts mid-line: %q", path, shown[:min(len(shown), 60)])
		}
		// What the box shows is the end of the stream; the note says how
		// much of it comes before.
		text := html.UnescapeString(regexp.MustCompile(`<[^>]*>`).ReplaceAllString(shown, ""))
		plain := strings.NewReplacer("\x1b[31m", "", "\x1b[0m", "").Replace(string(stdout))
		if !strings.HasSuffix(plain, text) {
			t.Fatalf("%s: the box's text is not the stream's end", path)
		}
		before := len(stdout) - (len(text) + len("\x1b[31m\x1b[0m"))
		n := omitted.FindStringSubmatch(body)
		if want := fmt.Sprintf("%.1f KiB of earlier output not shown", float64(before)/1024); n == nil || n[1] != want {
			t.Errorf("%s: the note on what is left out: %v, want %q", path, n, want)
		}
		if len(text) < 16<<10 {
			t.Errorf("%s: only %d bytes shown", path, len(text))
		}
	}

	_, page := s.do(t, "GET", "/ui/invocations/"+inv.InvocationID, nil)
	href := download.FindStringSubmatch(page)
	if href == nil {
		t.Fatal("no download link for stdout")
	}
	resp, body := s.do(t, "GET", html.UnescapeString(href[1]), nil)
	if resp.StatusCode != 200 || body != string(stdout) {
		t.Fatalf("the download: %d, %d bytes; want 200 and the %d bytes of stdout", resp.StatusCode, len(body), len(stdout))
	}
	if cd := resp.Header.Get("Content-Disposition"); !strings.HasPrefix(cd, "attachment;") || !strings.Contains(cd, inv.InvocationID+"-attempt-1-stdout.log") {
		t.Errorf("Content-Disposition %q", cd)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/plain; charset=utf-8" {
		t.Errorf("Content-Type %q", ct)
	}
	base := "/ui/invocations/" + inv.InvocationID
	if resp, body := s.do(t, "GET", base+"/output?attempt=1&stream=stderr", nil); resp.StatusCode != 200 || body != "warn\n" {
		t.Errorf("stderr's download: %d %q", resp.StatusCode, body)
	}
	for path, status := range map[string]int{
		base + "/output?attempt=1&stream=stdin":  400,
		base + "/output?attempt=x&stream=stdout": 400,
		base + "/output?attempt=2&stream=stdout": 404,
		base + "?attempt=2":                      404,
		base + "?attempt=0":                      400,
	} {
		if resp, _ := s.do(t, "GET", path, nil); resp.StatusCode != status {
			t.Errorf("%s: %d, want %d", path, resp.StatusCode, status)
		}
	}
	s.do(t, "POST", "/ui/logout", url.Values{"csrf": {csrfOf(t, page)}})
	if resp, body := s.do(t, "GET", html.UnescapeString(href[1]), nil); resp.StatusCode == 200 || strings.Contains(body, "line 0001") {
		t.Errorf("a download without a session: %d, %d bytes", resp.StatusCode, len(body))
	}
}

// csrfOf reads a page's CSRF token.
func csrfOf(t *testing.T, page string) string {
	t.Helper()
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(page)
	if m == nil {
		t.Fatal("no CSRF token on the page")
	}
	return m[1]
}

// TestAStreamOnlyBeforeTheTailIsLinked: stderr written early, then more
// stdout chunks than the page reads: stderr has no chunk among those read,
// yet the page links its whole stream and says why its box is empty; a
// short output, read whole, shows no stderr at all.
func TestAStreamOnlyBeforeTheTailIsLinked(t *testing.T) {
	s := serve(t)
	early := s.submit(t, "q", "early-stderr")
	s.claimAndShip(t, "q", early, shipped{domain.LogStderr, []byte("early warning\n"), 100},
		shipped{domain.LogStdout, bytes.Repeat([]byte("out\n"), 80), 4})
	short := s.submit(t, "q", "short")
	s.claimAndShip(t, "q", short, shipped{domain.LogStdout, []byte("just this\n"), 100})
	s.do(t, "POST", "/ui/login", url.Values{"token": {operatorToken}})

	_, page := s.do(t, "GET", "/ui/invocations/"+early.InvocationID, nil)
	m := regexp.MustCompile(`id="stderr-download" href="([^"]+)"`).FindStringSubmatch(page)
	if m == nil || !strings.Contains(page, `id="stderr-omitted">none of the last 64 chunks read is stderr`) {
		t.Fatalf("no stderr link or note for a stderr written before the chunks read:\n%s", page)
	}
	if resp, body := s.do(t, "GET", html.UnescapeString(m[1]), nil); resp.StatusCode != 200 || body != "early warning\n" {
		t.Errorf("stderr's download: %d %q", resp.StatusCode, body)
	}
	if _, page := s.do(t, "GET", "/ui/invocations/"+short.InvocationID, nil); strings.Contains(page, `id="stderr`) {
		t.Errorf("a short output read whole shows a stderr:\n%s", page)
	}
}
