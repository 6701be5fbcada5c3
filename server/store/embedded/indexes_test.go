package embedded

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/schema"
)

// miniDescription is minidyn's own description of table, asked past the
// shadow.
func miniDescription(t *testing.T, e *engine, table string) map[string]any {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"TableName": table})
	req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
	req.Header.Set("X-Amz-Target", "DynamoDB_20120810.DescribeTable")
	var rec *recorder
	e.locked(func() { rec = e.call(req, body) })
	if rec.code != http.StatusOK {
		t.Fatalf("minidyn DescribeTable %s: %d %s", table, rec.code, rec.body.Bytes())
	}
	var out struct{ Table map[string]any }
	if err := json.Unmarshal(rec.body.Bytes(), &out); err != nil {
		t.Fatalf("decode minidyn's description: %v", err)
	}
	return out.Table
}

// TestMinidynHoldsNoIndexes: minidyn keeps no secondary index of a
// shadowed table, so a write costs it its table's key slice and not an
// index's; the indexes are the shadow's (and DescribeTable shows them).
func TestMinidynHoldsNoIndexes(t *testing.T) {
	p := newPair(t)
	for _, tbl := range diffTables {
		p.both("CreateTable", tbl)
	}
	for _, table := range []string{"t1", "t2"} {
		desc := miniDescription(t, p.fastEngine, table)
		for _, kind := range []string{"GlobalSecondaryIndexes", "LocalSecondaryIndexes"} {
			if n, _ := desc[kind].([]any); len(n) > 0 {
				t.Errorf("minidyn holds %s %v of shadowed table %s", kind, desc[kind], table)
			}
		}
	}
}

// indexShape is what a described index must show: name, key, projection,
// status.
type indexShape struct {
	Name, Key, Projection string
	Status                ddbtypes.IndexStatus
}

func describedIndexes(t *testing.T, db *dynamodb.Client, table string) (global, local []indexShape, defs map[string]ddbtypes.ScalarAttributeType) {
	t.Helper()
	out, err := db.DescribeTable(context.Background(), &dynamodb.DescribeTableInput{TableName: aws.String(table)})
	if err != nil {
		t.Fatalf("DescribeTable %s: %v", table, err)
	}
	key := func(ks []ddbtypes.KeySchemaElement) string {
		var parts []string
		for _, k := range ks {
			parts = append(parts, aws.ToString(k.AttributeName)+"/"+string(k.KeyType))
		}
		return strings.Join(parts, ",")
	}
	proj := func(p *ddbtypes.Projection) string {
		if p == nil {
			return ""
		}
		return string(p.ProjectionType) + fmt.Sprint(p.NonKeyAttributes)
	}
	for _, g := range out.Table.GlobalSecondaryIndexes {
		global = append(global, indexShape{aws.ToString(g.IndexName), key(g.KeySchema), proj(g.Projection), g.IndexStatus})
	}
	for _, l := range out.Table.LocalSecondaryIndexes {
		local = append(local, indexShape{aws.ToString(l.IndexName), key(l.KeySchema), proj(l.Projection), ""})
	}
	byName := func(a, b indexShape) int { return strings.Compare(a.Name, b.Name) }
	slices.SortFunc(global, byName)
	slices.SortFunc(local, byName)
	defs = map[string]ddbtypes.ScalarAttributeType{}
	for _, d := range out.Table.AttributeDefinitions {
		defs[aws.ToString(d.AttributeName)] = d.AttributeType
	}
	return global, local, defs
}

// TestDescribeTableShowsIndexes: through the SDK, DescribeTable of the
// handler shows the indexes and attribute definitions the table was created
// with, ACTIVE, as minidyn holding the indexes shows them; schema.EnsureTables
// creates and waits for every table of the template on it, twice.
func TestDescribeTableShowsIndexes(t *testing.T) {
	p := newPair(t)
	for _, tbl := range diffTables {
		p.both("CreateTable", tbl)
	}
	p.both("PutItem", map[string]any{"TableName": "t1", "Item": map[string]any{"pk": s("p1"), "sk": s("a"), "gh": s("g1"), "gr": n(12)}})
	for _, table := range []string{"t1", "t2"} {
		fg, fl, fdefs := describedIndexes(t, p.fastDB, table)
		pg, pl, _ := describedIndexes(t, p.plainDB, table)
		for i := range fg {
			if fg[i].Status != ddbtypes.IndexStatusActive {
				t.Errorf("%s: index %s status %q, want ACTIVE", table, fg[i].Name, fg[i].Status)
			}
			fg[i].Status = "" // minidyn's own status is not the point
		}
		for i := range pg {
			pg[i].Status = ""
		}
		if !reflect.DeepEqual(fg, pg) || !reflect.DeepEqual(fl, pl) {
			t.Errorf("%s: described indexes\nfast  %v %v\nplain %v %v", table, fg, fl, pg, pl)
		}
		if len(fdefs) == 0 || fdefs["pk"] != ddbtypes.ScalarAttributeTypeS {
			t.Errorf("%s: attribute definitions %v", table, fdefs)
		}
	}

	ctx := context.Background()
	for range 2 {
		if err := schema.EnsureTables(ctx, p.fastDB, "ens-"); err != nil {
			t.Fatalf("EnsureTables: %v", err)
		}
	}
	names := store.NamesFor("ens-")
	global, _, _ := describedIndexes(t, p.fastDB, names.Invocations)
	if len(global) != 4 {
		t.Errorf("invocations table: %d GSIs described, want 4: %v", len(global), global)
	}
	if desc := miniDescription(t, p.fastEngine, names.Invocations); desc["GlobalSecondaryIndexes"] != nil {
		t.Errorf("minidyn holds the invocations table's GSIs: %v", desc["GlobalSecondaryIndexes"])
	}
}

// TestUpdateTableIndexes: UpdateTable creates a global index filled with
// the items already in the table (a Query of it answers what a filtered
// Scan of the table finds), and drops one; a Scan of an index and a Query
// of a missing index are refused with a ValidationException.
func TestUpdateTableIndexes(t *testing.T) {
	h, e := newHandlerEngine(true)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	db := store.EndpointClient(srv.URL)
	ctx := context.Background()
	call := func(op string, req any) (int, []byte) {
		body, err := json.Marshal(req)
		if err != nil {
			t.Fatalf("encode %s: %v", op, err)
		}
		return post(t, srv, op, body)
	}
	if code, out := call("CreateTable", diffTables[0]); code != http.StatusOK {
		t.Fatalf("CreateTable: %d %s", code, out)
	}
	for i := range 40 {
		item := map[string]any{"pk": s(fmt.Sprint("p", i%4)), "sk": s(fmt.Sprint("k", i)), "gh": s("g"), "gr": n(10 + i)}
		if i%3 != 0 {
			item["b"] = s(fmt.Sprint("b", i%5))
		}
		if code, out := call("PutItem", map[string]any{"TableName": "t1", "Item": item}); code != http.StatusOK {
			t.Fatalf("PutItem: %d %s", code, out)
		}
	}
	_, err := db.UpdateTable(ctx, &dynamodb.UpdateTableInput{
		TableName:            aws.String("t1"),
		AttributeDefinitions: []ddbtypes.AttributeDefinition{{AttributeName: aws.String("b"), AttributeType: ddbtypes.ScalarAttributeTypeS}},
		GlobalSecondaryIndexUpdates: []ddbtypes.GlobalSecondaryIndexUpdate{
			{Create: &ddbtypes.CreateGlobalSecondaryIndexAction{IndexName: aws.String("byb"),
				KeySchema:  []ddbtypes.KeySchemaElement{{AttributeName: aws.String("b"), KeyType: ddbtypes.KeyTypeHash}, {AttributeName: aws.String("sk"), KeyType: ddbtypes.KeyTypeRange}},
				Projection: &ddbtypes.Projection{ProjectionType: ddbtypes.ProjectionTypeAll}}},
			{Delete: &ddbtypes.DeleteGlobalSecondaryIndexAction{IndexName: aws.String("g3")}},
		},
	})
	if err != nil {
		t.Fatalf("UpdateTable: %v", err)
	}
	global, _, _ := describedIndexes(t, db, "t1")
	var names []string
	for _, g := range global {
		names = append(names, g.Name)
	}
	if fmt.Sprint(names) != "[byb g1 sp]" {
		t.Errorf("indexes after UpdateTable: %v, want [byb g1 sp]", names)
	}
	if desc := miniDescription(t, e, "t1"); desc["GlobalSecondaryIndexes"] != nil {
		t.Errorf("minidyn holds t1's GSIs after UpdateTable: %v", desc["GlobalSecondaryIndexes"])
	}

	for v := range 5 {
		b := fmt.Sprint("b", v)
		q, err := db.Query(ctx, &dynamodb.QueryInput{TableName: aws.String("t1"), IndexName: aws.String("byb"),
			KeyConditionExpression:    aws.String("b = :b"),
			ExpressionAttributeValues: map[string]ddbtypes.AttributeValue{":b": &ddbtypes.AttributeValueMemberS{Value: b}}})
		if err != nil {
			t.Fatalf("Query byb: %v", err)
		}
		sc, err := db.Scan(ctx, &dynamodb.ScanInput{TableName: aws.String("t1"), FilterExpression: aws.String("b = :b"),
			ExpressionAttributeValues: map[string]ddbtypes.AttributeValue{":b": &ddbtypes.AttributeValueMemberS{Value: b}}})
		if err != nil {
			t.Fatalf("Scan: %v", err)
		}
		sortKeys := func(items []map[string]ddbtypes.AttributeValue) []string {
			var out []string
			for _, it := range items {
				out = append(out, it["sk"].(*ddbtypes.AttributeValueMemberS).Value)
			}
			return out
		}
		got, want := sortKeys(q.Items), sortKeys(sc.Items)
		sort.Strings(want)
		if len(want) == 0 || !slices.Equal(got, want) {
			t.Errorf("Query of the new index for %s: %v, want %v", b, got, want)
		}
	}

	for name, req := range map[string]struct {
		op   string
		body map[string]any
	}{
		"query of a dropped index": {"Query", map[string]any{"TableName": "t1", "IndexName": "g3", "KeyConditionExpression": "gh = :h",
			"ExpressionAttributeValues": map[string]any{":h": s("g")}}},
		"key condition on another attribute": {"Query", map[string]any{"TableName": "t1", "IndexName": "g1", "KeyConditionExpression": "pk = :h",
			"ExpressionAttributeValues": map[string]any{":h": s("p1")}}},
		"scan of an index": {"Scan", map[string]any{"TableName": "t1", "IndexName": "g1"}},
		"create a taken name": {"UpdateTable", map[string]any{"TableName": "t1", "GlobalSecondaryIndexUpdates": []any{
			map[string]any{"Create": indexSpec("g1", keySchema("gh", ""), "ALL")}}}},
	} {
		code, out := call(req.op, req.body)
		if code != http.StatusBadRequest || !strings.Contains(string(out), "ValidationException") {
			t.Errorf("%s: %d %s, want a ValidationException", name, code, out)
		}
	}
	code, out := call("UpdateTable", map[string]any{"TableName": "t1", "GlobalSecondaryIndexUpdates": []any{
		map[string]any{"Delete": map[string]any{"IndexName": "nope"}}}})
	if code != http.StatusBadRequest || !strings.Contains(string(out), "ResourceNotFoundException") {
		t.Errorf("delete a missing index: %d %s, want ResourceNotFoundException", code, out)
	}
}
