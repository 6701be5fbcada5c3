package config

import (
	"fmt"
	"strconv"
	"time"
)

// The provisioner's environment (docs/provision.md).
const (
	EnvProvisionLaunchTemplate = "LAKESHORE_PROVISION_LAUNCH_TEMPLATE"
	EnvProvisionMaxHosts       = "LAKESHORE_PROVISION_MAX_HOSTS"
	EnvProvisionMaxHostsPerKey = "LAKESHORE_PROVISION_MAX_HOSTS_PER_KEY"
	EnvProvisionInterval       = "LAKESHORE_PROVISION_INTERVAL"
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

// Provision is the provisioner's configuration. MaxHosts 0 is off.
type Provision struct {
	LaunchTemplate string
	MaxHosts       int
	MaxHostsPerKey int
	Interval       time.Duration
	Stack          string
}

// LoadProvision reads the provisioner's configuration from getenv: off
// unless LAKESHORE_PROVISION_MAX_HOSTS is above 0, and then a launch
// template is required.
func LoadProvision(getenv func(string) string) (Provision, error) {
	p := Provision{LaunchTemplate: getenv(EnvProvisionLaunchTemplate), Stack: getenv(EnvProvisionStack), Interval: DefaultProvisionInterval}
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
// launch template to launch from.
func (p Provision) Check() error {
	if p.MaxHosts > 0 && p.LaunchTemplate == "" {
		return fmt.Errorf("provisioning is on (max hosts %d) but no launch template is named (%s)", p.MaxHosts, EnvProvisionLaunchTemplate)
	}
	return nil
}
