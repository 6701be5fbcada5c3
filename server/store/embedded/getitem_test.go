package embedded

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/truora/minidyn/server"
)

// richItem is an item of t2 for key (pk, k) holding every attribute type,
// numbers as a client may write them ("1.50", "-0", "1e3"), and nesting.
func (g *diffGen) richItem(pk string, k int) map[string]any {
	nums := []string{"1.50", "-0", "1e3", "007", "12345678901234567890.5"}
	return map[string]any{
		"pk": s(pk), "nr": n(k), "a": n(g.r.IntN(5)),
		"num":  map[string]any{"N": nums[g.r.IntN(len(nums))]},
		"bin":  map[string]any{"B": "AAEC/w=="},
		"flag": map[string]any{"BOOL": g.r.IntN(2) == 0},
		"none": map[string]any{"NULL": true},
		"ss":   map[string]any{"SS": []string{"x", g.sk()}},
		"ns":   map[string]any{"NS": []string{"1", "2.5"}},
		"bs":   map[string]any{"BS": []string{"AQ==", "Ag=="}},
		"list": map[string]any{"L": []any{s("é ünïcode <&>"), n(3), map[string]any{"M": map[string]any{"deep": s(g.sk())}}}},
		"map":  map[string]any{"M": map[string]any{"in": map[string]any{"L": []any{}}, "e": s("")}},
	}
}

// TestShadowHoldsWhatMinidynHolds: after every write, of every kind and
// outcome (puts, conditional ones that fail, updates, deletes, batches,
// transactions applied or cancelled), each item the shadow holds is the
// item plain minidyn holds, and the fast handler's own minidyn once given
// the writes the shadow took alone; and a GetItem or BatchGetItem the
// shadow answers is what plain minidyn answers, for items present and
// absent.
func TestShadowHoldsWhatMinidynHolds(t *testing.T) {
	for seed := range uint64(3) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			p, g := newDiff(t, seed, 13)
			gets := 0
			for i := range 500 {
				switch i % 5 {
				case 0:
					p.both("TransactWriteItems", g.transaction())
				case 1:
					// Rich items have keys of their own: minidyn's own
					// transactions and updates read some of their types
					// otherwise than the shadow's path does (sets in
					// another order, an empty list refused).
					pk, k := "r"+strconv.Itoa(g.r.IntN(2)), g.r.IntN(3)
					switch g.r.IntN(4) {
					case 0:
						p.both("DeleteItem", map[string]any{"TableName": "t2", "Key": map[string]any{"pk": s(pk), "nr": n(k)}})
					case 1:
						p.both("PutItem", map[string]any{"TableName": "t2", "Item": g.richItem(pk, k), "ConditionExpression": "attribute_not_exists(pk)"})
					default:
						p.both("PutItem", map[string]any{"TableName": "t2", "Item": g.richItem(pk, k)})
					}
					p.both("GetItem", map[string]any{"TableName": "t2", "Key": map[string]any{"pk": s(pk), "nr": n(k)}})
					gets++
				default:
					p.both(g.write())
				}
				p.shadowMatchesMinidyn()
				batch := map[string]any{}
				for range 3 {
					table := g.table()
					_, _, key := g.key(table)
					p.both("GetItem", map[string]any{"TableName": table, "Key": key, "ConsistentRead": g.r.IntN(2) == 0})
					gets++
					// The same keys in one batch (a key asked twice is
					// answered twice, as minidyn does).
					if batch[table] == nil {
						batch[table] = map[string]any{"Keys": []any{}}
					}
					reqs := batch[table].(map[string]any)
					reqs["Keys"] = append(reqs["Keys"].([]any), key)
				}
				p.both("BatchGetItem", map[string]any{"RequestItems": batch})
			}
			if got := p.gotItems(); got != gets {
				t.Fatalf("the shadow answered %d of %d GetItems", got, gets)
			}
			if got := p.gotBatches(); got != 500 {
				t.Fatalf("the shadow answered %d of 500 BatchGetItems", got)
			}
		})
	}
}

// TestGetItemLeavesMinidynItsErrors: a GetItem or BatchGetItem the shadow
// does not read as plainly valid (a key missing or extra or of another type, an unknown
// table, a projection) is answered by minidyn, as plain minidyn answers it.
func TestGetItemLeavesMinidynItsErrors(t *testing.T) {
	p := newPair(t)
	for _, tbl := range diffTables {
		p.both("CreateTable", tbl)
	}
	p.both("PutItem", map[string]any{"TableName": "t1", "Item": map[string]any{"pk": s("p1"), "sk": s("a"), "a": n(1), "b": s("x")}})
	for _, req := range []map[string]any{
		{"TableName": "t1", "Key": map[string]any{"pk": s("p1")}},
		{"TableName": "t1", "Key": map[string]any{"pk": s("p1"), "sk": s("a"), "a": n(1)}},
		{"TableName": "t1", "Key": map[string]any{"pk": s("p1"), "sk": n(1)}},
		{"TableName": "t1", "Key": map[string]any{"pk": s(""), "sk": s("a")}},
		{"TableName": "nope", "Key": map[string]any{"pk": s("p1"), "sk": s("a")}},
		{"TableName": "t1", "Key": map[string]any{"pk": s("p1"), "sk": s("a")}, "ProjectionExpression": "#b", "ExpressionAttributeNames": map[string]any{"#b": "b"}},
	} {
		p.both("GetItem", req)
	}
	if got := p.gotItems(); got != 0 {
		t.Fatalf("the shadow answered %d of these GetItems, want 0", got)
	}
	good := map[string]any{"pk": s("p1"), "sk": s("a")}
	many := []any{}
	for range maxBatchGetKeys + 1 {
		many = append(many, good)
	}
	for _, items := range []map[string]any{
		{},
		{"t1": map[string]any{"Keys": []any{}}},
		{"t1": map[string]any{"Keys": many}},
		{"t1": map[string]any{"Keys": []any{good, map[string]any{"pk": s(""), "sk": s("a")}}}},
		{"t1": map[string]any{"Keys": []any{good}}, "nope": map[string]any{"Keys": []any{good}}},
		{"t1": map[string]any{"Keys": []any{good}, "ProjectionExpression": "#b", "ExpressionAttributeNames": map[string]any{"#b": "b"}}},
		{"t1": map[string]any{"Keys": []any{map[string]any{"pk": s("p1")}}}},
	} {
		p.both("BatchGetItem", map[string]any{"RequestItems": items})
	}
	if got := p.gotBatches(); got != 0 {
		t.Fatalf("the shadow answered %d of these BatchGetItems, want 0", got)
	}
	code, out := p.both("GetItem", map[string]any{"TableName": "t1", "Key": good})
	if code != http.StatusOK || !strings.Contains(fmt.Sprint(out), "x") || p.gotItems() != 1 {
		t.Fatalf("a plain GetItem: %d %v, answered by the shadow %d times", code, out, p.gotItems())
	}
}

// gotItems is how many GetItems the fast handler answered from its shadow.
func (p *pair) gotItems() (n int) {
	p.fastEngine.locked(func() { n = int(p.fastEngine.gotItems.Load()) })
	return n
}

// gotBatches is how many BatchGetItems the fast handler answered from its
// shadow.
func (p *pair) gotBatches() (n int) {
	p.fastEngine.locked(func() { n = int(p.fastEngine.gotBatches.Load()) })
	return n
}

// shadowMatchesMinidyn fails unless every shadowed table of the fast
// handler holds exactly the items plain minidyn holds, which took the same
// requests; and, once the fast handler has given its own minidyn the
// writes the shadow took alone (syncAll), exactly the items there too.
func (p *pair) shadowMatchesMinidyn() {
	p.t.Helper()
	e := p.fastEngine
	e.locked(func() {
		for name, t := range e.tables {
			body, _ := json.Marshal(server.ScanInput{TableName: &name})
			code, plain := post(p.t, p.plain, "Scan", body)
			if code != http.StatusOK {
				p.t.Fatalf("scan %s in plain minidyn: %d %s", name, code, plain)
			}
			p.holds(t, "plain minidyn", name, plain)
		}
		e.syncAll()
		for name, t := range e.tables {
			rec := e.internal("Scan", server.ScanInput{TableName: &name})
			if rec == nil || rec.code != http.StatusOK {
				p.t.Fatalf("scan %s in the fast handler's minidyn: %v", name, rec)
			}
			p.holds(t, "the fast handler's minidyn", name, rec.body.Bytes())
			if len(t.dirty) > 0 {
				p.t.Fatalf("%s: %d writes not given to minidyn after syncAll", name, len(t.dirty))
			}
		}
	})
}

// holds fails unless shadow table t holds exactly the items of scan, a
// Scan's answer from where.
func (p *pair) holds(t *shadowTable, where, name string, scan []byte) {
	p.t.Helper()
	var out struct {
		Items []map[string]*server.AttributeValue
	}
	if err := json.Unmarshal(scan, &out); err != nil {
		p.t.Fatalf("scan %s in %s: %v", name, where, err)
	}
	if len(out.Items) != len(t.items) {
		p.t.Fatalf("%s: %s holds %d items, the shadow %d", name, where, len(out.Items), len(t.items))
	}
	for _, item := range out.Items {
		h, r, ok := t.tableKey(item)
		it := t.items[tableKeyID(h, r)]
		var held any
		if ok && it != nil {
			held = it.wire
		}
		// As answers carry them: an empty list decoded is an empty
		// slice, minidyn's a nil one, and both encode alike.
		a, _ := json.Marshal(item)
		b, _ := json.Marshal(held)
		if !bytes.Equal(a, b) {
			p.t.Fatalf("%s: %s holds %s, the shadow %s", name, where, a, b)
		}
	}
}
