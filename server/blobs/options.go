package blobs

import (
	"fmt"
	"time"

	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// Option tunes a store (NewDir, NewS3).
type Option func(*config)

type config struct {
	clock     clock.Clock
	threshold int64
	partSize  int64
}

func newConfig(opts []Option) config {
	c := config{threshold: wire.MultipartThreshold, partSize: wire.MultipartPartBytes}
	for _, o := range opts {
		o(&c)
	}
	return c
}

// WithClock makes the store read the time from c: the expiry of the URLs
// it signs, and for Dir the time it checks them against.
func WithClock(c clock.Clock) Option { return func(cfg *config) { cfg.clock = c } }

// WithMultipart makes uploads larger than threshold go in parts of
// partSize (the last one shorter) instead of wire.MultipartThreshold and
// wire.MultipartPartBytes, so tests need not move 100 MiB. S3 refuses
// parts under 5 MiB but the last.
func WithMultipart(threshold, partSize int64) Option {
	return func(cfg *config) {
		if threshold >= 0 && partSize > 0 {
			cfg.threshold, cfg.partSize = threshold, partSize
		}
	}
}

// MaxTTL is the longest a URL a store signs stays valid: S3's ceiling on
// a presigned URL, which Dir keeps too.
const MaxTTL = 7 * 24 * time.Hour

// checkPut checks what PresignPut is asked for, and reports how many
// parts the upload goes in (0: a single PUT).
func (c config) checkPut(key string, size int64, sha256Hex string, ttl time.Duration) (int, error) {
	if err := checkKey(key); err != nil {
		return 0, err
	}
	if !isSHA256Hex(sha256Hex) {
		return 0, wire.Errorf(wire.CodeInvalid, "sha256 must be 64 lower-case hex digits")
	}
	if err := checkTTL(key, ttl); err != nil {
		return 0, err
	}
	return c.parts(size)
}

// checkTTL refuses a ttl a URL of key cannot have.
func checkTTL(key string, ttl time.Duration) error {
	if ttl <= 0 || ttl > MaxTTL {
		return fmt.Errorf("blobs: presign %s: ttl %v is not within (0, %v]", key, ttl, MaxTTL)
	}
	return nil
}

// maxParts is S3's ceiling on the parts of one upload; Dir keeps it too,
// so both stores accept the same sizes.
const maxParts = 10_000

// parts reports how many parts an upload of size bytes goes in: 0 for a
// single PUT.
func (c config) parts(size int64) (int, error) {
	if size < 0 {
		return 0, wire.Errorf(wire.CodeInvalid, "size %d is negative", size)
	}
	if size <= c.threshold {
		return 0, nil
	}
	n := (size + c.partSize - 1) / c.partSize
	if n > maxParts {
		return 0, wire.Errorf(wire.CodeInvalid, "size %d needs %d parts of %d bytes; at most %d", size, n, c.partSize, maxParts)
	}
	return int(n), nil
}

// partLen reports the length of part n (from 1) of an upload of size bytes.
func (c config) partLen(size int64, n int) int64 {
	return min(c.partSize, size-int64(n-1)*c.partSize)
}

// incomplete reports a complete call whose content is not there or not as
// announced: the caller's to fix (a 400), not the store's failure.
func incomplete(format string, args ...any) error {
	return wire.Errorf(wire.CodeInvalid, "upload incomplete: "+format, args...)
}

// checkParts checks that a complete call of an upload of size bytes lists
// its parts 1..n, each once, in order, each with an ETag, n being the
// count PresignPut gave: S3 would assemble fewer parts into a shorter
// object, in place of the artifact at the key, before its size could be
// checked.
func (c config) checkParts(parts []wire.ArtifactPart, size int64) error {
	n, err := c.parts(size)
	if err != nil {
		return incomplete("%v", err)
	}
	if len(parts) != n {
		return incomplete("%d parts listed; an upload of %d bytes has %d", len(parts), size, n)
	}
	for i, p := range parts {
		if p.Number != i+1 {
			return incomplete("part %d listed where part %d belongs (list parts 1..n in order)", p.Number, i+1)
		}
		if p.ETag == "" {
			return incomplete("part %d has no etag", p.Number)
		}
	}
	return nil
}
