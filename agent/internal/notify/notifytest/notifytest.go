// Package notifytest is a service manager's end of sd_notify for tests: a
// unixgram socket that hands over each message it gets.
package notifytest

import (
	"net"
	"strings"
	"testing"
	"time"
)

// Listen listens on a unixgram socket named name (a path, or @abstract)
// like a service manager, and returns each datagram it gets. The socket is
// closed when the test ends.
func Listen(t testing.TB, name string) <-chan string {
	t.Helper()
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatalf("listen %s: %v", name, err)
	}
	t.Cleanup(func() { conn.Close() })
	out := make(chan string, 64)
	go func() {
		defer close(out)
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			out <- string(buf[:n])
		}
	}()
	return out
}

// Next returns the next message, failing the test if none comes within
// limit.
func Next(t testing.TB, msgs <-chan string, limit time.Duration) string {
	t.Helper()
	select {
	case m, ok := <-msgs:
		if !ok {
			t.Fatal("notify socket closed")
		}
		return m
	case <-time.After(limit):
		t.Fatalf("no notification within %s", limit)
		return ""
	}
}

// Lines splits a message into its VAR=VALUE assignments.
func Lines(m string) map[string]string {
	out := map[string]string{}
	for _, l := range strings.Split(m, "\n") {
		k, v, _ := strings.Cut(l, "=")
		out[k] = v
	}
	return out
}
