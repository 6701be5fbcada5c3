package embedded

import (
	"cmp"
	"math/big"
	"slices"
	"strconv"
	"sync/atomic"

	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/truora/minidyn/server"
	"github.com/truora/minidyn/types"
)

// shadowTable holds one table's items, kept in key order per partition of
// the table and of each secondary index, so a Query walks only the
// partition it names. It is the authority for the items: the writes it
// takes itself (plain puts and deletes, alone or in a transaction) reach
// minidyn's copy only when minidyn must answer a request (dirty, syncFor);
// every other item is what a consistent GetItem of minidyn answered after
// the last write minidyn took of its key.
type shadowTable struct {
	attrTypes map[string]string // attribute name -> S, N or B (AttributeDefinitions)
	primary   *shadowIndex
	indexes   map[string]*shadowIndex
	items     map[string]*shadowItem // by tableKeyID
	// dirty holds, by tableKeyID, the table key of each item written here
	// and not yet in minidyn: its item here, or its absence.
	dirty map[string]map[string]*server.AttributeValue
	// broken is set when the shadow lost track of an item (minidyn did
	// not answer its GetItem): table Queries go to minidyn from then on,
	// and Queries of its indexes, which only the shadow holds, are refused.
	broken bool
	// emptyValues is set once the table held an item with an empty list,
	// map, set or binary (anyEmpty): minidyn may hold such a value
	// otherwise than the shadow, so from then on the shadow leaves
	// refusals on the table to minidyn (refusable).
	emptyValues bool
}

// shadowIndex is the table's primary key or one secondary index: its key
// attributes, its projection, and its partitions.
type shadowIndex struct {
	hash, rng  string
	projection string   // ALL, KEYS_ONLY or INCLUDE; "" for the table
	include    []string // INCLUDE's non-key attributes
	local      bool     // a local secondary index
	parts      map[string][]*shadowItem
}

// shadowItem is one item as minidyn answers it (wire form, for the answer)
// and as its interpreter reads it (for filters and projections).
type shadowItem struct {
	id   string // tableKeyID of its table key
	wire map[string]*server.AttributeValue
	// typed is wire converted, made when a filter or projection first
	// reads the item (by any of the reads served side by side: each makes
	// the same).
	typed atomic.Pointer[map[string]*types.Item]
	// hashVal and rngVal are the table key, the tie-break of index entries.
	hashVal, rngVal keyValue
	// in holds where the item is in each index it is in (by index name;
	// "" for the table).
	in map[string]entryKey
}

// entryKey is an item's place in one index: its partition and sort key.
type entryKey struct {
	part string
	sort keyValue
}

// keyValue is a key attribute's value, ordered as DynamoDB orders keys: S
// and B by their bytes, N by numeric value.
type keyValue struct {
	typ byte   // 'S', 'N', 'B'; 0 when absent (a table without a sort key)
	raw string // S, the bytes of B, N as written
	num *big.Rat
}

// keyValueOf reads av as a key value of type typ, reporting whether it has
// that type (and, for N, is a number).
func keyValueOf(av *server.AttributeValue, typ string) (keyValue, bool) {
	if av == nil {
		return keyValue{}, false
	}
	switch typ {
	case "S":
		if av.S == nil {
			return keyValue{}, false
		}
		return keyValue{typ: 'S', raw: *av.S}, true
	case "B":
		if av.B == nil {
			return keyValue{}, false
		}
		return keyValue{typ: 'B', raw: string(av.B)}, true
	case "N":
		if av.N == nil {
			return keyValue{}, false
		}
		n, ok := new(big.Rat).SetString(*av.N)
		if !ok {
			return keyValue{}, false
		}
		return keyValue{typ: 'N', raw: *av.N, num: n}, true
	}
	return keyValue{}, false
}

// compare orders two values of the same key attribute.
func (k keyValue) compare(o keyValue) int {
	if k.typ == 'N' && o.typ == 'N' {
		return k.num.Cmp(o.num)
	}
	return cmp.Compare(k.raw, o.raw)
}

// id names the value as minidyn tells items apart: by the value as written,
// so "1" and "1.0" are two items there and two here.
func (k keyValue) id() string {
	return string(k.typ) + strconv.Itoa(len(k.raw)) + ":" + k.raw
}

// tableKeyID names an item by its table key.
func tableKeyID(h, r keyValue) string { return h.id() + r.id() }

// compareEntries orders an index partition: by the index sort key, ties
// (same sort key, or an index without one) by the table key, so every
// answer has one order. No two items compare equal.
func compareEntries(index string, a, b *shadowItem) int {
	if c := a.in[index].sort.compare(b.in[index].sort); c != 0 {
		return c
	}
	if c := a.hashVal.compare(b.hashVal); c != 0 {
		return c
	}
	if c := a.rngVal.compare(b.rngVal); c != 0 {
		return c
	}
	// N keys "1" and "1.0" are two items in minidyn but equal numbers.
	return cmp.Compare(a.id, b.id)
}

func newShadowTable(in *server.CreateTableInput) (*shadowTable, bool) {
	t := &shadowTable{attrTypes: map[string]string{}, indexes: map[string]*shadowIndex{}, items: map[string]*shadowItem{},
		dirty: map[string]map[string]*server.AttributeValue{}}
	for _, d := range in.AttributeDefinitions {
		if d.AttributeName != nil {
			t.attrTypes[*d.AttributeName] = string(d.AttributeType)
		}
	}
	var ok bool
	if t.primary, ok = t.newIndex(in.KeySchema, nil); !ok {
		return nil, false
	}
	for _, g := range in.GlobalSecondaryIndexes {
		if !t.addIndex(g.IndexName, g.KeySchema, g.Projection, false) {
			return nil, false
		}
	}
	for _, l := range in.LocalSecondaryIndexes {
		if !t.addIndex(l.IndexName, l.KeySchema, l.Projection, true) {
			return nil, false
		}
	}
	return t, true
}

// addIndex adds an empty index. A name already taken, or a local index
// whose partition key is not the table's, is a table the shadow leaves to
// minidyn (which answers its own error).
func (t *shadowTable) addIndex(name *string, ks []ddbtypes.KeySchemaElement, p *ddbtypes.Projection, local bool) bool {
	if name == nil || *name == "" || t.indexes[*name] != nil {
		return false
	}
	idx, ok := t.newIndex(ks, p)
	if !ok || (local && idx.hash != t.primary.hash) {
		return false
	}
	idx.local = local
	t.indexes[*name] = idx
	return true
}

// backfill puts every item of the table into the index name: what a new
// global secondary index starts with.
func (t *shadowTable) backfill(name string, idx *shadowIndex) {
	for _, it := range t.items {
		t.place(name, idx, it)
	}
}

// dropIndex takes the index name and its entries away.
func (t *shadowTable) dropIndex(name string) {
	for _, it := range t.items {
		delete(it.in, name)
	}
	delete(t.indexes, name)
}

// newIndex reads a key schema whose attributes are all defined; a schema it
// cannot read leaves the table unshadowed (its Queries go to minidyn).
func (t *shadowTable) newIndex(ks []ddbtypes.KeySchemaElement, p *ddbtypes.Projection) (*shadowIndex, bool) {
	idx := &shadowIndex{parts: map[string][]*shadowItem{}}
	for _, e := range ks {
		if e.AttributeName == nil || t.attrTypes[*e.AttributeName] == "" {
			return nil, false
		}
		switch e.KeyType {
		case ddbtypes.KeyTypeHash:
			idx.hash = *e.AttributeName
		case ddbtypes.KeyTypeRange:
			idx.rng = *e.AttributeName
		default:
			return nil, false
		}
	}
	if idx.hash == "" {
		return nil, false
	}
	if p != nil {
		idx.projection = string(p.ProjectionType)
		idx.include = p.NonKeyAttributes
		switch idx.projection {
		case "", "ALL", "KEYS_ONLY", "INCLUDE":
		default:
			return nil, false
		}
	}
	return idx, true
}

// tableKey reads the table key out of an item or a key map.
func (t *shadowTable) tableKey(m map[string]*server.AttributeValue) (h, r keyValue, ok bool) {
	h, ok = keyValueOf(m[t.primary.hash], t.attrTypes[t.primary.hash])
	if !ok {
		return h, r, false
	}
	if t.primary.rng != "" {
		r, ok = keyValueOf(m[t.primary.rng], t.attrTypes[t.primary.rng])
	}
	return h, r, ok
}

// indexKey reads an index's key out of an item: an item without both key
// attributes, or with one of another type, is not in the index (sparse).
func (t *shadowTable) indexKey(idx *shadowIndex, m map[string]*server.AttributeValue) (h, r keyValue, ok bool) {
	h, ok = keyValueOf(m[idx.hash], t.attrTypes[idx.hash])
	if !ok {
		return h, r, false
	}
	if idx.rng != "" {
		r, ok = keyValueOf(m[idx.rng], t.attrTypes[idx.rng])
	}
	return h, r, ok
}

// each calls f with the table and then every secondary index.
func (t *shadowTable) each(f func(name string, idx *shadowIndex)) {
	f("", t.primary)
	for name, idx := range t.indexes {
		f(name, idx)
	}
}

// set makes the item of key (h, r) what minidyn holds: item, or none
// when item is nil. It costs a binary search and a slice move per index.
func (t *shadowTable) set(h, r keyValue, item map[string]*server.AttributeValue) {
	id := tableKeyID(h, r)
	if old := t.items[id]; old != nil {
		t.each(func(name string, idx *shadowIndex) { idx.remove(name, old) })
		delete(t.items, id)
	}
	if item == nil {
		return
	}
	t.emptyValues = t.emptyValues || anyEmpty(item)
	it := &shadowItem{id: id, wire: item, hashVal: h, rngVal: r, in: map[string]entryKey{}}
	t.items[id] = it
	t.each(func(name string, idx *shadowIndex) { t.place(name, idx, it) })
}

// place puts it into the index name, if it holds the index's key.
func (t *shadowTable) place(name string, idx *shadowIndex, it *shadowItem) {
	ih, ir, ok := t.indexKey(idx, it.wire)
	if !ok {
		return
	}
	part := ih.id()
	it.in[name] = entryKey{part: part, sort: ir}
	entries := idx.parts[part]
	i, _ := slices.BinarySearchFunc(entries, it, func(a, b *shadowItem) int { return compareEntries(name, a, b) })
	idx.parts[part] = slices.Insert(entries, i, it)
}

// remove takes it out of the index's partition, if it is there.
func (idx *shadowIndex) remove(name string, it *shadowItem) {
	at, in := it.in[name]
	if !in {
		return
	}
	entries := idx.parts[at.part]
	i, found := slices.BinarySearchFunc(entries, it, func(a, b *shadowItem) int { return compareEntries(name, a, b) })
	if !found || entries[i] != it {
		return
	}
	entries = slices.Delete(entries, i, i+1)
	if len(entries) == 0 {
		delete(idx.parts, at.part)
		return
	}
	idx.parts[at.part] = entries
}

// typedItem is the item as minidyn's interpreter reads it.
func (it *shadowItem) typedItem() map[string]*types.Item {
	if typed := it.typed.Load(); typed != nil {
		return *typed
	}
	typed := toTypes(it.wire)
	it.typed.Store(&typed)
	return typed
}

// toTypes converts a wire item to the form minidyn's interpreter reads.
func toTypes(m map[string]*server.AttributeValue) map[string]*types.Item {
	return convertMap(m, toType)
}

func toType(av *server.AttributeValue) *types.Item {
	if av == nil {
		return nil
	}
	return &types.Item{B: av.B, BOOL: av.BOOL, BS: av.BS, L: convertList(av.L, toType), M: toTypes(av.M), N: av.N, NS: av.NS, NULL: av.NULL, S: av.S, SS: av.SS}
}

// fromTypes converts an interpreter item back to wire form.
func fromTypes(m map[string]*types.Item) map[string]*server.AttributeValue {
	return convertMap(m, fromType)
}

func fromType(it *types.Item) *server.AttributeValue {
	if it == nil {
		return nil
	}
	return &server.AttributeValue{B: it.B, BOOL: it.BOOL, BS: it.BS, L: convertList(it.L, fromType), M: fromTypes(it.M), N: it.N, NS: it.NS, NULL: it.NULL, S: it.S, SS: it.SS}
}

// convertMap converts every value of a map, keeping nil a nil map (the
// wire drops a nil M, and minidyn's conversions keep it nil).
func convertMap[A, B any](m map[string]*A, f func(*A) *B) map[string]*B {
	if m == nil {
		return nil
	}
	out := make(map[string]*B, len(m))
	for k, v := range m {
		out[k] = f(v)
	}
	return out
}

// convertList is convertMap for a list.
func convertList[A, B any](l []*A, f func(*A) *B) []*B {
	if l == nil {
		return nil
	}
	out := make([]*B, len(l))
	for i, v := range l {
		out[i] = f(v)
	}
	return out
}
