package embedded

import (
	"cmp"
	"encoding/json"
	"slices"

	"github.com/truora/minidyn/server"
)

// answerScan answers a plain Scan of a shadowed table (no index, filter,
// projection, Select or segments) from the shadow, in the shadow's order:
// partitions by hash key, each by sort key. DynamoDB promises a Scan no
// order, only that paging by LastEvaluatedKey reads every item once, and
// Lakeshore reads a Scan so (an unfiltered `lakeshore ls`). minidyn would
// need every write the shadow took alone first, and each new key costs it
// a sort of the table's keys: after a long run of submits the first Scan
// would hold the store for seconds. nil when minidyn must answer.
func (e *engine) answerScan(body []byte) []byte {
	var in server.ScanInput
	if json.Unmarshal(body, &in) != nil || in.IndexName != nil || in.FilterExpression != nil || in.ProjectionExpression != nil ||
		len(in.AttributesToGet) > 0 || len(in.ScanFilter) > 0 || in.ConditionalOperator != "" || in.Segment != nil ||
		in.TotalSegments != nil || (in.Select != "" && in.Select != "ALL_ATTRIBUTES") ||
		len(in.ExpressionAttributeNames) > 0 || len(in.ExpressionAttributeValues) > 0 || (in.Limit != nil && *in.Limit <= 0) {
		return nil
	}
	if in.TableName == nil {
		return nil
	}
	t := e.tables[*in.TableName]
	if t == nil || t.broken {
		return nil
	}
	parts := t.scanOrder()
	p, i := 0, 0
	if in.ExclusiveStartKey != nil {
		_, h, r, ok := e.plainKey(in.TableName, in.ExclusiveStartKey, true)
		if !ok {
			return nil
		}
		p, i = t.scanAfter(parts, h, r)
	}
	limit := -1
	if in.Limit != nil {
		limit = int(*in.Limit)
	}
	var out server.ScanOutput
	for ; p < len(parts); p, i = p+1, 0 {
		for ; i < len(parts[p]); i++ {
			if len(out.Items) == limit {
				out.LastEvaluatedKey = t.keyOf(t.primary, out.Items[len(out.Items)-1])
				return e.scanned(&out)
			}
			out.Items = append(out.Items, parts[p][i].wire)
		}
	}
	return e.scanned(&out)
}

// scanned is a Scan's answer as minidyn gives it (Count, and no
// ScannedCount), counted as the shadow's.
func (e *engine) scanned(out *server.ScanOutput) []byte {
	out.Count = int32(len(out.Items))
	answer, err := encode(out)
	if err != nil {
		return nil
	}
	e.gotScans.Add(1)
	return answer
}

// scanOrder is the table's partitions ordered by hash key (ties, "1" and
// "1.0" as N, by the value as written), each its items by sort key.
func (t *shadowTable) scanOrder() [][]*shadowItem {
	parts := make([][]*shadowItem, 0, len(t.primary.parts))
	for _, entries := range t.primary.parts {
		parts = append(parts, entries)
	}
	slices.SortFunc(parts, func(a, b []*shadowItem) int { return a[0].hashVal.scanCompare(b[0].hashVal) })
	return parts
}

// scanCompare orders key values as a Scan reads them: by value, and values
// equal but written apart (N "1" and "1.0", two items) by how they are
// written.
func (k keyValue) scanCompare(o keyValue) int {
	if c := k.compare(o); c != 0 {
		return c
	}
	return cmp.Compare(k.id(), o.id())
}

// scanAfter finds where a Scan resumes after the item of key (h, r): the
// partition and the index in it of the first item past it, whether or not
// that item is still there.
func (t *shadowTable) scanAfter(parts [][]*shadowItem, h, r keyValue) (p, i int) {
	p, found := slices.BinarySearchFunc(parts, h, func(part []*shadowItem, h keyValue) int { return part[0].hashVal.scanCompare(h) })
	if !found {
		return p, 0
	}
	i, found = slices.BinarySearchFunc(parts[p], r, func(it *shadowItem, r keyValue) int { return it.rngVal.scanCompare(r) })
	if found {
		i++
	}
	return p, i
}
