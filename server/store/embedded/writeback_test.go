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
// minidyn must answer a request that names their table (here a filtered
// Scan), which then sees them all; the writes cost no minidyn call, so none
// sorts its table's keys.
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
	call("CreateTable", tableSpec("other", []string{"pk", "S", "sk", "S"}, keySchema("pk", "sk"), "LocalSecondaryIndexes", nil))
	for i := range 100 {
		call("PutItem", map[string]any{"TableName": "wb", "Item": item(i), "ConditionExpression": "attribute_not_exists(pk)"})
		call("PutItem", map[string]any{"TableName": "other", "Item": item(i)})
	}
	for i := range 10 {
		call("DeleteItem", map[string]any{"TableName": "wb", "Key": map[string]any{"pk": s("p"), "sk": s(fmt.Sprintf("s%03d", i))}})
	}
	call("TransactWriteItems", map[string]any{"TransactItems": []any{
		map[string]any{"Put": map[string]any{"TableName": "wb", "Item": item(100)}},
		map[string]any{"Delete": map[string]any{"TableName": "wb", "Key": map[string]any{"pk": s("p"), "sk": s("s010")},
			"ConditionExpression": "attribute_exists(pk)"}},
	}})
	minidynHolds := func(table string) int {
		var n int
		e.locked(func() {
			rec := e.internal("Scan", server.ScanInput{TableName: &table})
			var out struct{ Count int }
			if rec == nil || json.Unmarshal(rec.body.Bytes(), &out) != nil {
				t.Fatalf("scan minidyn: %v", rec)
			}
			n = out.Count
		})
		return n
	}
	if n := minidynHolds("wb"); n != 0 {
		t.Fatalf("minidyn took %d items before anything asked it, want 0: the shadow takes plain writes", n)
	}
	var out struct{ Count int }
	if err := json.Unmarshal(call("Scan", map[string]any{"TableName": "wb"}), &out); err != nil || out.Count != 90 {
		t.Fatalf("a plain Scan (the shadow's to answer) saw %d items (%v), want 90", out.Count, err)
	}
	if n := minidynHolds("wb"); n != 0 {
		t.Fatalf("minidyn took %d items for a plain Scan, want 0: the shadow answers it", n)
	}
	filtered := call("Scan", map[string]any{"TableName": "wb", "FilterExpression": "attribute_exists(pk)"})
	if err := json.Unmarshal(filtered, &out); err != nil || out.Count != 90 {
		t.Fatalf("a filtered Scan (minidyn's to answer) saw %d items (%v), want 90", out.Count, err)
	}
	if n := minidynHolds("wb"); n != 90 {
		t.Fatalf("minidyn holds %d items after the filtered Scan, want 90", n)
	}
	// The Scan named one table: the other's writes wait for a request
	// that names it.
	if n := minidynHolds("other"); n != 0 {
		t.Fatalf("minidyn holds %d items of a table the Scan did not name, want 0", n)
	}
	// A TransactGetItems (an ack through Lambda reads so) is minidyn's to
	// answer, and gives it only the items it reads.
	got := call("TransactGetItems", map[string]any{"TransactItems": []any{
		map[string]any{"Get": map[string]any{"TableName": "other", "Key": map[string]any{"pk": s("p"), "sk": s("s005")}}},
	}})
	var tg struct {
		Responses []struct{ Item map[string]any }
	}
	if err := json.Unmarshal(got, &tg); err != nil || len(tg.Responses) != 1 || tg.Responses[0].Item == nil {
		t.Fatalf("TransactGetItems of an item the shadow took alone: %s (%v)", got, err)
	}
	if n := minidynHolds("other"); n != 1 {
		t.Fatalf("minidyn holds %d items of the table a TransactGetItems read one of, want 1", n)
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

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSingleWritesMatchMinidyn: puts and deletes of every shape a client
// can send (conditions that hold, fail or err; placeholders missing,
// unused or malformed; values asked back; empty keys and sets; extra key
// attributes) answer as plain minidyn answers them, and leave the same
// items; the shadow takes the plain ones itself.
func TestSingleWritesMatchMinidyn(t *testing.T) {
	p := newPair(t)
	for _, tbl := range diffTables {
		p.both("CreateTable", tbl)
	}
	key := func(pk, sk string) map[string]any { return map[string]any{"pk": s(pk), "sk": s(sk)} }
	item := func(pk, sk string, a int) map[string]any {
		return map[string]any{"pk": s(pk), "sk": s(sk), "a": n(a), "gh": s("g"), "gr": n(1)}
	}
	vals := func(kv ...any) map[string]any {
		m := map[string]any{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	// shadow: the shadow takes the write itself; every other one is
	// minidyn's (its condition fails or errs, or the shadow does not read
	// it as plainly valid).
	for i, w := range []struct {
		op     string
		req    map[string]any
		shadow bool
	}{
		{"PutItem", map[string]any{"TableName": "t1", "Item": item("p", "a", 1), "ConditionExpression": "attribute_not_exists(pk)"}, true},
		{"PutItem", map[string]any{"TableName": "t1", "Item": item("p", "a", 2), "ConditionExpression": "attribute_not_exists(pk)"}, false},
		{"PutItem", map[string]any{"TableName": "t1", "Item": item("p", "a", 3), "ConditionExpression": "#a < :v",
			"ExpressionAttributeNames": map[string]any{"#a": "a"}, "ExpressionAttributeValues": vals(":v", n(2))}, true},
		{"PutItem", map[string]any{"TableName": "t1", "Item": item("p", "a", 4), "ConditionExpression": "#a < :v",
			"ExpressionAttributeNames": map[string]any{"#a": "a"}, "ExpressionAttributeValues": vals(":v", n(2))}, false},
		{"PutItem", map[string]any{"TableName": "t1", "Item": item("p", "b", 1), "ConditionExpression": "attribute_not_exists(pk)",
			"ExpressionAttributeValues": vals(":unused", n(2))}, false},
		{"PutItem", map[string]any{"TableName": "t1", "Item": item("p", "b", 1), "ConditionExpression": "attribute_not_exists(#x)"}, false},
		{"PutItem", map[string]any{"TableName": "t1", "Item": item("p", "b", 1), "ConditionExpression": "attribute_not_exists(pk)",
			"ExpressionAttributeNames": map[string]any{"#unused": "a"}}, false},
		{"PutItem", map[string]any{"TableName": "t1", "Item": item("p", "b", 1), "ExpressionAttributeValues": vals(":v", n(1))}, false},
		{"PutItem", map[string]any{"TableName": "t1", "Item": item("p", "b", 1), "ConditionExpression": ""}, false},
		{"PutItem", map[string]any{"TableName": "t1", "Item": item("p", "a", 5), "ReturnValues": "ALL_OLD"}, false},
		{"PutItem", map[string]any{"TableName": "t1", "Item": item("", "a", 1)}, false},
		{"PutItem", map[string]any{"TableName": "t1", "Item": map[string]any{"pk": s("p"), "sk": s("c"), "ss": map[string]any{"SS": []any{}}}}, true},
		{"PutItem", map[string]any{"TableName": "t1", "Item": map[string]any{"pk": s("p"), "sk": n(1)}}, false},
		{"PutItem", map[string]any{"TableName": "nope", "Item": item("p", "a", 1)}, false},
		{"PutItem", map[string]any{"TableName": "t1", "Item": item("p", "c", 1), "ConditionExpression": "attribute_not_exists(pk) AND"}, false},
		{"PutItem", map[string]any{"TableName": "t1", "Item": item("p", "f", 1), "Expected": map[string]any{"a": map[string]any{"Exists": false}}}, false},
		{"PutItem", map[string]any{"TableName": "t1", "Item": item("p", "g", 1), "ConditionalOperator": "AND"}, false},
		{"PutItem", map[string]any{"TableName": "t1", "Item": item("p", "d", 1)}, true},
		{"DeleteItem", map[string]any{"TableName": "t1", "Key": key("p", "d"), "ConditionExpression": "a = :v", "ExpressionAttributeValues": vals(":v", n(9))}, false},
		{"DeleteItem", map[string]any{"TableName": "t1", "Key": key("p", "d"), "ConditionExpression": "a = :v", "ExpressionAttributeValues": vals(":v", n(1))}, true},
		{"DeleteItem", map[string]any{"TableName": "t1", "Key": key("p", "d"), "ConditionExpression": "attribute_exists(pk)"}, false},
		{"DeleteItem", map[string]any{"TableName": "t1", "Key": key("p", "a"), "ReturnValues": "ALL_OLD"}, false},
		{"DeleteItem", map[string]any{"TableName": "t1", "Key": map[string]any{"pk": s("p"), "sk": s("b"), "a": n(1)}}, false},
		{"DeleteItem", map[string]any{"TableName": "t1", "Key": map[string]any{"pk": s("p")}}, false},
		{"DeleteItem", map[string]any{"TableName": "t1", "Key": key("p", "nothing")}, true},
		{"PutItem", map[string]any{"TableName": "t1", "Item": item("p", "e", 1)}, true},
		{"DeleteItem", map[string]any{"TableName": "t1", "Key": key("p", "e")}, true},
	} {
		var before, after int
		p.fastEngine.locked(func() { before = p.fastEngine.took })
		p.both(w.op, w.req)
		p.fastEngine.locked(func() { after = p.fastEngine.took })
		if took := after > before; took != w.shadow {
			t.Fatalf("write %d %s %v: the shadow took it %v, want %v", i, w.op, w.req, took, w.shadow)
		}
		p.shadowMatchesMinidyn()
	}
}
