package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/server/store/schema"
)

// Snapshot is every item of every control-plane table under one prefix
// (Tables), each item as one JSON line (map keys sorted), the lines of each
// table sorted; tables are keyed by their suffix ("workers", "invocations",
// …). Tests take one before and after a refused request: nothing may
// change.
type Snapshot map[string][]string

// Tables reports the names of every control-plane table of prefix, listed
// from template.yaml (schema.Suffixes), the schema the tables are created
// from: a table added there is snapshotted with no change here.
func Tables(prefix string) ([]string, error) {
	suffixes, err := schema.Suffixes()
	if err != nil {
		return nil, fmt.Errorf("list tables: %w", err)
	}
	out := make([]string, 0, len(suffixes))
	for _, s := range suffixes {
		out = append(out, prefix+s)
	}
	return out, nil
}

// ScanTable reads every item of table with consistent reads.
func ScanTable(ctx context.Context, db *dynamodb.Client, table string) ([]map[string]types.AttributeValue, error) {
	var items []map[string]types.AttributeValue
	in := &dynamodb.ScanInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true)}
	for {
		out, err := db.Scan(ctx, in)
		if err != nil {
			return nil, fmt.Errorf("scan %s: %w", table, err)
		}
		items = append(items, out.Items...)
		if out.LastEvaluatedKey == nil {
			return items, nil
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
}

// ItemJSON renders an item (or a key) as JSON with sorted keys.
func ItemJSON(item map[string]types.AttributeValue) (string, error) {
	var m map[string]any
	if err := attributevalue.UnmarshalMap(item, &m); err != nil {
		return "", err
	}
	b, err := json.Marshal(m) // map keys marshal sorted
	return string(b), err
}

// ReadSnapshot scans every table of prefix.
func ReadSnapshot(ctx context.Context, db *dynamodb.Client, prefix string) (Snapshot, error) {
	tables, err := Tables(prefix)
	if err != nil {
		return nil, err
	}
	snap := Snapshot{}
	for _, table := range tables {
		items, err := ScanTable(ctx, db, table)
		if err != nil {
			return nil, err
		}
		rows := make([]string, 0, len(items))
		for _, item := range items {
			row, err := ItemJSON(item)
			if err != nil {
				return nil, fmt.Errorf("%s item: %w", table, err)
			}
			rows = append(rows, row)
		}
		slices.Sort(rows)
		snap[strings.TrimPrefix(table, prefix)] = rows
	}
	return snap, nil
}

// TakeSnapshot is ReadSnapshot that fails the test on an error.
func TakeSnapshot(t testing.TB, db *dynamodb.Client, prefix string) Snapshot {
	t.Helper()
	snap, err := ReadSnapshot(context.Background(), db, prefix)
	if err != nil {
		t.Fatalf("storetest: snapshot: %v", err)
	}
	return snap
}

// Diff reports how b differs from a, one line per item, or "".
func (a Snapshot) Diff(b Snapshot) string {
	var out strings.Builder
	for _, table := range slices.Sorted(maps.Keys(a)) {
		rows, other := a[table], b[table]
		for _, r := range rows {
			if !slices.Contains(other, r) {
				fmt.Fprintf(&out, "%s: gone or changed: %s\n", table, r)
			}
		}
		for _, r := range other {
			if !slices.Contains(rows, r) {
				fmt.Fprintf(&out, "%s: new or changed: %s\n", table, r)
			}
		}
	}
	return out.String()
}
