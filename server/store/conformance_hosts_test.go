package store_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// The provisioner's hosts table runs in the conformance suite, on every
// backend.
func init() {
	conformanceCases = append(conformanceCases,
		conformanceCase{"hosts/reserve, end, read the alive", testHostsAlive},
		conformanceCase{"hosts/an end moves its key's hold", testHostsEndMovesHold},
		conformanceCase{"hosts/a ledger from before the index", testHostsIndexOldLedger},
	)
	readCases = append(readCases, conformanceCase{"hosts/a pass's read does not grow with ended hosts", testHostsReadCost})
}

var hostKey = domain.ProvisionKey{Queue: "q", HostKey: "hk1_test"}

// reserve reserves n hosts of key k and reports them (version 1).
func (f *fixture) reserve(k domain.ProvisionKey, n int) []domain.Host {
	f.t.Helper()
	version, _, err := f.s.Fleet(f.ctx)
	if err != nil {
		f.t.Fatalf("Fleet: %v", err)
	}
	hosts := make([]domain.Host, n)
	for i := range hosts {
		f.mu.Lock()
		f.issued++
		hosts[i] = domain.Host{ID: fmt.Sprintf("host_%s_%04d", f.prefix, f.issued), Key: k, State: domain.LaunchReserved, CreatedAt: f.clock.Now()}
		f.mu.Unlock()
	}
	if err := f.s.ReserveHosts(f.ctx, version, hosts); err != nil {
		f.t.Fatalf("ReserveHosts: %v", err)
	}
	for i := range hosts {
		hosts[i].Version = 1
	}
	return hosts
}

// end ends h (ended well unless failure is set) with its key's hold
// moved, as a pass does.
func (f *fixture) end(h *domain.Host, failure string) domain.KeyHold {
	f.t.Helper()
	hold, _, err := f.s.KeyHold(f.ctx, h.Key)
	if err != nil {
		f.t.Fatalf("KeyHold: %v", err)
	}
	next, _ := h.Ended(domain.LaunchEnded, "test: "+failure, f.clock.Now())
	next.Failure = failure
	hold = hold.After(next, domain.BackoffPolicy{Min: time.Minute, Max: time.Hour, MaxFailures: 3, StopFor: 6 * time.Hour})
	if err := f.s.EndHost(f.ctx, h.Version, &next, &hold); err != nil {
		f.t.Fatalf("EndHost(%s): %v", h.ID, err)
	}
	*h = next
	return hold
}

// aliveIDs reads the fleet: its version and the ids of the hosts alive.
func (f *fixture) aliveIDs() (int64, []string) {
	f.t.Helper()
	version, hosts, err := f.s.Fleet(f.ctx)
	if err != nil {
		f.t.Fatalf("Fleet: %v", err)
	}
	var ids []string
	for _, h := range hosts {
		if !h.Alive() {
			f.t.Fatalf("Fleet read an ended host: %+v", h)
		}
		ids = append(ids, h.ID)
	}
	slices.Sort(ids)
	return version, ids
}

func idsOf(hosts ...domain.Host) []string {
	var ids []string
	for _, h := range hosts {
		ids = append(ids, h.ID)
	}
	slices.Sort(ids)
	return ids
}

// testHostsAlive: Fleet reads the hosts reserved and not ended, with the
// ledger's version; a stale version's reservation loses; Hosts (the
// operator's listing) still reads the ended ones.
func testHostsAlive(t *testing.T, f *fixture) {
	if v, ids := f.aliveIDs(); v != 0 || len(ids) != 0 {
		t.Fatalf("an empty table's fleet: version %d, %v", v, ids)
	}
	a := f.reserve(hostKey, 3)
	b := f.reserve(domain.ProvisionKey{Queue: "q"}, 2)
	if v, ids := f.aliveIDs(); v != 2 || !slices.Equal(ids, idsOf(append(a, b...)...)) {
		t.Fatalf("fleet after two reservations: version %d, %v; want 2, every host", v, ids)
	}
	launched, err := a[0].Launched("i-0123", "spot", f.clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := f.s.SaveHost(f.ctx, a[0].Version, &launched); err != nil {
		t.Fatalf("SaveHost: %v", err)
	}
	a[0] = launched
	f.end(&a[1], "")
	f.end(&b[0], domain.NoHello)
	if v, ids := f.aliveIDs(); v != 2 || !slices.Equal(ids, idsOf(a[0], a[2], b[1])) {
		t.Fatalf("fleet after two ends: version %d, %v; want 2, the three alive", v, ids)
	}
	stale := domain.Host{ID: "host_stale_" + f.prefix, Key: hostKey, State: domain.LaunchReserved, CreatedAt: f.clock.Now()}
	if err := f.s.ReserveHosts(f.ctx, 1, []domain.Host{stale}); err != store.ErrProvisionRaced {
		t.Fatalf("a reservation on a stale version: %v; want ErrProvisionRaced", err)
	}
	if err := f.s.EndHost(f.ctx, 1, &a[1], &domain.KeyHold{Key: hostKey}); !errorsIsConflict(err) {
		t.Fatalf("ending a host at a stale version: %v; want a conflict", err)
	}
	// An end goes only through EndHost, which keeps the index and the hold
	// in step: SaveHost refuses one, and EndHost refuses a host still alive
	// or another key's hold.
	ended, _ := a[2].Ended(domain.LaunchEnded, "test", f.clock.Now())
	if err := f.s.SaveHost(f.ctx, a[2].Version, &ended); err == nil {
		t.Fatal("SaveHost wrote a host that ended")
	}
	alive := a[2]
	if err := f.s.EndHost(f.ctx, a[2].Version, &alive, &domain.KeyHold{Key: hostKey}); err == nil {
		t.Fatal("EndHost ended a host still alive")
	}
	if err := f.s.EndHost(f.ctx, a[2].Version, &ended, &domain.KeyHold{Key: domain.ProvisionKey{Queue: "other"}}); err == nil {
		t.Fatal("EndHost took another key's hold")
	}
	if _, ids := f.aliveIDs(); !slices.Contains(ids, a[2].ID) {
		t.Fatalf("a refused end changed the fleet: %v", ids)
	}
	all, err := f.s.Hosts(f.ctx)
	if err != nil {
		t.Fatalf("Hosts: %v", err)
	}
	if got := idsOf(all...); !slices.Equal(got, idsOf(append(a, b...)...)) {
		t.Fatalf("Hosts: %v; want the five, ended or not", got)
	}
}

func errorsIsConflict(err error) bool { return wire.CodeOf(err) == wire.CodeConflict }

// testHostsEndMovesHold: ending a failed host writes its key's hold in
// the same transaction, a host that ended well resets it, and a hold that
// changed since read refuses the end (nothing of it written).
func testHostsEndMovesHold(t *testing.T, f *fixture) {
	hosts := f.reserve(hostKey, 4)
	f.end(&hosts[0], domain.HostSetupFailed)
	hold := f.end(&hosts[1], domain.NoHello)
	stored, ok, err := f.s.KeyHold(f.ctx, hostKey)
	if err != nil || !ok || stored.Failures != 2 || stored.Version != hold.Version || stored.Last.ID != hosts[1].ID ||
		!stored.Until.Equal(hosts[1].EndedAt.Add(2*time.Minute)) {
		t.Fatalf("hold after two failures: %+v %v %v; want 2 failures, the last host, 2 min after it", stored, ok, err)
	}
	// Another pass's end moved the hold: this one, read before it, loses.
	old := stored
	f.end(&hosts[2], domain.NoHello)
	next, _ := hosts[3].Ended(domain.LaunchEnded, "test", f.clock.Now())
	if err := f.s.EndHost(f.ctx, hosts[3].Version, &next, &old); !errorsIsConflict(err) {
		t.Fatalf("an end with a hold read before another end: %v; want a conflict", err)
	}
	if _, ids := f.aliveIDs(); !slices.Equal(ids, idsOf(hosts[3])) {
		t.Fatalf("fleet after the refused end: %v; want the host still alive", ids)
	}
	if h := f.end(&hosts[3], ""); h.Failures != 0 {
		t.Fatalf("a host that served left the hold at %+v; want reset", h)
	}
	if stored, _, _ := f.s.KeyHold(f.ctx, hostKey); stored.Failures != 0 || stored.Waiting(f.clock.Now()) {
		t.Fatalf("stored hold after a host served: %+v; want reset", stored)
	}
}

// testHostsIndexOldLedger: a ledger written before the index (a version,
// no ids) is indexed by the first Fleet, from a scan: the hosts alive are
// read, the version moves, and reservations go on from it. An id the
// index names whose host is gone is dropped.
func testHostsIndexOldLedger(t *testing.T, f *fixture) {
	put := func(item any) {
		t.Helper()
		av, err := attributevalue.MarshalMap(item)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.db.PutItem(f.ctx, &dynamodb.PutItemInput{TableName: aws.String(f.tables.Hosts), Item: av}); err != nil {
			t.Fatal(err)
		}
	}
	type oldHost struct {
		ID      string             `dynamodbav:"host_id"`
		Queue   string             `dynamodbav:"queue"`
		State   domain.LaunchState `dynamodbav:"state"`
		Created time.Time          `dynamodbav:"created_at"`
		Version int64              `dynamodbav:"version"`
	}
	put(struct {
		ID      string `dynamodbav:"host_id"`
		Version int64  `dynamodbav:"version"`
	}{"!fleet", 7})
	put(oldHost{"host_old_alive", "q", domain.LaunchRunning, t0, 2})
	put(oldHost{"host_old_ended", "q", domain.LaunchEnded, t0, 3})
	if v, ids := f.aliveIDs(); v != 8 || !slices.Equal(ids, []string{"host_old_alive"}) {
		t.Fatalf("fleet of an old ledger: version %d, %v; want 8, the host alive", v, ids)
	}
	more := f.reserve(domain.ProvisionKey{Queue: "q"}, 1)
	if v, ids := f.aliveIDs(); v != 9 || !slices.Equal(ids, idsOf(append(more, domain.Host{ID: "host_old_alive"})...)) {
		t.Fatalf("fleet after a reservation: version %d, %v", v, ids)
	}
	// The old host's item goes (it expired and DynamoDB deleted it): the
	// index forgets it at the next read.
	if _, err := f.db.DeleteItem(f.ctx, &dynamodb.DeleteItemInput{TableName: aws.String(f.tables.Hosts), Key: map[string]types.AttributeValue{"host_id": &types.AttributeValueMemberS{Value: "host_old_alive"}}}); err != nil {
		t.Fatal(err)
	}
	if _, ids := f.aliveIDs(); !slices.Equal(ids, idsOf(more...)) {
		t.Fatalf("fleet after a host's item went: %v", ids)
	}
	out, err := f.db.GetItem(f.ctx, &dynamodb.GetItemInput{TableName: aws.String(f.tables.Hosts), Key: map[string]types.AttributeValue{"host_id": &types.AttributeValueMemberS{Value: "!fleet"}}, ConsistentRead: aws.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	var ledger struct {
		Live []string `dynamodbav:"live,stringset"`
	}
	if err := attributevalue.UnmarshalMap(out.Item, &ledger); err != nil || !slices.Equal(ledger.Live, idsOf(more...)) {
		t.Fatalf("the ledger's index: %v %v; want only the host alive", ledger.Live, err)
	}
}

// testHostsReadCost: what a pass reads of the hosts table (Fleet) is the
// hosts alive, however many ended: the same with 5 ended as with 200 (40
// on moto, whose writes are slow).
func testHostsReadCost(t *testing.T, f *fixture) {
	history := 200
	if f.backend.name == "moto" {
		history = 40
	}
	counted, requests, items := f.counted()
	alive := f.reserve(hostKey, 3)
	endN := func(n int) {
		for ; n > 0; n -= store.MaxReservation {
			for _, h := range f.reserve(domain.ProvisionKey{Queue: "q"}, min(n, store.MaxReservation)) {
				f.end(&h, "")
			}
		}
	}
	cost := func(ended int) (reqs, read int) {
		t.Helper()
		requests.Reset()
		items.Reset()
		_, hosts, err := counted.Fleet(f.ctx)
		if err != nil {
			t.Fatalf("Fleet: %v", err)
		}
		if got := idsOf(hosts...); !slices.Equal(got, idsOf(alive...)) {
			t.Fatalf("with %d ended: fleet %v; want the 3 alive", ended, got)
		}
		return requests.Total(), items.Total()
	}
	endN(5)
	reqs5, read5 := cost(5)
	endN(history - 5)
	reqsMany, readMany := cost(history)
	t.Logf("Fleet: %d requests, %d items read with 5 ended; %d, %d with %d", reqs5, read5, reqsMany, readMany, history)
	if reqsMany > reqs5 || readMany > read5 || read5 > len(alive) {
		t.Fatalf("Fleet grows with ended hosts: %d requests and %d items read with 5 ended, %d and %d with %d; the hosts alive are %d",
			reqs5, read5, reqsMany, readMany, history, len(alive))
	}
}
