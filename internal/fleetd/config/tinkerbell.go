package config

import (
	"errors"
	"fmt"
	"net/url"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Tinkerbell is the [tinkerbell] section: where fleetd writes the
// Tinkerbell objects of each issued install (docs/install.md,
// "Tinkerbell"). Without a kubeconfig it writes none.
type Tinkerbell struct {
	// Kubeconfig is the kubeconfig file of the cluster Tinkerbell runs in,
	// with a user allowed to get, create, update and delete Hardware,
	// Template and Workflow objects in Namespace. Empty: off.
	Kubeconfig string `toml:"kubeconfig"`
	// Namespace holds the objects (default "tink-system").
	Namespace string `toml:"namespace"`
	// ActionImage is the image the provision action runs in: bash,
	// coreutils, wipefs and the installer. Required when on.
	ActionImage string `toml:"action_image"`
	// FleetdURL is fleetd's HTTPS base URL as the install environment
	// reaches it (http_listen's), where the installer fetches the config.
	// Required when on.
	FleetdURL string `toml:"fleetd_url"`
	// Installer is the program and arguments the provision script runs
	// after the wipe; empty: none.
	Installer []string `toml:"installer"`
	// ActionTimeout bounds the provision action (default 30m); CodeWait
	// its wait for the install code (default 10m), which must be shorter.
	ActionTimeout Duration `toml:"action_timeout"`
	CodeWait      Duration `toml:"code_wait"`
}

// Enabled reports whether fleetd writes Tinkerbell objects.
func (t *Tinkerbell) Enabled() bool { return t.Kubeconfig != "" }

func (t *Tinkerbell) applyDefaults() {
	if t.Namespace == "" {
		t.Namespace = "tink-system"
	}
	if t.ActionTimeout.Duration == 0 {
		t.ActionTimeout.Duration = 30 * time.Minute
	}
	if t.CodeWait.Duration == 0 {
		t.CodeWait.Duration = 10 * time.Minute
	}
}

func (t *Tinkerbell) validate(httpListen string) error {
	if !t.Enabled() {
		return nil
	}
	if errs := validation.IsDNS1123Label(t.Namespace); len(errs) > 0 {
		return fmt.Errorf("tinkerbell.namespace: %q is not a Kubernetes namespace name", t.Namespace)
	}
	if t.ActionImage == "" {
		return errors.New("tinkerbell.action_image is required: the image the provision script runs in (bash, coreutils, wipefs, the installer)")
	}
	u, err := url.Parse(t.FleetdURL)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || (u.Path != "" && u.Path != "/") {
		return fmt.Errorf("tinkerbell.fleetd_url: %q is not https://host:port, fleetd's HTTPS address as the install environment reaches it", t.FleetdURL)
	}
	if httpListen == "" {
		return errors.New("tinkerbell: http_listen is required: the installer fetches its config from fleetd over HTTPS")
	}
	if d := t.ActionTimeout.Duration; d < time.Minute || d > 24*time.Hour {
		return fmt.Errorf("tinkerbell.action_timeout: %s is outside 1m..24h", d)
	}
	if d := t.CodeWait.Duration; d < time.Second || d >= t.ActionTimeout.Duration {
		return fmt.Errorf("tinkerbell.code_wait: %s is not between 1s and the action's timeout (%s)", d, t.ActionTimeout.Duration)
	}
	return nil
}
