package provision_test

import (
	"context"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"

	"github.com/dreamlake/lakeshore/server/config"
	"github.com/dreamlake/lakeshore/server/provision"
	"github.com/dreamlake/lakeshore/shared/domain"
)

// spotShort is moto's EC2 with spot capacity refused when refuse is set:
// every RunInstances call is kept, and one that asks for spot is answered
// with EC2's capacity refusal.
type spotShort struct {
	provision.EC2
	refuse bool
	// asked is the market of each call ("" none), read as it was made:
	// the caller may change its input afterwards.
	asked []string
}

func (s *spotShort) RunInstances(ctx context.Context, in *ec2.RunInstancesInput, optFns ...func(*ec2.Options)) (*ec2.RunInstancesOutput, error) {
	m := ""
	if in.InstanceMarketOptions != nil {
		m = string(in.InstanceMarketOptions.MarketType)
	}
	s.asked = append(s.asked, m)
	if s.refuse && in.InstanceMarketOptions != nil && in.InstanceMarketOptions.MarketType == ec2types.MarketTypeSpot {
		return nil, &smithy.GenericAPIError{Code: "InsufficientInstanceCapacity", Message: "There is no Spot capacity available that matches your request."}
	}
	return s.EC2.RunInstances(ctx, in, optFns...)
}

// configured is a provisioner over w built as the Lambda builds it: from
// the environment env (config.LoadProvision, provision.ConfigOf), with
// EC2 calls through ec2c.
func (w *world) configured(ec2c provision.EC2, env map[string]string) *provision.Provisioner {
	w.t.Helper()
	env[config.EnvProvisionLaunchTemplate] = w.template
	c, err := config.LoadProvision(func(k string) string { return env[k] })
	if err != nil {
		w.t.Fatal(err)
	}
	pc := provision.ConfigOf(c)
	pc.Store, pc.EC2, pc.Clock = w.st, ec2c, w.clock.Clock()
	pc.HostSetup = func(context.Context, string, string) ([]string, error) { return []string{"echo warm"}, nil }
	return provision.New(pc)
}

// TestPassBuysAsConfigured: LAKESHORE_PROVISION_MARKET decides how a host
// is bought. Spot first (the default) asks for spot and, refused, on
// demand; spot asks for spot only and keeps the refusal as the host's
// failure; on-demand names no market (the launch template's own options
// apply).
func TestPassBuysAsConfigured(t *testing.T) {
	for _, c := range []struct {
		name, market string
		refuse       bool
		// markets: what each RunInstances call asked for ("" none).
		markets []string
		// bought: the launched host's market; "" a refused launch.
		bought string
	}{
		{"default, spot there", "", false, []string{"spot"}, "spot"},
		{"default, spot refused", "", true, []string{"spot", ""}, "on-demand"},
		{"spot-first, spot refused", "spot-first", true, []string{"spot", ""}, "on-demand"},
		{"spot, spot there", "spot", false, []string{"spot"}, "spot"},
		{"spot, spot refused", "spot", true, []string{"spot"}, ""},
		{"on-demand", "on-demand", true, []string{""}, "on-demand"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t)
			ec2c := &spotShort{EC2: w.ec2, refuse: c.refuse}
			env := map[string]string{config.EnvProvisionMaxHosts: "5"}
			if c.market != "" {
				env[config.EnvProvisionMarket] = c.market
			}
			p := w.configured(ec2c, env)
			w.submit("gpu", 4, "echo warm")
			res, err := p.Pass(w.ctx)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(ec2c.asked, ",") != strings.Join(c.markets, ",") {
				t.Fatalf("RunInstances asked for markets %q; want %q", ec2c.asked, c.markets)
			}
			hosts, err := w.st.Hosts(w.ctx)
			if err != nil || len(hosts) != 1 {
				t.Fatalf("hosts %+v %v; want one", hosts, err)
			}
			h := hosts[0]
			if c.bought == "" {
				if res.Failed != 1 || h.State != domain.LaunchFailed || !strings.Contains(h.Reason, "InsufficientInstanceCapacity") {
					t.Fatalf("pass %+v, host %+v; want the spot refusal kept as its failure", res, h)
				}
				return
			}
			if res.Launched != 1 || h.State != domain.LaunchRunning || h.Market != c.bought {
				t.Fatalf("pass %+v, host %+v; want launched, bought %s", res, h, c.bought)
			}
		})
	}
}

// TestPassGivesHostsTheConfiguredCapacity: with
// LAKESHORE_PROVISION_HOST_CAPACITY=8, 16 queued invocations take 2 hosts
// (not 4), and each host's nymph gets CAPACITY=8.
func TestPassGivesHostsTheConfiguredCapacity(t *testing.T) {
	w := newWorld(t)
	p := w.configured(w.ec2, map[string]string{config.EnvProvisionMaxHosts: "10", config.EnvProvisionHostCapacity: "8"})
	w.submit("gpu", 16, "echo warm")
	res, err := p.Pass(w.ctx)
	if err != nil || res.Launched != 2 {
		t.Fatalf("pass: %+v %v; want 2 hosts of 8 slots for 16 queued", res, err)
	}
	for _, in := range w.instances(w.alive()) {
		settings, _ := provision.ReadUserData(t, w.userData(aws.ToString(in.InstanceId)))
		if !strings.Contains(settings, "CAPACITY=8\n") {
			t.Errorf("instance %s settings:\n%s\nwant CAPACITY=8", aws.ToString(in.InstanceId), settings)
		}
	}
}
