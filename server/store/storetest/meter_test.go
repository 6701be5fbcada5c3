package storetest

import (
	"context"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

func s(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }

func TestItemSize(t *testing.T) {
	cases := []struct {
		name string
		item map[string]types.AttributeValue
		want int
	}{
		{"string", map[string]types.AttributeValue{"id": s("abc")}, 2 + 3},
		{"utf8 bytes", map[string]types.AttributeValue{"é": s("ßß")}, 2 + 4},
		// 1 byte per two significant digits, plus 1; zeros at either end
		// and the sign and point do not count.
		{"number", map[string]types.AttributeValue{"n": &types.AttributeValueMemberN{Value: "-00123.4500"}}, 1 + 3 + 1},
		{"one digit", map[string]types.AttributeValue{"n": &types.AttributeValueMemberN{Value: "7"}}, 1 + 1 + 1},
		{"bool and null", map[string]types.AttributeValue{"b": &types.AttributeValueMemberBOOL{Value: true}, "nu": &types.AttributeValueMemberNULL{Value: true}}, 2 + 3},
		{"binary", map[string]types.AttributeValue{"bin": &types.AttributeValueMemberB{Value: []byte{1, 2, 3, 4}}}, 3 + 4},
		// A list: 3 bytes, and each element 1 byte more than its value.
		{"list", map[string]types.AttributeValue{"l": &types.AttributeValueMemberL{Value: []types.AttributeValue{s("ab"), s("c")}}}, 1 + 3 + (1 + 2) + (1 + 1)},
		// A map: 3 bytes, each element its name, its value and 1 byte.
		{"map", map[string]types.AttributeValue{"m": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{"k": s("vv")}}}, 1 + 3 + (1 + 1 + 2)},
		{"empty map", map[string]types.AttributeValue{"m": &types.AttributeValueMemberM{}}, 1 + 3},
		{"string set", map[string]types.AttributeValue{"ss": &types.AttributeValueMemberSS{Value: []string{"a", "bc"}}}, 2 + 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := ItemSize(c.item); got != c.want {
				t.Fatalf("ItemSize = %d, want %d", got, c.want)
			}
		})
	}
}

// meterTable is a table keyed on id with three indexes: all (ProjectionType
// ALL on k), keys (KEYS_ONLY on h) and some (INCLUDE v, on k).
func meterTable(name string) *dynamodb.CreateTableInput {
	attr := func(n string) types.AttributeDefinition {
		return types.AttributeDefinition{AttributeName: aws.String(n), AttributeType: types.ScalarAttributeTypeS}
	}
	hash := func(n string) []types.KeySchemaElement {
		return []types.KeySchemaElement{{AttributeName: aws.String(n), KeyType: types.KeyTypeHash}}
	}
	return &dynamodb.CreateTableInput{
		TableName:            aws.String(name),
		BillingMode:          types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{attr("id"), attr("k"), attr("h")},
		KeySchema:            hash("id"),
		GlobalSecondaryIndexes: []types.GlobalSecondaryIndex{
			{IndexName: aws.String("all"), KeySchema: hash("k"), Projection: &types.Projection{ProjectionType: types.ProjectionTypeAll}},
			{IndexName: aws.String("keys"), KeySchema: hash("h"), Projection: &types.Projection{ProjectionType: types.ProjectionTypeKeysOnly}},
			{IndexName: aws.String("some"), KeySchema: hash("k"), Projection: &types.Projection{ProjectionType: types.ProjectionTypeInclude, NonKeyAttributes: []string{"v"}}},
		},
	}
}

// TestMeterBillsWrites checks the meter against write units computed by
// hand from DynamoDB's rules, step by step over one item's life.
func TestMeterBillsWrites(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := Embedded(t)
	prefix := Prefix(t)
	def := meterTable(prefix + "t")
	if _, err := db.CreateTable(ctx, def); err != nil {
		t.Fatalf("CreateTable: %v", err)
	}
	m := newMeter(db, nil, prefix, []*dynamodb.CreateTableInput{meterTable(prefix + "t")})
	table := aws.String(prefix + "t")
	big := strings.Repeat("x", 1500) // w's item is over 1 KB and under 2 KB

	steps := []struct {
		name  string
		write func() error
		want  map[string]Units
	}{
		{"put new, in all and some", func() error {
			_, err := m.PutItem(ctx, &dynamodb.PutItemInput{TableName: table, Item: map[string]types.AttributeValue{"id": s("a"), "k": s("x"), "v": s("1")}})
			return err
		}, map[string]Units{"t": {Write: 1}, "t/all": {Write: 1}, "t/some": {Write: 1}}},
		{"change v: projected by all and some", func() error {
			_, err := m.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: table, Key: map[string]types.AttributeValue{"id": s("a")},
				UpdateExpression: aws.String("SET v = :v"), ExpressionAttributeValues: map[string]types.AttributeValue{":v": s("2")}})
			return err
		}, map[string]Units{"t": {Write: 1}, "t/all": {Write: 1}, "t/some": {Write: 1}}},
		{"add w: projected by all only", func() error {
			_, err := m.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: table, Key: map[string]types.AttributeValue{"id": s("a")},
				UpdateExpression: aws.String("SET w = :w"), ExpressionAttributeValues: map[string]types.AttributeValue{":w": s(big)}})
			return err
		}, map[string]Units{"t": {Write: 2}, "t/all": {Write: 2}}},
		{"add h: into keys", func() error {
			_, err := m.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: table, Key: map[string]types.AttributeValue{"id": s("a")},
				UpdateExpression: aws.String("SET h = :h"), ExpressionAttributeValues: map[string]types.AttributeValue{":h": s("y")}})
			return err
		}, map[string]Units{"t": {Write: 2}, "t/all": {Write: 2}, "t/keys": {Write: 1}}},
		{"change k and drop w: delete and put in all and some", func() error {
			_, err := m.PutItem(ctx, &dynamodb.PutItemInput{TableName: table, Item: map[string]types.AttributeValue{"id": s("a"), "k": s("z"), "h": s("y"), "v": s("2")}})
			return err
		}, map[string]Units{"t": {Write: 2}, "t/all": {Write: 2 + 1}, "t/some": {Write: 2}}},
		{"remove k and h: deletes", func() error {
			_, err := m.PutItem(ctx, &dynamodb.PutItemInput{TableName: table, Item: map[string]types.AttributeValue{"id": s("a"), "v": s("2")}})
			return err
		}, map[string]Units{"t": {Write: 1}, "t/all": {Write: 1}, "t/some": {Write: 1}, "t/keys": {Write: 1}}},
		{"unchanged rewrite: the table only", func() error {
			_, err := m.PutItem(ctx, &dynamodb.PutItemInput{TableName: table, Item: map[string]types.AttributeValue{"id": s("a"), "v": s("2")}})
			return err
		}, map[string]Units{"t": {Write: 1}}},
		{"refused condition: the table only", func() error {
			_, err := m.PutItem(ctx, &dynamodb.PutItemInput{TableName: table, Item: map[string]types.AttributeValue{"id": s("a"), "k": s("x")},
				ConditionExpression: aws.String("attribute_not_exists(id)")})
			if err == nil {
				t.Fatal("conditional put over an existing item succeeded")
			}
			return nil
		}, map[string]Units{"t": {Write: 1}}},
		{"transaction: twice per item, a condition check included; indexes once", func() error {
			_, err := m.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
				{Put: &types.Put{TableName: table, Item: map[string]types.AttributeValue{"id": s("b"), "k": s("x")}}},
				{ConditionCheck: &types.ConditionCheck{TableName: table, Key: map[string]types.AttributeValue{"id": s("a")}, ConditionExpression: aws.String("attribute_exists(id)")}},
			}})
			return err
		}, map[string]Units{"t": {Write: 2 + 2}, "t/all": {Write: 1}, "t/some": {Write: 1}}},
	}
	for _, st := range steps {
		m.Reset()
		if err := st.write(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got := m.Snapshot(); !maps.Equal(got, st.want) {
			t.Fatalf("%s: billed %v, want %v", st.name, got, st.want)
		}
	}
}

// TestMeterBillsReads checks read units: per item for gets, summed and
// rounded once for a query, halved when eventually consistent.
func TestMeterBillsReads(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := Embedded(t)
	prefix := Prefix(t)
	if _, err := db.CreateTable(ctx, meterTable(prefix+"t")); err != nil {
		t.Fatalf("CreateTable: %v", err)
	}
	table := aws.String(prefix + "t")
	// Three items of 1,500 bytes and a bit: 4,500 and more in all, two 4 KB
	// blocks together, one each alone.
	for _, id := range []string{"a", "b", "c"} {
		item := map[string]types.AttributeValue{"id": s(id), "k": s("x"), "h": s("y"), "v": s(strings.Repeat("v", 1500))}
		if _, err := db.PutItem(ctx, &dynamodb.PutItemInput{TableName: table, Item: item}); err != nil {
			t.Fatalf("PutItem: %v", err)
		}
	}
	m := newMeter(db, nil, prefix, []*dynamodb.CreateTableInput{meterTable(prefix + "t")})
	key := func(id string) map[string]types.AttributeValue { return map[string]types.AttributeValue{"id": s(id)} }
	query := func(index, attr string, filter bool) func() error {
		return func() error {
			in := &dynamodb.QueryInput{TableName: table, IndexName: aws.String(index), KeyConditionExpression: aws.String(attr + " = :k"),
				ExpressionAttributeValues: map[string]types.AttributeValue{":k": s(map[string]string{"k": "x", "h": "y"}[attr])}}
			if filter {
				in.FilterExpression = aws.String("id = :none")
				in.ExpressionAttributeValues[":none"] = s("none")
			}
			_, err := m.Query(ctx, in)
			return err
		}
	}
	steps := []struct {
		name string
		read func() error
		want map[string]Units
	}{
		{"strong get", func() error {
			_, err := m.GetItem(ctx, &dynamodb.GetItemInput{TableName: table, Key: key("a"), ConsistentRead: aws.Bool(true)})
			return err
		}, map[string]Units{"t": {Read: 1}}},
		{"eventual get of a projection: the whole item", func() error {
			_, err := m.GetItem(ctx, &dynamodb.GetItemInput{TableName: table, Key: key("a"), ProjectionExpression: aws.String("id")})
			return err
		}, map[string]Units{"t": {Read: 0.5}}},
		{"get of nothing: one block", func() error {
			_, err := m.GetItem(ctx, &dynamodb.GetItemInput{TableName: table, Key: key("none"), ConsistentRead: aws.Bool(true)})
			return err
		}, map[string]Units{"t": {Read: 1}}},
		{"batch get: each item its own blocks", func() error {
			_, err := m.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{RequestItems: map[string]types.KeysAndAttributes{
				prefix + "t": {Keys: []map[string]types.AttributeValue{key("a"), key("b"), key("c")}}}})
			return err
		}, map[string]Units{"t": {Read: 1.5}}},
		{"query of an ALL index: summed, then rounded", query("all", "k", false), map[string]Units{"t/all": {Read: 1}}},
		{"query filtered to nothing: what it evaluated", query("all", "k", true), map[string]Units{"t/all": {Read: 1}}},
		{"query of an INCLUDE index: its projection, v included", query("some", "k", false), map[string]Units{"t/some": {Read: 1}}},
		{"query of a KEYS_ONLY index: keys only, one block", query("keys", "h", false), map[string]Units{"t/keys": {Read: 0.5}}},
	}
	for _, st := range steps {
		m.Reset()
		if err := st.read(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got := m.Snapshot(); !maps.Equal(got, st.want) {
			t.Fatalf("%s: billed %v, want %v", st.name, got, st.want)
		}
	}
}
