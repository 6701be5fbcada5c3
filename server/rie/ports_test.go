package rie

import (
	"net"
	"slices"
	"testing"
)

// TestPortsAreDistinct: the real picks of one take never collide: an
// emulator's invoke and runtime API addresses are two ports.
func TestPortsAreDistinct(t *testing.T) {
	for range 200 {
		addrs, release, err := ports.take(2)
		if err != nil {
			t.Fatal(err)
		}
		if addrs[0] == addrs[1] {
			t.Fatalf("take(2) = %v: the same port twice", addrs)
		}
		release()
	}
}

// fixedListener is a listener at one address, as a pick of the kernel's.
type fixedListener struct{ addr string }

func (l fixedListener) Accept() (net.Conn, error) { return nil, net.ErrClosed }
func (l fixedListener) Close() error              { return nil }
func (l fixedListener) Addr() net.Addr {
	a, _ := net.ResolveTCPAddr("tcp", l.addr)
	return a
}

// TestPortsNeverHandedOutTwice: the kernel may give a port back as soon as
// its picking listener closes, so two emulators starting at once could be
// handed one port (the flood test's emulators once were: one failed to
// bind, and its calls went to the other). A port an emulator holds is
// never handed out again until that emulator gives it back.
func TestPortsNeverHandedOutTwice(t *testing.T) {
	picks := []string{"127.0.0.1:1001", "127.0.0.1:1002", "127.0.0.1:1001", "127.0.0.1:1002", "127.0.0.1:1003",
		"127.0.0.1:1001", "127.0.0.1:1004", "127.0.0.1:1001", "127.0.0.1:1002"}
	s := &portSet{held: map[string]bool{}, listen: func() (net.Listener, error) {
		l := fixedListener{picks[0]}
		picks = append(picks[1:], picks[0])
		return l, nil
	}}
	first, releaseFirst, err := s.take(2)
	if err != nil || !slices.Equal(first, []string{"127.0.0.1:1001", "127.0.0.1:1002"}) {
		t.Fatalf("first take: %v %v", first, err)
	}
	second, releaseSecond, err := s.take(2)
	if err != nil || !slices.Equal(second, []string{"127.0.0.1:1003", "127.0.0.1:1004"}) {
		t.Fatalf("second take while the first holds its ports: %v %v; want two others", second, err)
	}
	releaseFirst()
	releaseFirst() // twice is once
	third, _, err := s.take(2)
	if err != nil || !slices.Equal(third, []string{"127.0.0.1:1001", "127.0.0.1:1002"}) {
		t.Fatalf("take after the first gave its ports back: %v %v; want them again", third, err)
	}
	releaseSecond()
	if _, _, err := (&portSet{held: map[string]bool{"127.0.0.1:1001": true}, listen: func() (net.Listener, error) {
		return fixedListener{"127.0.0.1:1001"}, nil
	}}).take(1); err == nil {
		t.Fatal("a take that only finds held ports did not stop")
	}
}
