package fleetd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodetrust/nodetrust/internal/fleetd/config"
)

const testKubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: tink
  cluster:
    server: https://127.0.0.1:6443
users:
- name: fleetd
  user:
    token: sekrit-kubeconfig-token
contexts:
- name: tink
  context: {cluster: tink, user: fleetd}
current-context: tink
`

func tinkConfig(t *testing.T, kubeconfig string, mode os.FileMode) *config.Fleetd {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tink.kubeconfig"), []byte(kubeconfig), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "tink.kubeconfig"), mode); err != nil {
		t.Fatal(err)
	}
	text := "pki_dir = \"pki\"\ndata_dir = \"data\"\nhttp_listen = \"127.0.0.1:0\"\n[tinkerbell]\nkubeconfig = \"tink.kubeconfig\"\n" +
		"action_image = \"registry.example/provision:1\"\nfleetd_url = \"https://fleetd.example:8444\"\n"
	if err := os.WriteFile(filepath.Join(dir, "fleetd.toml"), []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.LoadFleetd(filepath.Join(dir, "fleetd.toml"))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestTinkerbellProvisionerFromConfig(t *testing.T) {
	if p, err := tinkerbellProvisioner(tinkConfig(t, testKubeconfig, 0o600)); err != nil || p == nil {
		t.Fatalf("a valid [tinkerbell]: %v", err)
	}
	_, err := tinkerbellProvisioner(tinkConfig(t, testKubeconfig, 0o644))
	if err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a kubeconfig others can read: %v, want a refusal with the chmod", err)
	}
	_, err = tinkerbellProvisioner(tinkConfig(t, testKubeconfig, 0o620))
	if err == nil || !strings.Contains(err.Error(), "group or others may write it") {
		t.Errorf("a kubeconfig the group can write: %v, want a refusal", err)
	}
	broken := strings.Replace(testKubeconfig, "kind: Config", "kind: [Config", 1)
	_, err = tinkerbellProvisioner(tinkConfig(t, broken, 0o600))
	if err == nil || !strings.Contains(err.Error(), "is not a kubeconfig file") {
		t.Errorf("a malformed kubeconfig: %v", err)
	}
	if err != nil && strings.Contains(err.Error(), "sekrit") {
		t.Errorf("the error shows the kubeconfig's credential: %v", err)
	}
}
