package ui

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// The hosts page (/ui/hosts): the hosts the provisioner launched, newest
// first, each with where it is — reserved, launched and waiting for its
// worker's hello, joined as a worker (and that worker's state), refused by
// EC2, let go — and the launches EC2 refused, with its reasons. It reads
// the hosts the control plane keeps (GET /v1/hosts: those alive and those
// that ended within the last day) and a page of the worker list, off the
// fleet page's 2 s path.

// Rows the hosts page shows: the newest hosts, and the newest refusals.
const (
	hostRows    = 200
	refusalRows = 50
)

type hostRow struct {
	ID, Queue, HostKey, State, Where, Instance, Market, Created, Ended, Reason string
}

type refusalRow struct {
	HostID, Queue, HostKey, When, At, Reason string
	at                                       time.Time
}

type hostsPage struct {
	Hosts    []hostRow
	Refusals []refusalRow
	// More says how many hosts or refusals the page leaves out.
	More string
	CSRF string
}

func (u *UI) hosts(w http.ResponseWriter, r *http.Request, sess string) {
	p, err := u.hostsPage(r.Context(), sess)
	u.page(w, "hosts.html", p, err)
}

func (u *UI) hostsLive(w http.ResponseWriter, r *http.Request, sess string) {
	p, err := u.hostsPage(r.Context(), sess)
	u.liveParts(w, p, err, "hosts", "refusals")
}

func (u *UI) hostsPage(ctx context.Context, sess string) (hostsPage, error) {
	hl, err := u.api.ListHosts(ctx)
	if err != nil {
		return hostsPage{}, fmt.Errorf("list hosts: %w", err)
	}
	wl, err := u.api.ListWorkers(ctx, listLimit, "")
	if err != nil {
		return hostsPage{}, fmt.Errorf("list workers: %w", err)
	}
	return hostsView(hl.Hosts, wl.Workers, u.now(), u.csrfToken(sess)), nil
}

// hostsView lays out hosts (newest first, as the API lists them) beside
// the workers they joined as (a provisioned host's worker has its
// instance id as machine id).
func hostsView(hosts []wire.Host, workers []wire.Worker, now time.Time, csrf string) hostsPage {
	byInstance := map[string]wire.Worker{}
	for _, w := range workers {
		byInstance[w.MachineID] = w
	}
	p := hostsPage{CSRF: csrf}
	refused := 0
	for _, h := range hosts {
		ended := "—"
		if h.EndedAt != nil {
			ended = shortAge(now.Sub(*h.EndedAt)) + " ago"
		}
		w, joined := byInstance[h.InstanceID]
		joined = joined && h.InstanceID != ""
		if h.State == string(domain.LaunchFailed) {
			if refused < refusalRows {
				at := cmp.Or(h.EndedAt, &h.CreatedAt)
				p.Refusals = append(p.Refusals, refusalRow{HostID: h.HostID, Queue: h.Queue, HostKey: h.HostKey, Reason: printable(h.Reason),
					When: shortAge(now.Sub(*at)) + " ago", At: at.UTC().Format("2006-01-02 15:04:05Z"), at: *at})
			}
			refused++
		}
		if len(p.Hosts) == hostRows {
			continue
		}
		row := hostRow{ID: h.HostID, Queue: h.Queue, HostKey: h.HostKey, State: h.State, Where: where(h, w, joined),
			Instance: h.InstanceID, Market: h.Market, Created: shortAge(now.Sub(h.CreatedAt)) + " ago", Ended: ended,
			Reason: printable(h.Reason)}
		p.Hosts = append(p.Hosts, row)
	}
	slices.SortStableFunc(p.Refusals, func(a, b refusalRow) int { return b.at.Compare(a.at) })
	if n, m := len(hosts)-len(p.Hosts), refused-len(p.Refusals); n > 0 || m > 0 {
		p.More = fmt.Sprintf("and %d older hosts, %d older refusals (lakeshore ls hosts)", n, m)
	}
	return p
}

// domainPending reports whether w is a launched host's row no hello
// adopted yet.
func domainPending(w wire.Worker) bool { return w.State == string(domain.WorkerPending) }

// where says in words where host h is, beside w, the worker it joined as
// (joined: there is one).
func where(h wire.Host, w wire.Worker, joined bool) string {
	switch domain.LaunchState(h.State) {
	case domain.LaunchReserved:
		return "reserved: launching"
	case domain.LaunchFailed:
		return "refused by EC2"
	case domain.LaunchEnded:
		return "let go (terminated)"
	case domain.LaunchRunning:
		if !joined || domainPending(w) {
			return "launched: waiting for its hello"
		}
		return "joined as " + printable(cmp.Or(w.Label, w.WorkerID)) + " (" + w.State + ")"
	}
	return printable(h.State)
}
