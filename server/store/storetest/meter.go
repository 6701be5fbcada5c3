package storetest

import (
	"context"
	"fmt"
	"maps"
	"math"
	"reflect"
	"regexp"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/schema"
)

// Units are DynamoDB request units, as on-demand billing counts them.
type Units struct {
	Write float64 // write request units
	Read  float64 // read request units
}

// Meter is a store.DB that bills every request it passes on as DynamoDB
// on-demand billing would, in write and read request units, per table and
// per global secondary index. The emulators do not report it as AWS does
// (minidyn answers no ConsumedCapacity; moto answers the table's units and
// nothing for its indexes), so this is how tests and benchmarks measure
// what a store operation costs on AWS.
//
// For a write it reads the items the write touches before and after (Peek
// reads them and is not billed) and applies DynamoDB's rules:
//
//   - Item size: the sum of the UTF-8 lengths of the attribute names and the
//     sizes of the values: a string its UTF-8 bytes, a number 1 byte per two
//     significant digits plus 1, a binary its raw bytes, a Boolean or null 1
//     byte, a list or map 3 bytes plus its elements, each element 1 byte
//     more ("DynamoDB item sizes and formats", CapacityUnitCalculations in
//     the DynamoDB developer guide).
//   - A table write costs 1 unit per KB of the larger of the item before and
//     after (at least 1); in a transaction every item, a ConditionCheck
//     included, costs twice that ("Capacity management for transactions").
//   - Each global secondary index: no write if neither image has the index's
//     key attributes; a put of the projected entry if only the new one does;
//     a delete if only the old one does; a delete and a put if the index key
//     changed; a put if the key stayed and a projected attribute changed
//     (ProjectionType ALL: any attribute; KEYS_ONLY: none); nothing
//     otherwise. Each costs 1 unit per KB of the entry: the table key, the
//     index key and the projected attributes ("Provisioned throughput
//     considerations for global secondary indexes", GSI.ThroughputConsiderations).
//   - A write refused by its condition (or a cancelled transaction) costs
//     the table units of the item as it stands, and no index writes.
//
// A read costs, per 4 KB, half a unit eventually consistent, 1 strongly
// consistent: a GetItem (and each item of a BatchGetItem) by its whole
// item's size, even when a projection expression returns less, and at
// least one 4 KB block when nothing is
// found; a Query or Scan by the summed size of every entry it evaluated
// (before a filter), rounded up once, at least one block. The meter finds
// those entries by running the request again on Peek with the filter and
// projection dropped.
//
// Writes through a Meter are serialised, so its before and after images are
// exact when every writer goes through it. The zero value is not usable;
// make one with NewMeter.
type Meter struct {
	db, peek store.DB
	prefix   string
	tables   map[string]*dynamodb.CreateTableInput

	mu    sync.Mutex // serialises writes with their images
	umu   sync.Mutex
	units map[string]Units // by table suffix, or "suffix/index"
}

var _ store.DB = (*Meter)(nil)

// NewMeter returns a Meter over db for the tables of template.yaml under
// prefix. Peek reads the meter's before and after images (give it a client
// whose requests are not counted); nil uses db.
func NewMeter(db, peek store.DB, prefix string) (*Meter, error) {
	defs, err := schema.TableDefinitions(prefix)
	if err != nil {
		return nil, fmt.Errorf("meter: %w", err)
	}
	return newMeter(db, peek, prefix, defs), nil
}

func newMeter(db, peek store.DB, prefix string, defs []*dynamodb.CreateTableInput) *Meter {
	if peek == nil {
		peek = db
	}
	m := &Meter{db: db, peek: peek, prefix: prefix, tables: map[string]*dynamodb.CreateTableInput{}, units: map[string]Units{}}
	for _, d := range defs {
		m.tables[aws.ToString(d.TableName)] = d
	}
	return m
}

// Total reports the units billed so far over every table and index.
func (m *Meter) Total() Units {
	m.umu.Lock()
	defer m.umu.Unlock()
	var t Units
	for _, u := range m.units {
		t.Write += u.Write
		t.Read += u.Read
	}
	return t
}

// Snapshot reports the units billed so far by table ("invocations", the
// name without its prefix) and by index ("invocations/claim"). The map is
// a copy the caller owns.
func (m *Meter) Snapshot() map[string]Units {
	m.umu.Lock()
	defer m.umu.Unlock()
	return maps.Clone(m.units)
}

// Reset sets every count back to zero.
func (m *Meter) Reset() {
	m.umu.Lock()
	defer m.umu.Unlock()
	clear(m.units)
}

func (m *Meter) bill(table, index string, u Units) {
	name := strings.TrimPrefix(table, m.prefix)
	if index != "" {
		name += "/" + index
	}
	m.umu.Lock()
	defer m.umu.Unlock()
	t := m.units[name]
	t.Write += u.Write
	t.Read += u.Read
	m.units[name] = t
}

// ItemSize reports the size DynamoDB bills item at, in bytes.
func ItemSize(item map[string]types.AttributeValue) int {
	n := 0
	for name, v := range item {
		n += len(name) + valueSize(v)
	}
	return n
}

func valueSize(v types.AttributeValue) int {
	switch v := v.(type) {
	case *types.AttributeValueMemberS:
		return len(v.Value)
	case *types.AttributeValueMemberN:
		return numberSize(v.Value)
	case *types.AttributeValueMemberB:
		return len(v.Value)
	case *types.AttributeValueMemberBOOL, *types.AttributeValueMemberNULL:
		return 1
	case *types.AttributeValueMemberSS:
		n := 0
		for _, s := range v.Value {
			n += len(s)
		}
		return n
	case *types.AttributeValueMemberNS:
		n := 0
		for _, s := range v.Value {
			n += numberSize(s)
		}
		return n
	case *types.AttributeValueMemberBS:
		n := 0
		for _, b := range v.Value {
			n += len(b)
		}
		return n
	case *types.AttributeValueMemberL:
		n := 3
		for _, e := range v.Value {
			n += 1 + valueSize(e)
		}
		return n
	case *types.AttributeValueMemberM:
		n := 3
		for k, e := range v.Value {
			n += 1 + len(k) + valueSize(e)
		}
		return n
	}
	return 0
}

// numberSize is 1 byte per two significant digits, plus 1: leading and
// trailing zeros, the sign, the point and any exponent do not count.
func numberSize(s string) int {
	mantissa, _, _ := strings.Cut(strings.ToLower(s), "e")
	digits := strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return r
		}
		return -1
	}, mantissa)
	digits = strings.Trim(digits, "0")
	return (len(digits)+1)/2 + 1
}

// blocks is how many size-byte blocks n bytes take, at least one.
func blocks(n, size int) float64 {
	return math.Max(1, math.Ceil(float64(n)/float64(size)))
}

// keyOf is item's primary key under key schema ks, or nil when item lacks a
// key attribute.
func keyOf(item map[string]types.AttributeValue, ks []types.KeySchemaElement) map[string]types.AttributeValue {
	if item == nil {
		return nil
	}
	k := make(map[string]types.AttributeValue, len(ks))
	for _, e := range ks {
		v, ok := item[aws.ToString(e.AttributeName)]
		if !ok {
			return nil
		}
		k[aws.ToString(e.AttributeName)] = v
	}
	return k
}

// indexEntry is what index gsi of table def holds for item: nil when item
// lacks the index key (a sparse index leaves it out).
func indexEntry(def *dynamodb.CreateTableInput, gsi types.GlobalSecondaryIndex, item map[string]types.AttributeValue) map[string]types.AttributeValue {
	ik := keyOf(item, gsi.KeySchema)
	if ik == nil {
		return nil
	}
	p := gsi.Projection
	if p != nil && p.ProjectionType == types.ProjectionTypeAll {
		return item
	}
	entry := keyOf(item, def.KeySchema)
	maps.Copy(entry, ik)
	if p != nil && p.ProjectionType == types.ProjectionTypeInclude {
		for _, a := range p.NonKeyAttributes {
			if v, ok := item[a]; ok {
				entry[a] = v
			}
		}
	}
	return entry
}

// billWrite bills one item's write on table from image old to image new
// (nil: absent). failed: the write was refused and changed nothing.
func (m *Meter) billWrite(table string, old, new map[string]types.AttributeValue, transact, failed bool) {
	factor := 1.0
	if transact {
		factor = 2
	}
	if failed {
		m.bill(table, "", Units{Write: factor * blocks(ItemSize(old), 1024)})
		return
	}
	m.bill(table, "", Units{Write: factor * blocks(max(ItemSize(old), ItemSize(new)), 1024)})
	def := m.tables[table]
	if def == nil {
		return
	}
	for _, gsi := range def.GlobalSecondaryIndexes {
		before, after := indexEntry(def, gsi, old), indexEntry(def, gsi, new)
		var w float64
		switch {
		case before == nil && after == nil:
		case before == nil:
			w = blocks(ItemSize(after), 1024)
		case after == nil:
			w = blocks(ItemSize(before), 1024)
		case !reflect.DeepEqual(keyOf(before, gsi.KeySchema), keyOf(after, gsi.KeySchema)):
			w = blocks(ItemSize(before), 1024) + blocks(ItemSize(after), 1024)
		case !reflect.DeepEqual(before, after):
			w = blocks(max(ItemSize(before), ItemSize(after)), 1024)
		}
		if w > 0 {
			m.bill(table, aws.ToString(gsi.IndexName), Units{Write: w})
		}
	}
}

// image reads the item at key of table as it stands (nil: none).
func (m *Meter) image(ctx context.Context, table string, key map[string]types.AttributeValue) (map[string]types.AttributeValue, error) {
	if key == nil {
		return nil, nil
	}
	out, err := m.peek.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: key, ConsistentRead: aws.Bool(true)})
	if err != nil {
		return nil, fmt.Errorf("meter: read %s: %w", table, err)
	}
	if len(out.Item) == 0 {
		return nil, nil
	}
	return out.Item, nil
}

// written is one item a write touches.
type written struct {
	table string
	key   map[string]types.AttributeValue
	old   map[string]types.AttributeValue
}

// metered runs write over items, billing each from its image before to its
// image after.
func (m *Meter) metered(ctx context.Context, items []written, transact bool, write func() error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range items {
		old, err := m.image(ctx, items[i].table, items[i].key)
		if err != nil {
			return err
		}
		items[i].old = old
	}
	werr := write()
	for _, it := range items {
		if werr != nil {
			m.billWrite(it.table, it.old, nil, transact, true)
			continue
		}
		new, err := m.image(ctx, it.table, it.key)
		if err != nil {
			return err
		}
		m.billWrite(it.table, it.old, new, transact, false)
	}
	return werr
}

func (m *Meter) keyIn(table string, item map[string]types.AttributeValue) map[string]types.AttributeValue {
	def := m.tables[table]
	if def == nil {
		return nil
	}
	return keyOf(item, def.KeySchema)
}

// PutItem bills and passes on a PutItem.
func (m *Meter) PutItem(ctx context.Context, in *dynamodb.PutItemInput, opts ...func(*dynamodb.Options)) (out *dynamodb.PutItemOutput, err error) {
	table := aws.ToString(in.TableName)
	err = m.metered(ctx, []written{{table: table, key: m.keyIn(table, in.Item)}}, false, func() error {
		out, err = m.db.PutItem(ctx, in, opts...)
		return err
	})
	return out, err
}

// UpdateItem bills and passes on an UpdateItem.
func (m *Meter) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (out *dynamodb.UpdateItemOutput, err error) {
	err = m.metered(ctx, []written{{table: aws.ToString(in.TableName), key: in.Key}}, false, func() error {
		out, err = m.db.UpdateItem(ctx, in, opts...)
		return err
	})
	return out, err
}

// TransactWriteItems bills and passes on a TransactWriteItems: every item,
// a ConditionCheck included, at the transactional rate.
func (m *Meter) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, opts ...func(*dynamodb.Options)) (out *dynamodb.TransactWriteItemsOutput, err error) {
	items := make([]written, 0, len(in.TransactItems))
	for _, ti := range in.TransactItems {
		switch {
		case ti.Put != nil:
			t := aws.ToString(ti.Put.TableName)
			items = append(items, written{table: t, key: m.keyIn(t, ti.Put.Item)})
		case ti.Update != nil:
			items = append(items, written{table: aws.ToString(ti.Update.TableName), key: ti.Update.Key})
		case ti.Delete != nil:
			items = append(items, written{table: aws.ToString(ti.Delete.TableName), key: ti.Delete.Key})
		case ti.ConditionCheck != nil:
			items = append(items, written{table: aws.ToString(ti.ConditionCheck.TableName), key: ti.ConditionCheck.Key})
		}
	}
	err = m.metered(ctx, items, true, func() error {
		out, err = m.db.TransactWriteItems(ctx, in, opts...)
		return err
	})
	return out, err
}

// readUnits is the cost of reading n bytes at once: per 4 KB, half a unit
// eventually consistent, 1 strongly consistent.
func readUnits(n int, consistent bool) float64 {
	if consistent {
		return blocks(n, 4096)
	}
	return blocks(n, 4096) / 2
}

// GetItem bills and passes on a GetItem.
func (m *Meter) GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	out, err := m.db.GetItem(ctx, in, opts...)
	if err != nil {
		return out, err
	}
	return out, m.billWhole(ctx, aws.ToString(in.TableName), in.Key, func(n int) float64 { return readUnits(n, aws.ToBool(in.ConsistentRead)) })
}

// BatchGetItem bills and passes on a BatchGetItem: each key it answered
// (not left unprocessed) as one GetItem.
func (m *Meter) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	out, err := m.db.BatchGetItem(ctx, in, opts...)
	if err != nil {
		return out, err
	}
	for table, ka := range in.RequestItems {
		var left []map[string]types.AttributeValue
		if u, ok := out.UnprocessedKeys[table]; ok {
			left = u.Keys
		}
		for _, k := range ka.Keys {
			if containsKey(left, k) {
				continue
			}
			if err := m.billWhole(ctx, table, k, func(n int) float64 { return readUnits(n, aws.ToBool(ka.ConsistentRead)) }); err != nil {
				return out, err
			}
		}
	}
	return out, nil
}

// billWhole bills a read of the item at key of table by its whole size
// (even when the read returned less), in the units units gives for it.
func (m *Meter) billWhole(ctx context.Context, table string, key map[string]types.AttributeValue, units func(size int) float64) error {
	whole, err := m.image(ctx, table, key)
	if err != nil {
		return err
	}
	m.bill(table, "", Units{Read: units(ItemSize(whole))})
	return nil
}

func containsKey(keys []map[string]types.AttributeValue, k map[string]types.AttributeValue) bool {
	for _, l := range keys {
		if reflect.DeepEqual(l, k) {
			return true
		}
	}
	return false
}

// placeholder matches an expression attribute name or value placeholder.
var placeholder = regexp.MustCompile(`[#:][A-Za-z0-9_]+`)

// usedBy keeps the placeholders of names and values that expr uses: a
// request may not carry unused ones.
func usedBy[V any](expr string, m map[string]V) map[string]V {
	if m == nil {
		return nil
	}
	used := map[string]bool{}
	for _, p := range placeholder.FindAllString(expr, -1) {
		used[p] = true
	}
	out := map[string]V{}
	for k, v := range m {
		if used[k] {
			out[k] = v
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// Query bills and passes on a Query: the entries it evaluated, read again
// on Peek without filter or projection, summed and rounded up once.
func (m *Meter) Query(ctx context.Context, in *dynamodb.QueryInput, opts ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error) {
	out, err := m.db.Query(ctx, in, opts...)
	if err != nil {
		return out, err
	}
	shadow := *in
	shadow.FilterExpression, shadow.ProjectionExpression, shadow.Select = nil, nil, ""
	expr := aws.ToString(in.KeyConditionExpression)
	shadow.ExpressionAttributeNames = usedBy(expr, in.ExpressionAttributeNames)
	shadow.ExpressionAttributeValues = usedBy(expr, in.ExpressionAttributeValues)
	return out, m.billEvaluated(in.TableName, in.IndexName, in.ConsistentRead, func() ([]map[string]types.AttributeValue, error) {
		again, err := m.peek.Query(ctx, &shadow)
		if err != nil {
			return nil, err
		}
		return again.Items, nil
	})
}

// Scan bills and passes on a Scan, as Query.
func (m *Meter) Scan(ctx context.Context, in *dynamodb.ScanInput, opts ...func(*dynamodb.Options)) (*dynamodb.ScanOutput, error) {
	out, err := m.db.Scan(ctx, in, opts...)
	if err != nil {
		return out, err
	}
	shadow := *in
	shadow.FilterExpression, shadow.ProjectionExpression, shadow.Select = nil, nil, ""
	shadow.ExpressionAttributeNames, shadow.ExpressionAttributeValues = nil, nil
	return out, m.billEvaluated(in.TableName, in.IndexName, in.ConsistentRead, func() ([]map[string]types.AttributeValue, error) {
		again, err := m.peek.Scan(ctx, &shadow)
		if err != nil {
			return nil, err
		}
		return again.Items, nil
	})
}

// billEvaluated bills a query or scan of table (index) by the entries
// again reads: what it evaluated.
func (m *Meter) billEvaluated(table, index *string, consistent *bool, again func() ([]map[string]types.AttributeValue, error)) error {
	items, err := again()
	if err != nil {
		return fmt.Errorf("meter: read again what %s evaluated: %w", aws.ToString(table), err)
	}
	m.billRead(aws.ToString(table), aws.ToString(index), items, aws.ToBool(consistent))
	return nil
}

func (m *Meter) billRead(table, index string, items []map[string]types.AttributeValue, consistent bool) {
	n := 0
	for _, it := range items {
		n += ItemSize(it)
	}
	m.bill(table, index, Units{Read: readUnits(n, consistent)})
}
