package ui_test

import (
	"html"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// listed reports the invocation ids a fleet page (or its live parts) lists,
// in order, and its older and newer links.
func listed(body string) (ids []string, older, newer string) {
	body = strings.ReplaceAll(body, `\"`, `"`)
	body = strings.NewReplacer(`\u0026`, `&`, `\u003c`, `<`, `\u003e`, `>`).Replace(body)
	for _, m := range regexp.MustCompile(`<tr class="invocation" data-invocation="([^"]+)"`).FindAllStringSubmatch(body, -1) {
		ids = append(ids, m[1])
	}
	link := func(id string) string {
		m := regexp.MustCompile(`href="([^"]+)" id="` + id + `"`).FindStringSubmatch(body)
		if m == nil {
			return ""
		}
		return html.UnescapeString(m[1])
	}
	return ids, link("page-older"), link("page-newer")
}

// TestRecentListPagesAndFilters: the fleet page's list, newest first,
// pages 50 at a time (older, then newer back to the same page), filters by
// state and queue, finds an invocation by its exact id (any case, with or
// without inv_) and by the first characters of its id; the live parts read
// the same page; a cursor, state, queue or id no page hands out answers
// 400 on the page and on its live parts.
func TestRecentListPagesAndFilters(t *testing.T) {
	s := serve(t)
	ctx := t.Context()
	var all []wire.Invocation
	for i := range 120 {
		queue := "q"
		if i%3 == 0 {
			queue = "other"
		}
		inv := s.submit(t, queue, "job", strings.Repeat("x", i%5))
		if i%2 == 0 {
			if _, err := s.op.CancelInvocation(ctx, inv.InvocationID); err != nil {
				t.Fatal(err)
			}
		}
		all = append(all, inv)
	}
	newest := func(keep func(wire.Invocation) bool) []string {
		var out []string
		for _, inv := range slices.Backward(all) {
			if keep(inv) {
				out = append(out, inv.InvocationID)
			}
		}
		return out
	}
	every := newest(func(wire.Invocation) bool { return true })
	s.do(t, "POST", "/ui/login", url.Values{"token": {operatorToken}})
	get := func(path string) string {
		t.Helper()
		resp, body := s.do(t, "GET", path, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, body)
		}
		return body
	}
	first, older, newer := listed(get("/ui/"))
	if !slices.Equal(first, every[:50]) || older == "" || newer != "" {
		t.Fatalf("first page: %d ids (want the newest 50), older %q, newer %q", len(first), older, newer)
	}
	second, older2, newer2 := listed(get(older))
	if !slices.Equal(second, every[50:100]) || older2 == "" || newer2 == "" {
		t.Fatalf("second page: %v, want the next 50; older %q newer %q", second, older2, newer2)
	}
	// The live parts of the second page read the second page.
	live := strings.Replace(older, "/ui/?", "/ui/live?", 1)
	if got, _, _ := listed(get(live)); !slices.Equal(got, second) {
		t.Errorf("live parts of the second page: %v", got)
	}
	third, older3, _ := listed(get(older2))
	if !slices.Equal(third, every[100:]) || older3 != "" {
		t.Errorf("third page: %v (older %q), want the last 20 and no older", third, older3)
	}
	if back, _, _ := listed(get(newer2)); !slices.Equal(back, first) {
		t.Errorf("newer from the second page: %v, want the first page", back)
	}
	// Newer from the third page is the second.
	_, _, newer3 := listed(get(older2))
	if back, _, _ := listed(get(newer3)); !slices.Equal(back, second) {
		t.Errorf("newer from the third page: %v, want the second", back)
	}

	// Filters: state, queue and state, paged.
	cancelledOther := newest(func(inv wire.Invocation) bool { return inv.Queue == "other" })
	cancelledOther = slices.DeleteFunc(cancelledOther, func(id string) bool {
		i := slices.IndexFunc(all, func(inv wire.Invocation) bool { return inv.InvocationID == id })
		return i%2 != 0
	})
	if got, _, _ := listed(get("/ui/?queue=other&state=cancelled")); !slices.Equal(got, cancelledOther) {
		t.Errorf("other, cancelled: %v, want %v", got, cancelledOther)
	}
	queued := newest(func(inv wire.Invocation) bool {
		return slices.IndexFunc(all, func(x wire.Invocation) bool { return x.InvocationID == inv.InvocationID })%2 != 0
	})
	got, olderQ, _ := listed(get("/ui/?state=queued"))
	if !slices.Equal(got, queued[:50]) || olderQ == "" || !strings.Contains(olderQ, "state=queued") {
		t.Fatalf("queued: %d ids, older %q", len(got), olderQ)
	}
	if got, _, _ := listed(get(olderQ)); !slices.Equal(got, queued[50:]) {
		t.Errorf("queued, page 2: %v, want %v", got, queued[50:])
	}

	// By id: exact (lower case, without inv_), and by its first characters.
	pick := all[37].InvocationID
	if got, _, _ := listed(get("/ui/?id=" + strings.ToLower(strings.TrimPrefix(pick, "inv_")))); !slices.Equal(got, []string{pick}) {
		t.Errorf("exact id: %v, want %s", got, pick)
	}
	prefix := pick[:len(pick)-3]
	want := newest(func(inv wire.Invocation) bool { return strings.HasPrefix(inv.InvocationID, prefix) })
	if got, _, _ := listed(get("/ui/?id=" + prefix)); !slices.Equal(got, want) || len(want) == 0 {
		t.Errorf("id prefix %s: %v, want %v", prefix, got, want)
	}
	if body := get("/ui/?id=inv_00000000000000000000000000"); !strings.Contains(body, "No invocation inv_00000000000000000000000000.") {
		t.Errorf("an unknown id: no note in %s", body)
	}

	// What no page hands out: 400, on the page and its live parts.
	for _, q := range []string{"after=%21%21", "after=" + strings.Repeat("A", 600), "after=eyJ4IjoiMSJ9", "before=eyJ4IjoiMSJ9",
		"state=sleeping", "queue=%3Cscript%3E", "id=inv_%3Cb%3E", "after=QQ&before=QQ"} {
		for _, path := range []string{"/ui/?", "/ui/live?"} {
			resp, body := s.do(t, "GET", path+q, nil)
			if resp.StatusCode != 400 || strings.Contains(body, "<script>") || strings.Contains(body, "<b>") {
				t.Errorf("GET %s%s: %d %s, want 400 with the value escaped", path, q, resp.StatusCode, body)
			}
		}
	}
}

// TestRecentListColumns: a row shows the command (cut to 60 characters
// with …, its hidden characters escaped, whole as its title), how long it
// ran and its exit code.
func TestRecentListColumns(t *testing.T) {
	s := serve(t)
	ctx := t.Context()
	long := s.submit(t, "q", "/bin/echo", strings.Repeat("a", 80), "\x1b[31m")
	w, err := client.New(s.url, enrollToken).Hello(ctx, wire.HelloRequest{MachineID: "m-1", BootID: "b", Lanes: []string{"q"}})
	if err != nil {
		t.Fatal(err)
	}
	daemon := client.New(s.url, w.Token)
	if _, err := daemon.Poll(ctx, wire.PollRequest{WorkerID: w.WorkerID, Queue: "q", Phase: wire.PhaseReady}); err != nil {
		t.Fatal(err)
	}
	three := 3
	if _, err := daemon.Ack(ctx, wire.AckRequest{WorkerID: w.WorkerID, InvocationID: long.InvocationID, Attempt: 1,
		State: wire.StateFailed, ExitCode: &three}); err != nil {
		t.Fatal(err)
	}
	s.do(t, "POST", "/ui/login", url.Values{"token": {operatorToken}})
	_, body := s.do(t, "GET", "/ui/", nil)
	row := body[strings.Index(body, `<tr class="invocation" data-invocation="`+long.InvocationID+`"`):]
	row = row[:strings.Index(row, "</tr>")]
	cmd := "/bin/echo " + strings.Repeat("a", 49) + "…"
	for _, want := range []string{`<code>` + cmd + `</code>`, `title="/bin/echo ` + strings.Repeat("a", 80) + ` \x1b[31m"`,
		`<td class="exit">3</td>`, `data-state="failed"`} {
		if !strings.Contains(row, want) {
			t.Errorf("the row lacks %s:\n%s", want, row)
		}
	}
	// Its run time is the wall time between its claim and its ack here.
	if !regexp.MustCompile(`<td class="ran">\d+\.\d s</td>`).MatchString(row) {
		t.Errorf("the row lacks its run time:\n%s", row)
	}
}

// TestCancelFromTheListReturnsToItsPage: a row's Cancel on a filtered page
// of the list carries that page, and the cancel returns to it.
func TestCancelFromTheListReturnsToItsPage(t *testing.T) {
	s := serve(t)
	inv := s.submit(t, "nobody", "job")
	s.do(t, "POST", "/ui/login", url.Values{"token": {operatorToken}})
	_, body := s.do(t, "GET", "/ui/?queue=nobody&state=queued", nil)
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"><input type="hidden" name="back" value="([^"]+)"><button type="submit" class="cancel">`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no Cancel in the filtered list:\n%s", body)
	}
	back := html.UnescapeString(m[2])
	if u, err := url.Parse(back); err != nil || u.Path != "/ui/" || u.Query().Get("state") != "queued" || u.Query().Get("queue") != "nobody" {
		t.Fatalf("the row's Cancel returns to %q, not the filtered page", back)
	}
	resp, _ := s.do(t, "POST", "/ui/invocations/"+inv.InvocationID+"/cancel", url.Values{"csrf": {html.UnescapeString(m[1])}, "back": {back}})
	if loc := resp.Header.Get("Location"); loc != back {
		t.Fatalf("after the cancel: → %q, want %q", loc, back)
	}
}
