package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/api/localv1"
	"github.com/nodetrust/nodetrust/callsig"
	"github.com/nodetrust/nodetrust/localapi"
)

func fileMode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func gone(t *testing.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s is still there: %v", p, err)
		}
	}
}

// TestCallsigLocalAPI runs bcd node and checks, with real calls on its
// socket, the command line's calls, each refusal with its message, and the
// life of an instance's key.
func TestCallsigLocalAPI(t *testing.T) {
	cp := startControlPlane(t, "")
	n := newCallsigNode(t, cp, "node-a", "")
	ctx := context.Background()

	t.Run("bcd call signs as the command line", func(t *testing.T) {
		r := n.bcd(t, "", "call", "status", "get")
		if r.code != 0 {
			t.Fatalf("bcd call status get: %s", r)
		}
		var st localapi.Status
		if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
			t.Fatalf("bcd call printed %q: %v", r.stdout, err)
		}
		if st.Caller != (localapi.Principal{NodeID: n.node, Sender: localapi.CLISender}) || st.NodeID != n.node || st.MachineCertificate == nil {
			t.Errorf("status %+v", st)
		}
		for path, want := range map[string]os.FileMode{
			n.socket:                        0o600,
			filepath.Dir(n.socket):          0o700,
			n.cliKeyFile():                  0o600,
			filepath.Dir(n.cliKeyFile()):    0o700,
			filepath.Join(n.dataDir, "run"): 0o700,
		} {
			if got := fileMode(t, path); got != want {
				t.Errorf("%s has mode %04o, want %04o", path, got, want)
			}
		}
	})

	t.Run("a call with no signature", func(t *testing.T) {
		c := n.cli(t, 0)
		env, err := c.Envelope(localapi.Call{Service: "status", Method: "get"})
		if err != nil {
			t.Fatal(err)
		}
		env.Signature = nil
		b, _ := env.MarshalBinary()
		r, err := c.Send(ctx, &localv1.CallRequest{Envelope: b})
		if err != nil {
			t.Fatal(err)
		}
		wantRefusal(t, localapi.ReplyError(r).Error(), callsig.CheckNoSignature, "the call carries no signature; a client built before calls were signed must be built again")
	})

	t.Run("a replayed call", func(t *testing.T) {
		c := n.cli(t, 0)
		env, _ := c.Envelope(localapi.Call{Service: "status", Method: "get"})
		b, _ := env.MarshalBinary()
		first, err := c.Send(ctx, &localv1.CallRequest{Envelope: b})
		if err != nil || first.GetKind() != localapi.KindOK {
			t.Fatalf("first call: %v %v", first, err)
		}
		again, err := c.Send(ctx, &localv1.CallRequest{Envelope: b})
		if err != nil {
			t.Fatal(err)
		}
		wantRefusal(t, localapi.ReplyError(again).Error(), callsig.CheckReplay, "carried nonce", "the call is replayed")
	})

	for _, tc := range []struct {
		name string
		skew time.Duration
		dir  string
	}{
		{"a call 31 s in the past", -31 * time.Second, "before"},
		{"a call 31 s in the future", 31 * time.Second, "after"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := n.cli(t, tc.skew).Call(ctx, "status", "get", nil, nil)
			if err == nil {
				t.Fatal("the call was taken")
			}
			// The daemon's clock is the host's: by the time the call
			// arrives it is a little less (future) or more (past) than
			// 31 s away.
			wantRefusal(t, err.Error(), callsig.CheckTimestamp, tc.dir+" this daemon's clock, more than 30s away")
			if !regexp.MustCompile(`signed 3[01](\.\d+)?s `).MatchString(err.Error()) {
				t.Errorf("refusal %q does not say about 31s", err)
			}
		})
	}

	t.Run("an instance calls under the command line's sender id", func(t *testing.T) {
		got := n.instanceCall(t, "impostor", "as", localapi.CLISender, "status", "get")
		wantRefusal(t, got, callsig.CheckSignature, `the signature does not verify with the key of sender "nodetrust-cli"`)
	})

	t.Run("an instance's key after its process ended", func(t *testing.T) {
		h := n.hold(t, "worker")
		if m := fileMode(t, h.keyFile); m != 0o600 {
			t.Errorf("the key file has mode %04o, want 0600", m)
		}
		c := n.client(t, "worker", h.key, 0)
		if err := c.Call(ctx, "status", "get", nil, nil); err != nil {
			t.Fatalf("a call with the key of a running instance: %v", err)
		}
		h.exit(t)
		gone(t, h.keyFile, h.runtime)
		err := c.Call(ctx, "status", "get", nil, nil)
		if err == nil {
			t.Fatal("a call with the key of an ended instance was taken")
		}
		wantRefusal(t, err.Error(), callsig.CheckUnknownSender, `this daemon has no key for sender "worker"; an instance whose process does not run has none`)

		again := n.hold(t, "worker")
		if again.key.Equal(h.key) || again.keyFile == h.keyFile {
			t.Error("a restart of the instance got the same key or key file")
		}
		again.exit(t)
	})

	t.Run("an instance's key after bcd run is killed", func(t *testing.T) {
		h := n.hold(t, "killed")
		_ = h.proc.cmd.Process.Signal(syscall.SIGKILL)
		n.agent.waitFor(t, regexp.MustCompile(`msg="instance ended" .*instance=killed reason="the Run stream ended`), 30*time.Second)
		gone(t, h.keyFile, h.runtime)
		err := n.client(t, "killed", h.key, 0).Call(ctx, "status", "get", nil, nil)
		if err == nil {
			t.Fatal("a call with the key of a killed start was taken")
		}
		wantRefusal(t, err.Error(), callsig.CheckUnknownSender, `sender "killed"`)
	})

	t.Run("cancelling another sender's lease goal", func(t *testing.T) {
		h := n.hold(t, "holder")
		defer h.exit(t)
		holder := n.client(t, "holder", h.key, 0)
		var g localapi.Goal
		if err := holder.Call(ctx, "leases", "acquire", localapi.AcquireRequest{Resource: "gpu0"}, &g); err != nil || g.State != localapi.GoalGranted {
			t.Fatalf("acquire: %+v %v", g, err)
		}
		ref, _ := json.Marshal(localapi.GoalRequest{GoalID: g.GoalID})
		r := n.bcd(t, "", "call", "--kind", "cancel", "leases", "acquire", string(ref))
		if r.code != 1 {
			t.Fatalf("the command line cancelled the holder's goal: %s", r)
		}
		wantRefusal(t, r.stderr, "goal sender", "goal "+g.GoalID+" was sent by holder@"+n.node+", not by nodetrust-cli@"+n.node, "only its sender can end it")
		var list localapi.Leases
		if err := holder.Call(ctx, "leases", "list", nil, &list); err != nil || list.Resources[0].Holder == nil || list.Resources[0].Holder.GoalID != g.GoalID {
			t.Fatalf("after the refused cancel: %+v %v", list, err)
		}
		var done localapi.Goal
		if err := holder.Cancel(ctx, "leases", "acquire", localapi.GoalRequest{GoalID: g.GoalID}, &done); err != nil || done.State != localapi.GoalCancelled {
			t.Fatalf("the holder's own cancel: %+v %v", done, err)
		}
	})

	t.Run("a probe needs no signature", func(t *testing.T) {
		r := n.bcd(t, "", "call", "nope", "get")
		if r.code != 1 || !strings.Contains(r.stderr, `no service "nope"`) {
			t.Errorf("a call to an unknown service: %s", r)
		}
		ok, err := n.client(t, "anyone", ed25519Key(t), 0).Probe(ctx, "leases")
		if err != nil || !ok {
			t.Errorf("probe of leases: %v %v", ok, err)
		}
	})

	t.Run("the command line's key is kept, instance files are not", func(t *testing.T) {
		before, err := os.ReadFile(n.cliKeyFile())
		if err != nil {
			t.Fatal(err)
		}
		h := n.hold(t, "survivor")
		n.stop(t)
		gone(t, h.keyFile, h.runtime, n.socket)
		// The daemon's end ended the start: bcd run stops the program.
		h.stdin.Close()
		h.proc.wait(t, 30*time.Second)
		n.start(t)
		after, err := os.ReadFile(n.cliKeyFile())
		if err != nil || !bytes.Equal(before, after) {
			t.Fatalf("the command line's key changed across a restart of bcd node (%v)", err)
		}
		if r := n.bcd(t, "", "call", "status", "get"); r.code != 0 {
			t.Fatalf("bcd call after the restart: %s", r)
		}
	})
}
