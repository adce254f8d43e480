package identity

import (
	"crypto/ecdsa"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/bcd/datadir"
	"github.com/nodetrust/nodetrust/pki/pkitest"
)

var now = time.Unix(1_760_000_000, 0)

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func TestPersist(t *testing.T) {
	ca := newCA(t)
	k1, k2 := pkitest.NewKey(t), pkitest.NewKey(t)
	journal := []byte("old journal")
	aside := func(node string) string {
		return datadir.JournalFile + "." + node + "-" + strconv.FormatInt(now.Unix(), 10)
	}

	tests := []struct {
		name     string
		setup    func(t *testing.T, dir string)
		present  []string // files that must exist afterwards besides node.key and identity.json
		absent   []string
		movedTo  string // where journal.db must have gone, with its content
		keptJour bool   // journal.db must still hold the old journal
	}{
		{
			name:  "fresh directory",
			setup: func(t *testing.T, dir string) {},
		},
		{
			name: "stale next key is removed",
			setup: func(t *testing.T, dir string) {
				writeFile(t, dir, datadir.NextKeyFile, fileKeyPEM(t, k2))
			},
			absent: []string{datadir.NextKeyFile},
		},
		{
			name: "another node's journal moves aside with its sidecars",
			setup: func(t *testing.T, dir string) {
				writeIdentity(t, dir, ca.identity(t, "old-node", &k2.PublicKey))
				writeFile(t, dir, datadir.KeyFile, fileKeyPEM(t, k2))
				writeFile(t, dir, datadir.JournalFile, journal)
				writeFile(t, dir, datadir.JournalFile+"-wal", []byte("wal"))
			},
			movedTo: aside("old-node"),
			present: []string{aside("old-node") + "-wal"},
			absent:  []string{datadir.JournalFile, datadir.JournalFile + "-wal"},
		},
		{
			name: "the same node keeps its journal",
			setup: func(t *testing.T, dir string) {
				writeIdentity(t, dir, ca.identity(t, "n1", &k2.PublicKey))
				writeFile(t, dir, datadir.KeyFile, fileKeyPEM(t, k2))
				writeFile(t, dir, datadir.JournalFile, journal)
			},
			keptJour: true,
		},
		{
			name: "a journal without any previous identity stays",
			setup: func(t *testing.T, dir string) {
				writeFile(t, dir, datadir.JournalFile, journal)
			},
			keptJour: true,
		},
		{
			name: "a corrupt previous identity counts as another node's",
			setup: func(t *testing.T, dir string) {
				writeFile(t, dir, datadir.IdentityFile, []byte("{garbage"))
				writeFile(t, dir, datadir.JournalFile, journal)
			},
			movedTo: aside("unknown"),
		},
		{
			name: "a node id unsafe in a file name is sanitized",
			setup: func(t *testing.T, dir string) {
				writeIdentity(t, dir, ca.identity(t, "../evil/node", &k2.PublicKey))
				writeFile(t, dir, datadir.JournalFile, journal)
			},
			movedTo: aside(".._evil_node"),
		},
		{
			name: "a taken name gets a counter",
			setup: func(t *testing.T, dir string) {
				writeIdentity(t, dir, ca.identity(t, "old-node", &k2.PublicKey))
				writeFile(t, dir, datadir.JournalFile, journal)
				writeFile(t, dir, aside("old-node"), []byte("earlier"))
			},
			movedTo: aside("old-node") + ".1",
			present: []string{aside("old-node")},
		},
		{
			name: "another node without a journal",
			setup: func(t *testing.T, dir string) {
				writeIdentity(t, dir, ca.identity(t, "old-node", &k2.PublicKey))
			},
			absent: []string{datadir.JournalFile, aside("old-node")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "bcd")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			tt.setup(t, dir)
			id := ca.identity(t, "n1", &k1.PublicKey)
			if err := Persist(dir, id, fileKeyPEM(t, k1), now); err != nil {
				t.Fatalf("Persist: %v", err)
			}
			for _, name := range []string{datadir.KeyFile, datadir.IdentityFile} {
				if m := mode(t, filepath.Join(dir, name)); m != 0o600 {
					t.Errorf("%s mode = %v, want 0600", name, m)
				}
			}
			st, err := LoadState(dir, LoadOptions{})
			if err != nil {
				t.Fatalf("LoadState after Persist: %v", err)
			}
			if st.Identity.NodeID != "n1" || !k1.PublicKey.Equal(st.Key.Public()) {
				t.Errorf("loaded node %q with another key", st.Identity.NodeID)
			}
			for _, name := range tt.present {
				if !exists(t, filepath.Join(dir, name)) {
					t.Errorf("%s is missing", name)
				}
			}
			for _, name := range tt.absent {
				if exists(t, filepath.Join(dir, name)) {
					t.Errorf("%s exists", name)
				}
			}
			if tt.movedTo != "" {
				if got := readFile(t, dir, tt.movedTo); string(got) != string(journal) {
					t.Errorf("%s = %q, want the old journal", tt.movedTo, got)
				}
				if exists(t, filepath.Join(dir, datadir.JournalFile)) {
					t.Errorf("%s still exists", datadir.JournalFile)
				}
			}
			if tt.keptJour {
				if got := readFile(t, dir, datadir.JournalFile); string(got) != string(journal) {
					t.Errorf("journal.db = %q, want it kept", got)
				}
			}
		})
	}
}

func TestPersistCreatesDirectory(t *testing.T) {
	ca := newCA(t)
	k := pkitest.NewKey(t)
	dir := filepath.Join(t.TempDir(), "var", "lib", "bcd")
	if err := Persist(dir, ca.identity(t, "n1", &k.PublicKey), fileKeyPEM(t, k), now); err != nil {
		t.Fatal(err)
	}
	if m := mode(t, dir); m != 0o700 {
		t.Errorf("data directory mode = %v, want 0700", m)
	}
	if _, err := LoadState(dir, LoadOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestPersistRefusesIncompleteIdentity(t *testing.T) {
	ca := newCA(t)
	k := pkitest.NewKey(t)
	good := ca.identity(t, "n1", &k.PublicKey)
	for name, tc := range map[string]struct {
		mut func(*Identity)
		key []byte
	}{
		"no node id":     {mut: func(id *Identity) { id.NodeID = "" }, key: fileKeyPEM(t, k)},
		"no certificate": {mut: func(id *Identity) { id.Chain = nil }, key: fileKeyPEM(t, k)},
		"bad leaf":       {mut: func(id *Identity) { id.Chain = [][]byte{[]byte("x")} }, key: fileKeyPEM(t, k)},
		"other version":  {mut: func(id *Identity) { id.Version = 9 }, key: fileKeyPEM(t, k)},
		"no key":         {mut: func(*Identity) {}},
	} {
		dir := t.TempDir()
		id := good
		tc.mut(&id)
		if err := Persist(dir, id, tc.key, now); err == nil {
			t.Errorf("%s: Persist succeeded", name)
		}
		if err := StoreRenewal(dir, id, tc.key, nil); err == nil {
			t.Errorf("%s: StoreRenewal succeeded", name)
		}
		if plan := ResetPlan(dir); len(plan) != 0 {
			t.Errorf("%s: refused writes left %v", name, plan)
		}
	}
}

// renewal sets up dir with an identity for k1 and returns the renewed
// identity for k2.
func renewal(t *testing.T, dir string, ca testCA, k1, k2 *ecdsa.PrivateKey) Identity {
	t.Helper()
	old := ca.identity(t, "n1", &k1.PublicKey)
	if err := Persist(dir, old, fileKeyPEM(t, k1), now); err != nil {
		t.Fatal(err)
	}
	renewed := ca.identity(t, "n1", &k2.PublicKey)
	renewed.JoinedAt = old.JoinedAt
	renewed.RenewedAt = now.UTC()
	return renewed
}

// crashSteps are the points a renewal can stop at, and the key the node must
// load afterwards: the old one before identity.json holds the new certificate,
// the new one from then on.
var crashSteps = []struct {
	step   string
	newKey bool
}{
	{"", false}, // before StoreRenewal writes anything (after WriteNextKey)
	{StepNextKey, false},
	{StepIdentity, true},
	{StepPromote, true},
}

// checkAfterCrash loads dir and checks the key matches the leaf and is the
// expected one.
func checkAfterCrash(t *testing.T, dir string, want *ecdsa.PrivateKey) {
	t.Helper()
	st, err := LoadState(dir, LoadOptions{})
	if err != nil {
		t.Fatalf("LoadState after the crash: %v", err)
	}
	if !want.PublicKey.Equal(st.Key.Public()) || !want.PublicKey.Equal(st.Leaf.PublicKey) {
		t.Fatal("after the crash the node has not the expected key and certificate")
	}
	if exists(t, filepath.Join(dir, datadir.NextKeyFile)) {
		t.Error("node.key.next survived LoadState")
	}
	// A second load sees the same state.
	if _, err := LoadState(dir, LoadOptions{}); err != nil {
		t.Fatalf("second LoadState: %v", err)
	}
}

func TestStoreRenewalCrash(t *testing.T) {
	ca := newCA(t)
	for _, c := range crashSteps {
		name := c.step
		if name == "" {
			name = "before"
		}
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			k1, k2 := pkitest.NewKey(t), pkitest.NewKey(t)
			renewed := renewal(t, dir, ca, k1, k2)
			if err := WriteNextKey(dir, fileKeyPEM(t, k2)); err != nil {
				t.Fatal(err)
			}
			var steps []string
			if c.step != "" {
				func() {
					defer func() {
						if r := recover(); r != "crash" {
							t.Fatalf("recovered %v, want the hook's crash", r)
						}
					}()
					err := StoreRenewal(dir, renewed, fileKeyPEM(t, k2), func(step string) {
						steps = append(steps, step)
						if step == c.step {
							panic("crash")
						}
					})
					t.Fatalf("StoreRenewal returned %v without reaching %s", err, c.step)
				}()
				if steps[len(steps)-1] != c.step {
					t.Fatalf("hook saw %v", steps)
				}
			}
			want := k1
			if c.newKey {
				want = k2
			}
			checkAfterCrash(t, dir, want)
			if c.newKey {
				if st, _ := LoadState(dir, LoadOptions{}); !st.Identity.RenewedAt.Equal(now) {
					t.Errorf("renewed_at = %v, want %v", st.Identity.RenewedAt, now)
				}
			}
		})
	}
}

func TestStoreRenewal(t *testing.T) {
	ca := newCA(t)
	dir := t.TempDir()
	k1, k2 := pkitest.NewKey(t), pkitest.NewKey(t)
	renewed := renewal(t, dir, ca, k1, k2)
	// Something removed node.key.next after the request was sent: StoreRenewal
	// writes it again.
	if err := WriteNextKey(dir, fileKeyPEM(t, k2)); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, datadir.NextKeyFile)); err != nil {
		t.Fatal(err)
	}
	var steps []string
	if err := StoreRenewal(dir, renewed, fileKeyPEM(t, k2), func(s string) { steps = append(steps, s) }); err != nil {
		t.Fatal(err)
	}
	if want := []string{StepNextKey, StepIdentity, StepPromote}; !slices.Equal(steps, want) {
		t.Errorf("steps = %v, want %v", steps, want)
	}
	for _, name := range []string{datadir.KeyFile, datadir.IdentityFile} {
		if m := mode(t, filepath.Join(dir, name)); m != 0o600 {
			t.Errorf("%s mode = %v, want 0600", name, m)
		}
	}
	if exists(t, filepath.Join(dir, datadir.NextKeyFile)) {
		t.Error("node.key.next exists after StoreRenewal")
	}
	checkAfterCrash(t, dir, k2)
}

func TestWriteNextKey(t *testing.T) {
	dir := t.TempDir()
	k := pkitest.NewKey(t)
	if err := WriteNextKey(dir, fileKeyPEM(t, k)); err != nil {
		t.Fatal(err)
	}
	if m := mode(t, filepath.Join(dir, datadir.NextKeyFile)); m != 0o600 {
		t.Errorf("node.key.next mode = %v, want 0600", m)
	}
	if err := WriteNextKey(dir, nil); err == nil {
		t.Error("WriteNextKey of an empty key succeeded")
	}
}

// The environment of the re-executed test binary in TestStoreRenewalKilled.
const (
	envCrashDir  = "NODETRUST_IDENTITY_CRASH_DIR"
	envCrashStep = "NODETRUST_IDENTITY_CRASH_STEP"
)

// TestStoreRenewalKilled stops a real process with SIGKILL after each step of
// StoreRenewal, then loads what it left.
func TestStoreRenewalKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("re-executes the test binary")
	}
	ca := newCA(t)
	for _, c := range crashSteps[1:] {
		t.Run(c.step, func(t *testing.T) {
			dir := t.TempDir()
			k1, k2 := pkitest.NewKey(t), pkitest.NewKey(t)
			renewed := renewal(t, dir, ca, k1, k2)
			work := t.TempDir()
			data, err := json.Marshal(renewed)
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, work, "identity", data)
			writeFile(t, work, "key", fileKeyPEM(t, k2))

			cmd := exec.Command(os.Args[0], "-test.run=^TestStoreRenewalKilledChild$", "-test.count=1")
			cmd.Env = append(os.Environ(), envCrashDir+"="+dir, envCrashStep+"="+c.step, "NODETRUST_IDENTITY_CRASH_WORK="+work)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) {
				t.Fatalf("child ended with %v, want SIGKILL; output:\n%s", err, out)
			}
			if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("child ended with %v, want SIGKILL; output:\n%s", err, out)
			}
			want := k1
			if c.newKey {
				want = k2
			}
			checkAfterCrash(t, dir, want)
		})
	}
}

// TestStoreRenewalKilledChild is the process TestStoreRenewalKilled kills.
func TestStoreRenewalKilledChild(t *testing.T) {
	dir, step := os.Getenv(envCrashDir), os.Getenv(envCrashStep)
	if dir == "" {
		t.Skip("run by TestStoreRenewalKilled")
	}
	work := os.Getenv("NODETRUST_IDENTITY_CRASH_WORK")
	var id Identity
	if err := json.Unmarshal(readFile(t, work, "identity"), &id); err != nil {
		t.Fatal(err)
	}
	err := StoreRenewal(dir, id, readFile(t, work, "key"), func(s string) {
		if s == step {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
	})
	t.Fatalf("StoreRenewal returned %v without reaching step %q", err, step)
}

func TestResetPlanAndMoveAside(t *testing.T) {
	ca := newCA(t)
	k1, k2 := pkitest.NewKey(t), pkitest.NewKey(t)
	dir := t.TempDir()
	if got := ResetPlan(dir); len(got) != 0 {
		t.Fatalf("ResetPlan of an empty directory = %v", got)
	}
	if moved, err := MoveAside(dir, now); err != nil || len(moved) != 0 {
		t.Fatalf("MoveAside of an empty directory = %v, %v", moved, err)
	}

	if err := Persist(dir, ca.identity(t, "n1", &k1.PublicKey), fileKeyPEM(t, k1), now); err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, datadir.NextKeyFile, fileKeyPEM(t, k2))
	writeFile(t, dir, datadir.JournalFile, []byte("journal"))
	writeFile(t, dir, datadir.JournalFile+"-wal", []byte("wal"))
	writeFile(t, dir, "config.toml", []byte("unrelated"))
	ts := strconv.FormatInt(now.Unix(), 10)
	writeFile(t, dir, datadir.KeyFile+".reset-"+ts, []byte("an earlier reset"))

	full := func(names ...string) []string {
		var out []string
		for _, n := range names {
			out = append(out, filepath.Join(dir, n))
		}
		return out
	}
	plan := ResetPlan(dir)
	wantPlan := full(datadir.IdentityFile, datadir.KeyFile, datadir.NextKeyFile, datadir.JournalFile, datadir.JournalFile+"-wal")
	if !slices.Equal(plan, wantPlan) {
		t.Fatalf("ResetPlan = %v, want %v", plan, wantPlan)
	}
	if got := ResetPlan(dir); !slices.Equal(got, plan) {
		t.Fatal("ResetPlan changed something")
	}

	moved, err := MoveAside(dir, now)
	if err != nil {
		t.Fatal(err)
	}
	tag := ".reset-" + ts + ".1" // node.key.reset-<ts> was taken
	wantMoved := full(datadir.IdentityFile+tag, datadir.KeyFile+tag, datadir.NextKeyFile+tag, datadir.JournalFile+tag, datadir.JournalFile+tag+"-wal")
	if !slices.Equal(moved, wantMoved) {
		t.Fatalf("MoveAside = %v, want %v", moved, wantMoved)
	}
	for _, p := range moved {
		if !exists(t, p) {
			t.Errorf("%s does not exist", p)
		}
	}
	if got := readFile(t, dir, datadir.KeyFile+".reset-"+ts); string(got) != "an earlier reset" {
		t.Error("MoveAside overwrote an earlier reset's file")
	}
	if got := readFile(t, dir, "config.toml"); string(got) != "unrelated" {
		t.Error("MoveAside touched an unrelated file")
	}
	if got := ResetPlan(dir); len(got) != 0 {
		t.Errorf("ResetPlan after MoveAside = %v", got)
	}
	if _, err := LoadState(dir, LoadOptions{}); !errors.Is(err, ErrNotJoined) {
		t.Errorf("LoadState after MoveAside = %v, want ErrNotJoined", err)
	}
}
