package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestDevBucketFallsBack: `lakeshore dev --store aws` against an emulator
// that serves no S3 (the embedded DynamoDB, say) keeps its artifacts in a
// directory instead of failing to start; a bucket named with
// --artifacts-bucket that cannot be made is an error; against real AWS
// without one, no bucket is made (its name is global: the operator's to
// choose).
func TestDevBucketFallsBack(t *testing.T) {
	noS3 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "not S3", http.StatusMethodNotAllowed)
	}))
	t.Cleanup(noS3.Close)
	for k, v := range map[string]string{"AWS_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
		"AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"} {
		t.Setenv(k, v)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx := context.Background()

	t.Setenv("AWS_ENDPOINT_URL", noS3.URL)
	o := &devOptions{storeKind: "aws"}
	if s, err := devBucket(ctx, o, log); s != nil || err != nil {
		t.Fatalf("an emulator without S3: store %v, err %v; want none and no error (a directory then)", s, err)
	}
	o = &devOptions{storeKind: "aws", artifactsBucket: "mine"}
	if _, err := devBucket(ctx, o, log); err == nil {
		t.Fatal("a named bucket that cannot be made: no error")
	}

	t.Setenv("AWS_ENDPOINT_URL", "")
	o = &devOptions{storeKind: "aws"}
	if s, err := devBucket(ctx, o, log); s != nil || err != nil || o.artifactsEnv != nil {
		t.Fatalf("real AWS without --artifacts-bucket: store %v, err %v, env %v; want none", s, err, o.artifactsEnv)
	}
}
