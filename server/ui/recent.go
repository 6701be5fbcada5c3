package ui

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/ids"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// The fleet page's invocation list: newest first, a page at a time, of
// one queue, one state and the ids starting with what the operator typed
// (or the one invocation an exact id names), as the URL's query says, so
// a list can be bookmarked and the 2 s refresh reads the same page again.
// Each page is one listing of the API by index (GET /v1/invocations), so
// it costs the same however long the history.

// recentPageSize is how many invocations one page of the list shows.
const recentPageSize = 50

// commandWidth is how many characters of an argv a row shows.
const commandWidth = 60

// maxCursor bounds a cursor the view takes back (the API's are under
// 200 characters).
const maxCursor = 512

// recentQuery is what the URL asks of the list. After and Before are the
// API's cursors (base64url): the page past After (older), or the page
// before Before (newer); at most one is set.
type recentQuery struct {
	Queue, State, ID string
	After, Before    string
}

// badQuery is a query the view refuses (400).
func badQuery(format string, args ...any) error {
	return wire.Errorf(wire.CodeInvalid, format, args...)
}

// parseRecent reads the list's query from v, refusing what no page of the
// view writes: a queue or state that is not one, an id that is not the
// start of an invocation id, a cursor that is not base64url of a bounded
// length (the API checks what it decodes to), or both cursors.
func parseRecent(v url.Values) (recentQuery, error) {
	q := recentQuery{Queue: strings.TrimSpace(v.Get("queue")), State: v.Get("state"),
		After: v.Get("after"), Before: v.Get("before")}
	if q.Queue != "" && !wire.ValidQueue(q.Queue) {
		return q, badQuery("queue: %q is not a queue name", printable(q.Queue))
	}
	if q.State != "" && !slices.Contains(wire.InvocationStates, q.State) {
		return q, badQuery("state: %q is not one of %s", printable(q.State), strings.Join(wire.InvocationStates, ", "))
	}
	if id := strings.TrimSpace(v.Get("id")); id != "" {
		norm, ok := invocationIDPrefix(id)
		if !ok {
			return q, badQuery("id: %q is not an invocation id or the start of one (inv_ and up to 26 of 0-9, A-Z)", printable(id))
		}
		q.ID = norm
	}
	for _, c := range []string{q.After, q.Before} {
		if len(c) > maxCursor || strings.IndexFunc(c, func(r rune) bool { return !isBase64URL(r) }) >= 0 {
			return q, badQuery("cursor: not one this view hands out")
		}
	}
	if q.After != "" && q.Before != "" {
		return q, badQuery("cursor: after and before together")
	}
	return q, nil
}

func isBase64URL(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_'
}

// invocationIDPrefix reads what an operator typed to find an invocation:
// its id or the start of it, with or without "inv_", in either case (ids
// are upper case).
func invocationIDPrefix(s string) (string, bool) {
	if len(s) > 64 {
		return "", false
	}
	rest, ok := strings.CutPrefix(strings.ToLower(s), ids.Invocation+"_")
	if !ok {
		rest = s
	}
	p := ids.Invocation + "_" + strings.ToUpper(rest)
	return p, ids.ValidPrefix(ids.Invocation, p)
}

// values is q as a URL query (empty fields left out), with more added.
func (q recentQuery) values(more ...string) url.Values {
	v := url.Values{}
	for i := 0; i+1 < len(more); i += 2 {
		v.Set(more[i], more[i+1])
	}
	for _, kv := range [][2]string{{"queue", q.Queue}, {"state", q.State}, {"id", q.ID}, {"after", q.After}, {"before", q.Before}} {
		if kv[1] != "" {
			v.Set(kv[0], kv[1])
		}
	}
	return v
}

// filtered reports whether q narrows the list.
func (q recentQuery) filtered() bool { return q.Queue != "" || q.State != "" || q.ID != "" }

// recentList is one page of the list as the fleet page shows it.
type recentList struct {
	Query recentQuery
	Rows  []invRow
	// Newer and Older are the links to the pages either side ("": none);
	// Here is this page's, where an action taken from it returns.
	Newer, Older, Here string
	// Note says why the page is empty, in words.
	Note string
}

// recentList reads the page q asks for, with win, the timeline's window,
// kept in the links.
func (u *UI) recentList(ctx context.Context, q recentQuery, win time.Duration, names map[string]string, now time.Time) (recentList, error) {
	link := func(cursorKey, cursor string) string {
		page := q
		page.After, page.Before = "", ""
		v := page.values("minutes", strconv.Itoa(int(win/time.Minute)), cursorKey, cursor)
		return Prefix + "?" + v.Encode()
	}
	out := recentList{Query: q, Here: Prefix + "?" + q.values("minutes", strconv.Itoa(int(win/time.Minute))).Encode()}
	if ids.Valid(ids.Invocation, q.ID) {
		// An exact id: that invocation, by key.
		inv, err := u.api.GetInvocation(ctx, q.ID)
		switch {
		case wire.CodeOf(err) == wire.CodeNotFound:
			out.Note = "No invocation " + q.ID + "."
		case err != nil:
			return out, fmt.Errorf("get invocation %s: %w", q.ID, err)
		default:
			out.Rows = []invRow{invRowOf(inv, names, now)}
		}
		return out, nil
	}
	p := client.ListInvocationsParams{Queue: q.Queue, State: q.State, Order: wire.OrderNewest, Limit: recentPageSize,
		Cursor: q.After, IDPrefix: q.ID}
	var il wire.InvocationList
	var err error
	if q.Before != "" {
		// The page before: read from Before the other way, nearest
		// first. Past the newest end (nothing newer left), it is the
		// first page.
		back := p
		back.Order, back.Cursor = wire.OrderOldest, q.Before
		il, err = u.api.ListInvocations(ctx, back)
		if err == nil && il.NextCursor != "" {
			slices.Reverse(il.Invocations)
			out.Newer, out.Older = link("before", il.NextCursor), link("after", il.PrevCursor)
			out.Rows = rowsOf(il.Invocations, names, now)
			return out, nil
		}
	}
	if err == nil {
		if q.Before != "" {
			p.Cursor = ""
		}
		il, err = u.api.ListInvocations(ctx, p)
	}
	if err != nil {
		if wire.CodeOf(err) == wire.CodeInvalid {
			return out, err // the cursor: the API said what is wrong with it
		}
		return out, fmt.Errorf("list invocations: %w", err)
	}
	out.Rows = rowsOf(il.Invocations, names, now)
	if il.NextCursor != "" {
		out.Older = link("after", il.NextCursor)
	}
	if p.Cursor != "" && il.PrevCursor != "" {
		out.Newer = link("before", il.PrevCursor)
	}
	if len(out.Rows) == 0 {
		switch {
		case p.Cursor != "":
			out.Note = "Nothing more on this page."
		case q.filtered():
			out.Note = "No invocation matches."
		}
	}
	return out, nil
}

func rowsOf(invs []wire.Invocation, names map[string]string, now time.Time) []invRow {
	rows := make([]invRow, 0, len(invs))
	for _, inv := range invs {
		rows = append(rows, invRowOf(inv, names, now))
	}
	return rows
}

// shortCommand is argv on one line, escaped (printable), cut to width
// characters with "…".
func shortCommand(argv []string, width int) string {
	s := printable(strings.Join(argv, " "))
	if utf8.RuneCountInString(s) <= width {
		return s
	}
	r := []rune(s)
	return string(r[:width-1]) + "…"
}

// runTime says how long inv ran: from its start to its finish, or "for
// …" while it runs; "" before it started.
func runTime(inv wire.Invocation, now time.Time) string {
	switch {
	case inv.StartedAt == nil:
		return ""
	case inv.FinishedAt == nil && !wire.Terminal(inv.State):
		return "for " + duration(now.Sub(*inv.StartedAt))
	case inv.FinishedAt == nil:
		return ""
	}
	return duration(inv.FinishedAt.Sub(*inv.StartedAt))
}

// duration is shortAge with tenths of a second under ten seconds: most
// invocations take seconds.
func duration(d time.Duration) string {
	if d = max(d, 0); d < 10*time.Second {
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
	return shortAge(d)
}

// exitCode is inv's exit status, "" when it has none.
func exitCode(inv wire.Invocation) string {
	if inv.ExitCode == nil {
		return ""
	}
	return strconv.Itoa(*inv.ExitCode)
}
