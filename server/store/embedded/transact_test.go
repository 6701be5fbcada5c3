package embedded

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

// transacted is how many transactions the fast handler applied item by
// item.
// undone is how many it put back after a write failed.
func (p *pair) transacted() (n, undone int) {
	p.fastEngine.locked(func() { n, undone = p.fastEngine.transacted, p.fastEngine.undone })
	return n, undone
}

// sameTables fails unless a Scan of each diff table answers the same
// items on both handlers (the fast one scans in its own order).
func (p *pair) sameTables() {
	p.t.Helper()
	for _, tbl := range []string{"t1", "t2"} {
		fast, plain := p.scanBoth(tbl, 0)
		if !slices.Equal(fast, plain) {
			p.t.Fatalf("Scan %s:\nfast  %v\nplain %v", tbl, fast, plain)
		}
	}
}

// transaction draws one TransactWriteItems: puts (some only of new items),
// updates whose conditions hold or fail, deletes (some conditional),
// condition checks, now and then two operations on one item or an update
// minidyn rejects once the earlier operations are written.
func (g *diffGen) transaction() map[string]any {
	var items []any
	for range 1 + g.r.IntN(4) {
		table := g.table()
		pk, k, key := g.key(table)
		switch g.r.IntN(7) {
		case 0:
			put := map[string]any{"TableName": table, "Item": g.item(table, pk, k)}
			if g.r.IntN(2) == 0 {
				put["ConditionExpression"] = "attribute_not_exists(pk)"
			}
			items = append(items, map[string]any{"Put": put})
		case 1, 2:
			vals := map[string]any{":a": n(g.r.IntN(5))}
			cond := "attribute_exists(#p)"
			if g.r.IntN(2) == 0 {
				cond += " AND a <> :was"
				vals[":was"] = n(g.r.IntN(5))
			}
			items = append(items, map[string]any{"Update": map[string]any{"TableName": table, "Key": key,
				"UpdateExpression": "SET a = :a", "ConditionExpression": cond,
				"ExpressionAttributeNames": map[string]any{"#p": "pk"}, "ExpressionAttributeValues": vals}})
		case 3:
			del := map[string]any{"TableName": table, "Key": key}
			if g.r.IntN(2) == 0 {
				del["ConditionExpression"] = "a < :lim"
				del["ExpressionAttributeValues"] = map[string]any{":lim": n(3)}
			}
			items = append(items, map[string]any{"Delete": del})
		case 4:
			cond := "attribute_not_exists(pk)"
			if g.r.IntN(2) == 0 {
				cond = "attribute_exists(pk)"
			}
			items = append(items, map[string]any{"ConditionCheck": map[string]any{"TableName": table, "Key": key, "ConditionExpression": cond}})
		case 5:
			if len(items) > 0 && g.r.IntN(2) == 0 { // the same item again
				items = append(items, items[len(items)-1])
				continue
			}
			items = append(items, map[string]any{"Put": map[string]any{"TableName": table, "Item": g.item(table, pk, k)}})
		default: // a syntax error minidyn finds only when it applies the update
			if g.r.IntN(3) == 0 {
				items = append(items, map[string]any{"Update": map[string]any{"TableName": table, "Key": key,
					"UpdateExpression": "SET a = = :a", "ExpressionAttributeValues": map[string]any{":a": n(1)}}})
				continue
			}
			items = append(items, map[string]any{"Update": map[string]any{"TableName": table, "Key": key,
				"UpdateExpression": "SET b = :b", "ExpressionAttributeValues": map[string]any{":b": s(g.sk())}}})
		}
	}
	return map[string]any{"TransactItems": items}
}

// TestTransactMatchesMinidyn: random transactions answer as plain
// minidyn's do and leave the same tables, and the fast handler applies the
// ones whose conditions hold item by item.
func TestTransactMatchesMinidyn(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			p, g := newDiff(t, seed, 11)
			ok := 0
			for i := range 400 {
				op, req := "TransactWriteItems", g.transaction()
				if i%3 == 0 {
					op, req = g.write()
				}
				if code, _ := p.both(op, req); code == http.StatusOK && op == "TransactWriteItems" {
					ok++
				}
				p.sameTables()
			}
			applied, undone := p.transacted()
			if ok == 0 || applied != ok || undone == 0 {
				t.Fatalf("%d transactions succeeded; the fast handler applied %d and put back %d", ok, applied, undone)
			}
			t.Logf("%d transactions succeeded; the fast handler applied %d and put back %d", ok, applied, undone)
		})
	}
}

// txBody is a transaction of a conditional Update of an item of the cost
// table and a Put of a new one.
func txBody(tb testing.TB, i int) []byte {
	tb.Helper()
	// The AWS SDK sends a ClientRequestToken with every transaction.
	body, err := json.Marshal(map[string]any{"ClientRequestToken": fmt.Sprint("token-", i), "TransactItems": []any{
		map[string]any{"Update": map[string]any{"TableName": "cost", "Key": map[string]any{"pk": s("hot"), "sk": s("k00000001")},
			"UpdateExpression": "SET body = :b", "ConditionExpression": "attribute_exists(pk)",
			"ExpressionAttributeValues": map[string]any{":b": s(fmt.Sprint("v", i))}}},
		map[string]any{"Put": map[string]any{"TableName": "cost", "Item": map[string]any{
			"pk": s(fmt.Sprint("new", i%50)), "sk": s(fmt.Sprintf("n%08d", i)), "gh": s(fmt.Sprint("g", i%7)), "body": s("payload"),
		}}},
	}})
	if err != nil {
		tb.Fatalf("encode transaction: %v", err)
	}
	return body
}

// TestTransactCostIndependentOfTable: a transaction allocates about as
// much in a table of 20,000 items as in one of 100 (a copy of the table
// would allocate per item).
func TestTransactCostIndependentOfTable(t *testing.T) {
	allocsIndependentOfTable(t, "transaction", func(srv *httptest.Server, i int) {
		if code, out := post(t, srv, "TransactWriteItems", txBody(t, i)); code != http.StatusOK {
			t.Fatalf("TransactWriteItems: %d %s", code, out)
		}
	}, nil)
}

// allocsIndependentOfTable runs write (its i-th call) 20 times on the
// cost table of 100 items and on the one of 20,000, and fails when a call
// allocates over twice as much in the larger (what names a call); check,
// when set, then looks at each table's engine.
func allocsIndependentOfTable(t *testing.T, what string, write func(srv *httptest.Server, i int), check func(size int, e *engine)) {
	t.Helper()
	var allocs [2]float64
	for j, size := range []int{100, 20_000} {
		srv, e := costTable(t, size-10)
		i := 0
		allocs[j] = testing.AllocsPerRun(20, func() {
			i++
			write(srv, i)
		})
		if check != nil {
			check(size, e)
		}
	}
	if allocs[1] > 2*allocs[0] {
		t.Errorf("allocations per %s: %.0f in a table of 100 items, %.0f in one of 20,000", what, allocs[0], allocs[1])
	}
	t.Logf("allocations per %s: %.0f in a table of 100 items, %.0f in one of 20,000", what, allocs[0], allocs[1])
}

// BenchmarkEmbeddedTransact is a two-item TransactWriteItems (a
// conditional Update and a Put) on a table of 100 items and one of 20,000.
func BenchmarkEmbeddedTransact(b *testing.B) {
	benchWrites(b, "TransactWriteItems", txBody)
}

// TestLostRacesCostIndependentOfTable: a write whose condition does not
// hold (a claim that lost its race: a PutItem, or a transaction's put) is
// refused as minidyn refuses it, and costs about as much in a table of
// 20,000 items as in one of 100, though the shadow took a write alone
// just before. minidyn would first be given that write (a sort of the
// table's keys) and, for a transaction, copy the table whole.
func TestLostRacesCostIndependentOfTable(t *testing.T) {
	lost := map[string]func(i int) (string, any){
		"PutItem": func(int) (string, any) {
			return "PutItem", map[string]any{"TableName": "cost", "Item": map[string]any{"pk": s("hot"), "sk": s("k00000001"), "body": s("mine")},
				"ConditionExpression": "attribute_not_exists(pk)"}
		},
		"TransactWriteItems": func(i int) (string, any) {
			return "TransactWriteItems", map[string]any{"ClientRequestToken": fmt.Sprint("lost-", i), "TransactItems": []any{
				map[string]any{"Put": map[string]any{"TableName": "cost", "Item": map[string]any{"pk": s("hot"), "sk": s("k00000002"), "body": s("mine")},
					"ConditionExpression": "attribute_not_exists(pk)"}},
				map[string]any{"Update": map[string]any{"TableName": "cost", "Key": map[string]any{"pk": s("hot"), "sk": s("k00000003")},
					"UpdateExpression": "SET body = :b", "ExpressionAttributeValues": map[string]any{":b": s("mine")}}},
			}}
		},
	}
	for name, write := range lost {
		t.Run(name, func(t *testing.T) {
			allocsIndependentOfTable(t, "lost race (and the shadow's put before it)", func(srv *httptest.Server, i int) {
				// A write the shadow takes alone, as a submit's is.
				body, _ := json.Marshal(map[string]any{"TableName": "cost", "Item": map[string]any{"pk": s("new"), "sk": s(fmt.Sprintf("n%08d", i)), "gh": s("g")}})
				if code, out := post(t, srv, "PutItem", body); code != http.StatusOK {
					t.Fatalf("PutItem: %d %s", code, out)
				}
				op, req := write(i)
				body, _ = json.Marshal(req)
				code, out := post(t, srv, op, body)
				if code != http.StatusBadRequest || !bytes.Contains(out, []byte("ConditionalCheckFailed")) {
					t.Fatalf("%s: %d %s, want a failed condition", op, code, out)
				}
			}, func(size int, e *engine) {
				var refused, dirty int
				e.locked(func() { refused, dirty = e.refused, len(e.tables["cost"].dirty) })
				if refused == 0 || dirty == 0 {
					t.Fatalf("table of %d: the shadow refused %d writes and holds %d writes minidyn has not taken; want the refusals its own", size, refused, dirty)
				}
			})
		})
	}
}

// TestRefusalsThatReturnTheItem: a transaction operation that asks for
// its item back when its condition does not hold is refused by minidyn,
// whose answer carries the item; the shadow does not answer it.
func TestRefusalsThatReturnTheItem(t *testing.T) {
	p := newPair(t)
	for _, tbl := range diffTables {
		p.both("CreateTable", tbl)
	}
	key := map[string]any{"pk": s("p"), "sk": s("a")}
	p.both("PutItem", map[string]any{"TableName": "t1", "Item": map[string]any{"pk": s("p"), "sk": s("a"), "a": n(1)}})
	code, out := p.both("TransactWriteItems", map[string]any{"TransactItems": []any{
		map[string]any{"ConditionCheck": map[string]any{"TableName": "t1", "Key": key, "ConditionExpression": "attribute_not_exists(pk)",
			"ReturnValuesOnConditionCheckFailure": "ALL_OLD"}},
	}})
	if code != http.StatusBadRequest || !strings.Contains(fmt.Sprint(out), "ConditionalCheckFailed") {
		t.Fatalf("a failed condition check = %d %v, want it refused", code, out)
	}
	p.shadowMatchesMinidyn()
}

// TestRefusalsOfWritesCarryingEmptyValues: a write whose condition does
// not hold is refused as minidyn refuses it though the item it carries
// holds an empty list, alone or in a transaction (minidyn applies the
// transaction's first put, then puts it back).
func TestRefusalsOfWritesCarryingEmptyValues(t *testing.T) {
	p := newPair(t)
	for _, tbl := range diffTables {
		p.both("CreateTable", tbl)
	}
	p.both("PutItem", map[string]any{"TableName": "t1", "Item": map[string]any{"pk": s("p"), "sk": s("a"), "a": n(1)}})
	withEmpty := func(sk string) map[string]any {
		return map[string]any{"pk": s("p"), "sk": s(sk), "l": map[string]any{"L": []any{}}}
	}
	for _, w := range []struct {
		op  string
		req map[string]any
	}{
		{"PutItem", map[string]any{"TableName": "t1", "Item": withEmpty("a"), "ConditionExpression": "attribute_not_exists(pk)"}},
		{"TransactWriteItems", map[string]any{"TransactItems": []any{
			map[string]any{"Put": map[string]any{"TableName": "t1", "Item": withEmpty("b")}},
			map[string]any{"Put": map[string]any{"TableName": "t1", "Item": withEmpty("a"), "ConditionExpression": "attribute_not_exists(pk)"}},
		}}},
		{"PutItem", map[string]any{"TableName": "t1", "Item": map[string]any{"pk": s("p"), "sk": s("a"), "a": n(2)}, "ConditionExpression": "attribute_not_exists(pk)"}},
	} {
		if code, out := p.both(w.op, w.req); code != http.StatusBadRequest || !strings.Contains(fmt.Sprint(out), "ConditionalCheckFailed") {
			t.Fatalf("%s = %d %v, want it refused", w.op, code, out)
		}
		p.shadowMatchesMinidyn()
	}
	var refused int
	p.fastEngine.locked(func() { refused = p.fastEngine.refused })
	if refused != 3 {
		t.Fatalf("the shadow refused %d of the 3 writes itself", refused)
	}
}
