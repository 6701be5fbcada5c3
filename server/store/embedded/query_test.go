package embedded

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/server/store"
)

// pair is the handler under test beside plain minidyn, fed the same
// requests.
type pair struct {
	t           *testing.T
	fast, plain *httptest.Server
	fastEngine  *engine
	fastDB      *dynamodb.Client
	plainDB     *dynamodb.Client
}

func newPair(t *testing.T) *pair {
	t.Helper()
	p := &pair{t: t}
	var fastHandler http.Handler
	fastHandler, p.fastEngine = newHandlerEngine(true)
	p.fast = httptest.NewServer(fastHandler)
	p.plain = httptest.NewServer(newHandler(false))
	t.Cleanup(p.fast.Close)
	t.Cleanup(p.plain.Close)
	p.fastDB = store.EndpointClient(p.fast.URL)
	p.plainDB = store.EndpointClient(p.plain.URL)
	return p
}

// shadowed reports whether the fast handler holds a shadow of table.
func (p *pair) shadowed(table string) (ok bool) {
	p.fastEngine.locked(func() { _, ok = p.fastEngine.tables[table] })
	return ok
}

// evaluated is how many items the fast handler's Queries have read.
func (p *pair) evaluated() (n int) {
	p.fastEngine.locked(func() { n = int(p.fastEngine.evaluated.Load()) })
	return n
}

// answered is how many Queries the fast handler answered from its shadow.
func (p *pair) answered() (n int) {
	p.fastEngine.locked(func() { n = int(p.fastEngine.answered.Load()) })
	return n
}

// post sends one raw request to srv.
func post(t testing.TB, srv *httptest.Server, op string, body []byte) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(body))
	if err != nil {
		t.Fatalf("build %s: %v", op, err)
	}
	req.Header.Set("X-Amz-Target", "DynamoDB_20120810."+op)
	req.Header.Set("Content-Type", "application/x-amz-json-1.0")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", op, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s: read answer: %v", op, err)
	}
	return resp.StatusCode, out
}

// both sends a request to both handlers and fails unless the answers are
// equal as decoded JSON values. It returns the plain handler's answer.
func (p *pair) both(op string, req any) (int, map[string]any) {
	p.t.Helper()
	body, err := json.Marshal(req)
	if err != nil {
		p.t.Fatalf("encode %s: %v", op, err)
	}
	fc, fb := post(p.t, p.fast, op, body)
	pc, pb := post(p.t, p.plain, op, body)
	fv, pv := decode(p.t, fb), decode(p.t, pb)
	// A table's description holds its creation time: only the codes match.
	tableCall := strings.HasSuffix(op, "Table")
	if fc != pc || (!tableCall && !reflect.DeepEqual(fv, pv)) {
		p.t.Fatalf("%s %s:\nfast  %d %s\nplain %d %s", op, body, fc, fb, pc, pb)
	}
	return pc, pv
}

func decode(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal(b, &v); err != nil {
		return map[string]any{"raw": string(b)}
	}
	return v
}

func s(v string) map[string]any { return map[string]any{"S": v} }
func n(v int) map[string]any    { return map[string]any{"N": strconv.Itoa(v)} }

// The differential test's tables. Their values keep to where minidyn's own
// order is DynamoDB's (minidyn sorts keys as "hash.range" strings): hash
// values of one length, S sort keys of letters, N sort keys of two digits.
// Every item of "t1" is in index g1; an item's membership of the sparse
// index sp is fixed by its key, and UpdateItem never adds or drops an index
// key, because minidyn v0.8.2 loses index entries there (its index bugs,
// which the shadow does not have).
var diffTables = []map[string]any{
	tableSpec("t1", []string{"pk", "S", "sk", "S", "gh", "S", "gr", "N", "sp", "S"}, keySchema("pk", "sk"),
		"GlobalSecondaryIndexes", []any{
			indexSpec("g1", keySchema("gh", "gr"), "KEYS_ONLY"),
			indexSpec("sp", keySchema("sp", ""), "INCLUDE", "a"),
			indexSpec("g3", keySchema("gh", "sk"), "ALL"),
		}),
	tableSpec("t2", []string{"pk", "S", "nr", "N", "ls", "S"}, keySchema("pk", "nr"),
		"LocalSecondaryIndexes", []any{indexSpec("l2", keySchema("pk", "ls"), "KEYS_ONLY")}),
}

// tableSpec is a CreateTable request: attrs holds name, type pairs; kind
// names the list of indexes (global or local).
func tableSpec(name string, attrs []string, key []any, kind string, indexes []any) map[string]any {
	var defs []any
	for i := 0; i+1 < len(attrs); i += 2 {
		defs = append(defs, map[string]any{"AttributeName": attrs[i], "AttributeType": attrs[i+1]})
	}
	return map[string]any{"TableName": name, "BillingMode": "PAY_PER_REQUEST", "AttributeDefinitions": defs, "KeySchema": key, kind: indexes}
}

// keySchema is a key of hash and, unless "", range.
func keySchema(hash, rng string) []any {
	key := []any{map[string]any{"AttributeName": hash, "KeyType": "HASH"}}
	if rng != "" {
		key = append(key, map[string]any{"AttributeName": rng, "KeyType": "RANGE"})
	}
	return key
}

// indexSpec is a secondary index with its projection (and, for INCLUDE,
// its non-key attributes).
func indexSpec(name string, key []any, projection string, include ...string) map[string]any {
	p := map[string]any{"ProjectionType": projection}
	if len(include) > 0 {
		p["NonKeyAttributes"] = include
	}
	return map[string]any{"IndexName": name, "KeySchema": key, "Projection": p}
}

// newDiff is a pair with the differential tables (diffTables) created on
// both handlers, and a generator drawing from stream of seed.
func newDiff(t *testing.T, seed, stream uint64) (*pair, *diffGen) {
	t.Helper()
	p := newPair(t)
	g := &diffGen{r: rand.New(rand.NewPCG(seed, stream)), starts: map[string][]map[string]any{}, dropped: map[string]bool{}}
	for _, tbl := range diffTables {
		p.both("CreateTable", tbl)
	}
	return p, g
}

// diffGen draws the random operations of one run.
type diffGen struct {
	r *rand.Rand
	// starts holds LastEvaluatedKeys answered so far, by table/index.
	starts map[string][]map[string]any
	// dropped names indexes deleted: minidyn v0.8.2 panics on a Query of
	// an index it does not have.
	dropped map[string]bool
}

func (g *diffGen) pk() string { return "p" + strconv.Itoa(g.r.IntN(4)) }
func (g *diffGen) sk() string {
	b := make([]byte, 1+g.r.IntN(3))
	for i := range b {
		b[i] = "abc"[g.r.IntN(3)]
	}
	return string(b)
}
func (g *diffGen) num() int { return 10 + g.r.IntN(90) }

// sparseMember reports whether the item of a t1 key carries the sparse
// index's attribute: fixed by the key (see diffTables).
func sparseMember(pk, sk string) bool { return (len(sk)+int(pk[1]))%2 == 0 }

// item draws a whole item of table for key (pk, k).
func (g *diffGen) item(table, pk string, k any) map[string]any {
	it := map[string]any{"pk": s(pk), "a": n(g.r.IntN(5))}
	if g.r.IntN(2) == 0 {
		it["b"] = s(g.sk())
	}
	switch table {
	case "t1":
		sk := k.(string)
		it["sk"] = s(sk)
		it["gh"] = s("g" + strconv.Itoa(g.r.IntN(3)))
		it["gr"] = n(g.num())
		if sparseMember(pk, sk) {
			it["sp"] = s("s" + strconv.Itoa(g.r.IntN(2)))
		}
	default:
		it["nr"] = n(k.(int))
		it["ls"] = s(g.sk())
	}
	return it
}

func (g *diffGen) key(table string) (string, any, map[string]any) {
	pk := g.pk()
	if table == "t1" {
		sk := g.sk()
		return pk, sk, map[string]any{"pk": s(pk), "sk": s(sk)}
	}
	k := g.num()
	return pk, k, map[string]any{"pk": s(pk), "nr": n(k)}
}

func (g *diffGen) table() string { return []string{"t1", "t2"}[g.r.IntN(2)] }

// write draws one write request.
func (g *diffGen) write() (string, map[string]any) {
	table := g.table()
	pk, k, key := g.key(table)
	switch g.r.IntN(6) {
	case 0, 1:
		req := map[string]any{"TableName": table, "Item": g.item(table, pk, k)}
		if g.r.IntN(3) == 0 { // fails when the item exists
			req["ConditionExpression"] = "attribute_not_exists(pk)"
		}
		return "PutItem", req
	case 2:
		// Only existing items (minidyn indexes an upsert wrongly), and no
		// index key gained or lost; a failed condition writes nothing.
		expr := "SET a = :a"
		vals := map[string]any{":a": n(g.r.IntN(5))}
		if table == "t1" && g.r.IntN(2) == 0 {
			expr += ", gr = :gr"
			vals[":gr"] = n(g.num())
		}
		cond := "attribute_exists(pk)"
		if g.r.IntN(3) == 0 {
			cond += " AND a = :was"
			vals[":was"] = n(g.r.IntN(5))
		}
		return "UpdateItem", map[string]any{"TableName": table, "Key": key, "UpdateExpression": expr,
			"ConditionExpression": cond, "ExpressionAttributeValues": vals}
	case 3:
		return "DeleteItem", map[string]any{"TableName": table, "Key": key}
	case 4:
		var reqs []any
		for range 1 + g.r.IntN(4) {
			pk, k, key := g.key(table)
			if g.r.IntN(3) == 0 {
				reqs = append(reqs, map[string]any{"DeleteRequest": map[string]any{"Key": key}})
				continue
			}
			reqs = append(reqs, map[string]any{"PutRequest": map[string]any{"Item": g.item(table, pk, k)}})
		}
		return "BatchWriteItem", map[string]any{"RequestItems": map[string]any{table: reqs}}
	default:
		var items []any
		seen := map[string]bool{}
		for range 1 + g.r.IntN(3) {
			table := g.table()
			pk, k, key := g.key(table)
			id := fmt.Sprint(table, pk, k)
			if seen[id] {
				continue
			}
			seen[id] = true
			switch g.r.IntN(4) {
			case 0:
				items = append(items, map[string]any{"Put": map[string]any{"TableName": table, "Item": g.item(table, pk, k)}})
			case 1:
				items = append(items, map[string]any{"Delete": map[string]any{"TableName": table, "Key": key}})
			case 2:
				items = append(items, map[string]any{"Update": map[string]any{"TableName": table, "Key": key,
					"UpdateExpression": "SET b = :b", "ConditionExpression": "attribute_exists(pk)",
					"ExpressionAttributeValues": map[string]any{":b": s(g.sk())}}})
			default: // cancels the transaction when the item exists
				items = append(items, map[string]any{"ConditionCheck": map[string]any{"TableName": table, "Key": key,
					"ConditionExpression": "attribute_not_exists(pk)"}})
			}
		}
		return "TransactWriteItems", map[string]any{"TransactItems": items}
	}
}

// querySpec is one random Query, rendered both as raw JSON and as an SDK
// input from the same values.
type querySpec struct {
	table, index       string
	keyExpr            string
	names              map[string]string
	values             map[string]map[string]any
	filter, projection string
	forward            bool
	limit              int32
	count              bool
	start              map[string]any
	invalid            bool
}

// query draws one Query: each key condition shape, #name aliases, either
// operand order, optional parentheses, either direction, Limit, a start key
// from an earlier answer, a filter, a projection, Select COUNT.
func (g *diffGen) query(p *pair) querySpec {
	q := querySpec{names: map[string]string{}, values: map[string]map[string]any{}, forward: g.r.IntN(2) == 0}
	type shape struct {
		table, index, hash, rng, rngType string
		hashVal                          func() map[string]any
	}
	shapes := []shape{
		{"t1", "", "pk", "sk", "S", func() map[string]any { return s(g.pk()) }},
		{"t1", "g1", "gh", "gr", "N", func() map[string]any { return s("g" + strconv.Itoa(g.r.IntN(4))) }},
		{"t1", "sp", "sp", "", "", func() map[string]any { return s("s" + strconv.Itoa(g.r.IntN(3))) }},
		{"t1", "g3", "gh", "sk", "S", func() map[string]any { return s("g" + strconv.Itoa(g.r.IntN(4))) }},
		{"t2", "", "pk", "nr", "N", func() map[string]any { return s(g.pk()) }},
		{"t2", "l2", "pk", "ls", "S", func() map[string]any { return s(g.pk()) }},
	}
	sh := shapes[g.r.IntN(len(shapes))]
	for g.dropped[sh.index] {
		sh = shapes[g.r.IntN(len(shapes))]
	}
	q.table, q.index = sh.table, sh.index
	name := func(attr string) string {
		if g.r.IntN(2) == 0 {
			return attr
		}
		alias := "#" + attr + "x"
		q.names[alias] = attr
		return alias
	}
	hv := sh.hashVal()
	if starts := g.starts[q.table+"/"+q.index]; len(starts) > 0 && g.r.IntN(2) == 0 {
		start := starts[g.r.IntN(len(starts))]
		// A start key whose item is gone or moved is not compared: minidyn
		// then answers nothing, DynamoDB (and the shadow) what follows it.
		if p.startValid(q, start) {
			q.start = start
			hv = start[sh.hash].(map[string]any)
		}
	}
	q.values[":h"] = hv
	hn := name(sh.hash)
	cond := hn + " = :h"
	if g.r.IntN(2) == 0 {
		cond = ":h = " + hn
	}
	rv := func() map[string]any {
		if sh.rngType == "N" {
			return n(g.num())
		}
		return s(g.sk())
	}
	var rc string
	if sh.rng != "" {
		switch op := g.r.IntN(9); op {
		case 0, 1, 2, 3, 4:
			ops := []string{"=", "<", "<=", ">", ">="}
			flip := []string{"=", ">", ">=", "<", "<="}
			q.values[":r"] = rv()
			rc = name(sh.rng) + " " + ops[op] + " :r"
			if g.r.IntN(2) == 0 {
				rc = ":r " + flip[op] + " " + strings.Fields(rc)[0]
			}
		case 5:
			a, b := rv(), rv()
			if compareSpec(a, b) > 0 {
				a, b = b, a
			}
			q.values[":lo"], q.values[":hi"] = a, b
			rc = name(sh.rng) + " BETWEEN :lo AND :hi"
		case 6:
			if sh.rngType == "S" {
				q.values[":pre"] = s(g.sk()[:1])
				rc = "begins_with(" + name(sh.rng) + ", :pre)"
			}
		}
	}
	switch {
	case rc == "":
		q.keyExpr = cond
	case g.r.IntN(3) == 0:
		q.keyExpr = "(" + rc + ") AND (" + cond + ")"
	case g.r.IntN(2) == 0:
		q.keyExpr = "(" + cond + " AND " + rc + ")"
	default:
		q.keyExpr = cond + " AND " + rc
	}
	// minidyn counts every entry of the table towards Limit when a filter is
	// set; DynamoDB (and the shadow) only the partition's: one or the other.
	if g.r.IntN(2) == 0 {
		q.limit = int32(1 + g.r.IntN(4))
	} else if g.r.IntN(2) == 0 {
		q.filter = []string{"a = :fa", "attribute_exists(b)", "a > :fa AND attribute_not_exists(b)"}[g.r.IntN(3)]
		if strings.Contains(q.filter, ":fa") {
			q.values[":fa"] = n(g.r.IntN(5))
		}
	}
	// Now and then a request minidyn rejects (an unused #name): the shadow
	// leaves it to minidyn, whose error both answer.
	if g.r.IntN(20) == 0 {
		q.names["#unused"] = "zz"
		q.invalid = true
	}
	switch g.r.IntN(5) {
	case 0:
		q.count = true
	case 1:
		q.projection = name("a") + ", pk"
	case 2:
		q.projection = "b, " + name("pk")
	}
	return q
}

// compareSpec orders two raw key values of one type.
func compareSpec(a, b map[string]any) int {
	if x, ok := a["N"].(string); ok {
		xi, _ := strconv.Atoi(x)
		yi, _ := strconv.Atoi(b["N"].(string))
		return xi - yi
	}
	return strings.Compare(a["S"].(string), b["S"].(string))
}

// startValid reports whether start still names an item whose index key is
// what start holds.
func (p *pair) startValid(q querySpec, start map[string]any) bool {
	key := map[string]any{"pk": start["pk"]}
	if q.table == "t1" {
		key["sk"] = start["sk"]
	} else {
		key["nr"] = start["nr"]
	}
	_, out := p.both("GetItem", map[string]any{"TableName": q.table, "Key": key, "ConsistentRead": true})
	item, ok := out["Item"].(map[string]any)
	if !ok {
		return false
	}
	for k, v := range start {
		if !reflect.DeepEqual(item[k], v) {
			return false
		}
	}
	return true
}

func (q querySpec) raw() map[string]any {
	req := map[string]any{"TableName": q.table, "KeyConditionExpression": q.keyExpr, "ScanIndexForward": q.forward}
	if q.index != "" {
		req["IndexName"] = q.index
	}
	if len(q.names) > 0 {
		req["ExpressionAttributeNames"] = q.names
	}
	vals := map[string]any{}
	for k, v := range q.values {
		vals[k] = v
	}
	req["ExpressionAttributeValues"] = vals
	if q.filter != "" {
		req["FilterExpression"] = q.filter
	}
	if q.limit > 0 {
		req["Limit"] = q.limit
	}
	if q.count {
		req["Select"] = "COUNT"
	} else if q.projection != "" {
		req["ProjectionExpression"] = q.projection
	}
	if q.start != nil {
		req["ExclusiveStartKey"] = q.start
	}
	return req
}

func sdkValue(v any) ddbtypes.AttributeValue {
	m := v.(map[string]any)
	if x, ok := m["N"].(string); ok {
		return &ddbtypes.AttributeValueMemberN{Value: x}
	}
	return &ddbtypes.AttributeValueMemberS{Value: m["S"].(string)}
}

func sdkMap[V any](m map[string]V) map[string]ddbtypes.AttributeValue {
	if m == nil {
		return nil
	}
	out := map[string]ddbtypes.AttributeValue{}
	for k, v := range m {
		out[k] = sdkValue(any(v))
	}
	return out
}

func (q querySpec) sdk() *dynamodb.QueryInput {
	in := &dynamodb.QueryInput{
		TableName:                 aws.String(q.table),
		KeyConditionExpression:    aws.String(q.keyExpr),
		ScanIndexForward:          aws.Bool(q.forward),
		ExpressionAttributeValues: sdkMap(q.values),
		ExclusiveStartKey:         sdkMap(q.start),
	}
	if q.index != "" {
		in.IndexName = aws.String(q.index)
	}
	if len(q.names) > 0 {
		in.ExpressionAttributeNames = q.names
	}
	if q.filter != "" {
		in.FilterExpression = aws.String(q.filter)
	}
	if q.limit > 0 {
		in.Limit = aws.Int32(q.limit)
	}
	if q.count {
		in.Select = ddbtypes.SelectCount
	} else if q.projection != "" {
		in.ProjectionExpression = aws.String(q.projection)
	}
	return in
}

// compareQuery runs q on both handlers, raw or through the SDK, and fails
// unless the answers are equal. Select COUNT answers are compared on Count
// and LastEvaluatedKey: the shadow leaves Items out, as DynamoDB does;
// minidyn sends them.
func (p *pair) compareQuery(g *diffGen, q querySpec, viaSDK bool) {
	p.t.Helper()
	if viaSDK {
		ctx := context.Background()
		fo, ferr := p.fastDB.Query(ctx, q.sdk())
		po, perr := p.plainDB.Query(ctx, q.sdk())
		if (ferr == nil) != (perr == nil) || (ferr != nil && ferr.Error() != perr.Error()) {
			p.t.Fatalf("SDK Query %+v: fast err %v, plain err %v", q, ferr, perr)
		}
		if ferr != nil {
			return
		}
		if q.count {
			po.Items = nil
			if !p.shadowed(q.table) {
				fo.Items = nil
			}
		}
		if !reflect.DeepEqual(fo.Items, po.Items) || fo.Count != po.Count || !reflect.DeepEqual(fo.LastEvaluatedKey, po.LastEvaluatedKey) {
			p.t.Fatalf("SDK Query %+v:\nfast  %d %v %v\nplain %d %v %v", q, fo.Count, fo.Items, fo.LastEvaluatedKey, po.Count, po.Items, po.LastEvaluatedKey)
		}
		return
	}
	body, err := json.Marshal(q.raw())
	if err != nil {
		p.t.Fatalf("encode query: %v", err)
	}
	fc, fb := post(p.t, p.fast, "Query", body)
	pc, pb := post(p.t, p.plain, "Query", body)
	fv, pv := decode(p.t, fb), decode(p.t, pb)
	if q.count {
		delete(pv, "Items")
		if !p.shadowed(q.table) {
			delete(fv, "Items") // minidyn answered it
		}
	}
	if fc != pc || !reflect.DeepEqual(fv, pv) {
		p.t.Fatalf("Query %s:\nfast  %d %s\nplain %d %s", body, fc, fb, pc, pb)
	}
	if lek, ok := pv["LastEvaluatedKey"].(map[string]any); ok {
		k := q.table + "/" + q.index
		g.starts[k] = append(g.starts[k], lek)
	}
}

// TestQueryMatchesMinidyn: a Query the shadow answers gets the answer
// plain minidyn gives, over a random history of writes (puts, conditional
// updates that fail, deletes, batches, transactions that cancel) on tables
// with a KEYS_ONLY index, a sparse INCLUDE index, a local index, and N and
// S sort keys, and after an index is dropped (UpdateTable) or the table is
// deleted and created again. The reference is minidyn holding the indexes;
// the handler under test keeps them in its shadow alone.
func TestQueryMatchesMinidyn(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			p, g := newDiff(t, seed, 7)
			queries := 0
			steps := func(n int) {
				for i := range n {
					if g.r.IntN(2) == 0 {
						p.both(g.write())
						continue
					}
					q := g.query(p)
					if !q.invalid {
						queries++
					}
					p.compareQuery(g, q, i%5 == 0)
				}
			}
			steps(600)
			// Every query drawn is one the shadow handles.
			if answered := p.answered(); answered != queries {
				t.Fatalf("the shadow answered %d of %d queries", answered, queries)
			}
			t.Logf("%d queries read %d items", queries, p.evaluated())

			// A deleted and recreated table starts empty on both.
			p.both("DeleteTable", map[string]any{"TableName": "t2"})
			p.both("CreateTable", diffTables[1])
			g.starts = map[string][]map[string]any{}
			steps(200)

			// An index dropped by UpdateTable is gone from the shadow; the
			// others still answer as minidyn's do.
			p.both("UpdateTable", map[string]any{"TableName": "t1", "GlobalSecondaryIndexUpdates": []any{
				map[string]any{"Delete": map[string]any{"IndexName": "g3"}},
			}})
			g.dropped["g3"] = true
			if !p.shadowed("t1") {
				t.Fatal("t1 is not shadowed after UpdateTable")
			}
			body, _ := json.Marshal(map[string]any{"TableName": "t1", "IndexName": "g3", "KeyConditionExpression": "gh = :h",
				"ExpressionAttributeValues": map[string]any{":h": s("g1")}})
			if code, out := post(t, p.fast, "Query", body); code != http.StatusBadRequest || !strings.Contains(string(out), "ValidationException") {
				t.Fatalf("Query of the dropped index: %d %s, want a ValidationException", code, out)
			}
			answered := p.answered()
			queries = 0
			steps(100)
			if got := p.answered() - answered; got != queries {
				t.Fatalf("after UpdateTable the shadow answered %d of %d queries", got, queries)
			}
		})
	}
}
