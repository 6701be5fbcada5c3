package ui

import (
	"bytes"
	"context"
	"fmt"
	"html/template"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"unicode/utf8"

	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// logTailBytes is how much of each stream the invocation page shows: its
// last lines, from a line's start, and a link to the whole stream.
const logTailBytes = 32 << 10

// logTailChunks is how many of the last chunks of an attempt's output the
// invocation page reads (the most one read answers).
const logTailChunks = 64

// outputView is the output the invocation page shows: one attempt's.
type outputView struct {
	// Attempt is the attempt shown (0: none ran yet); Pinned is the one
	// the page's URL asks for (?attempt=N), 0 for the latest.
	Attempt, Pinned int
	Streams         []streamView
}

// streamView is one stream of the attempt shown.
type streamView struct {
	Name string // domain.LogStdout or domain.LogStderr: also the <pre>'s id
	HTML template.HTML
	// Omitted says how much earlier output the page leaves out ("" for
	// none).
	Omitted string
	// Download is the whole stream's URL ("" when nothing was shipped).
	Download string
}

// outputSegment is a piece of a stream's tail: its bytes, or the cap's
// marker of how many were left out just there.
type outputSegment struct {
	data    []byte
	dropped int64
}

// streamTail is the end of one stream of an attempt as the page shows it.
type streamTail struct {
	segs []outputSegment
	// before is how many bytes of the stream come before segs (left out
	// ones counted), when known.
	before      int64
	beforeKnown bool
	shipped     bool
}

// tailOf takes the last limit bytes of stream's chunks (the last chunks
// of an attempt, in order, from seq first), starting at a line's start: a
// cut line is left out whole unless the tail is one line, which then starts
// at a character's start. Where the stream starts before the chunks read,
// the chunks' End says how much comes before.
func tailOf(chunks []wire.LogChunk, stream string, limit int) streamTail {
	var t streamTail
	budget, whole := limit, true
	for i := len(chunks) - 1; i >= 0; i-- {
		c := chunks[i]
		if c.Stream != stream {
			continue
		}
		t.shipped = true
		if len(c.Data) > budget {
			cut := c.Data[len(c.Data)-budget:]
			if len(c.Data) > len(cut) && c.Data[len(c.Data)-len(cut)-1] != '\n' {
				if nl := bytes.IndexByte(cut, '\n'); nl >= 0 {
					cut = cut[nl+1:]
				} else {
					for len(cut) > 0 && !utf8.RuneStart(cut[0]) {
						cut = cut[1:]
					}
				}
			}
			t.segs = append([]outputSegment{{data: cut}}, t.segs...)
			t.before, t.beforeKnown = c.End-int64(len(cut)), c.End > 0
			return t
		}
		t.segs = append([]outputSegment{{data: c.Data}}, t.segs...)
		budget -= len(c.Data)
		if c.Dropped > 0 {
			t.segs = append([]outputSegment{{dropped: c.Dropped}}, t.segs...)
		}
		t.before, t.beforeKnown = c.End-int64(len(c.Data))-c.Dropped, c.End > 0
		if budget == 0 {
			whole = false
			break
		}
	}
	if whole && !t.beforeKnown && len(chunks) > 0 && chunks[0].Seq == 0 {
		t.before, t.beforeKnown = 0, true // every chunk of the attempt is in
	}
	t.before = max(t.before, 0)
	return t
}

// render is the tail as the page shows it.
func (t streamTail) render(stream string) template.HTML {
	var r ansiRenderer
	for _, s := range t.segs {
		if s.dropped > 0 {
			r.note(droppedNote(s.dropped, stream) + "\n")
			continue
		}
		r.write(string(s.data))
	}
	return r.html()
}

// omitted says what of the stream the page leaves out before the tail.
func (t streamTail) omitted() string {
	switch {
	case !t.beforeKnown:
		return "earlier output not shown"
	case t.before > 0:
		return byteSize(t.before) + " of earlier output not shown"
	}
	return ""
}

// droppedNote is the line that marks where nymph left bytes of a stream
// out (docs/logs.md), as `lakeshore logs` prints it.
func droppedNote(n int64, stream string) string {
	return fmt.Sprintf("[lakeshore] %d bytes of %s left out here (over the per-attempt cap; its head and tail are kept)", n, stream)
}

// output reads the tail of attempt n's output (0: the latest; its last
// chunks, what `lakeshore logs` ends with); an attempt whose output was
// not shipped shows its ack's tails when it is the invocation's latest.
func (u *UI) output(ctx context.Context, inv wire.Invocation, n int) outputView {
	v := outputView{Attempt: inv.Attempt, Pinned: n}
	if n > 0 {
		v.Attempt = n
	}
	tails := map[string]streamTail{}
	// laterOnly: the chunks read start after the attempt's first, so a
	// stream none of them holds may still have earlier output.
	laterOnly := false
	if v.Attempt > 0 {
		if page, err := u.api.LogsTail(ctx, inv.InvocationID, v.Attempt, logTailChunks); err == nil {
			for _, s := range []string{domain.LogStdout, domain.LogStderr} {
				tails[s] = tailOf(page.Chunks, s, logTailBytes)
			}
			laterOnly = len(page.Chunks) > 0 && page.Chunks[0].Seq > 0
		} else {
			u.log.Warn("ui: read output", "invocation_id", inv.InvocationID, "attempt", v.Attempt, "error", err.Error())
		}
	}
	ackTails := v.Attempt == inv.Attempt && !tails[domain.LogStdout].shipped && !tails[domain.LogStderr].shipped
	for _, s := range []string{domain.LogStdout, domain.LogStderr} {
		t, sv := tails[s], streamView{Name: s}
		switch {
		case ackTails:
			sv.HTML = ansiHTML(map[string]string{domain.LogStdout: inv.StdoutTail, domain.LogStderr: inv.StderrTail}[s])
		case t.shipped:
			sv.HTML, sv.Omitted = t.render(s), t.omitted()
			sv.Download = outputHref(inv.InvocationID, v.Attempt, s)
		case laterOnly:
			sv.Omitted = fmt.Sprintf("none of the last %d chunks read is %s: any earlier %s is in the download", logTailChunks, s, s)
			sv.Download = outputHref(inv.InvocationID, v.Attempt, s)
		}
		if s == domain.LogStdout || sv.HTML != "" || sv.Download != "" {
			v.Streams = append(v.Streams, sv)
		}
	}
	return v
}

// outputHref is the URL of the whole stream of attempt n of invocation id.
func outputHref(id string, n int, stream string) string {
	return "/ui/invocations/" + url.PathEscape(id) + "/output?" +
		url.Values{"attempt": {strconv.Itoa(n)}, "stream": {stream}}.Encode()
}

// attemptParam reads ?attempt= (1 up to the most attempts an invocation
// may have; absent: 0, the latest).
func attemptParam(r *http.Request) (int, error) {
	v := r.URL.Query().Get("attempt")
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > wire.MaxAttemptNumber {
		return 0, wire.Errorf(wire.CodeInvalid, "attempt must be 1-%d, got %q", wire.MaxAttemptNumber, v)
	}
	return n, nil
}

// maxOutputPages bounds the reads of one download: every page holds at
// least one chunk, and an attempt has at most domain.MaxLogChunks.
const maxOutputPages = domain.MaxLogChunks

// wholeOutput answers GET /ui/invocations/{id}/output?attempt=N&stream=S:
// the whole shipped stream S of attempt N (absent: the latest) as a text
// download, with the cap's markers where nymph left bytes out. It is
// written a page of chunks at a time, so a long output is never held
// whole.
func (u *UI) wholeOutput(w http.ResponseWriter, r *http.Request, _ string) {
	stream := r.URL.Query().Get("stream")
	if stream != domain.LogStdout && stream != domain.LogStderr {
		http.Error(w, "stream must be stdout or stderr", http.StatusBadRequest)
		return
	}
	n, err := attemptParam(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ctx := r.Context()
	page, err := u.api.Logs(ctx, r.PathValue("id"), n, 0)
	if err != nil {
		http.Error(w, "read output: "+err.Error(), statusOf(err))
		return
	}
	name := fmt.Sprintf("%s-attempt-%d-%s.log", page.InvocationID, page.Attempt, stream)
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": name}))
	for pages := 0; len(page.Chunks) > 0 && pages < maxOutputPages; pages++ {
		for _, c := range page.Chunks {
			if c.Stream != stream {
				continue
			}
			if c.Dropped > 0 {
				if _, err := io.WriteString(w, "\n"+droppedNote(c.Dropped, stream)+"\n"); err != nil {
					return
				}
			}
			if _, err := w.Write(c.Data); err != nil {
				return
			}
		}
		if page.Chunks[len(page.Chunks)-1].EOF {
			return // the attempt's last chunk: nothing follows
		}
		next, err := u.api.Logs(ctx, page.InvocationID, page.Attempt, page.Next)
		if err != nil {
			// The answer is under way: its status is sent. A cut download
			// ends short; the log says why.
			u.log.Error("ui: download output", "invocation_id", page.InvocationID, "attempt", page.Attempt, "error", err.Error())
			return
		}
		page = next
	}
}
