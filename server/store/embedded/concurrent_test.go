package embedded

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
)

// TestReadsSeeWholeWrites: GetItems and Queries (filtered, so they convert
// the items they read) served side by side while transactions rewrite two
// items of one partition together each see both items at one version,
// never one written and the other not: reads share the engine only with
// reads. Run with -race, it also holds that they share it safely.
func TestReadsSeeWholeWrites(t *testing.T) {
	srv, _ := costTable(t, 100)
	// The writer writes until every reader has read minReads times, so the
	// reads are known to overlap the writes, however the goroutines are
	// scheduled; maxWrites bounds it.
	const readers, minReads, maxWrites = 4, 25, 5000
	send := func(op string, req any) (int, []byte) {
		body, err := json.Marshal(req)
		if err != nil {
			t.Errorf("encode %s: %v", op, err)
			return 0, nil
		}
		return post(t, srv, op, body)
	}
	pair := func(v int) map[string]any {
		var items []any
		for _, sk := range []string{"pair-a", "pair-b"} {
			items = append(items, map[string]any{"Put": map[string]any{"TableName": "cost", "Item": map[string]any{
				"pk": s("pair"), "sk": s(sk), "gh": s("pair"), "v": n(v)}}})
		}
		return map[string]any{"TransactItems": items}
	}
	if code, out := send("TransactWriteItems", pair(0)); code != http.StatusOK {
		t.Fatalf("first write: %d %s", code, out)
	}

	var reads [readers]atomic.Int64
	allRead := func() bool {
		for r := range reads {
			if reads[r].Load() < minReads {
				return false
			}
		}
		return true
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	writes := 0
	wg.Go(func() {
		defer close(done)
		for v := 1; v <= maxWrites && !allRead(); v++ {
			if code, out := send("TransactWriteItems", pair(v)); code != http.StatusOK {
				t.Errorf("write %d: %d %s", v, code, out)
				return
			}
			writes = v
		}
	})
	queries := []map[string]any{
		{"TableName": "cost", "KeyConditionExpression": "pk = :p", "FilterExpression": "v >= :z",
			"ExpressionAttributeValues": map[string]any{":p": s("pair"), ":z": n(0)}},
		{"TableName": "cost", "IndexName": "g", "KeyConditionExpression": "gh = :p", "ProjectionExpression": "sk, v",
			"ExpressionAttributeValues": map[string]any{":p": s("pair")}},
	}
	for r := range readers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				code, out := send("Query", queries[i%len(queries)])
				var res struct {
					Items []map[string]map[string]string
				}
				if code != http.StatusOK || json.Unmarshal(out, &res) != nil || len(res.Items) != 2 {
					t.Errorf("reader %d: %d %s", r, code, out)
					return
				}
				if a, b := res.Items[0]["v"]["N"], res.Items[1]["v"]["N"]; a != b {
					t.Errorf("reader %d saw the pair at versions %s and %s", r, a, b)
					return
				}
				code, out = send("GetItem", map[string]any{"TableName": "cost", "Key": map[string]any{"pk": s("hot"), "sk": s(fmt.Sprintf("k%08d", i%10))}})
				if code != http.StatusOK {
					t.Errorf("reader %d: GetItem: %d %s", r, code, out)
					return
				}
				reads[r].Add(1)
			}
		})
	}
	wg.Wait()
	if !allRead() {
		t.Errorf("the readers did not each read %d times while %d writes ran", minReads, writes)
	}
}
