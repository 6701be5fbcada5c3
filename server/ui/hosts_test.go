package ui_test

import (
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestHostsPage: the hosts page lists the provisioner's hosts, newest
// first, each with where it is (reserved, launched and waiting for its
// hello, joined as a worker in its state, refused, let go), and the
// launches EC2 refused with their reasons, newest first; its live parts
// read the same; an odd reason reads escaped.
func TestHostsPage(t *testing.T) {
	tb := newTables(t)
	s := tb.serve(t, nil)
	ctx := t.Context()
	st := store.New(tb.db, tb.prefix)
	now := time.Now()
	key := domain.ProvisionKey{Queue: "gpu", HostKey: "hk1"}
	var hosts []domain.Host
	for i, id := range []string{"hst_reserved", "hst_waiting", "hst_joined", "hst_refused1", "hst_refused2", "hst_letgo"} {
		hosts = append(hosts, domain.Host{ID: id, Key: key, State: domain.LaunchReserved, CreatedAt: now.Add(time.Duration(i-10) * time.Second)})
	}
	if err := st.ReserveHosts(ctx, 0, hosts); err != nil {
		t.Fatal(err)
	}
	for i := range hosts {
		hosts[i].Version = 1 // as reserved
	}
	launch := func(i int, instance string) domain.Host {
		t.Helper()
		h, err := hosts[i].Launched(instance, "spot", now)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.SaveHost(ctx, 1, &h); err != nil {
			t.Fatal(err)
		}
		return h
	}
	end := func(h domain.Host, state domain.LaunchState, reason string, at time.Time) {
		t.Helper()
		next, _ := h.Ended(state, reason, at)
		if err := st.EndHost(ctx, h.Version, &next, &domain.KeyHold{Key: key}); err != nil {
			t.Fatal(err)
		}
	}
	launch(1, "i-waiting")
	if _, err := st.PutPendingWorker(ctx, domain.NewPendingWorker("wrk_01M8YXE0PB75TMJMCFE5WHZHNS", "i-waiting", key, "hst_waiting", now)); err != nil {
		t.Fatal(err)
	}
	launch(2, "i-joined")
	if _, err := client.New(s.url, enrollToken).Hello(ctx, wire.HelloRequest{MachineID: "i-joined", BootID: "b", Label: "gpu-box", Lanes: []string{"gpu"}}); err != nil {
		t.Fatal(err)
	}
	end(hosts[3], domain.LaunchFailed, "InsufficientInstanceCapacity: no capacity in us-east-1a", now.Add(-5*time.Second))
	end(hosts[4], domain.LaunchFailed, "VcpuLimitExceeded: quota\x1b[31m", now.Add(-2*time.Second))
	end(launch(5, "i-letgo"), domain.LaunchEnded, "it never said hello", now)

	s.do(t, "POST", "/ui/login", url.Values{"token": {operatorToken}})
	for _, path := range []string{"/ui/hosts", "/ui/hosts/live"} {
		resp, body := s.do(t, "GET", path, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, body)
		}
		body = strings.NewReplacer(`\"`, `"`, `\u003c`, `<`, `\u003e`, `>`, `\\`, `\`).Replace(body)
		var order []string
		for _, m := range regexp.MustCompile(`<tr class="host" data-host="([^"]+)"`).FindAllStringSubmatch(body, -1) {
			order = append(order, m[1])
		}
		if strings.Join(order, " ") != "hst_letgo hst_refused2 hst_refused1 hst_joined hst_waiting hst_reserved" {
			t.Errorf("%s: hosts in order %v, want newest first", path, order)
		}
		for id, want := range map[string]string{"hst_reserved": "reserved: launching", "hst_waiting": "launched: waiting for its hello",
			"hst_joined": "joined as gpu-box (joining)", "hst_refused1": "refused by EC2", "hst_letgo": "let go (terminated)"} {
			row := body[strings.Index(body, `<tr class="host" data-host="`+id+`"`):]
			row = row[:strings.Index(row, "</tr>")]
			if !strings.Contains(row, `<td class="where">`+want+`</td>`) {
				t.Errorf("%s: %s reads %s, want %q", path, id, row, want)
			}
		}
		refusals := regexp.MustCompile(`<tr class="refusal" data-host="([^"]+)">.*?<td class="reason">([^<]*)</td>`).FindAllStringSubmatch(body, -1)
		if len(refusals) != 2 || refusals[0][1] != "hst_refused2" || refusals[0][2] != `refused: VcpuLimitExceeded: quota\x1b[31m` ||
			refusals[1][2] != "refused: InsufficientInstanceCapacity: no capacity in us-east-1a" {
			t.Errorf("%s: refusals %q, want the quota one then the capacity one, escaped", path, refusals)
		}
	}
}
