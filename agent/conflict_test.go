package agent

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestReplacedWorkerStopsWithExit5: another process says hello with this
// daemon's machine id from another boot while it runs. Its next poll is
// refused 410 replaced, and it stops: Run's error is ErrMachineConflict
// (exit 5), with no hello of its own again (that would replace the other
// in turn) and no bye.
func TestReplacedWorkerStopsWithExit5(t *testing.T) {
	p := apitest.New(t)
	var hellos, byes atomic.Int32
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/daemon/hello":
			hellos.Add(1)
		case "/v1/daemon/bye":
			byes.Add(1)
		}
		p.Handler.ServeHTTP(w, r)
	}))
	defer front.Close()
	const machine = "cloned-image"
	var runErr error
	synctest.Test(t, func(t *testing.T) {
		_, done := runRegistered(t, p, machine, front.URL)
		other := client.New(front.URL, apitest.EnrollToken, client.WithHTTPClient(noKeepAlive()))
		if _, err := other.Hello(context.Background(), wire.HelloRequest{MachineID: machine, BootID: "another-boot", Lanes: []string{"q"}}); err != nil {
			t.Fatal(err)
		}
		runErr = <-done
	})
	if !errors.Is(runErr, ErrMachineConflict) {
		t.Fatalf("Run: %v; want ErrMachineConflict", runErr)
	}
	if got := ExitCode(runErr); got != ExitMachineConflict {
		t.Fatalf("ExitCode(%v) = %d, want %d", runErr, got, ExitMachineConflict)
	}
	if h, b := hellos.Load(), byes.Load(); h != 2 || b != 0 {
		t.Fatalf("%d hellos (want the daemon's one and the other process's) and %d byes (want none)", h, b)
	}
}
