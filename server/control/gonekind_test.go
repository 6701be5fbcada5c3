package control_test

import (
	"context"
	"testing"

	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestByeIsStoredAsABye: a bye's retirement kind is stored with the
// worker, so the sweep that finds its work still held hands it back as
// bye, read from the table, not from its reason's words; any other
// retirement is stored as gone.
func TestByeIsStoredAsABye(t *testing.T) {
	ctx := context.Background()
	st, c := storetest.Store(t)
	svc := storetest.Control(st)
	hello := func(m string) string {
		g, err := svc.Register(ctx, wire.HelloRequest{MachineID: m, BootID: "b"}.Registration(), func(string) (string, error) { return "h", nil })
		if err != nil {
			t.Fatal(err)
		}
		return g.Worker.ID
	}
	bye, other := hello("m-bye"), hello("m-other")
	if _, err := svc.Bye(ctx, domain.Bye{WorkerID: bye, Reason: "signal"}, nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.MarkGone(ctx, other, nil, domain.EndGone, "bye-bye: let go"); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]domain.EndKind{bye: domain.EndBye, other: domain.EndGone} {
		w, err := st.GetWorker(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if loss, ok := w.LostWhy(c.Now(), domain.DefaultStaleAfter); w.GoneKind != want || !ok || loss.Kind != want {
			t.Errorf("worker %s read back: kind %q, loss %+v %v; want %s", id, w.GoneKind, loss, ok, want)
		}
	}
}
