package store_test

import (
	"testing"

	"github.com/dreamlake/lakeshore/server/store/storetest"
)

// TestMain stops the moto servers the tests of this binary started.
func TestMain(m *testing.M) { storetest.Main(m) }
