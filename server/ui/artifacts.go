package ui

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/dreamlake/lakeshore/shared/ids"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// Artifacts in the view (docs/artifacts.md): the invocation page lists
// its counted attempt's artifacts, and apart those of its other attempts
// with how each ended; a run's page lists its jobs' counted artifacts.
// A link never holds the blob store's presigned URL: it names the
// artifact under the view (artifactHref), and that route, with the
// session, asks the API for a fresh GET and redirects to it, so the
// signed URL lands in no page, no history and no referrer.

// What one render of a run's page reads for its artifacts: the artifacts
// of at most artifactJobReads of its jobs (by index, skipping queued
// ones), listing at most artifactRows (variables for the tests of the
// cap). `lakeshore artifacts get RUN --all -o DIR` fetches them all.
var artifactJobReads, artifactRows = 100, 200

// artifactRow is one artifact in a page.
type artifactRow struct {
	Name, Size, SHA256, Created, Href string
	Attempt                           int
	// Outcome is how its attempt ended, for an attempt not counted.
	Outcome string
	// Index and InvocationID name its job, in a run's page.
	Index        int
	InvocationID string
}

// artifactsView is the artifacts part of a page: Off when the control
// plane has no blob store (the section does not show), Error when they
// could not be read (the rest of the page still shows).
type artifactsView struct {
	Off     bool
	Error   string
	Counted []artifactRow
	Others  []artifactRow
	// More, on a run's page, says what the list leaves out.
	More string
}

// artifactHref is the view's download route of artifact name of attempt
// n of invocation id, each segment path-escaped (a name may hold spaces,
// "%", "?" or any UTF-8).
func artifactHref(id string, n int, name string) string {
	return "/ui/invocations/" + url.PathEscape(id) + "/artifacts/" + strconv.Itoa(n) + "/" + url.PathEscape(name)
}

// artifactRowOf is the row of listed artifact a.
func (u *UI) artifactRowOf(a wire.Artifact, id string) artifactRow {
	row := artifactRow{Name: printable(a.Name), Size: byteSize(a.Size), SHA256: a.SHA256[:min(len(a.SHA256), 12)],
		Created: shortAge(u.now().Sub(a.CreatedAt)) + " ago", Href: artifactHref(id, a.Attempt, a.Name), Attempt: a.Attempt,
		Outcome: a.AttemptOutcome, InvocationID: id}
	if !a.Counted && row.Outcome == "" {
		row.Outcome = "running"
	}
	if a.Index != nil {
		row.Index = *a.Index
	}
	return row
}

// artifactsOff reports whether err says artifacts are not configured.
func artifactsOff(err error) bool { return statusOf(err) == http.StatusNotImplemented }

// invocationArtifacts reads invocation id's artifacts for its page.
func (u *UI) invocationArtifacts(ctx context.Context, id string) artifactsView {
	l, err := u.api.InvocationArtifacts(ctx, id)
	switch {
	case artifactsOff(err):
		return artifactsView{Off: true}
	case err != nil:
		return artifactsView{Error: printable("the artifacts could not be read: " + err.Error())}
	}
	var v artifactsView
	for _, a := range l.Artifacts {
		if a.Counted {
			v.Counted = append(v.Counted, u.artifactRowOf(a, id))
		} else {
			v.Others = append(v.Others, u.artifactRowOf(a, id))
		}
	}
	return v
}

// runArtifacts reads the counted artifacts of run id's jobs, of at most
// artifactJobReads of them (jobs, in index order, skipping queued ones:
// they have published nothing), at most artifactRows listed.
func (u *UI) runArtifacts(ctx context.Context, id string, jobs []wire.RunResult, total int) artifactsView {
	var v artifactsView
	read, past := 0, false
	for _, j := range jobs {
		if j.State == wire.StateQueued {
			continue
		}
		if read == artifactJobReads || len(v.Counted) >= artifactRows {
			past = true
			break
		}
		read++
		l, err := u.api.InvocationArtifacts(ctx, j.InvocationID)
		switch {
		case artifactsOff(err):
			return artifactsView{Off: true}
		case err != nil:
			v.Error = printable(fmt.Sprintf("the artifacts of job %d could not be read: %v", j.Index, err))
			return v
		}
		for _, a := range l.Artifacts {
			if a.Counted && len(v.Counted) < artifactRows {
				row := u.artifactRowOf(a, j.InvocationID)
				row.Index = j.Index
				v.Counted = append(v.Counted, row)
			} else if a.Counted {
				past = true
			}
		}
	}
	if past || len(jobs) < total {
		v.More = fmt.Sprintf("the page lists at most %d artifacts, of the first %d jobs that ran; for all: lakeshore artifacts get %s --all -o DIR",
			artifactRows, read, id)
	}
	return v
}

// artifact answers a download link: a redirect to a fresh presigned GET
// of the artifact the path names, found through the API's list of the
// invocation's artifacts; 404 when there is no such artifact (or no
// blob store). The answer is never cached and sends no referrer
// (ServeHTTP's headers), so the signed URL stays out of caches and of
// the blob store's logs of referrers.
func (u *UI) artifact(w http.ResponseWriter, r *http.Request, _ string) {
	id, name := r.PathValue("id"), r.PathValue("name")
	n, err := strconv.Atoi(r.PathValue("attempt"))
	if !ids.Valid(ids.Invocation, id) || err != nil || n < 1 {
		http.Error(w, "no such artifact", http.StatusNotFound)
		return
	}
	l, err := u.api.InvocationArtifacts(r.Context(), id)
	switch {
	case artifactsOff(err):
		http.Error(w, "artifacts are not configured on this control plane", http.StatusNotFound)
		return
	case err != nil:
		http.Error(w, "artifacts of "+id+": "+err.Error(), statusOf(err))
		return
	}
	for _, a := range l.Artifacts {
		if a.Attempt == n && a.Name == name && a.URL != "" {
			u.log.Info("ui: artifact download", "invocation", id, "attempt", n, "name", printable(name))
			// No body: http.Redirect would write the URL into one.
			w.Header().Set("Location", a.URL)
			w.WriteHeader(http.StatusFound)
			return
		}
	}
	http.Error(w, "no such artifact", http.StatusNotFound)
}

// byteSize writes a size as an operator reads it: "512 B", "1.5 KiB",
// "3.2 GiB".
func byteSize(n int64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	f, unit := float64(n)/1024, 0
	for f >= 1024 && unit < 4 {
		f, unit = f/1024, unit+1
	}
	return fmt.Sprintf("%.1f %s", f, []string{"KiB", "MiB", "GiB", "TiB", "PiB"}[unit])
}
