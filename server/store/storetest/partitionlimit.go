package storetest

import (
	"context"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/server/store"
)

// PartitionLimited is a store.DB that simulates one limit of DynamoDB on
// AWS that no local engine has: a partition of a global secondary index
// takes only so many writes a second (about 1,000 on AWS). It watches the
// puts to one table (whole items, as the store writes them), keeps which
// partition of index attribute Attr each item is in, and holds back the
// answer of every successful write that moves an item into, out of or
// within a partition until that partition's budget allows it (a token
// bucket per partition with no burst: Rate writes a second). Throughput
// then saturates as it would on AWS; only the wait stands in for the
// throttling errors and retries AWS would answer with.
type PartitionLimited struct {
	store.DB
	Table string  // the table whose writes are watched
	Attr  string  // the index's partition key attribute, e.g. claim_key
	Rate  float64 // writes a second per partition

	mu   sync.Mutex
	at   map[string]string    // item key → its partition ("" for none)
	next map[string]time.Time // partition → when its next write may land
	on   bool
}

// Limit turns the limit on (writes before are tracked, not held back).
func (p *PartitionLimited) Limit(on bool) {
	p.mu.Lock()
	p.on = on
	p.mu.Unlock()
}

func (p *PartitionLimited) PutItem(ctx context.Context, in *dynamodb.PutItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	out, err := p.DB.PutItem(ctx, in, opts...)
	if err == nil && in.TableName != nil && *in.TableName == p.Table {
		p.wait(ctx, p.moved(in.Item))
	}
	return out, err
}

func (p *PartitionLimited) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, opts ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	out, err := p.DB.TransactWriteItems(ctx, in, opts...)
	if err == nil {
		var parts []string
		for _, it := range in.TransactItems {
			if it.Put != nil && it.Put.TableName != nil && *it.Put.TableName == p.Table {
				parts = append(parts, p.moved(it.Put.Item)...)
			}
		}
		p.wait(ctx, parts)
	}
	return out, err
}

// moved records item's partition and reports the partitions its write
// touched: the one it left and the one it entered.
func (p *PartitionLimited) moved(item map[string]types.AttributeValue) []string {
	id := ""
	if v, ok := item["invocation_id"].(*types.AttributeValueMemberS); ok {
		id = v.Value
	}
	now := ""
	if v, ok := item[p.Attr].(*types.AttributeValueMemberS); ok {
		now = v.Value
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.at == nil {
		p.at = map[string]string{}
	}
	was := p.at[id]
	p.at[id] = now
	var parts []string
	for _, k := range []string{was, now} {
		if k != "" && (len(parts) == 0 || parts[0] != k) {
			parts = append(parts, k)
		}
	}
	return parts
}

// wait holds the caller until every partition in parts has budget for one
// more write.
func (p *PartitionLimited) wait(ctx context.Context, parts []string) {
	p.mu.Lock()
	if !p.on || p.Rate <= 0 {
		p.mu.Unlock()
		return
	}
	if p.next == nil {
		p.next = map[string]time.Time{}
	}
	now := time.Now()
	until := now
	for _, k := range parts {
		t := now
		if p.next[k].After(t) {
			t = p.next[k]
		}
		p.next[k] = t.Add(time.Duration(float64(time.Second) / p.Rate))
		if t.After(until) {
			until = t
		}
	}
	p.mu.Unlock()
	if d := time.Until(until); d > 0 {
		tm := time.NewTimer(d)
		defer tm.Stop()
		select {
		case <-tm.C:
		case <-ctx.Done():
		}
	}
}
