package storetest_test

import (
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/schema"
	"github.com/dreamlake/lakeshore/server/store/storetest"
)

// TestSnapshotCoversEveryTable writes one item into each table the store
// names (every field of store.TableNames) and checks that the snapshot sees
// each write, so a "nothing changed" check cannot miss a table.
func TestSnapshotCoversEveryTable(t *testing.T) {
	ctx := t.Context()
	db := storetest.Embedded(t)
	prefix := storetest.Prefix(t)
	if err := schema.EnsureTables(ctx, db, prefix); err != nil {
		t.Fatalf("create tables: %v", err)
	}
	names := reflect.ValueOf(store.NamesFor(prefix))
	var suffixes []string
	for i := range names.NumField() {
		suffixes = append(suffixes, strings.TrimPrefix(names.Field(i).String(), prefix))
	}
	slices.Sort(suffixes)
	before := storetest.TakeSnapshot(t, db, prefix)
	if got := slices.Sorted(maps.Keys(before)); !slices.Equal(got, suffixes) {
		t.Errorf("snapshot tables = %v, want every table of store.TableNames %v", got, suffixes)
	}

	defs, err := schema.TableDefinitions(prefix)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*dynamodb.CreateTableInput{}
	for _, d := range defs {
		byName[aws.ToString(d.TableName)] = d
	}
	for i := range names.NumField() {
		table := names.Field(i).String()
		def, ok := byName[table]
		if !ok {
			t.Fatalf("no table %s in the schema", table)
		}
		item := map[string]types.AttributeValue{}
		for _, k := range def.KeySchema {
			item[aws.ToString(k.AttributeName)] = keyValue(t, def.AttributeDefinitions, aws.ToString(k.AttributeName))
		}
		if _, err := db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item}); err != nil {
			t.Fatalf("put into %s: %v", table, err)
		}
	}
	diff := before.Diff(storetest.TakeSnapshot(t, db, prefix))
	for _, s := range suffixes {
		if !strings.Contains(diff, s+": new or changed: ") {
			t.Errorf("the snapshot does not see an item written to the %s table; diff:\n%s", s, diff)
		}
	}
}

// keyValue is a value for key attribute name of the type its table defines.
func keyValue(t *testing.T, defs []types.AttributeDefinition, name string) types.AttributeValue {
	t.Helper()
	for _, d := range defs {
		if aws.ToString(d.AttributeName) != name {
			continue
		}
		switch d.AttributeType {
		case types.ScalarAttributeTypeS:
			return &types.AttributeValueMemberS{Value: "k"}
		case types.ScalarAttributeTypeN:
			return &types.AttributeValueMemberN{Value: "1"}
		case types.ScalarAttributeTypeB:
			return &types.AttributeValueMemberB{Value: []byte("k")}
		}
	}
	t.Fatalf("no attribute definition for key %s", name)
	return nil
}
