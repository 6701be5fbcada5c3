package config

import (
	"testing"
	"time"
)

func TestLoadProvision(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	p, err := LoadProvision(env(nil))
	if err != nil || p.MaxHosts != 0 || p.Interval != DefaultProvisionInterval {
		t.Fatalf("defaults: %+v %v; want off, a minute", p, err)
	}
	p, err = LoadProvision(env(map[string]string{EnvProvisionMaxHosts: "10", EnvProvisionMaxHostsPerKey: "3",
		EnvProvisionLaunchTemplate: "lt-0abc", EnvProvisionInterval: "30s", EnvProvisionStack: "lakeshore"}))
	if err != nil || p != (Provision{LaunchTemplate: "lt-0abc", MaxHosts: 10, MaxHostsPerKey: 3, Interval: 30 * time.Second, Stack: "lakeshore"}) {
		t.Fatalf("set: %+v %v", p, err)
	}
	for name, kv := range map[string]map[string]string{
		"no template":    {EnvProvisionMaxHosts: "1"},
		"negative":       {EnvProvisionMaxHosts: "-1"},
		"not a number":   {EnvProvisionMaxHostsPerKey: "many"},
		"too short":      {EnvProvisionInterval: "10ms"},
		"not a duration": {EnvProvisionInterval: "often"},
	} {
		if _, err := LoadProvision(env(kv)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
