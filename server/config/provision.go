package config

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The provisioner's environment (docs/provision.md).
const (
	EnvProvisionLaunchTemplate = "LAKESHORE_PROVISION_LAUNCH_TEMPLATE"
	EnvProvisionMaxHosts       = "LAKESHORE_PROVISION_MAX_HOSTS"
	EnvProvisionMaxHostsPerKey = "LAKESHORE_PROVISION_MAX_HOSTS_PER_KEY"
	EnvProvisionInterval       = "LAKESHORE_PROVISION_INTERVAL"
	// EnvProvisionHostCapacity is each launched host's nymph --capacity,
	// and so how many queued invocations one launch covers.
	EnvProvisionHostCapacity = "LAKESHORE_PROVISION_HOST_CAPACITY"
	// EnvProvisionMarket is how launched hosts are bought: one of
	// ProvisionMarkets.
	EnvProvisionMarket = "LAKESHORE_PROVISION_MARKET"
	// EnvProvisionStack names the deployment (its stack): launched
	// instances carry it as their lakeshore:stack tag, which the deployed
	// policy requires to terminate them. Optional.
	EnvProvisionStack = "LAKESHORE_PROVISION_STACK"
	// EnvProvisionerFunction, in the api function's environment, names the
	// provisioner function a submit nudges (an async invoke); unset: none.
	EnvProvisionerFunction = "LAKESHORE_PROVISIONER_FUNCTION"
)

// DefaultProvisionInterval is how often `lakeshore dev` runs a pass (the
// Lambda's schedule is template.yaml's).
const DefaultProvisionInterval = time.Minute

// DefaultProvisionHostCapacity is a launched host's nymph --capacity
// unless LAKESHORE_PROVISION_HOST_CAPACITY says otherwise.
const DefaultProvisionHostCapacity = 4

// MaxProvisionHostCapacity is the highest host capacity taken (nymph's own
// --capacity limit).
const MaxProvisionHostCapacity = 1024

// How launched hosts are bought (LAKESHORE_PROVISION_MARKET).
const (
	// MarketSpotFirst asks for spot, and launches on demand when EC2
	// refuses spot capacity.
	MarketSpotFirst = "spot-first"
	// MarketSpot asks for spot only: a refusal is the launch's failure.
	MarketSpot = "spot"
	// MarketOnDemand names no market: the launch template's own market
	// options apply (none: on demand).
	MarketOnDemand = "on-demand"
)

// ProvisionMarkets are the markets LAKESHORE_PROVISION_MARKET takes; the
// first is the default.
var ProvisionMarkets = []string{MarketSpotFirst, MarketSpot, MarketOnDemand}

// Provision is the provisioner's configuration. MaxHosts 0 is off;
// HostCapacity 0 and Market "" are their defaults.
type Provision struct {
	LaunchTemplate string
	MaxHosts       int
	MaxHostsPerKey int
	Interval       time.Duration
	Stack          string
	// HostCapacity is each launched host's nymph --capacity.
	HostCapacity int
	// Market is how launched hosts are bought: one of ProvisionMarkets.
	Market string
}

// LoadProvision reads the provisioner's configuration from getenv: off
// unless LAKESHORE_PROVISION_MAX_HOSTS is above 0, and then a launch
// template is required.
func LoadProvision(getenv func(string) string) (Provision, error) {
	p := Provision{LaunchTemplate: getenv(EnvProvisionLaunchTemplate), Stack: getenv(EnvProvisionStack), Interval: DefaultProvisionInterval,
		HostCapacity: DefaultProvisionHostCapacity, Market: MarketSpotFirst}
	if s := getenv(EnvProvisionHostCapacity); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > MaxProvisionHostCapacity {
			return Provision{}, fmt.Errorf("%s must be a whole number from 1 to %d, got %q", EnvProvisionHostCapacity, MaxProvisionHostCapacity, s)
		}
		p.HostCapacity = n
	}
	if s := getenv(EnvProvisionMarket); s != "" {
		p.Market = s
	}
	for _, v := range []struct {
		name string
		dst  *int
	}{{EnvProvisionMaxHosts, &p.MaxHosts}, {EnvProvisionMaxHostsPerKey, &p.MaxHostsPerKey}} {
		s := getenv(v.name)
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > 10000 {
			return Provision{}, fmt.Errorf("%s must be a whole number from 0 to 10000, got %q", v.name, s)
		}
		*v.dst = n
	}
	if s := getenv(EnvProvisionInterval); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < time.Second {
			return Provision{}, fmt.Errorf("%s must be a duration of at least 1s, like 1m; got %q", EnvProvisionInterval, s)
		}
		p.Interval = d
	}
	return p, p.Check()
}

// Check reports a configuration that cannot work: provisioning on with no
// launch template to launch from or a host capacity out of range, or a
// market not in ProvisionMarkets ("" is the default).
func (p Provision) Check() error {
	if p.MaxHosts > 0 && p.LaunchTemplate == "" {
		return fmt.Errorf("provisioning is on (max hosts %d) but no launch template is named (%s)", p.MaxHosts, EnvProvisionLaunchTemplate)
	}
	if p.MaxHosts > 0 && (p.HostCapacity < 1 || p.HostCapacity > MaxProvisionHostCapacity) {
		return fmt.Errorf("a launched host's capacity (%s) must be from 1 to %d, got %d", EnvProvisionHostCapacity, MaxProvisionHostCapacity, p.HostCapacity)
	}
	if p.Market != "" && !slices.Contains(ProvisionMarkets, p.Market) {
		return fmt.Errorf("the provisioner's market (%s) must be one of %s, got %q", EnvProvisionMarket, strings.Join(ProvisionMarkets, ", "), p.Market)
	}
	return nil
}
