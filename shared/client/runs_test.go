package client_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestRunRoutes: a run submitted, read, listed, its results read page by
// page (one job a page) in index order, then cancelled, against the real
// router.
func TestRunRoutes(t *testing.T) {
	base := controlPlane(t)
	ctx := t.Context()
	op := client.New(base, operatorToken)
	req := wire.RunRequest{Queue: "default", Name: "r", Argv: []string{"echo", "{x}"},
		Matrix: map[string][]string{"x": {"a", "b", "c"}}, IdempotencyKey: "k"}
	created, fresh, err := op.SubmitRun(ctx, req)
	if err != nil || !fresh || created.Total != 3 || !strings.HasPrefix(created.RunID, "run_") {
		t.Fatalf("submit run: %+v %v %v", created, fresh, err)
	}
	again, fresh, err := op.SubmitRun(ctx, req)
	if err != nil || fresh || again.RunID != created.RunID {
		t.Fatalf("replay: %+v %v %v; want the same run, not fresh", again, fresh, err)
	}
	if r, err := op.Run(ctx, created.RunID); err != nil || r.Name != "r" || r.Counts[wire.StateQueued] != 3 {
		t.Fatalf("run: %+v %v", r, err)
	}
	if l, err := op.Runs(ctx, "default"); err != nil || len(l.Runs) != 1 {
		t.Fatalf("runs: %+v %v", l, err)
	}
	if l, err := op.Runs(ctx, "other"); err != nil || len(l.Runs) != 0 {
		t.Fatalf("runs of another queue: %+v %v", l, err)
	}
	var got []int
	err = op.RunResults(ctx, created.RunID, client.RunResultsParams{Limit: 1}, func(line json.RawMessage) error {
		var r wire.RunResult
		if err := json.Unmarshal(line, &r); err != nil {
			return err
		}
		got = append(got, r.Index)
		return nil
	})
	if err != nil || len(got) != 3 || got[0] != 0 || got[1] != 1 || got[2] != 2 {
		t.Fatalf("results one job a page: %v %v; want 0 1 2", got, err)
	}
	lines, next, more, err := op.RunResultsPage(ctx, created.RunID, client.RunResultsParams{From: 1, Limit: 1})
	if err != nil || len(lines) != 1 || next != 2 || !more {
		t.Fatalf("page from 1: %d lines, next %d, more %v, %v", len(lines), next, more, err)
	}
	c, err := op.CancelRun(ctx, created.RunID)
	if err != nil || c.Cancelled != 3 || c.Remaining != 0 {
		t.Fatalf("cancel run: %+v %v", c, err)
	}
	if _, err := op.Run(ctx, "run_01ARZ3NDEKTSV4RRFFQ69G5FAV"); !errors.Is(err, wire.ErrNotFound) {
		t.Fatalf("unknown run: %v, want not found", err)
	}
}

// TestRunResultsBadPages: a page whose next index does not move past its
// first, or whose line is not JSON, is an error, not a loop or a garbled
// line handed on.
func TestRunResultsBadPages(t *testing.T) {
	for name, h := range map[string]http.HandlerFunc{
		"next does not advance": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set(wire.NextIndexHeader, r.URL.Query().Get("from")+"0")
			_, _ = w.Write([]byte("{\"index\":0}\n"))
		},
		"next not a number": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set(wire.NextIndexHeader, "x")
		},
		"not JSON": func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte("{\"index\":0}\n{oops\n"))
		},
	} {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewServer(h)
			t.Cleanup(srv.Close)
			n := 0
			err := client.New(srv.URL, "tok").RunResults(t.Context(), "run_x", client.RunResultsParams{}, func(json.RawMessage) error { n++; return nil })
			if err == nil || n > 1 {
				t.Fatalf("err %v after %d lines; want an error", err, n)
			}
		})
	}
}
