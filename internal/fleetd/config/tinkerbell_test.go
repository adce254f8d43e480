package config

import (
	"strings"
	"testing"
	"time"
)

func TestLoadFleetdTinkerbell(t *testing.T) {
	base := "pki_dir = \"p\"\ndata_dir = \"d\"\nhttp_listen = \"0.0.0.0:8444\"\n"
	c, err := LoadFleetd(writeFile(t, base))
	if err != nil {
		t.Fatal(err)
	}
	if tb := c.Tinkerbell; tb.Enabled() || tb.Namespace != "tink-system" || tb.ActionTimeout.Duration != 30*time.Minute || tb.CodeWait.Duration != 10*time.Minute {
		t.Errorf("default [tinkerbell] %+v", tb)
	}
	on := base + "[tinkerbell]\nkubeconfig = \"tink.kubeconfig\"\naction_image = \"registry.example/provision:1\"\nfleetd_url = \"https://fleetd.example:8444\"\ninstaller = [\"/usr/bin/install-talos\"]\n"
	if c, err = LoadFleetd(writeFile(t, on)); err != nil {
		t.Fatal(err)
	}
	if tb := c.Tinkerbell; !tb.Enabled() || len(tb.Installer) != 1 || tb.FleetdURL != "https://fleetd.example:8444" {
		t.Errorf("[tinkerbell] %+v", tb)
	}
	for _, tc := range []struct{ name, text, want string }{
		{"no image", base + "[tinkerbell]\nkubeconfig = \"k\"\nfleetd_url = \"https://f:8444\"\n", "tinkerbell.action_image is required"},
		{"no URL", base + "[tinkerbell]\nkubeconfig = \"k\"\naction_image = \"i\"\n", "tinkerbell.fleetd_url"},
		{"plain http", base + "[tinkerbell]\nkubeconfig = \"k\"\naction_image = \"i\"\nfleetd_url = \"http://f:8444\"\n", "tinkerbell.fleetd_url"},
		{"a bad namespace", base + "[tinkerbell]\nkubeconfig = \"k\"\nnamespace = \"Tink\"\naction_image = \"i\"\nfleetd_url = \"https://f:8444\"\n", "tinkerbell.namespace"},
		{"a wait as long as the action", base + "[tinkerbell]\nkubeconfig = \"k\"\naction_image = \"i\"\nfleetd_url = \"https://f:8444\"\ncode_wait = \"30m\"\n", "tinkerbell.code_wait"},
		{"no http_listen", "pki_dir = \"p\"\ndata_dir = \"d\"\n[tinkerbell]\nkubeconfig = \"k\"\naction_image = \"i\"\nfleetd_url = \"https://f:8444\"\n", "http_listen is required"},
	} {
		if _, err := LoadFleetd(writeFile(t, tc.text)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}
