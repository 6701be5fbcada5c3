package rie

import "testing"

// TestFreeAddrsAreDistinct: an emulator's invoke and runtime API addresses
// never collide (they once could: each port was picked after the previous
// one's listener had closed, and a CI run saw the runtime API fail to bind
// the invoke port).
func TestFreeAddrsAreDistinct(t *testing.T) {
	for range 200 {
		addrs, err := freeAddrs(2)
		if err != nil {
			t.Fatal(err)
		}
		if addrs[0] == addrs[1] {
			t.Fatalf("freeAddrs(2) = %v: the same port twice", addrs)
		}
	}
}
