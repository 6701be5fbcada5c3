package domain

import (
	"maps"
	"testing"
)

func TestPlanLaunches(t *testing.T) {
	a := ProvisionKey{"q", "hk1_a"}
	b := ProvisionKey{"q", "hk1_b"}
	generic := ProvisionKey{"q", ""}
	lim := ProvisionLimits{MaxHosts: 100, SlotsPerHost: 4}
	for _, c := range []struct {
		name   string
		demand []Demand
		fleet  Fleet
		lim    ProvisionLimits
		want   map[ProvisionKey]int
	}{
		{"off", []Demand{{a, 20}}, Fleet{}, ProvisionLimits{SlotsPerHost: 4}, map[ProvisionKey]int{}},
		{"no work, no hosts", nil, Fleet{}, lim, map[ProvisionKey]int{}},
		{"20 for one key, 4 a host", []Demand{{a, 20}}, Fleet{}, lim, map[ProvisionKey]int{a: 5}},
		{"capped at 2", []Demand{{a, 20}}, Fleet{}, ProvisionLimits{MaxHosts: 2, SlotsPerHost: 4}, map[ProvisionKey]int{a: 2}},
		{"free slots count first", []Demand{{a, 20}}, Fleet{Free: map[ProvisionKey]int{a: 7}}, lim, map[ProvisionKey]int{a: 4}},
		{"pending hosts count", []Demand{{a, 20}}, Fleet{Pending: map[ProvisionKey]int{a: 3}, Hosts: map[ProvisionKey]int{a: 3}}, lim, map[ProvisionKey]int{a: 2}},
		{"all served", []Demand{{a, 8}}, Fleet{Pending: map[ProvisionKey]int{a: 2}, Hosts: map[ProvisionKey]int{a: 2}}, lim, map[ProvisionKey]int{}},
		{"the cap counts hosts alive", []Demand{{a, 40}}, Fleet{Hosts: map[ProvisionKey]int{b: 9}}, ProvisionLimits{MaxHosts: 10, SlotsPerHost: 4}, map[ProvisionKey]int{a: 1}},
		{"per-key cap", []Demand{{a, 40}, {b, 4}}, Fleet{}, ProvisionLimits{MaxHosts: 100, MaxHostsPerKey: 3, SlotsPerHost: 4}, map[ProvisionKey]int{a: 3, b: 1}},
		{"fair under the cap", []Demand{{a, 400}, {b, 400}, {generic, 4}}, Fleet{}, ProvisionLimits{MaxHosts: 5, SlotsPerHost: 4},
			map[ProvisionKey]int{generic: 1, a: 2, b: 2}},
	} {
		if got := PlanLaunches(c.demand, c.fleet, c.lim); !maps.Equal(got, c.want) {
			t.Errorf("%s: plan %v, want %v", c.name, got, c.want)
		}
	}
}
