package blobs

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// s3Staging prefixes where a single upload lands until Complete copies it
// to its key: uploads/<upload>/<key>, so an upload reaches only the key it
// was presigned for, and never replaces an artifact before it is complete.
// The bucket's lifecycle should expire it after a day or two (abandoned
// uploads); Complete deletes it.
const s3Staging = "uploads/"

// S3 is a Store in an S3 bucket: key k is the object k. A single upload is
// a presigned PutObject to a staging key (s3Staging) that S3 checks
// against the SHA-256 and length announced, which Complete copies to k; a
// multipart one is created when it is presigned, each part is a presigned
// UploadPart, and Complete completes it. The store's credentials need
// s3:PutObject, s3:GetObject and s3:DeleteObject on the bucket, and
// s3:AbortMultipartUpload.
type S3 struct {
	client  *s3.Client
	presign *s3.PresignClient
	bucket  string
	cfg     config
}

var _ Store = (*S3)(nil)

// NewS3 returns an S3 store over bucket, reached with client (its
// credentials sign the URLs, so they are what the URLs may do).
func NewS3(client *s3.Client, bucket string, opts ...Option) *S3 {
	return &S3{client: client, presign: s3.NewPresignClient(client), bucket: bucket, cfg: newConfig(opts)}
}

// NewS3FromConfig returns an S3 store over bucket with a client of cfg
// (the SDK's configuration). An endpoint set there (AWS_ENDPOINT_URL: moto,
// LocalStack) is addressed path-style: such a server has no per-bucket
// host names.
func NewS3FromConfig(cfg aws.Config, bucket string, opts ...Option) *S3 {
	client := s3.NewFromConfig(cfg, func(o *s3.Options) { o.UsePathStyle = cfg.BaseEndpoint != nil })
	return NewS3(client, bucket, opts...)
}

// PresignPut presigns a PutObject, or creates a multipart upload and
// presigns an UploadPart per part.
func (s *S3) PresignPut(ctx context.Context, key string, size int64, sha256Hex, contentType string, ttl time.Duration) (wire.ArtifactUpload, error) {
	n, err := s.cfg.checkPut(key, size, sha256Hex, ttl)
	if err != nil {
		return wire.ArtifactUpload{}, err
	}
	digest, err := hex.DecodeString(sha256Hex)
	if err != nil {
		return wire.ArtifactUpload{}, fmt.Errorf("blobs: presign %s: %w", key, err)
	}
	out := wire.ArtifactUpload{Method: http.MethodPut, ExpiresAt: s.cfg.clock.Now().Add(ttl)}
	expires := s3.WithPresignExpires(ttl)
	var ct *string
	if contentType != "" {
		ct = aws.String(contentType)
	}
	if n == 0 {
		if out.UploadID, err = randomID(); err != nil {
			return wire.ArtifactUpload{}, err
		}
		req, err := s.presign.PresignPutObject(ctx, &s3.PutObjectInput{
			Bucket:         aws.String(s.bucket),
			Key:            aws.String(stagedKey(out.UploadID, key)),
			ContentLength:  aws.Int64(size),
			ContentType:    ct,
			ChecksumSHA256: aws.String(base64.StdEncoding.EncodeToString(digest)),
		}, expires)
		if err != nil {
			return wire.ArtifactUpload{}, fmt.Errorf("blobs: presign put %s: %w", key, err)
		}
		out.URL, out.Headers = req.URL, headersToSend(req)
		return out, nil
	}
	created, err := s.client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{
		Bucket: aws.String(s.bucket), Key: aws.String(key), ContentType: ct,
	})
	if err != nil {
		return wire.ArtifactUpload{}, fmt.Errorf("blobs: create multipart upload %s: %w", key, err)
	}
	out.UploadID, out.PartSize = aws.ToString(created.UploadId), s.cfg.partSize
	out.Parts = make([]wire.ArtifactPart, n)
	for i := range n {
		req, err := s.presign.PresignUploadPart(ctx, &s3.UploadPartInput{
			Bucket:        aws.String(s.bucket),
			Key:           aws.String(key),
			UploadId:      created.UploadId,
			PartNumber:    aws.Int32(int32(i + 1)),
			ContentLength: aws.Int64(s.cfg.partLen(size, i+1)),
		}, expires)
		if err == nil && len(headersToSend(req)) != 0 {
			// The wire carries headers for a single PUT only; a part
			// signs just its length.
			err = fmt.Errorf("the URL needs headers %v", headersToSend(req))
		}
		if err != nil {
			s.abort(key, out.UploadID)
			return wire.ArtifactUpload{}, fmt.Errorf("blobs: presign part %d of %s: %w", i+1, key, err)
		}
		out.Parts[i] = wire.ArtifactPart{Number: i + 1, URL: req.URL}
	}
	return out, nil
}

// headersToSend reports the headers signed into req that the uploader
// must send; Host and Content-Length are the HTTP client's own to set.
func headersToSend(req *v4.PresignedHTTPRequest) map[string]string {
	h := map[string]string{}
	for k, vs := range req.SignedHeader {
		if k = http.CanonicalHeaderKey(k); k != "Host" && k != "Content-Length" && len(vs) > 0 {
			h[k] = vs[0]
		}
	}
	return h
}

// Complete checks a single upload's object, or completes a multipart
// upload (aborting it when S3 refuses the parts), and checks the size
// stored. What is the caller's to fix fails with a wire.CodeInvalid error.
func (s *S3) Complete(ctx context.Context, key, uploadID string, parts []wire.ArtifactPart, size int64) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if len(parts) == 0 {
		return s.completeSingle(ctx, key, uploadID, size)
	}
	if err := s.cfg.checkParts(parts, size); err != nil {
		return err
	}
	completed := make([]types.CompletedPart, len(parts))
	for i, p := range parts {
		completed[i] = types.CompletedPart{PartNumber: aws.Int32(int32(p.Number)), ETag: aws.String(p.ETag)}
	}
	_, err := s.client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{
		Bucket:          aws.String(s.bucket),
		Key:             aws.String(key),
		UploadId:        aws.String(uploadID),
		MpuObjectSize:   aws.Int64(size),
		MultipartUpload: &types.CompletedMultipartUpload{Parts: completed},
	})
	var api smithy.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode() {
		case "NoSuchUpload":
			return incomplete("no upload %s of %s is open", uploadID, key)
		case "InvalidPart", "InvalidPartOrder", "EntityTooSmall":
			s.abort(key, uploadID)
			return incomplete("%s: %s", key, api.ErrorMessage())
		}
	}
	if err != nil {
		return fmt.Errorf("blobs: complete %s: %w", key, err)
	}
	return s.checkObject(ctx, key, size)
}

// stagedKey reports where the single upload upload of key lands.
func stagedKey(upload, key string) string { return s3Staging + upload + "/" + key }

// completeSingle copies the single upload's object to key, when it holds
// size bytes, and deletes it.
func (s *S3) completeSingle(ctx context.Context, key, uploadID string, size int64) error {
	if !isUploadID(uploadID) {
		return incomplete("%s is not an upload id of a single upload", uploadID)
	}
	staged := stagedKey(uploadID, key)
	if err := s.checkObject(ctx, staged, size); err != nil {
		return err
	}
	_, err := s.client.CopyObject(ctx, &s3.CopyObjectInput{
		Bucket:            aws.String(s.bucket),
		Key:               aws.String(key),
		CopySource:        aws.String(escapeKey(s.bucket + "/" + staged)),
		ChecksumAlgorithm: types.ChecksumAlgorithmSha256,
	})
	if err != nil {
		return fmt.Errorf("blobs: complete %s: copy %s: %w", key, staged, err)
	}
	if _, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(staged)}); err != nil {
		return fmt.Errorf("blobs: complete %s: delete %s: %w", key, staged, err)
	}
	return nil
}

// checkObject checks that key holds size bytes.
func (s *S3) checkObject(ctx context.Context, key string, size int64) error {
	head, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(key)})
	var notFound *types.NotFound
	if errors.As(err, &notFound) {
		return incomplete("nothing was uploaded to %s", key)
	} else if err != nil {
		return fmt.Errorf("blobs: complete %s: %w", key, err)
	}
	if got := aws.ToInt64(head.ContentLength); got != size {
		return incomplete("%s holds %d bytes, not %d", key, got, size)
	}
	return nil
}

// abort drops a multipart upload that cannot complete, so its parts stop
// costing storage now rather than when the bucket's lifecycle rule aborts
// it. A failure leaves that rule to do it.
func (s *S3) abort(key, uploadID string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = s.client.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{
		Bucket: aws.String(s.bucket), Key: aws.String(key), UploadId: aws.String(uploadID),
	})
}

// PresignGet presigns a GetObject that downloads as filename.
func (s *S3) PresignGet(ctx context.Context, key, filename string, ttl time.Duration) (string, error) {
	if err := checkKey(key); err != nil {
		return "", err
	}
	if err := checkTTL(key, ttl); err != nil {
		return "", err
	}
	req, err := s.presign.PresignGetObject(ctx, &s3.GetObjectInput{
		Bucket:                     aws.String(s.bucket),
		Key:                        aws.String(key),
		ResponseContentDisposition: aws.String(attachment(filename)),
	}, s3.WithPresignExpires(ttl))
	if err != nil {
		return "", fmt.Errorf("blobs: presign get %s: %w", key, err)
	}
	return req.URL, nil
}
