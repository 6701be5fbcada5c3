// Package embedded is the in-memory DynamoDB of `lakeshore dev` and the fast
// tests. It is its own package so the Lambdas never link it.
package embedded

import (
	"bytes"
	"encoding/json"
	"hash/crc32"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/truora/minidyn/server"
)

// Handler returns a new, empty in-memory DynamoDB (minidyn's HTTP
// server). Serve it on a loopback port and reach it with
// store.EndpointClient: the same SDK client and code path as AWS.
//
// minidyn v0.8.2 locks its tables for item operations but not for
// CreateTable, DescribeTable, UpdateTable or DeleteTable, so a table call
// beside any other call is a data race. Every write, and every request
// minidyn answers, is served alone, which makes each atomic, as the claim
// race tests rely on; the reads the shadow answers are served side by side.
//
// minidyn answers a Query by walking every item of the table (or sorting a
// whole index) and parsing the key condition again for each, so a Query
// costs the table's size; and it sorts a table's keys again for every new
// item, so a put costs it too. In front of it a shadow of each table holds
// the items, in key order per partition, and answers GetItem,
// BatchGetItem, the Queries it can and plain Scans (in its own order,
// since DynamoDB promises none): such a read costs what it reads, as on
// DynamoDB. The shadow also takes plain puts and deletes, alone or in
// a transaction, whose conditions it checks with minidyn's interpreter;
// minidyn's copy of those items follows only when minidyn must answer a
// request that names their table (syncFor), so a write costs what it
// touches however long the history. A write whose condition does not
// hold (a claim that lost its race) the shadow refuses with minidyn's own
// answer, so a lost race costs no more than a won one.
// minidyn computes an update's item, which the shadow reads back.
// The secondary indexes live in the shadow alone (minidyn re-sorts a
// whole index on every new item), so the shadow answers every index
// Query, refusing one it cannot read; everything else, and any request
// the shadow does not read as plainly valid (with minidyn's errors),
// minidyn answers.
func Handler() http.Handler { return newHandler(true) }

// newHandler is Handler with the shadow's Query path (fast) or without it:
// plain minidyn, which the differential tests compare against.
func newHandler(fast bool) http.Handler {
	h, _ := newHandlerEngine(fast)
	return h
}

// newHandlerEngine is newHandler and its engine, for tests that read the
// engine's counters.
func newHandlerEngine(fast bool) (http.Handler, *engine) {
	e := newEngine(fast)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The request is read, and its answer written, outside the engine's
		// lock: a slow client holds up nobody else.
		body, err := io.ReadAll(r.Body)
		var rec *recorder
		switch {
		case err != nil:
			rec = newRecorder()
			rec.WriteHeader(http.StatusBadRequest)
			_, _ = rec.Write([]byte("read request: " + err.Error()))
		default:
			op := operation(r)
			if rec = e.read(r, op, body); rec == nil {
				w := decodeWrite(op, body)
				e.mu.Lock()
				rec = e.serve(r, op, body, w)
				e.mu.Unlock()
			}
		}
		for k, v := range rec.header {
			w.Header()[k] = v
		}
		// DynamoDB sends X-Amz-Crc32 with every answer and the SDK checks
		// it; minidyn sends none, and the SDK then warns on every call.
		w.Header().Set("X-Amz-Crc32", strconv.FormatUint(uint64(crc32.ChecksumIEEE(rec.body.Bytes())), 10))
		// As DynamoDB does, say the length: an answer over 2 KB is then
		// not chunked, and one cut short reads as cut short.
		w.Header().Set("Content-Length", strconv.Itoa(rec.body.Len()))
		w.WriteHeader(rec.code)
		_, _ = w.Write(rec.body.Bytes())
	}), e
}

// engine is minidyn and, when fast, the shadow of its tables. Its writes,
// and every request minidyn answers, are served one at a time (mu held);
// the reads the shadow answers (GetItem, BatchGetItem, Query, Scan) are
// served side by side (mu held for reading), since nothing changes while
// they read.
type engine struct {
	mu     sync.RWMutex
	mini   *server.Server
	fast   bool
	tables map[string]*shadowTable
	// evaluated counts the items the shadow's Queries have read: the
	// measure of a Query's work that the tests pin.
	evaluated atomic.Int64
	// answered counts the Queries the shadow answered.
	answered atomic.Int64
	// gotItems counts the GetItems the shadow answered; gotBatches the
	// BatchGetItems, gotScans the Scans.
	gotItems, gotBatches, gotScans atomic.Int64
	// transacted counts the TransactWriteItems the engine applied item
	// by item; undone those it put back when a write failed; took the
	// single puts and deletes the shadow took alone; refused the writes
	// and transactions the shadow refused for a condition that does not
	// hold.
	transacted, undone, took, refused int
}

// locked runs f with the engine to itself: tests read its counters so.
func (e *engine) locked(f func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f()
}

func newEngine(fast bool) *engine {
	return &engine{mini: server.NewServer(), fast: fast, tables: map[string]*shadowTable{}}
}

// read answers a GetItem, BatchGetItem, Query or Scan (op) that the
// shadow answers, reading the engine alongside other reads; nil when the request
// must be served alone (serve): any other request, and a read the shadow
// leaves to minidyn or refuses.
func (e *engine) read(r *http.Request, op string, body []byte) *recorder {
	if !e.fast || r.Method != http.MethodPost {
		return nil
	}
	var answer []byte
	switch op {
	case "GetItem":
		e.mu.RLock()
		answer = e.answerGetItem(body)
		e.mu.RUnlock()
	case "Query":
		e.mu.RLock()
		answer, _, _ = e.query(body)
		e.mu.RUnlock()
	case "BatchGetItem":
		e.mu.RLock()
		answer = e.answerBatchGet(body)
		e.mu.RUnlock()
	case "Scan":
		e.mu.RLock()
		answer = e.answerScan(body)
		e.mu.RUnlock()
	}
	if answer == nil {
		return nil
	}
	return jsonAnswer(answer)
}

// jsonAnswer is a successful answer of body.
func jsonAnswer(body []byte) *recorder {
	rec := newRecorder()
	rec.header.Set("Content-Type", "application/x-amz-json-1.0")
	_, _ = rec.Write(body)
	return rec
}

// decodedWrite is a write request as the engine applies it, decoded
// before the engine is locked, so the lock is held for the work alone.
type decodedWrite struct {
	tx  *server.TransactWriteItemsInput // a TransactWriteItems
	put *server.PutItemInput            // a PutItem
	del *server.DeleteItemInput         // a DeleteItem
	// table and key: an UpdateItem's.
	table *string
	key   map[string]*server.AttributeValue
}

// decodeWrite decodes what the engine reads of write op's body; the zero
// value when op is no write it reads, or the body does not decode (minidyn
// then answers it, and names the error).
func decodeWrite(op string, body []byte) decodedWrite {
	switch op {
	case "TransactWriteItems":
		var in server.TransactWriteItemsInput
		if json.Unmarshal(body, &in) == nil {
			return decodedWrite{tx: &in}
		}
	case "PutItem":
		var in server.PutItemInput
		if json.Unmarshal(body, &in) == nil && in.TableName != nil {
			return decodedWrite{put: &in}
		}
	case "DeleteItem":
		var in server.DeleteItemInput
		if json.Unmarshal(body, &in) == nil && in.TableName != nil {
			return decodedWrite{del: &in}
		}
	case "UpdateItem":
		var in struct {
			TableName *string
			Key       map[string]*server.AttributeValue
		}
		if json.Unmarshal(body, &in) == nil && in.TableName != nil {
			return decodedWrite{table: in.TableName, key: in.Key}
		}
	}
	return decodedWrite{}
}

// serve answers one request (operation op), with the engine to itself,
// once read has not; w is the request decoded (decodeWrite). The shadow
// takes the plain single-item writes and transactions it can check
// itself, and refuses those whose condition does not hold; everything
// else is minidyn's, which first takes every write the shadow took alone
// on the tables the request names (syncFor). A
// GetItem read left alone is minidyn's to answer.
func (e *engine) serve(r *http.Request, op string, body []byte, w decodedWrite) *recorder {
	if !e.fast || r.Method != http.MethodPost {
		return e.call(r, body)
	}
	var rec *recorder
	switch op {
	case "Query":
		answer, index, reason := e.query(body)
		switch {
		case answer != nil:
			return jsonAnswer(answer)
		case index:
			e.syncFor(body)
			return e.indexQueryError(r, body, reason)
		}
	case "PutItem":
		rec = e.put(w.put)
	case "DeleteItem":
		rec = e.del(w.del)
	case "TransactWriteItems":
		rec = e.transact(w.tx)
	}
	if rec != nil {
		return rec
	}
	e.syncFor(body)
	switch op {
	case "Scan":
		if refused, ok := e.scan(body); ok {
			return refused
		}
	case "CreateTable":
		return e.createTable(r, body)
	case "DescribeTable":
		return e.describeTable(r, body)
	case "UpdateTable":
		return e.updateTable(r, body)
	}
	rec = e.call(r, body)
	e.observe(op, body, w, rec.code == http.StatusOK)
	return rec
}

// operation is the request's DynamoDB operation, read as minidyn reads it.
func operation(r *http.Request) string {
	target := r.Header.Get("X-Amz-Target")
	return target[strings.LastIndex(target, ".")+1:]
}

// call passes a request to minidyn.
func (e *engine) call(r *http.Request, body []byte) *recorder {
	r.Body = io.NopCloser(bytes.NewReader(body))
	rec := newRecorder()
	e.mini.ServeHTTP(rec, r)
	return rec
}

// recorder holds an answer back until its checksum is known.
type recorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func newRecorder() *recorder { return &recorder{header: http.Header{}, code: http.StatusOK} }

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) WriteHeader(code int)        { r.code = code }
func (r *recorder) Write(p []byte) (int, error) { return r.body.Write(p) }

// observe brings the shadow up to date after minidyn answered op (w: the
// request decoded; ok: it succeeded). A deleted table loses its shadow. A
// put that succeeded stored its item as the request gives it, and a delete
// that succeeded left no item: the shadow takes both from the request.
// Every other key a write named is read again from minidyn, whether the
// write succeeded or not (an update's item is minidyn's to compute; a
// failed conditional write changes nothing, but a failed put can still
// have stored the item in minidyn before its index update failed).
func (e *engine) observe(op string, body []byte, w decodedWrite, ok bool) {
	switch op {
	case "DeleteTable":
		var in struct{ TableName *string }
		if json.Unmarshal(body, &in) == nil && in.TableName != nil {
			delete(e.tables, *in.TableName)
		}
	case "PutItem":
		switch {
		case w.put == nil:
		case ok:
			e.written(w.put.TableName, w.put.Item, w.put.Item)
		default:
			e.refresh(w.put.TableName, w.put.Item)
		}
	case "DeleteItem":
		switch {
		case w.del == nil:
		case ok:
			e.written(w.del.TableName, w.del.Key, nil)
		default:
			e.refresh(w.del.TableName, w.del.Key)
		}
	case "UpdateItem":
		if w.table != nil {
			e.refresh(w.table, w.key)
		}
	case "BatchWriteItem":
		var in server.BatchWriteItemInput
		if json.Unmarshal(body, &in) != nil {
			return
		}
		for table, reqs := range in.RequestItems {
			for _, req := range reqs {
				if req.PutRequest != nil {
					e.refresh(&table, req.PutRequest.Item)
				}
				if req.DeleteRequest != nil {
					e.refresh(&table, req.DeleteRequest.Key)
				}
			}
		}
	case "TransactWriteItems":
		if w.tx == nil {
			return
		}
		for _, ti := range w.tx.TransactItems {
			switch {
			case ti.Put != nil:
				e.refresh(ti.Put.TableName, ti.Put.Item)
			case ti.Update != nil:
				e.refresh(ti.Update.TableName, ti.Update.Key)
			case ti.Delete != nil:
				e.refresh(ti.Delete.TableName, ti.Delete.Key)
			}
		}
	}
}

// refresh reads the item whose table key m holds (m may be the whole item)
// from minidyn, consistently, and makes the shadow hold what it answered.
// A key the shadow cannot read (a write minidyn rejected for its key)
// names no item.
func (e *engine) refresh(tableName *string, m map[string]*server.AttributeValue) {
	if tableName == nil {
		return
	}
	t := e.tables[*tableName]
	if t == nil {
		return
	}
	h, r, ok := t.tableKey(m)
	if !ok {
		return
	}
	item, ok := e.getItem(tableName, t.keyOf(t.primary, m))
	if !ok {
		// The shadow no longer knows this item: stop answering from it.
		t.broken = true
		return
	}
	t.set(h, r, item)
}

// written makes the shadow hold item (nil: none) under the table key that
// key holds, as a write minidyn took left it: a put stores its item as
// given, a delete leaves none. A key the shadow cannot read names no item
// (minidyn took no write of it either).
func (e *engine) written(tableName *string, key, item map[string]*server.AttributeValue) {
	t := e.tables[deref(tableName)]
	if t == nil {
		return
	}
	if h, r, ok := t.tableKey(key); ok {
		t.set(h, r, item)
	}
}

// answerGetItem answers a GetItem of a whole item from the table's shadow,
// which holds every item. It answers nil, and minidyn answers, for a table
// it does not shadow (or lost track of), a projection or expression names,
// and a key that is not exactly the table's key attributes of their
// types, so minidyn's errors stay its own.
func (e *engine) answerGetItem(body []byte) []byte {
	var in server.GetItemInput
	if json.Unmarshal(body, &in) != nil || len(in.AttributesToGet) > 0 ||
		in.ProjectionExpression != nil || len(in.ExpressionAttributeNames) > 0 {
		return nil
	}
	t, h, r, ok := e.plainKey(in.TableName, in.Key, true)
	if !ok {
		return nil
	}
	var out server.GetItemOutput
	if it := t.items[tableKeyID(h, r)]; it != nil {
		out.Item = it.wire
	}
	answer, err := encode(&out)
	if err != nil {
		return nil
	}
	e.gotItems.Add(1)
	return answer
}

// maxBatchGetKeys is DynamoDB's (and minidyn's) limit on the keys of one
// BatchGetItem.
const maxBatchGetKeys = 100

// answerBatchGet answers a BatchGetItem from the shadow as minidyn does
// (each table's items found, in the order of its keys), when every table
// and key of it is one answerGetItem would answer; nil otherwise.
func (e *engine) answerBatchGet(body []byte) []byte {
	var in server.BatchGetItemInput
	if json.Unmarshal(body, &in) != nil {
		return nil
	}
	keys := 0
	out := server.BatchGetItemOutput{Responses: map[string][]map[string]*server.AttributeValue{}}
	for table, reqs := range in.RequestItems {
		if len(reqs.AttributesToGet) > 0 || reqs.ProjectionExpression != nil || len(reqs.ExpressionAttributeNames) > 0 {
			return nil
		}
		found := make([]map[string]*server.AttributeValue, 0, len(reqs.Keys))
		for _, key := range reqs.Keys {
			t, h, r, ok := e.plainKey(&table, key, true)
			if !ok {
				return nil
			}
			if it := t.items[tableKeyID(h, r)]; it != nil {
				found = append(found, it.wire)
			}
		}
		keys += len(reqs.Keys)
		out.Responses[table] = found
	}
	if keys == 0 || keys > maxBatchGetKeys {
		return nil
	}
	answer, err := encode(&out)
	if err != nil {
		return nil
	}
	e.gotBatches.Add(1)
	return answer
}
