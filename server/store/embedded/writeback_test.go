package embedded

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/truora/minidyn/server"
)

// TestWritesReachMinidynWhenItAnswers: plain puts and deletes, alone and
// in a transaction, are taken by the shadow and reach minidyn only when
// minidyn must answer a request (here a Scan), which then sees them all;
// the writes cost no minidyn call, so none sorts its table's keys.
func TestWritesReachMinidynWhenItAnswers(t *testing.T) {
	h, e := newHandlerEngine(true)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	call := func(op string, req any) []byte {
		t.Helper()
		body, err := json.Marshal(req)
		if err != nil {
			t.Fatalf("encode %s: %v", op, err)
		}
		code, out := post(t, srv, op, body)
		if code != http.StatusOK {
			t.Fatalf("%s %s: %d %s", op, body, code, out)
		}
		return out
	}
	call("CreateTable", tableSpec("wb", []string{"pk", "S", "sk", "S", "gh", "S"}, keySchema("pk", "sk"),
		"GlobalSecondaryIndexes", []any{indexSpec("g", keySchema("gh", "sk"), "ALL")}))
	item := func(i int) map[string]any {
		return map[string]any{"pk": s("p"), "sk": s(fmt.Sprintf("s%03d", i)), "lst": map[string]any{"L": []any{}}}
	}
	for i := range 100 {
		call("PutItem", map[string]any{"TableName": "wb", "Item": item(i), "ConditionExpression": "attribute_not_exists(pk)"})
	}
	for i := range 10 {
		call("DeleteItem", map[string]any{"TableName": "wb", "Key": map[string]any{"pk": s("p"), "sk": s(fmt.Sprintf("s%03d", i))}})
	}
	call("TransactWriteItems", map[string]any{"TransactItems": []any{
		map[string]any{"Put": map[string]any{"TableName": "wb", "Item": item(100)}},
		map[string]any{"Delete": map[string]any{"TableName": "wb", "Key": map[string]any{"pk": s("p"), "sk": s("s010")},
			"ConditionExpression": "attribute_exists(pk)"}},
	}})
	minidynHolds := func() int {
		var n int
		e.locked(func() {
			rec := e.internal("Scan", server.ScanInput{TableName: ptr("wb")})
			var out struct{ Count int }
			if rec == nil || json.Unmarshal(rec.body.Bytes(), &out) != nil {
				t.Fatalf("scan minidyn: %v", rec)
			}
			n = out.Count
		})
		return n
	}
	if n := minidynHolds(); n != 0 {
		t.Fatalf("minidyn took %d items before anything asked it, want 0: the shadow takes plain writes", n)
	}
	var out struct{ Count int }
	if err := json.Unmarshal(call("Scan", map[string]any{"TableName": "wb"}), &out); err != nil || out.Count != 90 {
		t.Fatalf("a Scan (minidyn's to answer) saw %d items (%v), want 90", out.Count, err)
	}
	if n := minidynHolds(); n != 90 {
		t.Fatalf("minidyn holds %d items after the Scan, want 90", n)
	}
	// minidyn evaluates a condition on a synced item with an empty list:
	// it must hold the list, not a value of no type.
	code, body := post(t, srv, "UpdateItem", mustJSON(t, map[string]any{"TableName": "wb",
		"Key": map[string]any{"pk": s("p"), "sk": s("s050")}, "UpdateExpression": "SET n = :one",
		"ConditionExpression": "size(lst) = :zero", "ExpressionAttributeValues": map[string]any{":one": n(1), ":zero": n(0)}}))
	if code != http.StatusOK {
		t.Fatalf("update of a synced item with an empty list: %d %s", code, body)
	}
}

func ptr(s string) *string { return &s }

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
