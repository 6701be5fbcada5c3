package embedded

import (
	"bytes"
	"encoding/json"
	"maps"
	"net/http"
	"slices"

	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/truora/minidyn/server"
)

// The secondary indexes of a shadowed table live in the shadow alone.
// minidyn keeps each index as one key slice that it sorts again on every
// new item, so with indexes a write costs the index's size; without them a
// write costs minidyn its table key slice and the shadow a binary search
// per index. The shadow answers every Query of an index, DescribeTable
// shows its indexes, and UpdateTable creates and drops them there.

// createTable passes minidyn the table without its secondary indexes and
// keeps them in the table's new shadow. A table whose key schemas the
// shadow cannot read keeps its indexes in minidyn, unshadowed.
func (e *engine) createTable(r *http.Request, body []byte) *recorder {
	var in server.CreateTableInput
	if json.Unmarshal(body, &in) != nil || in.TableName == nil {
		return e.call(r, body)
	}
	t, ok := newShadowTable(&in)
	if !ok {
		return e.call(r, body)
	}
	stripped, ok := withoutFields(body, "GlobalSecondaryIndexes", "LocalSecondaryIndexes")
	if !ok {
		return e.call(r, body)
	}
	rec := e.call(r, stripped)
	if rec.code != http.StatusOK {
		return rec
	}
	e.tables[*in.TableName] = t
	t.describe(rec, "TableDescription")
	return rec
}

// describeTable is minidyn's description with the shadow's indexes.
func (e *engine) describeTable(r *http.Request, body []byte) *recorder {
	rec := e.call(r, body)
	var in struct{ TableName *string }
	if rec.code != http.StatusOK || json.Unmarshal(body, &in) != nil || in.TableName == nil {
		return rec
	}
	if t := e.tables[*in.TableName]; t != nil {
		t.describe(rec, "Table")
	}
	return rec
}

// updateTable applies GlobalSecondaryIndexUpdates to the shadow (a new
// index is filled from the table's items at once, so it is ACTIVE when the
// answer comes) and passes minidyn the rest of the request. Nothing changes
// unless every update is valid and minidyn takes the rest.
func (e *engine) updateTable(r *http.Request, body []byte) *recorder {
	var in server.UpdateTableInput
	if json.Unmarshal(body, &in) != nil || in.TableName == nil {
		return e.call(r, body)
	}
	t := e.tables[*in.TableName]
	if t == nil {
		return e.call(r, body)
	}
	next, typ, reason := t.withIndexUpdates(in.AttributeDefinitions, in.GlobalSecondaryIndexUpdates)
	if reason != "" {
		return errorAnswer(typ, reason)
	}
	stripped, ok := withoutFields(body, "GlobalSecondaryIndexUpdates")
	if !ok {
		return errorAnswer("ValidationException", "the embedded store cannot read the UpdateTable request")
	}
	rec := e.call(r, stripped)
	if rec.code != http.StatusOK {
		return rec
	}
	next()
	t.describe(rec, "TableDescription")
	return rec
}

// withIndexUpdates checks attribute definitions and index updates against
// the shadow and returns the function that applies them, or the error
// (type and message) DynamoDB answers.
func (t *shadowTable) withIndexUpdates(defs []ddbtypes.AttributeDefinition, updates []ddbtypes.GlobalSecondaryIndexUpdate) (apply func(), typ, reason string) {
	attrTypes := maps.Clone(t.attrTypes)
	for _, d := range defs {
		if d.AttributeName == nil {
			return nil, "ValidationException", "an attribute definition has no AttributeName"
		}
		if was, ok := attrTypes[*d.AttributeName]; ok && was != string(d.AttributeType) {
			return nil, "ValidationException", "attribute " + *d.AttributeName + " is already defined as " + was
		}
		attrTypes[*d.AttributeName] = string(d.AttributeType)
	}
	probe := &shadowTable{attrTypes: attrTypes, primary: t.primary}
	created := map[string]*shadowIndex{}
	var dropped []string
	taken := func(name string) bool { return t.indexes[name] != nil || created[name] != nil }
	for _, u := range updates {
		switch {
		case u.Create != nil:
			name := deref(u.Create.IndexName)
			if name == "" || taken(name) || slices.Contains(dropped, name) {
				return nil, "ValidationException", "cannot create index " + name + ": the name is empty or taken"
			}
			idx, ok := probe.newIndex(u.Create.KeySchema, u.Create.Projection)
			if !ok {
				return nil, "ValidationException", "index " + name + ": its key schema names an attribute without a definition"
			}
			created[name] = idx
		case u.Delete != nil:
			name := deref(u.Delete.IndexName)
			idx := t.indexes[name]
			if idx == nil || slices.Contains(dropped, name) {
				return nil, "ResourceNotFoundException", "Requested resource not found: index " + name + " does not exist"
			}
			if idx.local {
				return nil, "ValidationException", "index " + name + " is a local secondary index, which cannot be deleted"
			}
			dropped = append(dropped, name)
		case u.Update != nil:
			if name := deref(u.Update.IndexName); t.indexes[name] == nil {
				return nil, "ResourceNotFoundException", "Requested resource not found: index " + name + " does not exist"
			}
		}
	}
	return func() {
		t.attrTypes = attrTypes
		for _, name := range dropped {
			t.dropIndex(name)
		}
		for name, idx := range created {
			t.indexes[name] = idx
			t.backfill(name, idx)
		}
	}, "", ""
}

// indexDescription is a secondary index as DescribeTable shows it.
type indexDescription struct {
	IndexName   string
	KeySchema   []keyElement
	Projection  *projectionDescription `json:",omitempty"`
	IndexStatus string                 `json:",omitempty"`
	ItemCount   int
}

type keyElement struct{ AttributeName, KeyType string }

type projectionDescription struct {
	ProjectionType   string
	NonKeyAttributes []string `json:",omitempty"`
}

type attributeDefinition struct{ AttributeName, AttributeType string }

// describe adds the shadow's indexes and attribute definitions to the
// table description under key of minidyn's answer in rec, and its status
// ACTIVE (minidyn leaves it out; a table is usable when created).
func (t *shadowTable) describe(rec *recorder, key string) {
	var answer map[string]json.RawMessage
	var desc map[string]any
	if json.Unmarshal(rec.body.Bytes(), &answer) != nil || json.Unmarshal(answer[key], &desc) != nil || desc == nil {
		return
	}
	var global, local []indexDescription
	for _, name := range slices.Sorted(maps.Keys(t.indexes)) {
		idx := t.indexes[name]
		d := indexDescription{IndexName: name, KeySchema: []keyElement{{idx.hash, "HASH"}}}
		if idx.rng != "" {
			d.KeySchema = append(d.KeySchema, keyElement{idx.rng, "RANGE"})
		}
		if idx.projection != "" {
			d.Projection = &projectionDescription{ProjectionType: idx.projection, NonKeyAttributes: idx.include}
		}
		for _, entries := range idx.parts {
			d.ItemCount += len(entries)
		}
		if idx.local {
			local = append(local, d)
			continue
		}
		d.IndexStatus = "ACTIVE"
		global = append(global, d)
	}
	delete(desc, "GlobalSecondaryIndexes")
	delete(desc, "LocalSecondaryIndexes")
	if len(global) > 0 {
		desc["GlobalSecondaryIndexes"] = global
	}
	if len(local) > 0 {
		desc["LocalSecondaryIndexes"] = local
	}
	var defs []attributeDefinition
	for _, name := range slices.Sorted(maps.Keys(t.attrTypes)) {
		defs = append(defs, attributeDefinition{name, t.attrTypes[name]})
	}
	desc["AttributeDefinitions"] = defs
	if desc["TableStatus"] == nil {
		desc["TableStatus"] = "ACTIVE"
	}
	out, err := encode(map[string]any{key: desc})
	if err != nil {
		return
	}
	rec.body.Reset()
	rec.body.Write(out)
}

// scan refuses a Scan of a secondary index of a shadowed table (minidyn
// does not hold the index; nothing in Lakeshore scans an index), and
// reports false for any other Scan, which minidyn answers.
func (e *engine) scan(body []byte) (*recorder, bool) {
	var in struct{ TableName, IndexName *string }
	if json.Unmarshal(body, &in) != nil || in.TableName == nil || in.IndexName == nil || e.tables[*in.TableName] == nil {
		return nil, false
	}
	return errorAnswer("ValidationException", "the embedded store does not Scan a secondary index: Query index "+*in.IndexName+" instead"), true
}

// indexQueryError answers an index Query the shadow refused. With no
// reason, the request is one minidyn rejects before it reads any index:
// minidyn, asked the same without the index, answers its own error.
func (e *engine) indexQueryError(r *http.Request, body []byte, reason string) *recorder {
	if reason == "" {
		if stripped, ok := withoutFields(body, "IndexName"); ok {
			if rec := e.call(r, stripped); rec.code != http.StatusOK {
				return rec
			}
		}
		reason = "the embedded store cannot answer this Query of an index"
	}
	return errorAnswer("ValidationException", reason)
}

// errorAnswer is an error answer in DynamoDB's shape.
func errorAnswer(typ, message string) *recorder {
	rec := newRecorder()
	rec.header.Set("Content-Type", "application/x-amz-json-1.0")
	rec.WriteHeader(http.StatusBadRequest)
	out, err := encode(map[string]string{"__type": "com.amazonaws.dynamodb.v20120810#" + typ, "message": message})
	if err != nil {
		out = []byte(`{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError"}`)
	}
	_, _ = rec.Write(out)
	return rec
}

// withoutFields is a JSON object without the named top-level fields.
func withoutFields(body []byte, names ...string) ([]byte, bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil || m == nil {
		return nil, false
	}
	for _, n := range names {
		delete(m, n)
	}
	out, err := encode(m)
	return out, err == nil
}

// encode is JSON as minidyn's server writes it: HTML characters unescaped.
func encode(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
