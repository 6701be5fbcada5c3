package embedded

import (
	"encoding/json"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/truora/minidyn/interpreter"
	"github.com/truora/minidyn/server"
	"github.com/truora/minidyn/types"
)

var (
	namePlaceholder  = regexp.MustCompile("^#[A-Za-z0-9_]+$")
	valuePlaceholder = regexp.MustCompile("^:[A-Za-z0-9_]+$")
)

// query answers a Query from the table's shadow, walking only the entries
// of the named partition that the sort key condition, ExclusiveStartKey and
// Limit leave: its cost follows what it reads, not the table's size.
//
// When it does not answer (answer nil), index reports whether the Query
// names a secondary index of a shadowed table, which minidyn does not hold:
// such a Query is refused, with reason, or with minidyn's own error when
// reason is "" (a request minidyn rejects before it reads any index). Any
// other Query the shadow does not answer, minidyn answers.
func (e *engine) query(body []byte) (answer []byte, index bool, reason string) {
	var in server.QueryInput
	if err := json.Unmarshal(body, &in); err != nil || in.TableName == nil {
		return nil, false, ""
	}
	t := e.tables[*in.TableName]
	if t == nil {
		return nil, false, ""
	}
	indexName := deref(in.IndexName)
	index = indexName != ""
	refuse := func(why string) ([]byte, bool, string) { return nil, index, why }
	if t.broken {
		if !index {
			return nil, false, ""
		}
		return refuse("the embedded store lost track of an item of table " + *in.TableName + " and no longer answers Queries of its indexes")
	}
	if in.KeyConditionExpression == nil {
		return refuse("the embedded store needs a KeyConditionExpression")
	}
	if len(in.AttributesToGet) > 0 || in.ConditionalOperator != "" || len(in.KeyConditions) > 0 || len(in.QueryFilter) > 0 {
		return refuse("the embedded store does not take AttributesToGet, ConditionalOperator, KeyConditions or QueryFilter; use expressions")
	}
	if in.Limit != nil && *in.Limit <= 0 {
		return refuse("Limit must be at least 1")
	}
	countOnly := in.Select == ddbtypes.SelectCount
	switch {
	case in.Select == "" || countOnly:
	case index && in.Select == ddbtypes.SelectAllProjectedAttributes:
	default:
		return refuse("the embedded store takes Select COUNT, or ALL_PROJECTED_ATTRIBUTES on an index, or none")
	}
	keyExpr, filter, projection := *in.KeyConditionExpression, deref(in.FilterExpression), deref(in.ProjectionExpression)
	if countOnly && projection != "" {
		return refuse("Select COUNT takes no ProjectionExpression")
	}
	if !placeholdersValid(in.ExpressionAttributeNames, in.ExpressionAttributeValues, keyExpr, filter, projection) {
		return refuse("")
	}
	values := toTypes(in.ExpressionAttributeValues)
	if types.ValidateItemMap(values) != nil || types.ValidateItemMap(toTypes(in.ExclusiveStartKey)) != nil {
		return refuse("")
	}
	idx := t.primary
	if index {
		if idx = t.indexes[indexName]; idx == nil {
			return refuse("The table does not have the specified index: " + indexName)
		}
	}

	conds, ok := parseKeyCondition(keyExpr, in.ExpressionAttributeNames)
	if !ok {
		return refuse("Invalid KeyConditionExpression: the embedded store cannot read " + strconv.Quote(keyExpr))
	}
	var hashCond, rangeCond *keyCond
	for i := range conds {
		switch c := &conds[i]; {
		case c.attr == idx.hash && c.op == "=" && hashCond == nil:
			hashCond = c
		case c.attr == idx.rng && idx.rng != "" && rangeCond == nil:
			rangeCond = c
		default:
			return refuse("Query condition missed key schema element or names another attribute: " + strconv.Quote(keyExpr))
		}
	}
	if hashCond == nil {
		return refuse("Query condition missed key schema element: " + idx.hash)
	}
	hv, ok := keyValueOf(in.ExpressionAttributeValues[hashCond.vals[0]], t.attrTypes[idx.hash])
	if !ok {
		return refuse("One or more parameter values were invalid: Condition parameter type does not match schema type")
	}
	entries := idx.parts[hv.id()]
	lo, hi, ok := t.window(indexName, idx, entries, rangeCond, in.ExpressionAttributeValues)
	if !ok {
		return refuse("Invalid KeyConditionExpression: the sort key condition's values do not fit its type or order")
	}
	forward := in.ScanIndexForward == nil || *in.ScanIndexForward
	if len(in.ExclusiveStartKey) > 0 {
		pos, found, ok := t.startPosition(indexName, idx, entries, hv, in.ExclusiveStartKey)
		if !ok {
			return refuse("The provided starting key is invalid")
		}
		if forward {
			if found {
				pos++
			}
			lo = max(lo, pos)
		} else {
			hi = min(hi, pos)
		}
	}

	var (
		out     server.QueryOutput
		scanned int32
		last    *shadowItem
		limit   int32
	)
	if in.Limit != nil {
		limit = *in.Limit
	}
	lang := &interpreter.Language{}
	for n := range max(hi-lo, 0) {
		i := lo + n
		if !forward {
			i = hi - 1 - n
		}
		it := entries[i]
		e.evaluated.Add(1)
		scanned++
		last = it
		matched := true
		if filter != "" {
			m, err := lang.Match(interpreter.MatchInput{
				TableName: *in.TableName, Expression: filter, ExpressionType: interpreter.ExpressionTypeFilter,
				Item: it.typedItem(), Attributes: values, Aliases: in.ExpressionAttributeNames,
			})
			if err != nil {
				return refuse("Invalid FilterExpression: " + err.Error())
			}
			matched = m
		}
		if matched {
			out.Count++
			if !countOnly {
				item, ok := t.project(index, idx, it, projection, in.ExpressionAttributeNames)
				if !ok {
					return refuse("Invalid ProjectionExpression: " + strconv.Quote(projection))
				}
				out.Items = append(out.Items, item)
			}
		}
		// DynamoDB's Limit counts the items read, before the filter.
		if limit > 0 && scanned == limit {
			out.LastEvaluatedKey = t.keyOf(idx, last.wire)
			break
		}
	}

	answer, err := encode(&out)
	if err != nil {
		return refuse("encode the answer: " + err.Error())
	}
	e.answered.Add(1)
	return answer, index, ""
}

// window returns the range [lo, hi) of a partition's entries that the sort
// key condition keeps, found by binary search: entries are in sort key order.
func (t *shadowTable) window(name string, idx *shadowIndex, entries []*shadowItem, c *keyCond, values map[string]*server.AttributeValue) (lo, hi int, ok bool) {
	if c == nil {
		return 0, len(entries), true
	}
	typ := t.attrTypes[idx.rng]
	vals := make([]keyValue, len(c.vals))
	for i, v := range c.vals {
		if vals[i], ok = keyValueOf(values[v], typ); !ok {
			return 0, 0, false
		}
	}
	// first index whose sort key is >= v (strict: > v).
	search := func(v keyValue, strict bool) int {
		return sort.Search(len(entries), func(i int) bool {
			c := entries[i].in[name].sort.compare(v)
			return c > 0 || (!strict && c == 0)
		})
	}
	switch c.op {
	case "=":
		return search(vals[0], false), search(vals[0], true), true
	case "<":
		return 0, search(vals[0], false), true
	case "<=":
		return 0, search(vals[0], true), true
	case ">":
		return search(vals[0], true), len(entries), true
	case ">=":
		return search(vals[0], false), len(entries), true
	case "BETWEEN":
		if vals[0].compare(vals[1]) > 0 {
			return 0, 0, false // DynamoDB rejects it; minidyn answers
		}
		return search(vals[0], false), search(vals[1], true), true
	case "begins_with":
		if typ != "S" {
			return 0, 0, false
		}
		// Keys with a prefix are contiguous in byte order, from the prefix on.
		lo = search(vals[0], false)
		hi = lo + sort.Search(len(entries)-lo, func(i int) bool {
			return !strings.HasPrefix(entries[lo+i].in[name].sort.raw, vals[0].raw)
		})
		return lo, hi, true
	}
	return 0, 0, false
}

// startPosition finds ExclusiveStartKey's place in the partition: the index
// of its item (found) or of the first entry after it. A start key that is
// not exactly the table key (and index key) of an item of this partition
// reports false: minidyn answers it.
func (t *shadowTable) startPosition(name string, idx *shadowIndex, entries []*shadowItem, hv keyValue, esk map[string]*server.AttributeValue) (int, bool, bool) {
	want := map[string]bool{t.primary.hash: true, idx.hash: true}
	if t.primary.rng != "" {
		want[t.primary.rng] = true
	}
	if idx.rng != "" {
		want[idx.rng] = true
	}
	if len(esk) != len(want) {
		return 0, false, false
	}
	th, tr, ok := t.tableKey(esk)
	if !ok {
		return 0, false, false
	}
	ih, ir, ok := t.indexKey(idx, esk)
	if !ok || ih.id() != hv.id() {
		return 0, false, false
	}
	probe := &shadowItem{id: tableKeyID(th, tr), hashVal: th, rngVal: tr, in: map[string]entryKey{name: {sort: ir}}}
	pos, found := slices.BinarySearchFunc(entries, probe, func(a, b *shadowItem) int { return compareEntries(name, a, b) })
	return pos, found, true
}

// project shapes an answer's item: an index shows the attributes its
// projection holds (its keys and the table's for KEYS_ONLY, and the named
// ones for INCLUDE), then ProjectionExpression picks among those.
func (t *shadowTable) project(secondary bool, idx *shadowIndex, it *shadowItem, expr string, names map[string]string) (map[string]*server.AttributeValue, bool) {
	wire := it.wire
	if secondary && (idx.projection == "KEYS_ONLY" || idx.projection == "INCLUDE") {
		wire = t.keyOf(idx, it.wire)
		for _, a := range idx.include {
			if v, ok := it.wire[a]; ok && idx.projection == "INCLUDE" {
				wire[a] = v
			}
		}
	}
	if expr == "" {
		return wire, true
	}
	var typed map[string]*types.Item
	if len(wire) != len(it.wire) {
		typed = toTypes(wire)
	} else {
		typed = it.typedItem()
	}
	p, err := (&interpreter.Language{}).Project(interpreter.ProjectInput{Expression: expr, Item: typed, Aliases: names})
	if err != nil {
		return nil, false
	}
	return fromTypes(p), true
}

// keyOf holds the table key and the index key attributes of item: the
// shape of LastEvaluatedKey and of a KEYS_ONLY projection.
func (t *shadowTable) keyOf(idx *shadowIndex, item map[string]*server.AttributeValue) map[string]*server.AttributeValue {
	out := map[string]*server.AttributeValue{}
	for _, a := range []string{t.primary.hash, t.primary.rng, idx.hash, idx.rng} {
		if v, ok := item[a]; ok && a != "" {
			out[a] = v
		}
	}
	return out
}

// placeholdersValid reports whether minidyn's checks of
// ExpressionAttributeNames and ExpressionAttributeValues pass: every
// declared placeholder is well formed and used, and every #name used is
// declared. When they do not, minidyn answers with its own error.
func placeholdersValid(names map[string]string, values map[string]*server.AttributeValue, exprs ...string) bool {
	joined := strings.Join(exprs, " ")
	for k := range names {
		if !namePlaceholder.MatchString(k) || !strings.Contains(joined, k) {
			return false
		}
	}
	for k := range values {
		if !valuePlaceholder.MatchString(k) || !strings.Contains(joined, k) {
			return false
		}
	}
	for i, label := range []string{"KeyConditionExpression", "FilterExpression", "ProjectionExpression"} {
		if interpreter.ValidateExpressionAttributeNamesDeclared(label, exprs[i], names) != nil {
			return false
		}
	}
	return true
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
