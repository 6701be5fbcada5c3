package blobs_test

import (
	"testing"

	"github.com/dreamlake/lakeshore/server/store/storetest"
)

// TestMain stops the moto server the S3 tests started.
func TestMain(m *testing.M) { storetest.Main(m) }
