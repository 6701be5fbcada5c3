package store

import (
	"context"
	"encoding/base64"
	"fmt"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/shared/domain"
)

// logRecord is the stored form of domain.LogChunk: one item per chunk of
// one attempt's output (docs/logs.md). Output that is valid UTF-8 (nearly
// all of it) is stored as text, the rest as base64 in data64: strings, not
// binary, because minidyn (the embedded store) does not serve binary
// attributes.
type logRecord struct {
	LogKey  string    `dynamodbav:"log_key"`
	Seq     string    `dynamodbav:"seq"` // seqKey
	Stream  string    `dynamodbav:"stream"`
	Text    string    `dynamodbav:"text,omitempty"`
	Data64  string    `dynamodbav:"data64,omitempty"`
	At      time.Time `dynamodbav:"at"`
	Dropped int64     `dynamodbav:"dropped,omitempty"`
	EOF     bool      `dynamodbav:"eof,omitempty"`
	// StdoutTotal and StderrTotal are the bytes of each stream in the
	// attempt's chunks up to and including this one (domain.LogTotals).
	StdoutTotal int64 `dynamodbav:"stdout_total,omitempty"`
	StderrTotal int64 `dynamodbav:"stderr_total,omitempty"`
	// StdoutDropped and StderrDropped are the bytes of each stream left out
	// up to and including this chunk (domain.LogTotals).
	StdoutDropped int64 `dynamodbav:"stdout_dropped,omitempty"`
	StderrDropped int64 `dynamodbav:"stderr_dropped,omitempty"`
	ExpiresAt     int64 `dynamodbav:"expires_at"`
}

// logKey is the partition of attempt n of invocation id.
func logKey(id string, n int) string { return id + "#" + strconv.Itoa(n) }

// seqKey is the range key of chunk seq: zero-padded text, so it sorts as
// the number on every engine (minidyn orders number range keys as text).
func seqKey(seq int) string { return fmt.Sprintf("%06d", seq) }

// PutLogs stores chunks of attempt n of invocation id, in the order given:
// a reader that sees chunk k of a shipment in order also sees every chunk
// before it. Each chunk is written once (a put conditional on its seq being
// free), and only after the chunk before it: it carries the attempt's
// totals through itself (domain.LogTotals), so the per-stream cap holds
// however a worker splits, orders or races its requests. A chunk shipped
// again the same (a retry after a lost answer) is taken as stored; a
// different one under a stored seq, a gap, or a chunk past the cap or
// after the eof is refused (409), and the chunks after it are not stored.
// Each expires LogTTL from now.
func (s *Store) PutLogs(ctx context.Context, id string, n int, chunks []domain.LogChunk) error {
	exp := s.now().Add(s.LogTTL).Unix()
	var before domain.LogTotals // the totals through seq prev
	prev := -1
	for _, c := range chunks {
		if c.Seq > 0 && c.Seq-1 != prev {
			r, ok, err := s.logRecord(ctx, id, n, c.Seq-1)
			if err != nil {
				return err
			}
			if !ok {
				return domain.Errorf(domain.KindConflict, "chunk %d of %s attempt %d: chunk %d is not stored; chunks are stored in seq order", c.Seq, id, n, c.Seq-1)
			}
			before = r.totals()
		}
		if c.Seq == 0 {
			before = domain.LogTotals{}
		}
		after, err := before.Add(c)
		if err != nil {
			return err
		}
		r := logRecord{LogKey: logKey(id, n), Seq: seqKey(c.Seq), Stream: c.Stream, At: c.At.UTC(),
			Dropped: c.Dropped, EOF: c.EOF, StdoutTotal: after.Stdout, StderrTotal: after.Stderr,
			StdoutDropped: after.StdoutDropped, StderrDropped: after.StderrDropped, ExpiresAt: exp}
		if utf8.Valid(c.Data) {
			r.Text = string(c.Data)
		} else {
			r.Data64 = base64.StdEncoding.EncodeToString(c.Data)
		}
		item, err := attributevalue.MarshalMap(r)
		if err != nil {
			return fmt.Errorf("encode log chunk %d of %s attempt %d: %w", c.Seq, id, n, err)
		}
		_, err = s.db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(s.tables.Logs), Item: item,
			ConditionExpression:      aws.String("attribute_not_exists(#k)"),
			ExpressionAttributeNames: map[string]string{"#k": "log_key"}})
		switch {
		case isConditionFailed(err):
			if err := s.storedSame(ctx, id, n, c); err != nil {
				return err
			}
		case err != nil:
			return storeErr(fmt.Sprintf("put log chunk %d of %s attempt %d", c.Seq, id, n), err)
		}
		before, prev = after, c.Seq
	}
	return nil
}

// storedSame reports nil when chunk c of attempt n of id is stored as it
// is (a retry), and refuses it when another chunk holds its seq.
func (s *Store) storedSame(ctx context.Context, id string, n int, c domain.LogChunk) error {
	r, ok, err := s.logRecord(ctx, id, n, c.Seq)
	if err != nil {
		return err
	}
	if !ok {
		return domain.Errorf(domain.KindUnavailable, "log chunk %d of %s attempt %d is neither free nor stored; try again", c.Seq, id, n)
	}
	old, err := r.chunk()
	if err != nil {
		return fmt.Errorf("put log chunk %d of %s attempt %d: %w", c.Seq, id, n, err)
	}
	if !old.Same(c) {
		return domain.Errorf(domain.KindConflict, "chunk %d of %s attempt %d is stored already, with other content; a chunk is written once", c.Seq, id, n)
	}
	return nil
}

// logRecord reads chunk seq of attempt n of id (strongly consistent: a
// chunk whose put was answered is seen), and whether it is stored.
func (s *Store) logRecord(ctx context.Context, id string, n, seq int) (logRecord, bool, error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(s.tables.Logs),
		Key:            map[string]types.AttributeValue{"log_key": str(logKey(id, n)), "seq": str(seqKey(seq))},
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return logRecord{}, false, storeErr(fmt.Sprintf("read log chunk %d of %s attempt %d", seq, id, n), err)
	}
	if out.Item == nil {
		return logRecord{}, false, nil
	}
	var r logRecord
	if err := attributevalue.UnmarshalMap(out.Item, &r); err != nil {
		return logRecord{}, false, fmt.Errorf("decode log chunk %d of %s attempt %d: %w", seq, id, n, err)
	}
	return r, true, nil
}

// totals reports the attempt's totals through r.
func (r logRecord) totals() domain.LogTotals {
	return domain.LogTotals{Stdout: r.StdoutTotal, Stderr: r.StderrTotal,
		StdoutDropped: r.StdoutDropped, StderrDropped: r.StderrDropped, EOF: r.EOF}
}

// chunk reports the chunk r stores, with where it ends in its stream.
func (r logRecord) chunk() (domain.LogChunk, error) {
	data := []byte(r.Text)
	if r.Data64 != "" {
		var err error
		if data, err = base64.StdEncoding.DecodeString(r.Data64); err != nil {
			return domain.LogChunk{}, fmt.Errorf("decode data of log chunk %s: %w", r.Seq, err)
		}
	}
	seq, err := strconv.Atoi(r.Seq)
	if err != nil {
		return domain.LogChunk{}, fmt.Errorf("decode log chunk %q: %w", r.Seq, err)
	}
	return domain.LogChunk{Seq: seq, Stream: r.Stream, Data: data, At: r.At, Dropped: r.Dropped, EOF: r.EOF,
		End: r.totals().End(r.Stream)}, nil
}

// Logs reads up to limit chunks of attempt n of invocation id from seq
// after on, in order (a strongly consistent read, so a chunk a put has
// answered is never skipped). Chunks past their expiry are left out: TTL
// deletes them some time later, and emulators never do.
func (s *Store) Logs(ctx context.Context, id string, n, after, limit int) ([]domain.LogChunk, error) {
	return s.readLogs(ctx, id, n, &dynamodb.QueryInput{
		KeyConditionExpression: aws.String("log_key = :k AND seq >= :after"),
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":k": str(logKey(id, n)), ":after": str(seqKey(after)),
		},
		Limit: aws.Int32(int32(limit)),
	})
}

// LogsTail reads the last limit chunks of attempt n of invocation id, in
// order: one query of the partition from its end, so the tail of a long
// output costs as little as its head.
func (s *Store) LogsTail(ctx context.Context, id string, n, limit int) ([]domain.LogChunk, error) {
	chunks, err := s.readLogs(ctx, id, n, &dynamodb.QueryInput{
		KeyConditionExpression:    aws.String("log_key = :k"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":k": str(logKey(id, n))},
		ScanIndexForward:          aws.Bool(false),
		Limit:                     aws.Int32(int32(limit)),
	})
	slices.Reverse(chunks)
	return chunks, err
}

// readLogs runs in (its key condition, values and limit set) on the logs
// table, strongly consistent, and decodes the chunks it answers.
func (s *Store) readLogs(ctx context.Context, id string, n int, in *dynamodb.QueryInput) ([]domain.LogChunk, error) {
	in.TableName = aws.String(s.tables.Logs)
	in.ConsistentRead = aws.Bool(true)
	out, err := s.db.Query(ctx, in)
	if err != nil {
		return nil, storeErr(fmt.Sprintf("read logs of %s attempt %d", id, n), err)
	}
	now := s.now().Unix()
	chunks := make([]domain.LogChunk, 0, len(out.Items))
	for _, item := range out.Items {
		var r logRecord
		if err := attributevalue.UnmarshalMap(item, &r); err != nil {
			return nil, fmt.Errorf("decode log chunk of %s attempt %d: %w", id, n, err)
		}
		if r.ExpiresAt > 0 && r.ExpiresAt < now {
			continue
		}
		c, err := r.chunk()
		if err != nil {
			return nil, fmt.Errorf("read logs of %s attempt %d: %w", id, n, err)
		}
		chunks = append(chunks, c)
	}
	return chunks, nil
}
