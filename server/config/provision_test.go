package config

import (
	"testing"
	"time"
)

func TestLoadProvision(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	p, err := LoadProvision(env(nil))
	if err != nil || p.MaxHosts != 0 || p.Interval != DefaultProvisionInterval || p.HostCapacity != 4 || p.Market != MarketSpotFirst {
		t.Fatalf("defaults: %+v %v; want off, a minute, 4 slots a host, spot first", p, err)
	}
	p, err = LoadProvision(env(map[string]string{EnvProvisionMaxHosts: "10", EnvProvisionMaxHostsPerKey: "3",
		EnvProvisionLaunchTemplate: "lt-0abc", EnvProvisionInterval: "30s", EnvProvisionStack: "lakeshore",
		EnvProvisionHostCapacity: "16", EnvProvisionMarket: "on-demand"}))
	if err != nil || p != (Provision{LaunchTemplate: "lt-0abc", MaxHosts: 10, MaxHostsPerKey: 3, Interval: 30 * time.Second, Stack: "lakeshore",
		HostCapacity: 16, Market: MarketOnDemand}) {
		t.Fatalf("set: %+v %v", p, err)
	}
	for name, kv := range map[string]map[string]string{
		"no template":    {EnvProvisionMaxHosts: "1"},
		"negative":       {EnvProvisionMaxHosts: "-1"},
		"not a number":   {EnvProvisionMaxHostsPerKey: "many"},
		"too short":      {EnvProvisionInterval: "10ms"},
		"not a duration": {EnvProvisionInterval: "often"},
		"no capacity":    {EnvProvisionHostCapacity: "0"},
		"capacity big":   {EnvProvisionHostCapacity: "1025"},
		"capacity word":  {EnvProvisionHostCapacity: "four"},
		"unknown market": {EnvProvisionMarket: "reserved"},
		"market case":    {EnvProvisionMarket: "Spot"},
	} {
		if _, err := LoadProvision(env(kv)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// lakeshore dev's flags fill the struct and call Check.
	if err := (Provision{MaxHosts: 1, LaunchTemplate: "lt-0abc", HostCapacity: 0}).Check(); err == nil {
		t.Error("provisioning on with a host capacity of 0: accepted")
	}
}
