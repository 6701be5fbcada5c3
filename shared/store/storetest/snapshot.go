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

	"github.com/dreamlake/lakeshore/shared/store"
)

// Snapshot is every item of every control-plane table under one prefix,
// each item as one JSON line (map keys sorted), the lines of each table
// sorted; tables are keyed by their suffix ("workers", "invocations", …).
// Tests take one before and after a refused request: nothing may change.
type Snapshot map[string][]string

// TakeSnapshot scans every table of prefix with consistent reads.
func TakeSnapshot(t testing.TB, db *dynamodb.Client, prefix string) Snapshot {
	t.Helper()
	names := store.NamesFor(prefix)
	snap := Snapshot{}
	for _, table := range []string{names.Workers, names.Machines, names.Invocations, names.Commands, names.Queues, names.Idempotency} {
		var rows []string
		in := &dynamodb.ScanInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true)}
		for {
			out, err := db.Scan(context.Background(), in)
			if err != nil {
				t.Fatalf("storetest: scan %s: %v", table, err)
			}
			for _, item := range out.Items {
				var m map[string]any
				if err := attributevalue.UnmarshalMap(item, &m); err != nil {
					t.Fatalf("storetest: decode %s item: %v", table, err)
				}
				b, err := json.Marshal(m) // map keys marshal sorted
				if err != nil {
					t.Fatalf("storetest: encode %s item: %v", table, err)
				}
				rows = append(rows, string(b))
			}
			if out.LastEvaluatedKey == nil {
				break
			}
			in.ExclusiveStartKey = out.LastEvaluatedKey
		}
		slices.Sort(rows)
		snap[strings.TrimPrefix(table, prefix)] = rows
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
