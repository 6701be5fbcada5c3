package embedded

import (
	"encoding/json"
	"net/http"
	"slices"

	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/truora/minidyn/interpreter"
	"github.com/truora/minidyn/server"
	"github.com/truora/minidyn/types"
)

// The shadow takes a plain PutItem or DeleteItem itself, and so does a
// transaction's put or delete, and minidyn's copy of the item follows
// only when minidyn must answer a request that names its table
// (syncFor). minidyn sorts a table's keys again for every new item and
// answers in JSON it decodes and encodes again, so a write it takes costs
// the table's size: one the shadow takes costs a binary search per index,
// however long the history.
// A write whose condition does not hold is refused by the shadow with
// minidyn's own answer (conditionFailed), without minidyn: minidyn would
// first take every write the shadow took alone on the table, and copy the
// tables of a transaction whole, so each lost race would cost the
// history. A write the shadow does not read as plainly valid, and one
// whose condition errs, is minidyn's to answer, with its own error.

// put applies a PutItem the shadow can take alone, and answers it as
// minidyn does (the item as Attributes); nil when minidyn must answer.
func (e *engine) put(in *server.PutItemInput) *recorder {
	if in == nil || !plainReturn(string(in.ReturnValues)) || in.ConditionalOperator != "" || len(in.Expected) > 0 {
		return nil
	}
	t, h, r, ok := e.plainKey(in.TableName, in.Item, false)
	if !ok || types.ValidateItemMap(toTypes(in.Item)) != nil {
		return nil
	}
	holds, decided := e.condition(t, tableKeyID(h, r), *in.TableName, in.ConditionExpression, in.ExpressionAttributeNames, in.ExpressionAttributeValues)
	if !holds {
		return e.refuse(t, decided, in.ReturnValuesOnConditionCheckFailure)
	}
	answer, err := encode(server.PutItemOutput{Attributes: in.Item})
	if err != nil {
		return nil
	}
	t.take(h, r, in.Item, t.keyOf(t.primary, in.Item))
	e.took++
	return jsonAnswer(answer)
}

// del applies a DeleteItem the shadow can take alone, and answers it as
// minidyn does; nil when minidyn must answer.
func (e *engine) del(in *server.DeleteItemInput) *recorder {
	if in == nil || !plainReturn(string(in.ReturnValues)) || in.ConditionalOperator != "" || len(in.Expected) > 0 {
		return nil
	}
	t, h, r, ok := e.plainKey(in.TableName, in.Key, true)
	if !ok {
		return nil
	}
	holds, decided := e.condition(t, tableKeyID(h, r), *in.TableName, in.ConditionExpression, in.ExpressionAttributeNames, in.ExpressionAttributeValues)
	if !holds {
		return e.refuse(t, decided, in.ReturnValuesOnConditionCheckFailure)
	}
	answer, err := encode(server.DeleteItemOutput{})
	if err != nil {
		return nil
	}
	t.take(h, r, nil, in.Key)
	e.took++
	return jsonAnswer(answer)
}

// plainReturn reports whether a write asks for no values back.
func plainReturn(rv string) bool { return rv == "" || rv == "NONE" }

// plainKey reads the table key out of m on a table the shadow answers for:
// attributes of the key's types, no empty string or binary among them, and
// (exact) nothing but the key attributes.
func (e *engine) plainKey(tableName *string, m map[string]*server.AttributeValue, exact bool) (t *shadowTable, h, r keyValue, ok bool) {
	if tableName == nil {
		return nil, h, r, false
	}
	t = e.tables[*tableName]
	if t == nil || t.broken {
		return nil, h, r, false
	}
	h, r, ok = t.tableKey(m)
	if !ok || h.raw == "" || (r.typ != 0 && r.raw == "") || (exact && len(m) != len(t.keyOf(t.primary, m))) {
		return nil, h, r, false
	}
	return t, h, r, true
}

// condition reports whether a single write's condition holds for the
// item id as the shadow holds it (holds), and whether the shadow can say
// so as minidyn would (decided): not for placeholders or values minidyn
// would refuse, nor a condition its interpreter errs on.
func (e *engine) condition(t *shadowTable, id, tableName string, cond *string, names map[string]string, values map[string]*server.AttributeValue) (holds, decided bool) {
	expr := deref(cond)
	if expr == "" && (cond != nil || len(names) > 0 || len(values) > 0) {
		return false, false
	}
	if !placeholdersValid(names, values, expr, "", "") || types.ValidateItemMap(toTypes(values)) != nil {
		return false, false
	}
	matched, err := t.evaluate(id, tableName, cond, names, values)
	return matched, err == nil
}

// refuse answers a single write whose condition does not hold as minidyn
// does (conditionFailed), when the shadow decided it (decided) and may
// answer refusals on table t (refusable), and the write asks for no item
// back on failure; nil otherwise: minidyn answers.
func (e *engine) refuse(t *shadowTable, decided bool, onFailure ddbtypes.ReturnValuesOnConditionCheckFailure) *recorder {
	if !decided || !plainReturn(string(onFailure)) || !t.refusable() {
		return nil
	}
	e.refused++
	return conditionFailed()
}

// refusable reports whether the shadow answers a failed condition on the
// table as minidyn would. An item minidyn holds with an empty list, map,
// set or binary (holdsEmpty) can hold it as a value of no type, and
// minidyn's interpreter then answers a condition on that item with a
// ValidationException where the shadow sees the condition fail
// (TestShadowHoldsWhatMinidynHolds found it); so a table that ever held
// such a value has its refusals answered by minidyn.
func (t *shadowTable) refusable() bool { return !t.emptyValues }

// anyEmpty reports whether an attribute of item holds an empty list, map,
// set or binary (holdsEmpty). A write that carries one is refused as
// minidyn refuses it; only a stored one changes minidyn's answer
// (TestRefusalsOfWritesCarryingEmptyValues).
func anyEmpty(item map[string]*server.AttributeValue) bool {
	for _, av := range item {
		if holdsEmpty(av) {
			return true
		}
	}
	return false
}

// holdsEmpty reports whether av is, or holds, an empty list, map, set or
// binary.
func holdsEmpty(av *server.AttributeValue) bool {
	switch {
	case av == nil:
		return false
	case av.B != nil && len(av.B) == 0, av.L != nil && len(av.L) == 0, av.M != nil && len(av.M) == 0,
		av.SS != nil && len(av.SS) == 0, av.NS != nil && len(av.NS) == 0, av.BS != nil && len(av.BS) == 0:
		return true
	}
	return slices.ContainsFunc(av.L, holdsEmpty) || anyEmpty(av.M)
}

// conditionFailedMessage is minidyn's (and DynamoDB's) message for a
// condition that does not hold.
const conditionFailedMessage = "The conditional request failed"

// conditionFailed is minidyn's answer to a PutItem or DeleteItem whose
// condition does not hold.
func conditionFailed() *recorder {
	return errorBody(struct {
		Type    string `json:"__type"`
		Message string `json:"message"`
	}{"ConditionalCheckFailedException", conditionFailedMessage})
}

// transactionCancelled is minidyn's answer to a TransactWriteItems of n
// operations whose operation i's condition does not hold: the reasons
// name it, and every other one "None".
func transactionCancelled(i, n int) *recorder {
	type reason struct {
		Code    string `json:"Code"`
		Message string `json:"Message,omitempty"`
	}
	reasons := make([]reason, n)
	for j := range reasons {
		reasons[j].Code = "None"
	}
	reasons[i] = reason{"ConditionalCheckFailed", conditionFailedMessage}
	return errorBody(struct {
		Type                string   `json:"__type"`
		Message             string   `json:"message"`
		CancellationReasons []reason `json:"CancellationReasons"`
	}{"TransactionCanceledException", "Transaction cancelled, please refer cancellation reasons for specific reasons [ConditionalCheckFailed]", reasons})
}

// errorBody is an answer of status 400 with body, as minidyn writes its
// errors.
func errorBody(body any) *recorder {
	rec := newRecorder()
	rec.header.Set("Content-Type", "application/x-amz-json-1.0")
	rec.code = http.StatusBadRequest
	_ = json.NewEncoder(&rec.body).Encode(body)
	return rec
}

// evaluate reports whether condition cond (nil: none) holds for the item
// id as the shadow holds it (none: an empty item), as minidyn's
// interpreter reads it; err when the interpreter errs on it.
func (t *shadowTable) evaluate(id, tableName string, cond *string, names map[string]string, values map[string]*server.AttributeValue) (bool, error) {
	if cond == nil {
		return true, nil
	}
	item := map[string]*types.Item{}
	if it := t.items[id]; it != nil {
		item = it.typedItem()
	}
	lang := interpreter.Language{}
	return lang.Match(interpreter.MatchInput{
		TableName:      tableName,
		Expression:     *cond,
		ExpressionType: interpreter.ExpressionTypeConditional,
		Item:           item,
		Aliases:        names,
		Attributes:     toTypes(values),
	})
}

// take makes the shadow hold item (nil: none) under the table key (h, r),
// whose attributes key holds, ahead of minidyn.
func (t *shadowTable) take(h, r keyValue, item, key map[string]*server.AttributeValue) {
	t.set(h, r, item)
	t.dirty[tableKeyID(h, r)] = key
}

// syncAll gives minidyn every write the shadow took alone, so that it
// answers as if it had taken them itself. A write minidyn refuses (it
// cannot: the shadow took only writes minidyn takes) leaves the shadow no
// longer answering for its table.
func (e *engine) syncAll() {
	for name, t := range e.tables {
		e.syncTable(name, t)
	}
}

// syncFor is syncAll for what request body names, since a request reads
// and writes only that: the tables of TableName or of RequestItems' keys,
// the items of a TransactGetItems (an ack through Lambda reads so); all
// of it for a request that names them otherwise (a transaction of
// writes) or not at all.
func (e *engine) syncFor(body []byte) {
	var in struct {
		TableName     *string
		RequestItems  map[string]json.RawMessage
		TransactItems []txGet
	}
	switch {
	case json.Unmarshal(body, &in) != nil:
		e.syncAll()
	case in.TableName != nil:
		e.syncTable(*in.TableName, e.tables[*in.TableName])
	case len(in.RequestItems) > 0:
		for name := range in.RequestItems {
			e.syncTable(name, e.tables[name])
		}
	case len(in.TransactItems) > 0 && e.syncGets(in.TransactItems):
	default:
		e.syncAll()
	}
}

// txGet is one item of a TransactGetItems, as syncFor reads it.
type txGet struct {
	Get *struct {
		TableName *string
		Key       map[string]*server.AttributeValue
	}
}

// syncGets gives minidyn the shadow's item of each Get of gets, and
// reports true; false, and it gives nothing, when one is not a Get of a
// key the shadow reads (the caller then syncs everything).
func (e *engine) syncGets(gets []txGet) bool {
	type item struct {
		name string
		t    *shadowTable
		id   string
	}
	var items []item
	for _, g := range gets {
		if g.Get == nil || g.Get.TableName == nil {
			return false
		}
		t := e.tables[*g.Get.TableName]
		if t == nil {
			continue // no shadow: nothing to give
		}
		h, r, ok := t.tableKey(g.Get.Key)
		if !ok {
			return false
		}
		items = append(items, item{*g.Get.TableName, t, tableKeyID(h, r)})
	}
	for _, it := range items {
		e.syncItem(it.name, it.t, it.id)
	}
	return true
}

// syncTable gives minidyn every write the shadow took alone on table name
// (t: its shadow; nil for none).
func (e *engine) syncTable(name string, t *shadowTable) {
	if t == nil {
		return
	}
	for id := range t.dirty {
		e.syncItem(name, t, id)
	}
}

// syncItem gives minidyn the shadow's item id of table name, if minidyn
// does not hold it yet.
func (e *engine) syncItem(name string, t *shadowTable, id string) {
	key, ok := t.dirty[id]
	if !ok {
		return
	}
	delete(t.dirty, id)
	var rec *recorder
	if it := t.items[id]; it != nil {
		rec = e.internal("PutItem", map[string]any{"TableName": name, "Item": wireItem(it.wire)})
	} else {
		rec = e.internal("DeleteItem", server.DeleteItemInput{TableName: &name, Key: key})
	}
	if rec == nil || rec.code != http.StatusOK {
		t.broken = true
	}
}

// wireItem is item as JSON that keeps every value as it was decoded: the
// wire type's omitempty would drop an empty list, map or binary, and
// minidyn would then hold a value of no type, which its interpreter
// refuses.
func wireItem(item map[string]*server.AttributeValue) map[string]any {
	if item == nil {
		return nil
	}
	out := make(map[string]any, len(item))
	for k, v := range item {
		out[k] = wireValue(v)
	}
	return out
}

func wireValue(av *server.AttributeValue) any {
	if av == nil {
		return nil
	}
	m := map[string]any{}
	set := func(name string, present bool, v any) {
		if present {
			m[name] = v
		}
	}
	set("B", av.B != nil, av.B)
	set("BOOL", av.BOOL != nil, av.BOOL)
	set("BS", av.BS != nil, av.BS)
	set("N", av.N != nil, av.N)
	set("NS", av.NS != nil, av.NS)
	set("NULL", av.NULL != nil, av.NULL)
	set("S", av.S != nil, av.S)
	set("SS", av.SS != nil, av.SS)
	if av.L != nil {
		l := make([]any, len(av.L))
		for i, v := range av.L {
			l[i] = wireValue(v)
		}
		m["L"] = l
	}
	if av.M != nil {
		m["M"] = wireItem(av.M)
	}
	return m
}
