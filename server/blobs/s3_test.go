package blobs_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/dreamlake/lakeshore/server/blobs"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// motoBucket returns a client of the shared moto_server's S3 and a new,
// empty bucket on it.
func motoBucket(t *testing.T) (*s3.Client, string) {
	t.Helper()
	endpoint := storetest.MotoEndpoint(t)
	client := s3.New(s3.Options{
		Region:       storetest.Region,
		Credentials:  credentials.NewStaticCredentialsProvider("local", "local", ""),
		BaseEndpoint: aws.String(endpoint),
		UsePathStyle: true,
	})
	bucket := strings.TrimSuffix(storetest.Prefix(t), "-")
	if _, err := client.CreateBucket(context.Background(), &s3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
		t.Fatalf("create bucket: %v", err)
	}
	return client, bucket
}

func TestS3SinglePutGet(t *testing.T) {
	client, bucket := motoBucket(t)
	store := blobs.NewS3(client, bucket)
	ctx := context.Background()
	key := blobs.Key("inv-1", 1, "predictions é.jsonl")
	data, sum := content(t, 1<<20+17)
	up, err := store.PresignPut(ctx, key, int64(len(data)), sum, "application/jsonl", ttl)
	if err != nil {
		t.Fatal(err)
	}
	if up.Method != http.MethodPut || up.URL == "" || len(up.Parts) != 0 {
		t.Fatalf("upload = %+v, want one PUT", up)
	}
	// Completing before the PUT finds nothing.
	if err := store.Complete(ctx, key, up.UploadID, nil, int64(len(data))); !errors.Is(err, wire.ErrInvalid) {
		t.Fatalf("complete before the PUT: %v, want invalid", err)
	}
	if status, _, body := do(t, up.Method, up.URL, data, up.Headers, false); status != http.StatusOK {
		t.Fatalf("PUT: %d %s", status, body)
	}
	// Uploaded but not complete: the key is not there yet.
	if _, err := client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)}); err == nil {
		t.Fatal("the key is there before complete")
	}
	other, _ := content(t, 16)
	// An upload id is only ours: one that holds a "/" could name the
	// staged upload of a key that ends like this one.
	nested := "artifacts/b/1/y/" + key
	upNested := putSingle(t, store, nested, data, sum)
	for _, tc := range []struct {
		name, key, upload string
		size              int64
	}{
		{"another upload", key, hex.EncodeToString(other), int64(len(data))},
		{"an upload id not ours", key, upNested.UploadID + "/artifacts/b/1/y", int64(len(data))},
		{"another key", "artifacts/inv-2/1/x", up.UploadID, int64(len(data))},
		{"another size", key, up.UploadID, int64(len(data)) - 1},
	} {
		if err := store.Complete(ctx, tc.key, tc.upload, nil, tc.size); !errors.Is(err, wire.ErrInvalid) {
			t.Errorf("complete of %s: %v, want invalid", tc.name, err)
		}
	}
	if err := store.Complete(ctx, key, up.UploadID, nil, int64(len(data))); err != nil {
		t.Fatal(err)
	}
	if listed, err := client.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String(bucket), Prefix: aws.String("uploads/" + up.UploadID)}); err != nil {
		t.Fatal(err)
	} else if len(listed.Contents) != 0 {
		t.Errorf("the upload is still staged after complete: %s", aws.ToString(listed.Contents[0].Key))
	}
	u, err := store.PresignGet(ctx, key, "predictions é.jsonl", ttl)
	if err != nil {
		t.Fatal(err)
	}
	resp, got := fetch(t, store, key, "predictions é.jsonl")
	if resp.StatusCode != http.StatusOK || !bytes.Equal(got, data) {
		t.Fatalf("GET: %d, %d bytes; want 200 and the %d bytes put", resp.StatusCode, len(got), len(data))
	}
	// moto ignores response-content-disposition; S3 answers with it.
	q, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	if cd := q.Query().Get("response-content-disposition"); cd != `attachment; filename*=utf-8''predictions%20%C3%A9.jsonl` {
		t.Errorf("response-content-disposition = %q", cd)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/jsonl" {
		t.Errorf("Content-Type = %q, want the one presigned", ct)
	}
}

// The presigned PUT binds the SHA-256 and the length announced: S3 refuses
// a PUT of other content (moto does not check it, so this test reads the
// signature's header list).
func TestS3SinglePutSignsChecksum(t *testing.T) {
	client, bucket := motoBucket(t)
	store := blobs.NewS3(client, bucket)
	data, sum := content(t, 4096)
	up, err := store.PresignPut(context.Background(), "artifacts/inv/1/x", int64(len(data)), sum, "", ttl)
	if err != nil {
		t.Fatal(err)
	}
	digest := sha256.Sum256(data)
	if got := up.Headers["X-Amz-Checksum-Sha256"]; got != base64.StdEncoding.EncodeToString(digest[:]) {
		t.Errorf("X-Amz-Checksum-Sha256 to send = %q, want the content's", got)
	}
	u, err := url.Parse(up.URL)
	if err != nil {
		t.Fatal(err)
	}
	signed := strings.Split(u.Query().Get("X-Amz-SignedHeaders"), ";")
	for _, h := range []string{"content-length", "x-amz-checksum-sha256"} {
		if !slices.Contains(signed, h) {
			t.Errorf("signed headers %v lack %s", signed, h)
		}
	}
}

func TestS3Multipart(t *testing.T) {
	const part = 5 << 20 // S3's smallest part but the last
	client, bucket := motoBucket(t)
	store := blobs.NewS3(client, bucket, blobs.WithMultipart(part, part))
	ctx := context.Background()
	key := "artifacts/inv/2/checkpoint.tar.gz"
	old, _ := content(t, 100)
	if _, err := client.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), Body: bytes.NewReader(old)}); err != nil {
		t.Fatal(err)
	}
	data, sum := content(t, 2*part+1234)
	up := presign(t, store, key, data, sum, "application/gzip")
	if up.URL != "" || up.PartSize != part || len(up.Parts) != 3 {
		t.Fatalf("upload = %+v, want 3 parts of %d", up, part)
	}
	parts := putParts(t, up, data)
	if err := store.Complete(ctx, key, up.UploadID, parts[:2], int64(len(data))); !errors.Is(err, wire.ErrInvalid) {
		t.Errorf("complete with a part missing: %v, want invalid", err)
	}
	if got, err := client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)}); err != nil {
		t.Fatal(err)
	} else if b := readBody(t, got.Body); !bytes.Equal(b, old) {
		t.Fatalf("after a refused complete the key holds %d bytes, not the %d already there", len(b), len(old))
	}
	if err := store.Complete(ctx, key, up.UploadID, parts, int64(len(data))); err != nil {
		t.Fatal(err)
	}
	if resp, got := fetch(t, store, key, "checkpoint.tar.gz"); resp.StatusCode != http.StatusOK || !bytes.Equal(got, data) {
		t.Fatalf("GET: %d, %d bytes; want the %d bytes put", resp.StatusCode, len(got), len(data))
	}
}

// A complete call that names a part S3 does not hold fails as the
// caller's error, and aborts the upload.
func TestS3MultipartBadETagAborts(t *testing.T) {
	const part = 5 << 20
	client, bucket := motoBucket(t)
	store := blobs.NewS3(client, bucket, blobs.WithMultipart(part, part))
	ctx := context.Background()
	key := "artifacts/inv/3/x"
	data, sum := content(t, part+1)
	up := presign(t, store, key, data, sum, "")
	parts := putParts(t, up, data)
	parts[1].ETag = `"0123456789abcdef0123456789abcdef"`
	if err := store.Complete(ctx, key, up.UploadID, parts, int64(len(data))); !errors.Is(err, wire.ErrInvalid) {
		t.Fatalf("complete with a wrong etag: %v, want invalid", err)
	}
	listed, err := client.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String(bucket)})
	if err != nil {
		t.Fatal(err)
	}
	if len(listed.Uploads) != 0 {
		t.Errorf("uploads still open after a failed complete: %d, want 0", len(listed.Uploads))
	}
}

func readBody(t *testing.T, body io.ReadCloser) []byte {
	t.Helper()
	defer func() { _ = body.Close() }()
	var b bytes.Buffer
	if _, err := b.ReadFrom(body); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}
