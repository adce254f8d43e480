package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDoctor(t *testing.T) {
	cp := startControlPlane(t, "")
	joined := newMachine(t, cp, "", "")
	joined.join(t, cp)
	fresh := newMachine(t, cp, "", "")
	other := startControlPlane(t, "")
	wrongPin := newMachine(t, cp, "", "")
	text, err := os.ReadFile(wrongPin.cfg)
	if err != nil {
		t.Fatal(err)
	}
	text = []byte(strings.Replace(string(text), cp.bundle.ServingCASPKIPin, other.bundle.ServingCASPKIPin, 1))
	if err := os.WriteFile(wrongPin.cfg, text, 0o600); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name     string
		args     []string
		wantCode int
		want     []string
	}{
		{"a joined node passes every check", []string{"--config", joined.cfg}, 0,
			[]string{"pass", "joined as", "answers over TLS pinned", "clock within"}},
		{"a node that has not joined warns with the way to join", []string{"--config", fresh.cfg}, 3,
			[]string{"warn", "this node has not joined", "bcd join"}},
		{"a wrong serving pin fails the reachability check", []string{"--config", wrongPin.cfg}, 1,
			[]string{"fail", "serving_ca_spki_pin"}},
		{"a missing config warns with the way to write one", []string{"--config", filepath.Join(t.TempDir(), "absent.toml"), "--data-dir", joined.dataDir}, 3,
			[]string{"warn", "install script"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, "", nil, "bcd", append([]string{"doctor"}, tc.args...)...)
			if r.code != tc.wantCode {
				t.Errorf("exit %d, want %d: %s", r.code, tc.wantCode, r)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stdout, w) {
					t.Errorf("output lacks %q: %s", w, r)
				}
			}
		})
	}
}
