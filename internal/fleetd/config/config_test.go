package config

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func writeFile(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadFleetd(t *testing.T) {
	p := writeFile(t, "pki_dir = \"pki\"\ndata_dir = \"data\"\nlisten = \"0.0.0.0:9443\"\n")
	c, err := LoadFleetd(p)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(p)
	if got := c.Resolve(c.PKIDir); got != filepath.Join(dir, "pki") {
		t.Errorf("Resolve(pki_dir) = %s", got)
	}
	if c.Store.Path != filepath.Join("data", "fleetd.db") || c.Resolve(c.Store.Path) != filepath.Join(dir, "data", "fleetd.db") {
		t.Errorf("store path = %s", c.Store.Path)
	}
	if c.AdminAddress() != "127.0.0.1:9443" {
		t.Errorf("AdminAddress = %s", c.AdminAddress())
	}
	if c.NodeCertLifetime.Duration != MaxNodeCertLifetime {
		t.Errorf("default lifetime %s", c.NodeCertLifetime)
	}
	if inv := c.Inventory; inv.Required || inv.AutoProvision || inv.Source != "fleetd" || len(inv.Classes) != 3 || inv.MaxClaims != 10000 {
		t.Errorf("default [inventory] %+v", inv)
	}
	if k := c.Kubernetes; k.Enabled() || k.TokenLifetime.Duration != 8*time.Hour || k.DrainTimeout.Duration != 2*time.Minute || k.RetireRetry.Duration != time.Minute || c.Actuator.Kind != "" {
		t.Errorf("default [kubernetes] %+v, actuator kind %q", k, c.Actuator.Kind)
	}
	if b := c.BootPolicy; b.Dir != "" || b.VerdictLogMaxBytes != 10<<20 || b.VerdictLogKeep != 5 || b.StaleAfter.Duration != 150*time.Minute {
		t.Errorf("default boot_policy %+v", b)
	}
}

func TestLoadFleetdRefusals(t *testing.T) {
	cases := []struct{ name, text, want string }{
		{"no pki_dir", "data_dir = \"d\"\n", "pki_dir is required"},
		{"a lifetime over 24h", "pki_dir = \"p\"\ndata_dir = \"d\"\nnode_cert_lifetime = \"25h\"\n", "node_cert_lifetime"},
		{"a malformed duration", "pki_dir = \"p\"\ndata_dir = \"d\"\ntoken_ttl = \"soon\"\n", "duration"},
		{"an unknown store", "pki_dir = \"p\"\ndata_dir = \"d\"\n[store]\ndriver = \"mysql\"\n", "store.driver"},
		{"a relative PKCS#11 module", "pki_dir = \"p\"\ndata_dir = \"d\"\n[pkcs11]\nmodule = \"libsofthsm2.so\"\n", "pkcs11.module"},
		{"a bad log level", "pki_dir = \"p\"\ndata_dir = \"d\"\nlog_level = \"loud\"\n", "log_level"},
		{"an unknown inventory source", "pki_dir = \"p\"\ndata_dir = \"d\"\n[inventory]\nsource = \"ldap\"\n", "inventory.source"},
		{"netbox without a url", "pki_dir = \"p\"\ndata_dir = \"d\"\n[inventory]\nsource = \"netbox\"\n", "inventory.netbox.url is required"},
		{"netbox without a declarer", "pki_dir = \"p\"\ndata_dir = \"d\"\n[inventory]\nsource = \"netbox\"\n[inventory.netbox]\nurl = \"https://nb\"\ntoken_file = \"t\"\n", "declarer_user is required"},
		{"a bad class", "pki_dir = \"p\"\ndata_dir = \"d\"\n[inventory]\nclasses = [\"Worker\"]\n", "inventory.classes"},
		{"a kubernetes actuator without a cluster", "pki_dir = \"p\"\ndata_dir = \"d\"\n[actuator]\nkind = \"kubernetes\"\n", "needs kubernetes.kubeconfig"},
		{"a kubernetes actuator with a webhook", "pki_dir = \"p\"\ndata_dir = \"d\"\n[actuator]\nkind = \"kubernetes\"\nwebhook_url = \"https://h\"\n[kubernetes]\nkubeconfig = \"k\"\n", "actuator.webhook_url"},
		{"a webhook actuator without a URL", "pki_dir = \"p\"\ndata_dir = \"d\"\n[actuator]\nkind = \"webhook\"\n", "actuator.webhook_url is required"},
		{"an unknown actuator", "pki_dir = \"p\"\ndata_dir = \"d\"\n[actuator]\nkind = \"ipmi\"\n", "actuator.kind"},
		{"a short bootstrap token", "pki_dir = \"p\"\ndata_dir = \"d\"\n[kubernetes]\nkubeconfig = \"k\"\ntoken_lifetime = \"10m\"\n", "kubernetes.token_lifetime"},
		{"a long drain", "pki_dir = \"p\"\ndata_dir = \"d\"\n[kubernetes]\nkubeconfig = \"k\"\ndrain_timeout = \"2h\"\n", "kubernetes.drain_timeout"},
		{"a zero retry", "pki_dir = \"p\"\ndata_dir = \"d\"\n[kubernetes]\nretire_retry = \"10ms\"\n", "kubernetes.retire_retry"},
		{"no claims kept", "pki_dir = \"p\"\ndata_dir = \"d\"\n[inventory]\nmax_claims = -1\n", "inventory.max_claims"},
		{"a negative connection limit", "pki_dir = \"p\"\ndata_dir = \"d\"\n[limits]\nmax_connections = -1\n", "limits.max_connections"},
		{"a per-source limit above the total", "pki_dir = \"p\"\ndata_dir = \"d\"\n[limits]\nmax_connections = 10\nmax_connections_per_source = 11\n", "limits.max_connections_per_source"},
		{"a negative idle timeout", "pki_dir = \"p\"\ndata_dir = \"d\"\n[limits]\nidle_timeout = \"-1s\"\n", "limits.idle_timeout"},
		{"a tiny verdict log", "pki_dir = \"p\"\ndata_dir = \"d\"\n[boot_policy]\nverdict_log_max_bytes = 100\n", "boot_policy.verdict_log_max_bytes"},
		{"a config waiting longer than its join credential lives", "pki_dir = \"p\"\ndata_dir = \"d\"\n[install]\ncredential_lifetime = \"2h\"\nconfig_ttl = \"3h\"\n", "install.config_ttl (3h0m0s) is longer than install.credential_lifetime (2h0m0s)"},
		{"a staleness margin under a minute", "pki_dir = \"p\"\ndata_dir = \"d\"\n[boot_policy]\nstale_after = \"30s\"\n", "boot_policy.stale_after: 30s is outside 1m..720h"},
		{"no verdict log kept", "pki_dir = \"p\"\ndata_dir = \"d\"\n[boot_policy]\nverdict_log_keep = -1\n", "boot_policy.verdict_log_keep"},
		{"a password in the store URL", "pki_dir = \"p\"\ndata_dir = \"d\"\nstore = \"postgres://fleetd:hunter2@db/fleetd\"\n", "store.url: the URL carries a password"},
		{"a password parameter in the store URL", "pki_dir = \"p\"\ndata_dir = \"d\"\n[store]\nurl = \"postgres://fleetd@db/fleetd?password=hunter2\"\n", "store.url: the URL carries a password"},
		{"a store URL of another scheme", "pki_dir = \"p\"\ndata_dir = \"d\"\nstore = \"mysql://db/fleetd\"\n", "store.url: scheme"},
		{"postgres without a URL", "pki_dir = \"p\"\ndata_dir = \"d\"\n[store]\ndriver = \"postgres\"\n", "store.url: the PostgreSQL URL is required"},
		{"an unknown store setting", "pki_dir = \"p\"\ndata_dir = \"d\"\n[store]\nuri = \"postgres://db/x\"\n", "store.uri"},
		{"an unknown key exchange", "pki_dir = \"p\"\ndata_dir = \"d\"\ntls_key_exchanges = [\"Kyber512\"]\n", "tls_key_exchanges: \"Kyber512\""},
		{"a key exchange twice", "pki_dir = \"p\"\ndata_dir = \"d\"\ntls_key_exchanges = [\"X25519\", \"X25519\"]\n", "named twice"},
		{"a debug endpoint off loopback", "pki_dir = \"p\"\ndata_dir = \"d\"\ndebug_listen = \"0.0.0.0:6060\"\n", "debug_listen: \"0.0.0.0:6060\" is not a loopback address"},
		{"a debug endpoint by host name", "pki_dir = \"p\"\ndata_dir = \"d\"\ndebug_listen = \"example.test:6060\"\n", "not a loopback address"},
		{"a password file for SQLite", "pki_dir = \"p\"\ndata_dir = \"d\"\n[store]\ndriver = \"sqlite\"\npassword_file = \"pw\"\n", "PostgreSQL settings"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadFleetd(writeFile(t, tc.text))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("the error shows the password: %v", err)
			}
		})
	}
}

func TestLoadFleetdKeyExchangesAndDebug(t *testing.T) {
	c, err := LoadFleetd(writeFile(t, "pki_dir = \"p\"\ndata_dir = \"d\"\ntls_key_exchanges = [\"X25519\", \"P256\"]\ndebug_listen = \"[::1]:6060\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	ids, err := c.KeyExchanges()
	if err != nil || !slices.Equal(ids, []tls.CurveID{tls.X25519, tls.CurveP256}) {
		t.Errorf("KeyExchanges = %v, %v; want X25519, P256", ids, err)
	}
	if c.DebugListen != "[::1]:6060" {
		t.Errorf("debug_listen = %q", c.DebugListen)
	}
	c, err = LoadFleetd(writeFile(t, "pki_dir = \"p\"\ndata_dir = \"d\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if ids, _ := c.KeyExchanges(); ids != nil || c.DebugListen != "" {
		t.Errorf("defaults: key exchanges %v, debug_listen %q; want Go's default and off", ids, c.DebugListen)
	}
}

func TestLoadFleetdStore(t *testing.T) {
	cases := []struct{ name, text, driver, url, path string }{
		{"the default is SQLite in data_dir", "", "sqlite", "", filepath.Join("data", "fleetd.db")},
		{"a SQLite table", "[store]\ndriver = \"sqlite\"\npath = \"x.db\"\n", "sqlite", "", "x.db"},
		{"a URL string", "store = \"postgres://fleetd@db:5432/fleetd?sslmode=verify-full\"\n", "postgres", "postgres://fleetd@db:5432/fleetd?sslmode=verify-full", ""},
		{"a table with a URL", "[store]\nurl = \"postgresql://fleetd@db/fleetd\"\npassword_file = \"pw\"\nmax_conns = 8\n", "postgres", "postgresql://fleetd@db/fleetd", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := LoadFleetd(writeFile(t, "pki_dir = \"p\"\ndata_dir = \"data\"\n"+tc.text))
			if err != nil {
				t.Fatal(err)
			}
			if c.Store.Driver != tc.driver || c.Store.URL != tc.url || c.Store.Path != tc.path {
				t.Errorf("store = %+v, want driver %q url %q path %q", c.Store, tc.driver, tc.url, tc.path)
			}
		})
	}
}
