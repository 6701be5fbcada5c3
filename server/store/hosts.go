package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/domain"
)

// fleetItemID is the hosts table's ledger item: the index of the hosts
// alive (live: their ids), and a version that moves with every
// reservation (ReserveHosts).
const fleetItemID = "!fleet"

// ErrProvisionRaced answers a reservation made on a fleet another pass
// changed since it was read: read it again and plan again.
var ErrProvisionRaced = errors.New("another provisioner pass reserved hosts first")

// ledgerRecord is the stored form of the ledger. Indexed says live lists
// every host alive; a ledger written before the index existed has hosts
// alive that live does not name, and Fleet indexes them once.
type ledgerRecord struct {
	ID      string   `dynamodbav:"host_id"`
	Version int64    `dynamodbav:"version"`
	Live    []string `dynamodbav:"live,stringset,omitempty"`
	Indexed bool     `dynamodbav:"indexed,omitempty"`
}

// indexed reports whether live names every host alive: the ledger says
// so, or no reservation was ever made.
func (l ledgerRecord) indexed() bool { return l.Indexed || l.Version == 0 }

// readLedger reads the ledger, strongly consistent: what a reservation's
// condition compares with.
func (s *Store) readLedger(ctx context.Context) (ledgerRecord, error) {
	var l ledgerRecord
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.tables.Hosts), Key: key("host_id", fleetItemID), ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return l, storeErr("read the fleet", err)
	}
	if out.Item != nil {
		if err := attributevalue.UnmarshalMap(out.Item, &l); err != nil {
			return l, fmt.Errorf("decode the fleet ledger: %w", err)
		}
	}
	return l, nil
}

// indexTries bounds Fleet's re-reads while another pass indexes an
// unindexed ledger at the same time.
const indexTries = 3

// Fleet reads the hosts alive, by the ledger's index: the ledger (one
// consistent read), then the hosts it names (consistent batch reads), so
// a pass reads what is alive, not the day's ended hosts. Both reads are
// strongly consistent: every host the version read counts is in what is
// read (an index of DynamoDB's own could not promise that, its reads being
// eventually consistent). An id the index still names whose host ended or
// expired is dropped from it. A ledger not indexed yet is indexed here,
// once, from a scan.
func (s *Store) Fleet(ctx context.Context) (version int64, alive []domain.Host, err error) {
	for range indexTries {
		l, err := s.readLedger(ctx)
		if err != nil {
			return 0, nil, err
		}
		if !l.indexed() {
			switch version, alive, err := s.indexFleet(ctx, l.Version); {
			case errors.Is(err, errVersion):
				continue // another pass indexed or reserved first: read again
			default:
				return version, alive, err
			}
		}
		hosts, err := s.getHosts(ctx, l.Live)
		if err != nil {
			return 0, nil, err
		}
		var over []string
		for _, id := range l.Live {
			h, ok := hosts[id]
			if !ok || !h.Alive() {
				over = append(over, id)
				continue
			}
			alive = append(alive, h)
		}
		if err := s.unindex(ctx, over); err != nil {
			return 0, nil, err
		}
		return l.Version, alive, nil
	}
	return 0, nil, fmt.Errorf("read the fleet: the ledger changed %d times while being indexed", indexTries)
}

// indexFleet indexes a ledger at version that does not name its hosts
// alive: it reads them with a scan and records their ids, moving the
// version (errVersion: the ledger moved first).
func (s *Store) indexFleet(ctx context.Context, version int64) (int64, []domain.Host, error) {
	hosts, err := s.Hosts(ctx)
	if err != nil {
		return 0, nil, err
	}
	alive := slices.DeleteFunc(hosts, func(h domain.Host) bool { return !h.Alive() })
	update, names := "SET #v = :next, #i = :t", map[string]string{"#v": "version", "#i": "indexed"}
	values := map[string]types.AttributeValue{":next": num(version + 1), ":prev": num(version), ":t": &types.AttributeValueMemberBOOL{Value: true}}
	if len(alive) > 0 {
		ids := make([]string, len(alive))
		for i, h := range alive {
			ids[i] = h.ID
		}
		update, names["#l"] = update+", #l = :ids", "live"
		values[":ids"] = &types.AttributeValueMemberSS{Value: ids}
	}
	_, err = s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(s.tables.Hosts), Key: key("host_id", fleetItemID),
		UpdateExpression: aws.String(update), ConditionExpression: aws.String("#v = :prev"),
		ExpressionAttributeNames: names, ExpressionAttributeValues: values,
	})
	if isConditionFailed(err) || isTransactionConflict(err) {
		return 0, nil, errVersion
	}
	if err != nil {
		return 0, nil, storeErr("index the fleet", err)
	}
	return version + 1, alive, nil
}

// unindex drops ids from the ledger's index (hosts ended, or gone).
func (s *Store) unindex(ctx context.Context, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	_, err := s.db.UpdateItem(ctx, unindexUpdate(s.tables.Hosts, ids))
	return storeErr("drop ended hosts from the fleet's index", err)
}

// unindexUpdate is the ledger update dropping ids from its index. It needs
// no condition: a reservation only adds ids, and adding and dropping
// commute.
func unindexUpdate(table string, ids []string) *dynamodb.UpdateItemInput {
	return &dynamodb.UpdateItemInput{
		TableName: aws.String(table), Key: key("host_id", fleetItemID),
		UpdateExpression:          aws.String("DELETE #l :ids"),
		ExpressionAttributeNames:  map[string]string{"#l": "live"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":ids": &types.AttributeValueMemberSS{Value: ids}},
	}
}

// batchGetMost is how many items one BatchGetItem reads.
const batchGetMost = 100

// batchGetTries bounds the re-asks for keys a BatchGetItem left
// unprocessed (DynamoDB's throttling).
const batchGetTries = 8

// getHosts reads the hosts ids name, strongly consistent (a host expired
// or never written is not in the answer).
func (s *Store) getHosts(ctx context.Context, ids []string) (map[string]domain.Host, error) {
	out := map[string]domain.Host{}
	now := s.now().Unix()
	err := s.batchGet(ctx, "read the hosts alive", s.tables.Hosts, "host_id", ids, func(item map[string]types.AttributeValue) error {
		h, live, err := decodeHost(item, now)
		if err == nil && live {
			out[h.ID] = h
		}
		return err
	})
	return out, err
}

// batchGet reads the items of table whose hashKey is one of ids, strongly
// consistent, batchGetMost to a request, handing each found to fn (in no
// particular order).
func (s *Store) batchGet(ctx context.Context, op, table, hashKey string, ids []string, fn func(map[string]types.AttributeValue) error) error {
	for chunk := range slices.Chunk(ids, batchGetMost) {
		keys := make([]map[string]types.AttributeValue, len(chunk))
		for i, id := range chunk {
			keys[i] = key(hashKey, id)
		}
		err := s.batchGetItems(ctx, op, map[string]types.KeysAndAttributes{table: {Keys: keys, ConsistentRead: aws.Bool(true)}},
			func(_ string, item map[string]types.AttributeValue) error { return fn(item) })
		if err != nil {
			return err
		}
	}
	return nil
}

// batchGetItems runs one BatchGetItem of req (at most batchGetMost keys in
// all), handing each item found to fn with its table (in no particular
// order). Keys DynamoDB leaves unprocessed are asked again, at most
// batchGetTries times.
func (s *Store) batchGetItems(ctx context.Context, op string, req map[string]types.KeysAndAttributes, fn func(table string, item map[string]types.AttributeValue) error) error {
	for try := 0; len(req) > 0; try++ {
		if try == batchGetTries {
			return storeErr(op, errors.New("keys left unprocessed after every retry"))
		}
		if try > 0 {
			if err := clock.Sleep(ctx, time.Duration(try)*50*time.Millisecond); err != nil {
				return storeErr(op, err)
			}
		}
		page, err := s.db.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{RequestItems: req})
		if err != nil {
			return storeErr(op, err)
		}
		for table, items := range page.Responses {
			for _, item := range items {
				if err := fn(table, item); err != nil {
					return err
				}
			}
		}
		req = page.UnprocessedKeys
	}
	return nil
}

// decodeHost decodes a host item, and reports whether it has not expired
// at now (Unix seconds): DynamoDB deletes an expired item within days, not
// at once, so a read skips it itself.
func decodeHost(item map[string]types.AttributeValue, now int64) (domain.Host, bool, error) {
	var r hostRecord
	if err := attributevalue.UnmarshalMap(item, &r); err != nil {
		return domain.Host{}, false, fmt.Errorf("decode a host: %w", err)
	}
	return r.domain(), r.ExpiresAt == 0 || r.ExpiresAt > now, nil
}

// Hosts reads the hosts table whole (an operator's listing, off the
// pass's path): every host alive and every ended one not expired yet.
func (s *Store) Hosts(ctx context.Context) ([]domain.Host, error) {
	now := s.now().Unix()
	var hosts []domain.Host
	var start map[string]types.AttributeValue
	for {
		page, err := s.db.Scan(ctx, &dynamodb.ScanInput{
			TableName: aws.String(s.tables.Hosts), ConsistentRead: aws.Bool(true), ExclusiveStartKey: start,
		})
		if err != nil {
			return nil, storeErr("read the hosts", err)
		}
		for _, item := range page.Items {
			if v, ok := item["host_id"].(*types.AttributeValueMemberS); ok && strings.HasPrefix(v.Value, "!") {
				continue // the ledger, a key's hold: not hosts
			}
			h, live, err := decodeHost(item, now)
			if err != nil {
				return nil, err
			}
			if live {
				hosts = append(hosts, h)
			}
		}
		if page.LastEvaluatedKey == nil {
			return hosts, nil
		}
		start = page.LastEvaluatedKey
	}
}

// HostRetention is how long an ended host's item stays in the hosts table
// (its TTL), and a key's hold after its last change: a day, so
// `lakeshore ls hosts` shows the day's launches; passes read only the
// hosts alive.
const HostRetention = 24 * time.Hour

// MaxReservation is how many hosts one reservation writes: a transaction
// holds at most 100 items, one of them the ledger.
const MaxReservation = 99

// ReserveHosts records hosts (new, state reserved) in one transaction with
// the ledger moving from version to version + 1 and naming them alive: it
// fails with ErrProvisionRaced when another pass reserved since version
// was read, so two passes never both launch for the same demand.
func (s *Store) ReserveHosts(ctx context.Context, version int64, hosts []domain.Host) error {
	if len(hosts) == 0 || len(hosts) > MaxReservation {
		return fmt.Errorf("reserve hosts: %d hosts, 1-%d a reservation", len(hosts), MaxReservation)
	}
	ids := make([]string, len(hosts))
	for i, h := range hosts {
		ids[i] = h.ID
	}
	cond, values := "#v = :prev", map[string]types.AttributeValue{":prev": num(version)}
	if version == 0 {
		cond, values = "attribute_not_exists(#v)", map[string]types.AttributeValue{}
	}
	values[":next"], values[":t"] = num(version+1), &types.AttributeValueMemberBOOL{Value: true}
	values[":ids"] = &types.AttributeValueMemberSS{Value: ids}
	items := []types.TransactWriteItem{{Update: &types.Update{
		TableName: aws.String(s.tables.Hosts), Key: key("host_id", fleetItemID),
		UpdateExpression: aws.String("SET #v = :next, #i = :t ADD #l :ids"), ConditionExpression: aws.String(cond),
		ExpressionAttributeNames: map[string]string{"#v": "version", "#i": "indexed", "#l": "live"}, ExpressionAttributeValues: values,
	}}}
	for _, h := range hosts {
		h.Version = 1
		item, err := attributevalue.MarshalMap(toHostRecord(h))
		if err != nil {
			return fmt.Errorf("encode host %s: %w", h.ID, err)
		}
		items = append(items, types.TransactWriteItem{Put: versionedPut(s.tables.Hosts, "host_id", item, 0)})
	}
	_, err := s.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items})
	if _, ok := cancelledBy(err); ok {
		return ErrProvisionRaced
	}
	if err != nil {
		return storeErr("reserve hosts", err)
	}
	return nil
}

// SaveHost writes next, a host still alive (launched), over the host
// stored at version prev, bumping its version. A host that ends is
// EndHost's.
func (s *Store) SaveHost(ctx context.Context, prev int64, next *domain.Host) error {
	if !next.Alive() {
		return fmt.Errorf("save host %s: it ended (%s); end it with EndHost", next.ID, next.State)
	}
	next.Version = prev + 1
	item, err := attributevalue.MarshalMap(toHostRecord(*next))
	if err != nil {
		return fmt.Errorf("encode host %s: %w", next.ID, err)
	}
	if err := s.put(ctx, versionedPut(s.tables.Hosts, "host_id", item, prev)); err != nil {
		if errors.Is(err, errVersion) {
			return domain.Errorf(domain.KindConflict, "host %s changed since it was read", next.ID)
		}
		return storeErr("save host "+next.ID, err)
	}
	return nil
}

// EndHost writes next, a host that ended (refused, let go), over the host
// stored at version prev, in one transaction with its key's hold (hold,
// stored at hold.Version: domain.KeyHold.After) and the ledger's index
// dropping it. Both versions move; either changed since read is a
// conflict (read again). A hold that holds nothing and was never stored
// is not written.
func (s *Store) EndHost(ctx context.Context, prev int64, next *domain.Host, hold *domain.KeyHold) error {
	if next.Alive() {
		return fmt.Errorf("end host %s: it is %s, still alive", next.ID, next.State)
	}
	if hold.Key != next.Key {
		return fmt.Errorf("end host %s: the hold given is another key's", next.ID)
	}
	saved := *next
	saved.Version = prev + 1
	item, err := attributevalue.MarshalMap(toHostRecord(saved))
	if err != nil {
		return fmt.Errorf("encode host %s: %w", next.ID, err)
	}
	un := unindexUpdate(s.tables.Hosts, []string{next.ID})
	items := []types.TransactWriteItem{
		{Put: versionedPut(s.tables.Hosts, "host_id", item, prev)},
		{Update: &types.Update{TableName: un.TableName, Key: un.Key, UpdateExpression: un.UpdateExpression,
			ExpressionAttributeNames: un.ExpressionAttributeNames, ExpressionAttributeValues: un.ExpressionAttributeValues}},
	}
	writeHold := hold.Failures > 0 || hold.Version > 0
	if writeHold {
		put, err := s.holdPut(*hold, next.EndedAt)
		if err != nil {
			return err
		}
		items = append(items, types.TransactWriteItem{Put: put})
	}
	_, err = s.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items})
	if failed, ok := cancelledBy(err); ok {
		what := "host " + next.ID
		if slices.Contains(failed, 2) {
			what = "the hold of " + next.Key.Queue + "/" + next.Key.HostKey
		}
		return domain.Errorf(domain.KindConflict, "end host %s: %s changed since it was read", next.ID, what)
	}
	if err != nil {
		return storeErr("end host "+next.ID, err)
	}
	next.Version = saved.Version
	if writeHold {
		hold.Version++
	}
	return nil
}

// QueuedByHostKey counts queue's queued invocations by host key, from the
// state index (an off-path read for the provisioner; it reads every queued
// item's host key, so it stops after limit items and says so).
func (s *Store) QueuedByHostKey(ctx context.Context, queue string, limit int) (counts map[string]int, truncated bool, err error) {
	counts = map[string]int{}
	seen := 0
	err = s.queryEach(ctx, "queued work of "+queue, &dynamodb.QueryInput{
		TableName:                 aws.String(s.tables.Invocations),
		IndexName:                 aws.String(indexQueueState),
		KeyConditionExpression:    aws.String("queue_state = :q"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":q": str(queueState(queue, domain.StateQueued))},
		ProjectionExpression:      aws.String("host_key, retry_at"),
	}, func(item map[string]types.AttributeValue) error {
		var r struct {
			HostKey string    `dynamodbav:"host_key"`
			RetryAt time.Time `dynamodbav:"retry_at"`
		}
		if err := attributevalue.UnmarshalMap(item, &r); err != nil {
			return fmt.Errorf("decode queued work of %s: %w", queue, err)
		}
		if !r.RetryAt.IsZero() {
			return nil // waiting out a retry backoff: no slot needed yet
		}
		counts[r.HostKey]++
		if seen++; seen >= limit {
			truncated = true
			return errStopPaging
		}
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	return counts, truncated, nil
}

// HostSetupOf reports the host_setup of queue's queued work with host key
// hk: what a host launched for that key must run (every such invocation
// has the same commands, since the key is their hash). nil when none is
// queued.
func (s *Store) HostSetupOf(ctx context.Context, queue, hk string) ([]string, error) {
	for shard := range max(s.ClaimShards, 1) {
		out, err := s.db.Query(ctx, &dynamodb.QueryInput{
			TableName:                 aws.String(s.tables.Invocations),
			IndexName:                 aws.String(indexClaim),
			KeyConditionExpression:    aws.String("claim_key = :k"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":k": str(s.claimKey(queue, hk, shard))},
			Limit:                     aws.Int32(1),
		})
		if err != nil {
			return nil, storeErr("host setup of "+hk, err)
		}
		if len(out.Items) > 0 {
			inv, err := decodeInvocation(out.Items[0])
			if err != nil {
				return nil, err
			}
			return inv.RunConfig.HostSetup, nil
		}
	}
	return nil, nil
}

// holdItemID is the hosts table's item keeping k's hold (KeyHold).
func holdItemID(k domain.ProvisionKey) string { return "!hold#" + k.Queue + "#" + k.HostKey }

// holdRecord is the stored form of a key's hold (domain.KeyHold): what
// holds its launches back, and what the invocation view shows its queued
// work waiting on.
type holdRecord struct {
	ID          string    `dynamodbav:"host_id"`
	Reason      string    `dynamodbav:"reason,omitempty"`
	LastHost    string    `dynamodbav:"last_host,omitempty"`
	LastEndedAt time.Time `dynamodbav:"last_ended_at,omitempty"`
	Failures    int       `dynamodbav:"failures"`
	Stopped     bool      `dynamodbav:"stopped,omitempty"`
	Until       time.Time `dynamodbav:"until,omitempty"`
	// ExpiresAt (the table's TTL): HostRetention after its hold ends, or
	// after the host that last changed it ended.
	ExpiresAt int64 `dynamodbav:"expires_at"`
	Version   int64 `dynamodbav:"version"`
}

// holdPut is the versioned put of h (stored at h.Version), last changed by
// a host that ended at ended.
func (s *Store) holdPut(h domain.KeyHold, ended time.Time) (*types.Put, error) {
	expires := h.Until
	if ended.After(expires) {
		expires = ended
	}
	item, err := attributevalue.MarshalMap(holdRecord{ID: holdItemID(h.Key), Reason: h.Last.Reason, LastHost: h.Last.ID,
		LastEndedAt: h.Last.EndedAt, Failures: h.Failures, Stopped: h.Stopped, Until: h.Until,
		ExpiresAt: expires.Add(HostRetention).Unix(), Version: h.Version + 1})
	if err != nil {
		return nil, fmt.Errorf("encode the hold of %s/%s: %w", h.Key.Queue, h.Key.HostKey, err)
	}
	put := versionedPut(s.tables.Hosts, "host_id", item, h.Version)
	if h.Version == 0 {
		// None stored, or one stored before holds had versions.
		put.ConditionExpression, put.ExpressionAttributeNames = aws.String("attribute_not_exists(#v)"), map[string]string{"#v": "version"}
	}
	return put, nil
}

// SaveKeyHold writes h over the hold stored at h.Version (0: none), and
// moves h.Version: a conflict when it changed since it was read.
func (s *Store) SaveKeyHold(ctx context.Context, h *domain.KeyHold) error {
	put, err := s.holdPut(*h, s.now())
	if err != nil {
		return err
	}
	if err := s.put(ctx, put); err != nil {
		if errors.Is(err, errVersion) {
			return domain.Errorf(domain.KindConflict, "the hold of %s/%s changed since it was read", h.Key.Queue, h.Key.HostKey)
		}
		return storeErr("save the hold of "+h.Key.HostKey, err)
	}
	h.Version++
	return nil
}

// KeyHold reads what holds k's launches back, strongly consistent (ok
// false: nothing ever did, or it expired). Its Last carries the failed
// host's id, reason and end.
func (s *Store) KeyHold(ctx context.Context, k domain.ProvisionKey) (hold domain.KeyHold, ok bool, err error) {
	hold.Key = k
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(s.tables.Hosts), Key: key("host_id", holdItemID(k)), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return hold, false, storeErr("read the hold of "+k.HostKey, err)
	}
	if out.Item == nil {
		return hold, false, nil
	}
	var r holdRecord
	if err := attributevalue.UnmarshalMap(out.Item, &r); err != nil {
		return hold, false, fmt.Errorf("decode the hold of %s/%s: %w", k.Queue, k.HostKey, err)
	}
	hold = domain.KeyHold{Key: k, Failures: r.Failures, Stopped: r.Stopped, Until: r.Until, Version: r.Version,
		Last: domain.Host{ID: r.LastHost, Key: k, Reason: r.Reason, EndedAt: r.LastEndedAt}}
	return hold, true, nil
}
