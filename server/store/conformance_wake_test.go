package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/server/store"
)

// TestConformanceWake runs the wake channel's connection cases on every
// backend, as TestConformance does.
func TestConformanceWake(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			db := b.client(t)
			for _, c := range []conformanceCase{
				{"connections/limit applies before the filter", testConnectionsLimitBeforeFilter},
				{"connections/every live listener past pages of expired ones", testConnectionsPastExpiredPages},
				{"connections/connected at round-trips", testConnectionsConnectedAt},
				{"connections/a sample of a large key's listeners", testConnectionsSample},
			} {
				t.Run(c.name, func(t *testing.T) {
					c.run(t, newFixture(t, b, db))
				})
			}
		})
	}
}

// putConnections records one connection per id under wake key k, expiring
// at exp.
func (f *fixture) putConnections(k string, exp time.Time, ids ...string) {
	f.t.Helper()
	for _, id := range ids {
		if err := f.s.PutConnection(f.ctx, store.Connection{ID: id, WorkerID: "wrk_" + id, Keys: []string{k}, ExpiresAt: exp}); err != nil {
			f.t.Fatalf("put connection %s: %v", id, err)
		}
	}
}

// listeners is the sorted ids of what Connections lists under key.
func (f *fixture) listeners(key string) []string {
	f.t.Helper()
	conns, err := f.s.Connections(f.ctx, key)
	if err != nil {
		f.t.Fatal(err)
	}
	var got []string
	for _, c := range conns {
		got = append(got, c.ID)
	}
	slices.Sort(got)
	return got
}

func connectionIDs(prefix string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s%03d", prefix, i)
	}
	return ids
}

// testConnectionsLimitBeforeFilter: a Query's Limit counts the items it
// read, not those the filter kept, so a page whose items are all filtered
// out comes back empty yet with a LastEvaluatedKey: more may follow. The
// listing must page on that key, not stop at a short page.
func testConnectionsLimitBeforeFilter(t *testing.T, f *fixture) {
	now := f.clock.Now()
	f.putConnections("q#", now.Add(-time.Minute), connectionIDs("a", 3)...)
	f.putConnections("q#", now.Add(time.Hour), "z000")
	in := &dynamodb.QueryInput{
		TableName:              aws.String(f.tables.Connections),
		KeyConditionExpression: aws.String("wake_key = :k"),
		FilterExpression:       aws.String("expires_at > :now"),
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":k": &types.AttributeValueMemberS{Value: "q#"}, ":now": &types.AttributeValueMemberN{Value: strconv.FormatInt(now.Unix(), 10)},
		},
		Limit: aws.Int32(2),
	}
	out, err := f.db.Query(f.ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Items) != 0 || len(out.LastEvaluatedKey) == 0 {
		t.Fatalf("first page of 2 expired items: %d items, last key %v; want none, with a last key", len(out.Items), out.LastEvaluatedKey)
	}
	var pages []int
	for range 10 {
		in.ExclusiveStartKey = out.LastEvaluatedKey
		if out, err = f.db.Query(f.ctx, in); err != nil {
			t.Fatal(err)
		}
		pages = append(pages, len(out.Items))
		if len(out.LastEvaluatedKey) == 0 {
			break
		}
	}
	// The pages after the first: DynamoDB and moto read the two items
	// left and keep the live one, and say the end. The embedded store
	// counts Limit as they do, but like minidyn it ends a page that
	// reached its Limit with a LastEvaluatedKey even when nothing
	// follows, so one more empty page says the end; the live item still
	// comes once, so a listing that pages to the end agrees.
	want := []int{1}
	if f.backend.name == "embedded" {
		want = []int{1, 0}
	}
	if !slices.Equal(pages, want) {
		t.Fatalf("the pages after the first held %v items; want %v", pages, want)
	}
}

// testConnectionsPastExpiredPages: the live listeners of a key are all
// listed even behind more pages of expired items than one page holds.
func testConnectionsPastExpiredPages(t *testing.T, f *fixture) {
	now := f.clock.Now()
	f.putConnections("q#", now.Add(-time.Minute), connectionIDs("a", 230)...)
	live := connectionIDs("z", 3)
	f.putConnections("q#", now.Add(time.Hour), live...)
	f.putConnections("other#", now.Add(time.Hour), "b000")
	if got := f.listeners("q#"); !slices.Equal(got, live) {
		t.Fatalf("listed %v; want every live listener %v", got, live)
	}
}

// testConnectionsConnectedAt: a connection's ConnectedAt reads back to the
// millisecond, under each of its keys, read either way.
func testConnectionsConnectedAt(t *testing.T, f *fixture) {
	at := f.clock.Now().Add(1234 * time.Millisecond)
	c := store.Connection{ID: "c1", WorkerID: "wrk_1", Keys: []string{"q#", "worker/wrk_1"}, ConnectedAt: at, ExpiresAt: at.Add(time.Hour)}
	if err := f.s.PutConnection(f.ctx, c); err != nil {
		t.Fatal(err)
	}
	for _, k := range c.Keys {
		for _, list := range []func(context.Context, string) ([]store.Connection, error){f.s.Connections, f.s.ConnectionsConsistent} {
			conns, err := list(f.ctx, k)
			if err != nil || len(conns) != 1 || !conns[0].ConnectedAt.Equal(at) || conns[0].WorkerID != "wrk_1" {
				t.Fatalf("under %s: %+v %v; want c1 connected at %s", k, conns, err, at)
			}
		}
	}
}

// testConnectionsSample: a key with more listeners than one wake reads
// (32) gives a sample of that many live ones, from a random point of their
// expiries, in a few small queries whatever their number; over many wakes
// every listener is in some sample. A key with fewer gives every one.
func testConnectionsSample(t *testing.T, f *fixture) {
	now := f.clock.Now()
	few := connectionIDs("f", 5)
	f.putConnections("few#", now.Add(time.Hour), few...)
	f.putConnections("q#", now.Add(-time.Minute), connectionIDs("x", 20)...)
	var all []string
	for i := range 100 {
		id := fmt.Sprintf("c%03d", i)
		all = append(all, id)
		// Expiries spread over two hours, several a second apart.
		f.putConnections("q#", now.Add(time.Hour+time.Duration(i%40)*3*time.Minute), id)
	}
	if got := f.listeners("few#"); !slices.Equal(got, few) {
		t.Fatalf("a key with 5 listeners gave %v; want every one", got)
	}
	seen := map[string]bool{}
	f.s.Random = rand.New(rand.NewPCG(1, 2)).Uint64
	for range 40 {
		got := f.listeners("q#")
		if len(got) != 32 || len(slices.Compact(slices.Clone(got))) != 32 {
			t.Fatalf("a sample of %d distinct listeners (%v); want 32", len(slices.Compact(slices.Clone(got))), got)
		}
		for _, id := range got {
			if id[0] != 'c' {
				t.Fatalf("sample holds %s, an expired listener", id)
			}
			seen[id] = true
		}
	}
	if len(seen) != len(all) {
		var missing []string
		for _, id := range all {
			if !seen[id] {
				missing = append(missing, id)
			}
		}
		t.Errorf("40 samples reached %d of %d listeners (not %v); want every one", len(seen), len(all), missing)
	}
}
