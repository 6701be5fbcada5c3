package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// benchRunJobs is the size of the run the run benchmarks submit.
const benchRunJobs = 10_000

// matrixRun is a run request of n×100 jobs (n a multiple of 100, or n < 100
// for a run of n jobs) on queue q.
func matrixRun(q string, n int) wire.RunRequest {
	axis := func(k int) []string {
		out := make([]string, k)
		for i := range out {
			out[i] = fmt.Sprint(i)
		}
		return out
	}
	m := map[string][]string{"a": axis(max(n/100, 1)), "b": axis(min(n, 100))}
	return wire.RunRequest{Queue: q, Argv: []string{"eval", "--a={a}", "--b={b}"}, Matrix: m}
}

// BenchmarkRun measures a run of 10,000 jobs on the embedded store
// (docs/runs.md; `make bench`, one iteration each):
//   - submit: jobs written a second (target ≥ 1,000) and DynamoDB write
//     requests per job (target ≤ 1.1);
//   - status: the requests one status read costs, at 10 and at 10,000
//     jobs (target: the same);
//   - results: the time to read every job's result, 1,000 a page
//     (target ≤ 5 s).
func BenchmarkRun(b *testing.B) {
	ctx := context.Background()
	b.Run("submit", func(b *testing.B) {
		s, counter := benchStore(b)
		svc := storetest.Control(s)
		jobs := 0
		counter.Reset()
		start := time.Now()
		for i := range b.N {
			req := matrixRun(fmt.Sprintf("q%d", i), benchRunJobs)
			run, _, err := svc.SubmitRun(ctx, req.RunSpec())
			if err != nil || run.Total != benchRunJobs {
				b.Fatalf("SubmitRun: %+v %v", run, err)
			}
			jobs += run.Total
		}
		elapsed := time.Since(start)
		writes := counter.Get("TransactWriteItems") + counter.Get("PutItem") + counter.Get("UpdateItem") + counter.Get("BatchWriteItem")
		b.ReportMetric(float64(jobs)/elapsed.Seconds(), "jobs/s")
		b.ReportMetric(float64(writes)/float64(jobs), "write-requests/job")
		b.ReportMetric(float64(counter.Total())/float64(jobs), "requests/job")
	})
	for _, n := range []int{10, benchRunJobs} {
		b.Run(fmt.Sprintf("status/jobs=%d", n), func(b *testing.B) {
			s, counter := benchStore(b)
			svc := storetest.Control(s)
			run, _, err := svc.SubmitRun(ctx, matrixRun("q", n).RunSpec())
			if err != nil {
				b.Fatal(err)
			}
			counter.Reset()
			b.ResetTimer()
			for range b.N {
				st, err := svc.Run(ctx, run.ID)
				if err != nil || st.Queued != n {
					b.Fatalf("Run: %+v %v", st, err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(counter.Total())/float64(b.N), "requests/status")
		})
	}
	b.Run("results", func(b *testing.B) {
		s, _ := benchStore(b)
		svc := storetest.Control(s)
		run, _, err := svc.SubmitRun(ctx, matrixRun("q", benchRunJobs).RunSpec())
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for range b.N {
			read := 0
			for from := 0; from < run.Total; from += 1000 {
				_, jobs, err := svc.RunJobs(ctx, run.ID, from, 1000)
				if err != nil {
					b.Fatal(err)
				}
				read += len(jobs)
			}
			if read != benchRunJobs {
				b.Fatalf("read %d jobs, want %d", read, benchRunJobs)
			}
		}
		b.StopTimer()
		b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/results")
	})
}
