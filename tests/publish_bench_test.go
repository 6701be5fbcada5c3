package tests

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// publishBenchBytes is the size of the artifact BenchmarkPublish publishes:
// past wire.MultipartThreshold, so it goes in parts.
const publishBenchBytes = 256 << 20

// publishRSSBound bounds how much nymph's peak RSS may exceed its RSS
// before the publish: one part's size, far under the file's.
const publishRSSBound = wire.MultipartPartBytes

// rssSample is one reading of a process's resident memory.
type rssSample struct {
	at  time.Time
	rss int64 // bytes
}

// rssSampler reads a process's VmRSS every period until stopped.
type rssSampler struct {
	pid     int
	stop    chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	samples []rssSample
	err     error
}

func sampleRSS(pid int, period time.Duration) *rssSampler {
	s := &rssSampler{pid: pid, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			rss, _, err := procMemory(pid)
			s.mu.Lock()
			if err != nil {
				s.err = err
			} else {
				s.samples = append(s.samples, rssSample{at: time.Now(), rss: rss})
			}
			s.mu.Unlock()
			if err != nil {
				return
			}
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

// end stops the sampling and reports every sample taken.
func (s *rssSampler) end() ([]rssSample, error) {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.samples, s.err
}

// procMemory reads pid's VmRSS and VmHWM (peak RSS over its whole life)
// from /proc/<pid>/status, in bytes.
func procMemory(pid int) (rss, hwm int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("read the status of process %d: %w", pid, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			return 0, 0, fmt.Errorf("process %d: unexpected %s line %q", pid, k, v)
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("process %d: %s: %w", pid, k, err)
		}
		if k == "VmRSS" {
			rss = n << 10
		} else {
			hwm = n << 10
		}
	}
	if rss == 0 || hwm == 0 {
		return 0, 0, fmt.Errorf("process %d: no VmRSS or VmHWM in its status", pid)
	}
	return rss, hwm, nil
}

// publishFigures is what one timed publish measured.
type publishFigures struct {
	invocationID string
	sha256       string        // what the body computed
	took         time.Duration // `nymph publish` as the body timed it
	idleRSS      int64         // nymph idle, before the submit
	beforeRSS    int64         // nymph's last sample before the publish began
	peakRSS      int64         // nymph's highest sample while the publish ran
	hwm          int64         // nymph's VmHWM after the publish (its whole life)
	samples      int           // samples taken while the publish ran
}

// timePublish has nymph n (serving queue "q" of d) run a shell body that
// writes publishBenchBytes of random bytes to the file "big", times
// `nymph publish big` (date before and after) and computes its SHA-256,
// while the test samples n's VmRSS every 10 ms.
func timePublish(tb testing.TB, d *devServer, n *nymphProc) publishFigures {
	tb.Helper()
	marks := tb.TempDir()
	script := `set -eu
head -c ` + strconv.Itoa(publishBenchBytes) + ` /dev/urandom > big
date +%s%N > "$MARKS/start"
"$NYMPH" publish big
date +%s%N > "$MARKS/end"
sha256sum big | cut -d' ' -f1 > "$MARKS/sum"
rm -f big`
	pid := n.cmd.Process.Pid
	var idle []int64
	for range 10 {
		rss, _, err := procMemory(pid)
		if err != nil {
			tb.Fatal(err)
		}
		idle = append(idle, rss)
		time.Sleep(10 * time.Millisecond)
	}
	sampler := sampleRSS(pid, 10*time.Millisecond)
	op := d.Operator()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	inv, _, err := op.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"/bin/sh", "-c", script},
		Env: map[string]string{"NYMPH": bin(tb, "nymph"), "MARKS": marks}, TimeoutS: 600})
	if err != nil {
		tb.Fatal(err)
	}
	var got wire.Invocation
	waittest.Until(tb, 10*time.Minute, "the publishing body to end", func() bool {
		got, err = op.GetInvocation(ctx, inv.InvocationID)
		return err == nil && wire.Terminal(got.State)
	})
	samples, err := sampler.end()
	if err != nil {
		tb.Fatalf("sampling nymph's memory: %v", err)
	}
	if got.State != wire.StateSucceeded {
		tb.Fatalf("the body: %s; stdout %q stderr %q", got.State, got.StdoutTail, got.StderrTail)
	}
	_, hwm, err := procMemory(pid)
	if err != nil {
		tb.Fatal(err)
	}
	mark := func(name string) string {
		b, err := os.ReadFile(filepath.Join(marks, name))
		if err != nil {
			tb.Fatalf("the body's mark %s: %v", name, err)
		}
		return strings.TrimSpace(string(b))
	}
	nanos := func(name string) time.Time {
		ns, err := strconv.ParseInt(mark(name), 10, 64)
		if err != nil {
			tb.Fatalf("the body's mark %s: %v", name, err)
		}
		return time.Unix(0, ns)
	}
	start, end := nanos("start"), nanos("end")
	f := publishFigures{invocationID: inv.InvocationID, sha256: mark("sum"), took: end.Sub(start), idleRSS: slices.Max(idle), hwm: hwm}
	for _, s := range samples {
		switch {
		case s.at.Before(start):
			f.beforeRSS = s.rss
		case !s.at.After(end):
			f.peakRSS = max(f.peakRSS, s.rss)
			f.samples++
		}
	}
	if f.beforeRSS == 0 || f.samples == 0 || f.took <= 0 {
		tb.Fatalf("no samples around the publish (%d during it, took %v)", f.samples, f.took)
	}
	return f
}

// checkPublished checks the artifact "big" of invocation id is listed at
// publishBenchBytes with SHA-256 sum, and that what downloads from its URL
// is those bytes.
func checkPublished(tb testing.TB, d *devServer, id, sum string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	op := d.Operator()
	list, err := op.InvocationArtifacts(ctx, id)
	if err != nil {
		tb.Fatal(err)
	}
	if len(list.Artifacts) != 1 {
		tb.Fatalf("the invocation lists %d artifacts, want 1: %+v", len(list.Artifacts), list.Artifacts)
	}
	a := list.Artifacts[0]
	if a.Name != "big" || a.Size != publishBenchBytes || a.SHA256 != sum {
		tb.Fatalf("artifact %q: %d bytes, sha256 %s; the body published %d bytes, sha256 %s", a.Name, a.Size, a.SHA256, publishBenchBytes, sum)
	}
	if err := op.DownloadArtifact(ctx, a, io.Discard); err != nil {
		tb.Fatal(err)
	}
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// BenchmarkPublish: a shell body of a real nymph publishes a 256 MiB file
// of random bytes to the blob store of a real `lakeshore dev`, over
// loopback. It reports the throughput (MB/s: 10^6 bytes a second) and time as the body saw `nymph
// publish`, and nymph's resident memory: idle, just before the publish,
// its highest 10 ms sample during it (and the difference, the publish's
// own cost: bounded, since the file is streamed, never read whole), and
// its VmHWM afterwards (which covers its whole life). The artifact is then
// listed and downloaded, and its SHA-256 checked against the body's.
func BenchmarkPublish(b *testing.B) {
	d := startDev(b, backends[0], "--artifacts-dir", b.TempDir())
	n := startNymph(b, d, "publish-bench")
	for i := 0; i < b.N; i++ {
		f := timePublish(b, d, n)
		checkPublished(b, d, f.invocationID, f.sha256)
		// VmHWM misses no peak (a 10 ms sample can): past the memory
		// nymph held before the publish, it must stay under one part's
		// size, so neither the file nor a whole part was held.
		if grew := f.hwm - f.beforeRSS; grew >= publishRSSBound {
			b.Fatalf("nymph's peak RSS %.1f MiB is %.1f MiB over its %.1f MiB before the publish: not streamed (bound %d MiB)",
				mib(f.hwm), mib(grew), mib(f.beforeRSS), publishRSSBound>>20)
		}
		b.ReportMetric(publishBenchBytes/1e6/f.took.Seconds(), "MB/s")
		b.ReportMetric(f.took.Seconds(), "publish-s")
		b.ReportMetric(mib(f.idleRSS), "idle-rss-MiB")
		b.ReportMetric(mib(f.beforeRSS), "before-rss-MiB")
		b.ReportMetric(mib(f.peakRSS), "peak-rss-MiB")
		b.ReportMetric(mib(f.peakRSS-f.beforeRSS), "rss-delta-MiB")
		b.ReportMetric(mib(f.hwm), "hwm-MiB")
		b.ReportMetric(float64(f.samples), "samples")
	}
}
