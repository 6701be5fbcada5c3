package ui_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"html"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/server/blobs"
	"github.com/dreamlake/lakeshore/server/blobs/blobstest"
	"github.com/dreamlake/lakeshore/server/ui"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// oddName is an artifact name a link must escape: a space, "%", "?",
// "#", "&" and non-ASCII.
const oddName = "résumé 100% done?#1&.txt"

// serveWithBlobs serves the router over the embedded store with blob
// store b.
func serveWithBlobs(t *testing.T, b *blobstest.Store) served {
	t.Helper()
	return newTables(t).serve(t, func(cfg *apitest.Config) { cfg.Control.Blobs = blobs.UseCases{Store: b} })
}

// worker is a worker of the tests' plane and its client.
type worker struct {
	id string
	c  *client.Client
}

func (s served) worker(t *testing.T, machine, queue string) worker {
	t.Helper()
	w, err := client.New(s.url, enrollToken).Hello(t.Context(), wire.HelloRequest{MachineID: machine, BootID: "b", Lanes: []string{queue}})
	if err != nil {
		t.Fatal(err)
	}
	return worker{id: w.WorkerID, c: client.New(s.url, w.Token)}
}

// claim has w claim one invocation of queue, and reports it.
func (w worker) claim(t *testing.T, queue string) wire.RunInvocation {
	t.Helper()
	poll, err := w.c.Poll(t.Context(), wire.PollRequest{WorkerID: w.id, Queue: queue, Phase: wire.PhaseReady})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range poll.Commands {
		if c.Invocation != nil {
			return *c.Invocation
		}
	}
	t.Fatalf("%s claimed nothing of %s", w.id, queue)
	return wire.RunInvocation{}
}

// publish uploads body as artifact name of attempt n of inv, as nymph
// does: presign, PUT, complete.
func (w worker) publish(t *testing.T, inv string, n int, name string, body []byte) {
	t.Helper()
	sum := sha256.Sum256(body)
	up, err := w.c.PresignArtifact(t.Context(), wire.ArtifactUploadRequest{WorkerID: w.id, InvocationID: inv, Attempt: n, Name: name,
		Size: int64(len(body)), SHA256: hex.EncodeToString(sum[:]), ContentType: "text/plain"})
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(up.Method, up.URL, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range up.Headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("PUT %s: %d", name, resp.StatusCode)
	}
	if _, err := w.c.CompleteArtifact(t.Context(), wire.ArtifactCompleteRequest{WorkerID: w.id, InvocationID: inv, Attempt: n,
		Name: name, UploadID: up.UploadID}); err != nil {
		t.Fatal(err)
	}
}

func (w worker) ack(t *testing.T, req wire.AckRequest) {
	t.Helper()
	req.WorkerID = w.id
	if _, err := w.c.Ack(t.Context(), req); err != nil {
		t.Fatalf("ack %+v: %v", req, err)
	}
}

// handedBack runs a one-job run of queue whose first attempt, on a
// worker that drains, publishes "checkpoint" ("half done") and is handed
// back; the second attempt publishes oddName ("all done") and succeeds.
// It reports the run and the job's invocation.
func handedBack(t *testing.T, s served, queue string) (run, inv string) {
	t.Helper()
	r, _, err := s.op.SubmitRun(t.Context(), wire.RunRequest{Queue: queue, MaxAttempts: 2, Jobs: []wire.RunJob{{Argv: []string{"eval"}}}})
	if err != nil {
		t.Fatal(err)
	}
	first := s.worker(t, "m-first", queue)
	inv = first.claim(t, queue).InvocationID
	first.publish(t, inv, 1, "checkpoint", []byte("half done"))
	first.ack(t, wire.AckRequest{InvocationID: inv, Attempt: 1, State: "requeued", Phase: wire.PhaseDraining})
	second := s.worker(t, "m-second", queue)
	if got := second.claim(t, queue).InvocationID; got != inv {
		t.Fatalf("the second worker claimed %s, want %s", got, inv)
	}
	second.publish(t, inv, 2, oddName, []byte("all done"))
	second.ack(t, wire.AckRequest{InvocationID: inv, Attempt: 2, State: wire.StateSucceeded, ExitCode: new(int)})
	return r.RunID, inv
}

// hrefRE finds the links of a page.
var hrefRE = regexp.MustCompile(`href="([^"]*)"`)

// artifactLinks reports the download links of page, unescaped as a
// browser reads them.
func artifactLinks(page string) []string {
	var out []string
	for _, m := range hrefRE.FindAllStringSubmatch(page, -1) {
		if strings.Contains(m[1], "/artifacts/") {
			out = append(out, html.UnescapeString(m[1]))
		}
	}
	return out
}

// download follows a download link of the view to the blob store, and
// reports the content.
func (s served) download(t *testing.T, b *blobstest.Store, link string) string {
	t.Helper()
	resp, body := s.do(t, "GET", link, nil)
	loc := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusFound || !strings.HasPrefix(loc, b.URL+"/") {
		t.Fatalf("GET %s: %d → %q %s, want 302 to the blob store", link, resp.StatusCode, loc, body)
	}
	if strings.Contains(body, b.URL) {
		t.Errorf("GET %s: the answer's body holds the signed URL: %s", link, body)
	}
	if cc, rp := resp.Header.Get("Cache-Control"), resp.Header.Get("Referrer-Policy"); cc != "no-store" || rp != "no-referrer" {
		t.Errorf("GET %s: Cache-Control %q, Referrer-Policy %q", link, cc, rp)
	}
	got, err := http.Get(loc)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Body.Close()
	content, _ := io.ReadAll(got.Body)
	if got.StatusCode != 200 {
		t.Fatalf("GET %s: %d", loc, got.StatusCode)
	}
	return string(content)
}

// TestInvocationPageArtifacts: the invocation page lists the counted
// attempt's artifact with a link to the view's download route, never the
// blob store's URL, and the handed-back attempt's apart with how it
// ended; each link (a name with a space, %, ?, # and UTF-8 among them)
// answers 302 to a fresh GET of its content, not cached; an unknown name
// or attempt answers 404, and a request without a session goes to the
// login.
func TestInvocationPageArtifacts(t *testing.T) {
	b := blobstest.New(t)
	s := serveWithBlobs(t, b)
	_, inv := handedBack(t, s, "q")
	counted := "/ui/invocations/" + inv + "/artifacts/2/" + url.PathEscape(oddName)
	if resp, _ := s.do(t, "GET", counted, nil); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ui/" {
		t.Fatalf("a download without a session: %d → %q, want the login", resp.StatusCode, resp.Header.Get("Location"))
	}
	s.do(t, "POST", "/ui/login", url.Values{"token": {operatorToken}})

	for _, path := range []string{"/ui/invocations/" + inv, "/ui/invocations/" + inv + "/live"} {
		page := s.html(t, path)
		if strings.Contains(page, b.URL) || strings.Contains(page, "/get?") {
			t.Errorf("%s holds the blob store's URL", path)
		}
		cut := strings.Index(page, `id="artifacts-other"`)
		if !strings.Contains(page, `<section id="artifacts">`) || cut < 0 {
			t.Fatalf("%s has no artifacts sections:\n%s", path, page)
		}
		own, others := artifactLinks(page[:cut]), artifactLinks(page[cut:])
		if len(own) != 1 || own[0] != counted || !strings.Contains(page[:cut], html.EscapeString(oddName)) {
			t.Errorf("%s: the counted links %q, want [%s]", path, own, counted)
		}
		if want := "/ui/invocations/" + inv + "/artifacts/1/checkpoint"; len(others) != 1 || others[0] != want ||
			!strings.Contains(page[cut:], `<td class="state requeued">requeued</td>`) {
			t.Errorf("%s: the other attempts' links %q, want [%s] marked requeued", path, others, want)
		}
		if !strings.Contains(page[:cut], "8 B") {
			t.Errorf("%s: no size of the counted artifact", path)
		}
	}

	if got := s.download(t, b, counted); got != "all done" {
		t.Errorf("the counted artifact's content %q", got)
	}
	if got := s.download(t, b, "/ui/invocations/"+inv+"/artifacts/1/checkpoint"); got != "half done" {
		t.Errorf("the handed-back attempt's content %q", got)
	}
	for _, path := range []string{
		"/ui/invocations/" + inv + "/artifacts/2/checkpoint",
		"/ui/invocations/" + inv + "/artifacts/3/" + url.PathEscape(oddName),
		"/ui/invocations/" + inv + "/artifacts/x/checkpoint",
		"/ui/invocations/" + inv + "/artifacts/2/" + url.PathEscape(oddName[:len(oddName)-1]),
		"/ui/invocations/inv_01J0000000000000000000000X/artifacts/1/checkpoint",
	} {
		if resp, _ := s.do(t, "GET", path, nil); resp.StatusCode != http.StatusNotFound || resp.Header.Get("Location") != "" {
			t.Errorf("GET %s: %d → %q, want 404", path, resp.StatusCode, resp.Header.Get("Location"))
		}
	}
}

// TestRunPageArtifacts: a run's page lists its jobs' counted artifacts,
// each with its job's index linking to the job's page, and a download
// link of the view; the handed-back attempt's is not among them. Past
// the cap of rows, or of jobs read, it says so and names the CLI that
// fetches all.
func TestRunPageArtifacts(t *testing.T) {
	b := blobstest.New(t)
	s := serveWithBlobs(t, b)
	run, inv := handedBack(t, s, "q")
	s.do(t, "POST", "/ui/login", url.Values{"token": {operatorToken}})
	page := s.html(t, "/ui/runs/"+run)
	if strings.Contains(page, b.URL) {
		t.Error("the run's page holds the blob store's URL")
	}
	if !strings.Contains(page, `<tr class="artifact" data-index="0"><td><a href="/ui/invocations/`+inv+`">0</a></td>`) {
		t.Errorf("the run's page lacks job 0's artifact row:\n%s", page)
	}
	want := "/ui/invocations/" + inv + "/artifacts/2/" + url.PathEscape(oddName)
	if links := artifactLinks(page); len(links) != 1 || links[0] != want {
		t.Errorf("the run's page links %q, want [%s]", links, want)
	}
	if strings.Contains(page, `id="artifacts-more"`) {
		t.Error("the run's page says it left artifacts out")
	}

	two := s.submitRun(t, "q2", "two", "0")
	w := s.worker(t, "m-two", "q2")
	job := w.claim(t, "q2")
	w.publish(t, job.InvocationID, job.Attempt, "a.txt", []byte("a"))
	w.publish(t, job.InvocationID, job.Attempt, "b.txt", []byte("b"))
	w.ack(t, wire.AckRequest{InvocationID: job.InvocationID, Attempt: job.Attempt, State: wire.StateSucceeded, ExitCode: new(int)})
	if links := artifactLinks(s.html(t, "/ui/runs/"+two)); len(links) != 2 {
		t.Errorf("the run of two artifacts links %q", links)
	}
	ui.SetArtifactReads(t, 100, 1)
	if page := s.html(t, "/ui/runs/"+two); !strings.Contains(page, "lakeshore artifacts get "+two+" --all -o DIR") ||
		len(artifactLinks(page)) != 1 {
		t.Errorf("past the rows' cap, the page does not list one and point to the CLI:\n%s", page)
	}
	ui.SetArtifactReads(t, 0, 200)
	if page := s.html(t, "/ui/runs/"+run); !strings.Contains(page, "lakeshore artifacts get "+run+" --all -o DIR") ||
		len(artifactLinks(page)) != 0 {
		t.Errorf("with no job read, the page does not point to the CLI:\n%s", page)
	}
}

// TestArtifactsNotConfigured: without a blob store the invocation and run
// pages show no artifacts section and no error, and a download link
// answers 404.
func TestArtifactsNotConfigured(t *testing.T) {
	s := serve(t)
	run := s.submitRun(t, "q", "plain", "0")
	s.finishAll(t, "q", 1, "")
	lines, _, _, err := s.op.RunResultsPage(t.Context(), run, client.RunResultsParams{Limit: 1})
	if err != nil || len(lines) != 1 {
		t.Fatalf("the run's results: %s %v", lines, err)
	}
	inv := regexp.MustCompile(`inv_[0-9A-Za-z]+`).FindString(string(lines[0]))
	s.do(t, "POST", "/ui/login", url.Values{"token": {operatorToken}})
	for _, path := range []string{"/ui/invocations/" + inv, "/ui/runs/" + run} {
		if page := s.html(t, path); strings.Contains(page, `id="artifacts"`) || strings.Contains(page, "could not be read") {
			t.Errorf("%s shows an artifacts section without a blob store", path)
		}
	}
	if resp, _ := s.do(t, "GET", "/ui/invocations/"+inv+"/artifacts/1/out.txt", nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("a download without a blob store: %d, want 404", resp.StatusCode)
	}
}
