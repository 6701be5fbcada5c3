package embedded

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// costTable is a table with three GSIs, in which partition "hot" of the
// table and of index g holds 10 items and the other partitions others items.
func costTable(tb testing.TB, others int) (*httptest.Server, *engine) {
	tb.Helper()
	h, e := newHandlerEngine(true)
	srv := httptest.NewServer(h)
	tb.Cleanup(srv.Close)
	call := func(op string, req any) {
		body, err := json.Marshal(req)
		if err != nil {
			tb.Fatalf("encode %s: %v", op, err)
		}
		if code, out := post(tb, srv, op, body); code != http.StatusOK {
			tb.Fatalf("%s: %d %s", op, code, out)
		}
	}
	call("CreateTable", tableSpec("cost", []string{"pk", "S", "sk", "S", "gh", "S"}, keySchema("pk", "sk"),
		"GlobalSecondaryIndexes", []any{indexSpec("g", keySchema("gh", "sk"), "ALL"),
			indexSpec("bypk", keySchema("sk", "pk"), "KEYS_ONLY"), indexSpec("bygh", keySchema("gh", ""), "ALL")}))
	var batch []any
	flush := func() {
		if len(batch) > 0 {
			call("BatchWriteItem", map[string]any{"RequestItems": map[string]any{"cost": batch}})
			batch = nil
		}
	}
	put := func(pk, sk, gh string) {
		batch = append(batch, map[string]any{"PutRequest": map[string]any{"Item": map[string]any{
			"pk": s(pk), "sk": s(sk), "gh": s(gh), "body": s("payload"),
		}}})
		if len(batch) == 25 {
			flush()
		}
	}
	for i := range 10 {
		put("hot", fmt.Sprintf("k%08d", i), "hot")
	}
	// The others sort before and after the hot partition's entries, in the
	// table's and the index's key order.
	for i := range others {
		put(fmt.Sprintf("p%06d", i%(others/10+1)), fmt.Sprintf("k%08d", i), fmt.Sprintf("g%02d", i%7))
	}
	flush()
	return srv, e
}

// hotQueries are the Queries of the hot partition: the table's and the
// index's, whole and paged.
var hotQueries = []map[string]any{
	{"TableName": "cost", "KeyConditionExpression": "pk = :h", "ExpressionAttributeValues": map[string]any{":h": s("hot")}},
	{"TableName": "cost", "IndexName": "g", "KeyConditionExpression": "gh = :h", "ExpressionAttributeValues": map[string]any{":h": s("hot")}},
	{"TableName": "cost", "IndexName": "g", "KeyConditionExpression": "gh = :h AND sk >= :s", "ScanIndexForward": false,
		"ExpressionAttributeValues": map[string]any{":h": s("hot"), ":s": s("k00000005")}},
}

// TestQueryCostIndependentOfTable: a Query reads its partition's entries
// and no others, however many items the rest of the table holds.
func TestQueryCostIndependentOfTable(t *testing.T) {
	var reads [2][]int
	for i, others := range []int{10, 10_000} {
		srv, e := costTable(t, others)
		for _, q := range hotQueries {
			var before, after, answered int64
			e.locked(func() { before, answered = e.evaluated.Load(), e.answered.Load() })
			body, _ := json.Marshal(q)
			code, out := post(t, srv, "Query", body)
			if code != http.StatusOK {
				t.Fatalf("Query %s: %d %s", body, code, out)
			}
			e.locked(func() { after, answered = e.evaluated.Load(), e.answered.Load()-answered })
			if answered != 1 {
				t.Fatalf("Query %s was not answered from the shadow", body)
			}
			var res struct{ Count int }
			if err := json.Unmarshal(out, &res); err != nil {
				t.Fatalf("decode %s: %v", out, err)
			}
			if res.Count == 0 || int(after-before) != res.Count {
				t.Errorf("%d other items: Query %s answered %d items and read %d", others, body, res.Count, after-before)
			}
			reads[i] = append(reads[i], int(after-before))
		}
	}
	if fmt.Sprint(reads[0]) != fmt.Sprint(reads[1]) {
		t.Errorf("items read per query: %v beside 10 other items, %v beside 10,000", reads[0], reads[1])
	}
}

// BenchmarkEmbeddedQuery is a Query of a 10-item partition through the
// handler, in a table of 100 items and in one of 100,000.
func BenchmarkEmbeddedQuery(b *testing.B) {
	for _, size := range []int{100, 100_000} {
		b.Run(fmt.Sprint("items=", size), func(b *testing.B) {
			srv, _ := costTable(b, size-10)
			body, _ := json.Marshal(hotQueries[1])
			for b.Loop() {
				if code, out := post(b, srv, "Query", body); code != http.StatusOK {
					b.Fatalf("Query: %d %s", code, out)
				}
			}
		})
	}
}

// BenchmarkEmbeddedPut is a PutItem of a new item into a table with three
// global secondary indexes that holds 100 items and one that holds 20,000:
// a write costs what it touches, not the indexes' size.
func BenchmarkEmbeddedPut(b *testing.B) {
	benchWrites(b, "PutItem", func(tb testing.TB, i int) []byte {
		body, _ := json.Marshal(map[string]any{"TableName": "cost", "Item": map[string]any{
			"pk": s(fmt.Sprint("new", i%50)), "sk": s(fmt.Sprintf("n%08d", i)), "gh": s(fmt.Sprint("g", i%7)), "body": s("payload"),
		}})
		return body
	})
}

// benchWrites runs op with the i-th request body on the cost table of 100
// items and on the one of 20,000.
func benchWrites(b *testing.B, op string, body func(tb testing.TB, i int) []byte) {
	for _, size := range []int{100, 20_000} {
		b.Run(fmt.Sprint("items=", size), func(b *testing.B) {
			srv, _ := costTable(b, size-10)
			i := 0
			for b.Loop() {
				i++
				if code, out := post(b, srv, op, body(b, i)); code != http.StatusOK {
					b.Fatalf("%s: %d %s", op, code, out)
				}
			}
		})
	}
}

// TestLongAnswersSayTheirLength: an answer over net/http's 2 KB buffer
// comes with its Content-Length, as DynamoDB's do, not chunked; a client
// then reads an answer cut short as cut short. Before, such answers were
// chunked.
func TestLongAnswersSayTheirLength(t *testing.T) {
	srv, _ := costTable(t, 100)
	// A plain Scan is the shadow's answer, a filtered one minidyn's.
	for op, req := range map[string]map[string]any{
		"Scan": {"TableName": "cost"},
		"Scan with a filter": {"TableName": "cost", "FilterExpression": "body = :b",
			"ExpressionAttributeValues": map[string]any{":b": s("payload")}},
	} {
		body, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		hr, err := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		hr.Header.Set("X-Amz-Target", "DynamoDB_20120810.Scan")
		hr.Header.Set("Content-Type", "application/x-amz-json-1.0")
		resp, err := http.DefaultClient.Do(hr)
		if err != nil {
			t.Fatalf("%s: %v", op, err)
		}
		out, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("%s: read: %v", op, err)
		}
		if len(out) <= 2048 {
			t.Fatalf("%s answered %d bytes; the test needs more than 2048", op, len(out))
		}
		if resp.ContentLength != int64(len(out)) || len(resp.TransferEncoding) != 0 {
			t.Errorf("%s: Content-Length %d, transfer encoding %v for %d bytes; want the length, not chunked",
				op, resp.ContentLength, resp.TransferEncoding, len(out))
		}
	}
}
