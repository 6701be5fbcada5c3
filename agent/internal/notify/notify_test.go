package notify

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/notify/notifytest"
)

func TestSDSendsDatagrams(t *testing.T) {
	for _, tc := range []struct {
		name   string
		socket func(t *testing.T) string
	}{
		{"path", func(t *testing.T) string { return filepath.Join(t.TempDir(), "notify") }},
		{"abstract", func(t *testing.T) string { return fmt.Sprintf("@lakeshore-sdnotify-test-%d", os.Getpid()) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			socket := tc.socket(t)
			msgs := notifytest.Listen(t, socket)
			n, err := FromEnv(func(k string) string {
				if k == SocketEnv {
					return socket
				}
				return ""
			})
			if err != nil || n == nil {
				t.Fatalf("FromEnv: %v, %v", n, err)
			}
			for _, want := range []string{"READY=1\nSTATUS=hello", "STOPPING=1"} {
				if err := n.Notify(want); err != nil {
					t.Fatalf("Notify(%q): %v", want, err)
				}
				if got := notifytest.Next(t, msgs, 5*time.Second); got != want {
					t.Fatalf("got %q, want %q", got, want)
				}
			}
		})
	}
}

func TestSDAddresses(t *testing.T) {
	for _, tc := range []struct {
		socket string
		ok     bool
	}{
		{"/run/systemd/notify", true},
		{"@abstract", true},
		{"relative/notify", false},
		{"vsock:2:1234", false},
	} {
		_, err := NewSD(tc.socket)
		if (err == nil) != tc.ok {
			t.Errorf("NewSD(%q): %v, want ok=%v", tc.socket, err, tc.ok)
		}
	}
	if n, err := FromEnv(func(string) string { return "" }); n != nil || err != nil {
		t.Errorf("FromEnv without NOTIFY_SOCKET: %v, %v; want nil, nil", n, err)
	}
}

// TestSDNeverStalls: an absent socket fails at once, and a service
// manager that stops reading costs each message at most the write timeout.
func TestSDNeverStalls(t *testing.T) {
	missing, _ := NewSD(filepath.Join(t.TempDir(), "absent"))
	if err := missing.Notify("READY=1"); err == nil {
		t.Fatal("Notify to an absent socket: no error")
	}

	socket := filepath.Join(t.TempDir(), "full")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: socket, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close() // never read: its queue fills
	n, _ := NewSD(socket)
	msg := strings.Repeat("STATUS=filling\n", 256)
	for i := range 100000 {
		start := time.Now()
		err := n.Notify(msg)
		if took := time.Since(start); took > WriteTimeout+2*time.Second {
			t.Fatalf("message %d took %s", i, took)
		}
		if err != nil {
			return // the queue is full and Notify gave up: as it should
		}
	}
	t.Fatal("100000 messages into a socket nobody reads, and no error")
}
