package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

var joinedRE = regexp.MustCompile(`^joined as (\S+) \(site (\S+), role (\S+)\); certificate valid until (\S+)\n$`)

func TestJoinWithTokenEndToEnd(t *testing.T) {
	cp := startControlPlane(t, "")
	tok := cp.token(t, "--role", "worker", "--site", "lab1")
	dataDir := filepath.Join(t.TempDir(), "bcd")
	env := claimsEnv(t)

	r := run(t, tok+"\n", env, "bcd", cp.joinArgs(dataDir)...)
	if r.code != 0 {
		t.Fatalf("bcd join: %s", r)
	}
	m := joinedRE.FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("bcd join printed %q, want the seed's joined-as line", r.stdout)
	}
	node, site, role := m[1], m[2], m[3]
	if site != "lab1" || role != "worker" {
		t.Errorf("joined with site %s role %s, want lab1 worker", site, role)
	}
	until, err := time.Parse(time.RFC3339, m[4])
	if err != nil || !until.After(time.Now()) {
		t.Errorf("certificate valid until %q: want a future RFC 3339 time (%v)", m[4], err)
	}
	for _, name := range []string{"identity.json", "node.key"} {
		fi, err := os.Stat(filepath.Join(dataDir, name))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", name, fi.Mode().Perm())
		}
	}

	t.Run("the server lists the node", func(t *testing.T) {
		r := run(t, "", nil, "fleetd", "nodes", "list", "--config", cp.config, "--json")
		if r.code != 0 {
			t.Fatalf("nodes list: %s", r)
		}
		var nodes []struct {
			ID       string `json:"id"`
			Role     string `json:"role"`
			Site     string `json:"site"`
			State    string `json:"state"`
			SpiffeID string `json:"spiffe_id"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &nodes); err != nil {
			t.Fatalf("nodes list --json: %v\n%s", err, r.stdout)
		}
		if len(nodes) != 1 || nodes[0].ID != node || nodes[0].State != "active" {
			t.Fatalf("nodes = %+v, want one active node %s", nodes, node)
		}
		if want := "spiffe://test.nodetrust.example/node/" + node; nodes[0].SpiffeID != want {
			t.Errorf("spiffe id %q, want %q", nodes[0].SpiffeID, want)
		}
		show := run(t, "", nil, "fleetd", "nodes", "show", node, "--config", cp.config)
		if show.code != 0 || !strings.Contains(show.stdout, node) {
			t.Errorf("nodes show: %s", show)
		}
	})

	t.Run("bcd status shows the identity", func(t *testing.T) {
		r := run(t, "", nil, "bcd", "status", "--data-dir", dataDir)
		if r.code != 0 || !regexp.MustCompile(`(?m)^node:\s+`+regexp.QuoteMeta(node)+`$`).MatchString(r.stdout) {
			t.Fatalf("bcd status: %s", r)
		}
	})

	t.Run("joining again reads no credential and says already joined", func(t *testing.T) {
		// A token file that does not exist: reading it would fail.
		args := append(cp.joinArgs(dataDir), "--token-file", filepath.Join(t.TempDir(), "absent"))
		r := run(t, "", env, "bcd", args...)
		if r.code != 0 {
			t.Fatalf("second join: %s", r)
		}
		want := "already joined as " + node + " (site lab1, role worker); certificate valid until "
		if !strings.HasPrefix(r.stdout, want) {
			t.Errorf("second join printed %q, want prefix %q", r.stdout, want)
		}
	})

	t.Run("a different node id is refused", func(t *testing.T) {
		args := append(cp.joinArgs(dataDir), "--node-id", "someone-else")
		r := run(t, "", env, "bcd", args...)
		if r.code == 0 || !strings.Contains(r.stderr, "joined as "+node+", not someone-else") {
			t.Errorf("join with another --node-id: %s", r)
		}
	})

	t.Run("a reused token is refused", func(t *testing.T) {
		r := run(t, tok, claimsEnv(t), "bcd", cp.joinArgs(filepath.Join(t.TempDir(), "bcd"))...)
		assertRefused(t, r)
	})

	t.Run("the token is listed as used", func(t *testing.T) {
		r := run(t, "", nil, "fleetd", "token", "list", "--config", cp.config, "--json")
		var toks []struct {
			UsedByNode string `json:"used_by_node"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &toks); err != nil || len(toks) != 1 || toks[0].UsedByNode != node {
			t.Errorf("token list = %s (%v), want one token used by %s", r.stdout, err, node)
		}
	})

	cp.stop(t)
	if strings.Contains(cp.log.String(), tok) {
		t.Errorf("the server log contains the join token")
	}
}

func assertRefused(t *testing.T, r result) {
	t.Helper()
	if r.code != 1 {
		t.Errorf("exit %d, want 1: %s", r.code, r)
	}
	if !strings.Contains(r.stderr, "Join refused") {
		t.Errorf("stderr does not say Join refused: %s", r)
	}
}

func TestJoinRefusals(t *testing.T) {
	cp := startControlPlane(t, "")
	var tokens []string

	t.Run("an expired token", func(t *testing.T) {
		r := run(t, "", nil, "fleetd", "token", "create", "--config", cp.config, "--role", "worker", "--ttl", "1s", "--json")
		var out struct{ Token, Expires string }
		if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
			t.Fatalf("token create --json: %v: %s", err, r)
		}
		tokens = append(tokens, out.Token)
		exp, err := time.Parse(time.RFC3339, out.Expires)
		if err != nil {
			t.Fatal(err)
		}
		// The token's expiry is a point in time; wait until it has passed.
		time.Sleep(time.Until(exp.Add(time.Second)))
		assertRefused(t, run(t, out.Token, claimsEnv(t), "bcd", cp.joinArgs(filepath.Join(t.TempDir(), "bcd"))...))
	})

	t.Run("a token for another role", func(t *testing.T) {
		tok := cp.token(t, "--role", "gpu")
		tokens = append(tokens, tok)
		args := append(cp.joinArgs(filepath.Join(t.TempDir(), "bcd")), "--role", "worker")
		assertRefused(t, run(t, tok, claimsEnv(t), "bcd", args...))
	})

	t.Run("a token nobody issued", func(t *testing.T) {
		fake := "ntjt_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
		tokens = append(tokens, fake)
		assertRefused(t, run(t, fake, claimsEnv(t), "bcd", cp.joinArgs(filepath.Join(t.TempDir(), "bcd"))...))
	})

	t.Run("a wrong serving pin fails before the token is sent", func(t *testing.T) {
		other := startControlPlane(t, "")
		tok := cp.token(t, "--role", "worker")
		tokens = append(tokens, tok)
		args := cp.joinArgs(filepath.Join(t.TempDir(), "bcd"))
		for i, a := range args {
			if a == cp.bundle.ServingCASPKIPin {
				args[i] = other.bundle.ServingCASPKIPin
			}
		}
		r := run(t, tok, claimsEnv(t), "bcd", args...)
		if r.code != 1 || !strings.Contains(r.stderr, "pinned serving CA") {
			t.Fatalf("join with a wrong serving pin: %s", r)
		}
		// The token was never used: it still joins.
		ok := run(t, tok, claimsEnv(t), "bcd", cp.joinArgs(filepath.Join(t.TempDir(), "bcd"))...)
		if ok.code != 0 {
			t.Fatalf("the token did not join after the failed attempt: %s", ok)
		}
	})

	t.Run("a positional token is refused and not echoed", func(t *testing.T) {
		secret := "ntjt_positional-secret-must-not-be-echoed"
		args := append(cp.joinArgs(filepath.Join(t.TempDir(), "bcd")), secret)
		r := run(t, "", claimsEnv(t), "bcd", args...)
		if r.code != 2 {
			t.Errorf("exit %d, want 2: %s", r.code, r)
		}
		if strings.Contains(r.stdout+r.stderr, "positional-secret") {
			t.Errorf("the positional argument was echoed: %s", r)
		}
		if !strings.Contains(r.stderr, "never on the command line") {
			t.Errorf("the refusal does not say where the token goes: %s", r)
		}
	})

	t.Run("two token sources are refused", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "tok")
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		args := append(cp.joinArgs(filepath.Join(t.TempDir(), "bcd")), "--token-file", f)
		r := run(t, "", append(claimsEnv(t), "BCD_JOIN_TOKEN=y"), "bcd", args...)
		if r.code != 1 || !strings.Contains(r.stderr, "exactly one source") {
			t.Errorf("two sources: %s", r)
		}
	})

	t.Run("a malformed pin stops bcd and names the flag", func(t *testing.T) {
		args := cp.joinArgs(filepath.Join(t.TempDir(), "bcd"))
		for i, a := range args {
			if a == cp.bundle.JoinSigningKeyPin {
				args[i] = "sha256:nothex"
			}
		}
		r := run(t, "", claimsEnv(t), "bcd", args...)
		if r.code != 2 || !strings.Contains(r.stderr, "--join-signing-key-pin") {
			t.Errorf("malformed pin: %s", r)
		}
	})

	cp.stop(t)
	log := cp.log.String()
	if !strings.Contains(log, "join refused") {
		t.Errorf("the server logged no refusal reason:\n%s", log)
	}
	for _, tok := range tokens {
		if strings.Contains(log, tok) {
			t.Errorf("the server log contains a join token")
		}
	}
}

func TestDevServerJoin(t *testing.T) {
	dir := t.TempDir()
	log := &syncBuffer{}
	cmd := startDev(t, dir, log)
	env := readEnvFile(t, filepath.Join(dir, "dev.env"))
	dataDir := env["BCD_DATA_DIR"]
	r := run(t, "", claimsEnv(t), "bcd", "join", "--server", env["FLEETD_SERVER"],
		"--serving-ca-spki-pin", env["SERVING_CA_SPKI_PIN"],
		"--join-signing-key-pin", env["JOIN_SIGNING_KEY_PIN"],
		"--join-encryption-key-pin", env["JOIN_ENCRYPTION_KEY_PIN"],
		"--data-dir", dataDir, "--token-file", env["BCD_TOKEN_FILE"])
	if r.code != 0 || !joinedRE.MatchString(r.stdout) {
		t.Fatalf("join against fleetd dev: %s", r)
	}
	nl := run(t, "", nil, "fleetd", "nodes", "list", "--config", env["FLEETD_CONFIG"])
	if nl.code != 0 || !strings.Contains(nl.stdout, "active") {
		t.Fatalf("nodes list against fleetd dev: %s", nl)
	}
	stopDev(t, cmd, log)
}
