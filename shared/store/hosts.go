package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// fleetItemID is the hosts table's ledger item: its version moves with
// every reservation (ReserveHosts).
const fleetItemID = "!fleet"

// ErrProvisionRaced answers a reservation made on a fleet another pass
// changed since it was read: read it again and plan again.
var ErrProvisionRaced = errors.New("another provisioner pass reserved hosts first")

// Fleet reads the hosts table whole: the ledger's version (what a
// reservation must find unchanged) and every host not expired (strongly
// consistent: a reservation that moved the version is in what a read after
// it sees; an index could not promise that, its reads being eventually
// consistent). Ended hosts expire after HostRetention, so the table holds
// the hosts alive and about a day's ended ones.
func (s *Store) Fleet(ctx context.Context) (version int64, hosts []domain.Host, err error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(s.tables.Hosts), Key: key("host_id", fleetItemID), ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return 0, nil, storeErr("read the fleet", err)
	}
	if out.Item != nil {
		var ledger struct {
			Version int64 `dynamodbav:"version"`
		}
		if err := attributevalue.UnmarshalMap(out.Item, &ledger); err != nil {
			return 0, nil, fmt.Errorf("decode the fleet ledger: %w", err)
		}
		version = ledger.Version
	}
	now := s.now().Unix()
	var start map[string]types.AttributeValue
	for {
		page, err := s.db.Scan(ctx, &dynamodb.ScanInput{
			TableName: aws.String(s.tables.Hosts), ConsistentRead: aws.Bool(true), ExclusiveStartKey: start,
		})
		if err != nil {
			return 0, nil, storeErr("read the hosts", err)
		}
		for _, item := range page.Items {
			if v, ok := item["host_id"].(*types.AttributeValueMemberS); ok && strings.HasPrefix(v.Value, "!") {
				continue // the ledger, a key's hold: not hosts
			}
			var r hostRecord
			if err := attributevalue.UnmarshalMap(item, &r); err != nil {
				return 0, nil, fmt.Errorf("decode a host: %w", err)
			}
			if r.ExpiresAt != 0 && r.ExpiresAt <= now {
				continue // expired: DynamoDB deletes it within days, not at once
			}
			hosts = append(hosts, r.domain())
		}
		if page.LastEvaluatedKey == nil {
			break
		}
		start = page.LastEvaluatedKey
	}
	return version, hosts, nil
}

// HostRetention is how long an ended host's item stays in the hosts table
// (its TTL): longer than the provisioner's longest hold (6 hours), so a
// key's failed hosts still hold it back, and short enough that the table,
// which every pass reads whole, holds about a day's launches.
const HostRetention = 24 * time.Hour

// MaxReservation is how many hosts one reservation writes: a transaction
// holds at most 100 items, one of them the ledger.
const MaxReservation = 99

// ReserveHosts records hosts (new, state reserved) in one transaction with
// the ledger moving from version to version + 1: it fails with
// ErrProvisionRaced when another pass reserved since version was read, so
// two passes never both launch for the same demand.
func (s *Store) ReserveHosts(ctx context.Context, version int64, hosts []domain.Host) error {
	if len(hosts) == 0 || len(hosts) > MaxReservation {
		return fmt.Errorf("reserve hosts: %d hosts, 1-%d a reservation", len(hosts), MaxReservation)
	}
	ledger, err := attributevalue.MarshalMap(struct {
		ID      string `dynamodbav:"host_id"`
		Version int64  `dynamodbav:"version"`
	}{fleetItemID, version + 1})
	if err != nil {
		return fmt.Errorf("encode the fleet ledger: %w", err)
	}
	items := []types.TransactWriteItem{{Put: versionedPut(s.tables.Hosts, "host_id", ledger, version)}}
	for _, h := range hosts {
		h.Version = 1
		item, err := attributevalue.MarshalMap(toHostRecord(h))
		if err != nil {
			return fmt.Errorf("encode host %s: %w", h.ID, err)
		}
		items = append(items, types.TransactWriteItem{Put: versionedPut(s.tables.Hosts, "host_id", item, 0)})
	}
	_, err = s.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items})
	if _, ok := cancelledBy(err); ok {
		return ErrProvisionRaced
	}
	if err != nil {
		return storeErr("reserve hosts", err)
	}
	return nil
}

// SaveHost writes next over the host stored at version prev (a launch, a
// refusal, an end), bumping its version.
func (s *Store) SaveHost(ctx context.Context, prev int64, next *domain.Host) error {
	next.Version = prev + 1
	item, err := attributevalue.MarshalMap(toHostRecord(*next))
	if err != nil {
		return fmt.Errorf("encode host %s: %w", next.ID, err)
	}
	if err := s.put(ctx, versionedPut(s.tables.Hosts, "host_id", item, prev)); err != nil {
		if errors.Is(err, errVersion) {
			return wire.Errorf(wire.CodeConflict, "host %s changed since it was read", next.ID)
		}
		return storeErr("save host "+next.ID, err)
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
		ExpressionAttributeValues: map[string]types.AttributeValue{":q": str(queue + "#" + wire.StateQueued)},
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

// holdRecord is the stored form of what holds a key's launches back: what
// the invocation view shows its queued work waiting on.
type holdRecord struct {
	ID       string    `dynamodbav:"host_id"`
	Reason   string    `dynamodbav:"reason"`
	Failures int       `dynamodbav:"failures"`
	Stopped  bool      `dynamodbav:"stopped,omitempty"`
	Until    time.Time `dynamodbav:"until"`
	// ExpiresAt (the table's TTL): a hold outlives its Until by
	// HostRetention, then goes.
	ExpiresAt int64 `dynamodbav:"expires_at"`
}

// SaveKeyHold records why the provisioner holds k's launches back until
// until (reason: the last failed host's), for the invocation view.
func (s *Store) SaveKeyHold(ctx context.Context, h domain.KeyHold) error {
	item, err := attributevalue.MarshalMap(holdRecord{ID: holdItemID(h.Key), Reason: h.Last.Reason,
		Failures: h.Failures, Stopped: h.Stopped, Until: h.Until, ExpiresAt: h.Until.Add(HostRetention).Unix()})
	if err != nil {
		return fmt.Errorf("encode the hold of %s/%s: %w", h.Key.Queue, h.Key.HostKey, err)
	}
	if _, err := s.db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(s.tables.Hosts), Item: item}); err != nil {
		return storeErr("save the hold of "+h.Key.HostKey, err)
	}
	return nil
}

// KeyHold reads what holds k's launches back (ok false: nothing was ever
// held). Its Last carries only the reason.
func (s *Store) KeyHold(ctx context.Context, k domain.ProvisionKey) (hold domain.KeyHold, ok bool, err error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(s.tables.Hosts), Key: key("host_id", holdItemID(k))})
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
	return domain.KeyHold{Key: k, Failures: r.Failures, Stopped: r.Stopped, Until: r.Until, Last: domain.Host{Key: k, Reason: r.Reason}}, true, nil
}
