package embedded

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"strings"

	"github.com/truora/minidyn/server"
	"github.com/truora/minidyn/types"
)

// maxTransactItems is DynamoDB's limit on the operations of one
// TransactWriteItems.
const maxTransactItems = 100

// txOp is one operation of a TransactWriteItems as the fast path reads it.
type txOp struct {
	table     *shadowTable
	tableName *string
	h, r      keyValue                          // the table key
	id        string                            // tableKeyID of key
	key       map[string]*server.AttributeValue // the table key alone
	cond      *string
	names     map[string]string
	values    map[string]*server.AttributeValue
	// write is the single-item request that applies the operation (op
	// "PutItem", "UpdateItem" or "DeleteItem"); op is "" for a
	// ConditionCheck.
	op    string
	write any
	// pre is the item before the transaction; nil when there was none.
	pre map[string]*server.AttributeValue
	// returnsItem: the operation asks for its item back should its
	// condition not hold.
	returnsItem bool
}

// transact serves a TransactWriteItems without minidyn's rollback, which
// copies every table the transaction touches whole, so a transaction
// costs the tables' size. Instead it takes each item the transaction
// names from the shadow and checks every condition first; when all hold,
// minidyn applies the updates one item at a time, each with its own
// condition (which still holds: writes are served one at a time and no two
// operations name one item), and the shadow takes the puts and deletes
// itself. A condition that does not hold is refused with minidyn's own
// answer (transactionCancelled), nothing applied. It answers nil, and
// minidyn answers the original request, for a request it does not read as
// plainly valid, for a condition that errs or that the shadow leaves to
// minidyn (phase 1), and when an update fails (after putting back every
// item updated so far): minidyn's answer is then exactly what it answers
// today.
func (e *engine) transact(in *server.TransactWriteItemsInput) *recorder {
	// A ClientRequestToken (the AWS SDK sends one with every transaction)
	// is read and ignored, as minidyn ignores it: a retried transaction is
	// applied again, its conditions deciding.
	if in == nil || len(in.TransactItems) == 0 || len(in.TransactItems) > maxTransactItems {
		return nil
	}
	ops := make([]*txOp, 0, len(in.TransactItems))
	seen := map[string]bool{}
	for _, ti := range in.TransactItems {
		op := e.txOpOf(ti)
		if op == nil {
			return nil
		}
		id := *op.tableName + "\x00" + op.id
		if seen[id] {
			return nil
		}
		seen[id] = true
		ops = append(ops, op)
	}
	// Phase 1: every condition, against the items as the shadow holds them
	// (no two operations name one item, so each holds as it would once
	// those before it were applied). minidyn applies the operations in
	// order and stops at the first whose condition does not hold: the
	// shadow answers that as minidyn does, unless an update comes first
	// (minidyn's to compute, and it might fail first), the operation asks
	// for its item back, or a table of the transaction ever held an empty
	// value (refusable).
	for i, op := range ops {
		if it := op.table.items[op.id]; it != nil {
			op.pre = it.wire
		}
		holds, err := op.table.evaluate(op.id, *op.tableName, op.cond, op.names, op.values)
		switch {
		case err != nil:
			return nil
		case holds:
			continue
		case op.returnsItem || slices.ContainsFunc(ops, func(o *txOp) bool { return !o.table.refusable() }) ||
			slices.ContainsFunc(ops[:i], func(o *txOp) bool { return o.op == "UpdateItem" }):
			return nil
		}
		e.refused++
		return transactionCancelled(i, len(ops))
	}
	// Phase 2: the updates, each an item request of minidyn's (it computes
	// the item), the item first brought up to date there; then the puts
	// and deletes, which the shadow takes itself; then the updated items,
	// read back.
	var updated []*txOp
	for _, op := range ops {
		if op.op != "UpdateItem" {
			continue
		}
		e.syncItem(*op.tableName, op.table, op.id)
		if rec := e.internal(op.op, op.write); rec == nil || rec.code != http.StatusOK {
			e.undo(updated)
			e.undone++
			return nil
		}
		updated = append(updated, op)
	}
	for _, op := range ops {
		switch w := op.write.(type) {
		case server.PutItemInput:
			op.table.take(op.h, op.r, w.Item, op.key)
		case server.DeleteItemInput:
			op.table.take(op.h, op.r, nil, op.key)
		}
	}
	for _, op := range updated {
		e.refresh(op.tableName, op.key)
	}
	e.transacted++
	// minidyn's answer to a TransactWriteItems that succeeded.
	rec := newRecorder()
	rec.header.Set("Content-Type", "application/x-amz-json-1.0")
	_ = json.NewEncoder(&rec.body).Encode(server.TransactWriteItemsOutput{})
	return rec
}

// txOpOf reads one operation of a transaction: nil unless it names exactly
// one of Put, Update, Delete and ConditionCheck, on a shadowed table, with
// a key of the table's key attributes alone, none of them empty (a Put's
// item holding them, and one minidyn's validation takes), and expression
// names and values that its expressions all use.
func (e *engine) txOpOf(ti server.TransactWriteItem) *txOp {
	named := 0
	for _, set := range []bool{ti.Put != nil, ti.Update != nil, ti.Delete != nil, ti.ConditionCheck != nil} {
		if set {
			named++
		}
	}
	if named != 1 {
		return nil
	}
	var op txOp
	var exprs []string
	var onFailure string // what the operation asks back should its condition not hold
	switch {
	case ti.Put != nil:
		p := ti.Put
		op = txOp{tableName: p.TableName, cond: p.ConditionExpression, names: p.ExpressionAttributeNames, values: p.ExpressionAttributeValues,
			op: "PutItem", write: server.PutItemInput{TableName: p.TableName, Item: p.Item, ConditionExpression: p.ConditionExpression,
				ExpressionAttributeNames: p.ExpressionAttributeNames, ExpressionAttributeValues: p.ExpressionAttributeValues}}
		if t := e.tables[deref(p.TableName)]; t != nil {
			op.key = t.keyOf(t.primary, p.Item)
		}
		onFailure = string(p.ReturnValuesOnConditionCheckFailure)
	case ti.Update != nil:
		u := ti.Update
		if u.UpdateExpression == nil {
			return nil
		}
		exprs = append(exprs, *u.UpdateExpression)
		op = txOp{tableName: u.TableName, key: u.Key, cond: u.ConditionExpression, names: u.ExpressionAttributeNames, values: u.ExpressionAttributeValues,
			op: "UpdateItem", write: server.UpdateItemInput{TableName: u.TableName, Key: u.Key, UpdateExpression: u.UpdateExpression,
				ConditionExpression: u.ConditionExpression, ExpressionAttributeNames: u.ExpressionAttributeNames, ExpressionAttributeValues: u.ExpressionAttributeValues,
				ReturnValuesOnConditionCheckFailure: u.ReturnValuesOnConditionCheckFailure}}
		onFailure = string(u.ReturnValuesOnConditionCheckFailure)
	case ti.Delete != nil:
		d := ti.Delete
		op = txOp{tableName: d.TableName, key: d.Key, cond: d.ConditionExpression, names: d.ExpressionAttributeNames, values: d.ExpressionAttributeValues,
			op: "DeleteItem", write: server.DeleteItemInput{TableName: d.TableName, Key: d.Key, ConditionExpression: d.ConditionExpression,
				ExpressionAttributeNames: d.ExpressionAttributeNames, ExpressionAttributeValues: d.ExpressionAttributeValues}}
		onFailure = string(d.ReturnValuesOnConditionCheckFailure)
	default:
		c := ti.ConditionCheck
		if c.ConditionExpression == nil {
			return nil
		}
		op = txOp{tableName: c.TableName, key: c.Key, cond: c.ConditionExpression, names: c.ExpressionAttributeNames, values: c.ExpressionAttributeValues}
		onFailure = string(c.ReturnValuesOnConditionCheckFailure)
	}
	op.returnsItem = !plainReturn(onFailure)
	t, h, r, ok := e.plainKey(op.tableName, op.key, true)
	if !ok || (ti.Put != nil && types.ValidateItemMap(toTypes(ti.Put.Item)) != nil) {
		return nil
	}
	op.table, op.h, op.r, op.id = t, h, r, tableKeyID(h, r)
	if op.cond != nil {
		exprs = append(exprs, *op.cond)
	}
	if len(exprs) == 0 && (len(op.names) > 0 || len(op.values) > 0) {
		return nil
	}
	if !placeholdersValid(op.names, op.values, strings.Join(exprs, " "), "", "") || types.ValidateItemMap(toTypes(op.values)) != nil {
		return nil
	}
	return &op
}

// undo puts back the item of every write of applied as it was before the
// transaction. A put-back minidyn refuses leaves the shadow no longer
// answering for that table.
func (e *engine) undo(applied []*txOp) {
	for _, op := range applied {
		if op.op == "" {
			continue
		}
		var rec *recorder
		if op.pre == nil {
			rec = e.internal("DeleteItem", server.DeleteItemInput{TableName: op.tableName, Key: op.key})
		} else {
			rec = e.internal("PutItem", map[string]any{"TableName": op.tableName, "Item": wireItem(op.pre)})
		}
		if rec == nil || rec.code != http.StatusOK {
			op.table.broken = true
		}
	}
}

// getItem reads an item from minidyn, consistently: nil when there is
// none; ok false when minidyn refused the read.
func (e *engine) getItem(tableName *string, key map[string]*server.AttributeValue) (map[string]*server.AttributeValue, bool) {
	consistent := true
	rec := e.internal("GetItem", server.GetItemInput{TableName: tableName, Key: key, ConsistentRead: &consistent})
	var out struct {
		Item map[string]*server.AttributeValue
	}
	if rec == nil || rec.code != http.StatusOK || json.Unmarshal(rec.body.Bytes(), &out) != nil {
		return nil, false
	}
	if len(out.Item) == 0 {
		return nil, true
	}
	return out.Item, true
}

// internal sends minidyn a request of the engine's own: nil when it cannot
// be built (it cannot happen for values decoded from a request).
func (e *engine) internal(op string, in any) *recorder {
	body, err := json.Marshal(in)
	if err != nil {
		return nil
	}
	req, err := http.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
	if err != nil {
		return nil
	}
	req.Header.Set("X-Amz-Target", "DynamoDB_20120810."+op)
	return e.call(req, body)
}
