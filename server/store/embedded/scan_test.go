package embedded

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
)

// scanBoth reads table whole on both handlers, paging by
// LastEvaluatedKey with limit items a page (0: no limit), and reports
// each handler's items as JSON, sorted: a Scan promises no order.
func (p *pair) scanBoth(table string, limit int) (fast, plain []string) {
	p.t.Helper()
	return scanAll(p.t, p.fast, table, limit), scanAll(p.t, p.plain, table, limit)
}

// scanAll pages through a Scan of table on srv and reports its items as
// JSON, sorted; it fails on an error, on a page larger than limit, and on
// an item read twice.
func scanAll(t *testing.T, srv *httptest.Server, table string, limit int) []string {
	t.Helper()
	var items []string
	var start map[string]any
	for pages := 0; ; pages++ {
		if pages > 10_000 {
			t.Fatalf("Scan %s: more than 10,000 pages", table)
		}
		req := map[string]any{"TableName": table}
		if limit > 0 {
			req["Limit"] = limit
		}
		if start != nil {
			req["ExclusiveStartKey"] = start
		}
		code, body := post(t, srv, "Scan", mustJSON(t, req))
		if code != http.StatusOK {
			t.Fatalf("Scan %s: %d %s", table, code, body)
		}
		var out struct {
			Items            []json.RawMessage
			Count            int
			LastEvaluatedKey map[string]any
		}
		if err := json.Unmarshal(body, &out); err != nil {
			t.Fatalf("Scan %s: %v", table, err)
		}
		if out.Count != len(out.Items) || (limit > 0 && len(out.Items) > limit) {
			t.Fatalf("Scan %s, limit %d: a page of %d items counted %d", table, limit, len(out.Items), out.Count)
		}
		for _, it := range out.Items {
			var v any
			_ = json.Unmarshal(it, &v)
			b, _ := json.Marshal(v)
			items = append(items, string(b))
		}
		if out.LastEvaluatedKey == nil {
			break
		}
		start = out.LastEvaluatedKey
	}
	slices.Sort(items)
	for i := 1; i < len(items); i++ {
		if items[i] == items[i-1] {
			t.Fatalf("Scan %s, limit %d: %s read twice", table, limit, items[i])
		}
	}
	return items
}

// TestScanMatchesMinidyn: a plain Scan, paged with any limit, reads from
// the shadow exactly the items plain minidyn holds, each once, whatever
// the writes before it.
func TestScanMatchesMinidyn(t *testing.T) {
	for seed := range uint64(3) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			p, g := newDiff(t, seed, 13)
			for i := range 300 {
				p.both(g.write())
				if i%30 != 29 {
					continue
				}
				for _, table := range []string{"t1", "t2"} {
					for _, limit := range []int{0, 1, 2, 7} {
						fast, plain := p.scanBoth(table, limit)
						if !slices.Equal(fast, plain) {
							t.Fatalf("Scan %s, limit %d, after %d writes:\nfast  %v\nplain %v", table, limit, i+1, fast, plain)
						}
					}
				}
			}
		})
	}
}

// TestScanLeavesMinidynWhatItCannotRead: a Scan the shadow does not read
// as plain (a limit under 1, Select COUNT, segments, a projection, a start
// key with more than the table key, an unknown table) is minidyn's, and
// answers as plain minidyn answers it.
func TestScanLeavesMinidynWhatItCannotRead(t *testing.T) {
	p := newPair(t)
	for _, tbl := range diffTables {
		p.both("CreateTable", tbl)
	}
	for i := range 5 {
		p.both("PutItem", map[string]any{"TableName": "t1", "Item": map[string]any{"pk": s("p"), "sk": s(fmt.Sprint("k", i)), "a": n(i)}})
	}
	for _, req := range []map[string]any{
		{"TableName": "t1", "Limit": 0},
		{"TableName": "t1", "Limit": -1},
		{"TableName": "t1", "Select": "COUNT"},
		{"TableName": "t1", "Segment": 0, "TotalSegments": 2},
		{"TableName": "t1", "ProjectionExpression": "a"},
		{"TableName": "t1", "ExclusiveStartKey": map[string]any{"pk": s("p"), "sk": s("k1"), "a": n(1)}},
		{"TableName": "nope"},
	} {
		p.both("Scan", req)
	}
	if got := p.gotScans(); got != 0 {
		t.Fatalf("the shadow answered %d of these Scans, want 0", got)
	}
	p.both("Scan", map[string]any{"TableName": "t1", "Limit": 2})
	if got := p.gotScans(); got != 1 {
		t.Fatalf("the shadow answered %d plain Scans of 1", got)
	}
}

// gotScans is how many Scans the fast handler answered from its shadow.
func (p *pair) gotScans() (n int) {
	p.fastEngine.locked(func() { n = int(p.fastEngine.gotScans.Load()) })
	return n
}
