package lifecycle

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// dialEnv switches the test binary into a caller of the endpoint (see
// TestMain): it waits for a line on stdin, then GETs the URL in the
// variable over an AF_INET6 socket connected to ::ffff:127.0.0.1 (a
// dual-stack socket, as a JVM opens by default) and prints the status.
const dialEnv = "RUNVIEW_TEST_DIAL_URL"

func TestMain(m *testing.M) {
	if url := os.Getenv(dialEnv); url != "" {
		os.Exit(dialMapped(url))
	}
	os.Exit(m.Run())
}

// dialMapped is the child's side of TestRunViewDualStackCaller.
func dialMapped(rawURL string) int {
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		fmt.Fprintln(os.Stderr, "stdin:", err)
		return 2
	}
	hostPort, path, _ := strings.Cut(strings.TrimPrefix(rawURL, "http://"), "/")
	_, portText, _ := strings.Cut(hostPort, ":")
	port, err := strconv.Atoi(portText)
	if err != nil {
		fmt.Fprintln(os.Stderr, "port:", err)
		return 2
	}
	fd, err := syscall.Socket(syscall.AF_INET6, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "socket:", err)
		return 2
	}
	if err := syscall.SetsockoptInt(fd, syscall.IPPROTO_IPV6, syscall.IPV6_V6ONLY, 0); err != nil {
		fmt.Fprintln(os.Stderr, "dual stack:", err)
		return 2
	}
	sa := &syscall.SockaddrInet6{Port: port, Addr: [16]byte{10: 0xff, 11: 0xff, 12: 127, 15: 1}}
	if err := syscall.Connect(fd, sa); err != nil {
		fmt.Fprintln(os.Stderr, "connect [::ffff:127.0.0.1]:", port, err)
		return 2
	}
	f := os.NewFile(uintptr(fd), "dual-stack socket")
	conn, err := net.FileConn(f)
	f.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "conn:", err)
		return 2
	}
	defer conn.Close()
	if _, err := fmt.Fprintf(conn, "GET /%s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, hostPort); err != nil {
		fmt.Fprintln(os.Stderr, "request:", err)
		return 2
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "response:", err)
		return 2
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode)
	return 0
}

// caller is a child process in a process group of its own (its pgid is
// its pid), waiting to make its one request.
type caller struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   strings.Builder
	errs  strings.Builder
	pgid  int
	asked bool
}

func startCaller(t *testing.T, url string) *caller {
	t.Helper()
	c := &caller{cmd: exec.Command(os.Args[0], "-test.run=^$")}
	c.cmd.Env = append(os.Environ(), dialEnv+"="+url)
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.errs
	var err error
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c.pgid = c.cmd.Process.Pid
	t.Cleanup(func() {
		if !c.asked {
			_ = c.cmd.Process.Kill()
			_ = c.cmd.Wait()
		}
	})
	return c
}

// ask lets the caller make its request and reports the status it got.
func (c *caller) ask(t *testing.T) int {
	t.Helper()
	c.asked = true
	if _, err := io.WriteString(c.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	c.stdin.Close()
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("caller: %v; stderr: %s", err, c.errs.String())
	}
	code, err := strconv.Atoi(strings.TrimSpace(c.out.String()))
	if err != nil {
		t.Fatalf("caller printed %q; stderr: %s", c.out.String(), c.errs.String())
	}
	return code
}

// listenLoopback serves the endpoint on a free loopback port, the run's
// processes listed by members, until the test ends.
func listenLoopback(t *testing.T, members func(pgid int) []int) *Server {
	t.Helper()
	s, err := Listen("127.0.0.1:0", Config{Members: members})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	return s
}

// TestRunViewDualStackCaller: a process of the run that talks to the
// (IPv4) endpoint over an AF_INET6 socket connected to ::ffff:127.0.0.1
// (the kernel lists that socket in /proc/net/tcp6, not tcp) reads its
// view; a process of another group over the same kind of socket still
// reads nothing. Both are real processes, each a group of its own (of
// one member: the package that lists a group's members, process, serves
// warm processes from this one, so its listing is not imported here).
func TestRunViewDualStackCaller(t *testing.T) {
	var memberPgid atomic.Int64
	s := listenLoopback(t, func(pgid int) []int {
		if int64(pgid) == memberPgid.Load() {
			return []int{pgid}
		}
		return nil
	})
	h, err := s.Add(Run{HostKey: "hk1_abc", WorkerID: "wrk_1", InvocationID: "inv_1", Attempt: 1})
	if err != nil {
		t.Fatal(err)
	}
	member := startCaller(t, h.URL())
	memberPgid.Store(int64(member.pgid))
	stranger := startCaller(t, h.URL())
	started := make(chan struct{})
	close(started)
	h.Attach(started, func() int { return member.pgid }, func() {})

	if code := stranger.ask(t); code != http.StatusForbidden {
		t.Errorf("a process of another group over a dual-stack socket: %d, want 403", code)
	}
	if code := member.ask(t); code != http.StatusOK {
		t.Errorf("the run's own process over a dual-stack socket: %d, want 200", code)
	}
}

// TestRunViewStrangerWhileTheRunHoldsOtherSockets: the caller's own
// socket must be held by a process of the run, not just any socket. Here
// the run's one process is the daemon itself (this test binary), which
// holds the endpoint's listener and its end of every connection: a
// stranger's request still reads nothing.
func TestRunViewStrangerWhileTheRunHoldsOtherSockets(t *testing.T) {
	self := os.Getpid()
	s := listenLoopback(t, func(int) []int { return []int{self} })
	h, err := s.Add(Run{InvocationID: "inv_1", Attempt: 1})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	close(started)
	h.Attach(started, func() int { return self }, func() {})
	stranger := startCaller(t, h.URL())
	if code := stranger.ask(t); code != http.StatusForbidden {
		t.Errorf("a stranger, while the run's process holds other sockets: %d, want 403", code)
	}
}
