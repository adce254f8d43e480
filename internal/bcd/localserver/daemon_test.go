package localserver

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/api/localv1"
	"github.com/nodetrust/nodetrust/callsig"
	"github.com/nodetrust/nodetrust/internal/bcd/datadir"
	"github.com/nodetrust/nodetrust/localapi"
)

const testTD = "fleet.test"

func newKey(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func statusCall() localapi.Call {
	return localapi.Call{Service: localapi.ServiceStatus, Method: localapi.MethodGet}
}

// TestRefusalsOfLocalCalls sends one call per refusal to a daemon and
// checks the kind and the message of each.
func TestRefusalsOfLocalCalls(t *testing.T) {
	d := startDaemon(t, newFleet(t, testTD).state(t, "node-a", false), nil)
	cli := d.cli(t)
	inst := d.startInstance(t, "trainer")

	t.Run("a call with no envelope has no signature", func(t *testing.T) {
		r, err := cli.Send(context.Background(), &localv1.CallRequest{})
		if err != nil {
			t.Fatal(err)
		}
		wantRejected(t, r, callsig.CheckNoSignature, "carries no signature")
	})
	t.Run("an envelope without a signature has no signature", func(t *testing.T) {
		env, _ := cli.Envelope(statusCall())
		env.Signature = nil
		b, _ := env.MarshalBinary()
		r, _ := cli.Send(context.Background(), &localv1.CallRequest{Envelope: b})
		wantRejected(t, r, callsig.CheckNoSignature)
	})
	t.Run("an envelope that does not decode is malformed", func(t *testing.T) {
		r, _ := cli.Send(context.Background(), &localv1.CallRequest{Envelope: []byte{1, 2, 3}})
		wantRejected(t, r, callsig.CheckMalformed, "does not decode")
	})
	t.Run("a sender with no key is unknown", func(t *testing.T) {
		c := d.client(t, d.signer(t, "ghost", newKey(t), 0))
		wantRejected(t, send(t, c, statusCall()), callsig.CheckUnknownSender, `no key for sender "ghost"`)
	})
	t.Run("an instance calling under the command line's id has a bad signature", func(t *testing.T) {
		c := d.client(t, d.signer(t, localapi.CLISender, inst.key, 0))
		wantRejected(t, send(t, c, statusCall()), callsig.CheckSignature, `the key of sender "nodetrust-cli"`)
	})
	t.Run("a call signed for another namespace", func(t *testing.T) {
		env, _ := cli.Envelope(statusCall())
		env.Namespace = "other-ns"
		env.KeyExpr = "other-ns" + env.KeyExpr[len(testTD):]
		signer := d.signer(t, localapi.CLISender, d.cliKey(t), 0)
		re, _ := signer.Sign(env.Namespace, env.KeyExpr, env.Kind, env.Payload)
		b, _ := re.MarshalBinary()
		r, _ := cli.Send(context.Background(), &localv1.CallRequest{Envelope: b})
		wantRejected(t, r, callsig.CheckNamespace, `"other-ns"`)
	})
	t.Run("a replayed call", func(t *testing.T) {
		env, _ := cli.Envelope(statusCall())
		b, _ := env.MarshalBinary()
		first, _ := cli.Send(context.Background(), &localv1.CallRequest{Envelope: b})
		wantOK(t, first)
		again, _ := cli.Send(context.Background(), &localv1.CallRequest{Envelope: b})
		wantRejected(t, again, callsig.CheckReplay, "the call is replayed")
	})
	t.Run("a key expression that names another sender", func(t *testing.T) {
		signer := d.signer(t, localapi.CLISender, d.cliKey(t), 0)
		ke := cli.KeyExpr(statusCall())
		ke.Sender = "trainer"
		env, _ := signer.Sign(testTD, ke.String(), callsig.KindQuery, []byte("{}"))
		b, _ := env.MarshalBinary()
		r, _ := cli.Send(context.Background(), &localv1.CallRequest{Envelope: b})
		wantRejected(t, r, checkKeyExpr, `names sender "trainer", but the call is signed by sender "nodetrust-cli"`)
	})
	t.Run("an instance may not apply a launch", func(t *testing.T) {
		c := d.client(t, d.signer(t, "trainer", inst.key, 0))
		r := send(t, c, localapi.Call{Service: localapi.ServiceLaunch, Method: localapi.MethodApply, Request: json.RawMessage(`{"name":"x"}`)})
		wantRejected(t, r, checkRights, "only the command line")
	})
	t.Run("an instance may not start instances", func(t *testing.T) {
		c := d.client(t, d.signer(t, "trainer", inst.key, 0))
		env, _ := c.Envelope(localapi.Call{Service: localapi.ServiceInstances, Method: localapi.MethodStart, Request: localapi.StartRequest{Name: "other"}})
		b, _ := env.MarshalBinary()
		stream, err := c.Run(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		stream.Send(&localv1.RunRequest{Body: &localv1.RunRequest_Start{Start: b}})
		m, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		wantRejected(t, m.GetRefused(), checkRights, "only the command line")
	})
}

// TestTimestampsAgainstTheDaemonsClock injects the daemon's clock: a call
// 31 s in the past or the future is refused, one exactly 30 s away is
// taken.
func TestTimestampsAgainstTheDaemonsClock(t *testing.T) {
	d := startDaemon(t, newFleet(t, testTD).state(t, "node-a", false), nil)
	t.Run("a call signed before the daemon started", func(t *testing.T) {
		c := d.client(t, d.signer(t, localapi.CLISender, d.cliKey(t), -5*time.Second))
		wantRejected(t, send(t, c, statusCall()), callsig.CheckTimestamp, "signed 5s before this daemon started")
	})
	// Move the daemon's clock on, so that the past cases test the window
	// rather than the start.
	d.clock.Add(time.Minute)
	for _, tc := range []struct {
		name string
		skew time.Duration
		want string // "" for ok
	}{
		{"31 s in the past", -31 * time.Second, "the call was signed 31s before this daemon's clock, more than 30s away"},
		{"31 s in the future", 31 * time.Second, "the call was signed 31s after this daemon's clock, more than 30s away"},
		{"30 s in the past", -30 * time.Second, ""},
		{"30 s in the future", 30 * time.Second, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := d.client(t, d.signer(t, localapi.CLISender, d.cliKey(t), tc.skew))
			r := send(t, c, statusCall())
			if tc.want == "" {
				wantOK(t, r)
				return
			}
			wantRejected(t, r, callsig.CheckTimestamp, tc.want)
		})
	}
}

func TestProbeNeedsNoSignature(t *testing.T) {
	d := startDaemon(t, newFleet(t, testTD).state(t, "node-a", false), nil)
	c := d.client(t, d.signer(t, "anyone", newKey(t), 0))
	for service, want := range map[string]bool{localapi.ServiceLeases: true, localapi.ServiceStatus: true, "nope": false} {
		got, err := c.Probe(context.Background(), service)
		if err != nil || got != want {
			t.Errorf("probe %s = %v, %v; want %v", service, got, err, want)
		}
	}
}

// TestInstanceKeyLivesWithItsStart: the key file and runtime configuration
// exist (0600) while the start runs, and are gone with the key after it
// ends, however it ends; a restart gets a new key.
func TestInstanceKeyLivesWithItsStart(t *testing.T) {
	d := startDaemon(t, newFleet(t, testTD).state(t, "node-a", false), nil)
	for _, how := range []string{"the process exits", "bcd run is gone"} {
		t.Run(how, func(t *testing.T) {
			in := d.startInstance(t, "worker")
			for _, f := range []string{in.rt.KeyFile, in.started.GetRuntimeFile()} {
				fi, err := os.Stat(f)
				if err != nil || fi.Mode().Perm() != 0o600 {
					t.Fatalf("%s: %v, mode %v; want mode 0600", f, err, fi.Mode())
				}
			}
			c := d.client(t, d.signer(t, "worker", in.key, 0))
			var st localapi.Status
			if err := c.Call(context.Background(), localapi.ServiceStatus, localapi.MethodGet, nil, &st); err != nil {
				t.Fatal(err)
			}
			if st.Caller != (localapi.Principal{NodeID: "node-a", Sender: "worker"}) {
				t.Errorf("caller %+v, want worker@node-a", st.Caller)
			}
			if how == "the process exits" {
				in.exit(t)
			} else {
				in.cancel()
				if got := <-d.ended; got != "worker" {
					t.Fatalf("ended %q, want worker", got)
				}
			}
			for _, f := range []string{in.rt.KeyFile, in.started.GetRuntimeFile()} {
				if _, err := os.Stat(f); !os.IsNotExist(err) {
					t.Errorf("%s is still there after the start ended: %v", f, err)
				}
			}
			wantRejected(t, send(t, c, statusCall()), callsig.CheckUnknownSender, `no key for sender "worker"`)
			again := d.startInstance(t, "worker")
			if again.key.Equal(in.key) {
				t.Error("a restart got the same key")
			}
			again.exit(t)
			if how == "the process exits" {
				<-d.ended
			}
			<-d.ended
		})
	}
}

func TestInstanceNameIsTakenWhileItRuns(t *testing.T) {
	d := startDaemon(t, newFleet(t, testTD).state(t, "node-a", false), nil)
	d.startInstance(t, "solo")
	cli := d.cli(t)
	env, _ := cli.Envelope(localapi.Call{Service: localapi.ServiceInstances, Method: localapi.MethodStart, Request: localapi.StartRequest{Name: "solo"}})
	b, _ := env.MarshalBinary()
	stream, _ := cli.Run(context.Background())
	stream.Send(&localv1.RunRequest{Body: &localv1.RunRequest_Start{Start: b}})
	m, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if r := m.GetRefused(); r.GetKind() != localapi.KindError || !bytes.Contains([]byte(r.GetMessage()), []byte(`an instance named "solo" runs on this machine`)) {
		t.Fatalf("second start of solo: %v", m)
	}
}

// TestOnlyItsSenderEndsALeaseGoal: the command line cannot cancel, renew
// or release an instance's lease goal; the instance can.
func TestOnlyItsSenderEndsALeaseGoal(t *testing.T) {
	d := startDaemon(t, newFleet(t, testTD).state(t, "node-a", false), nil)
	inst := d.startInstance(t, "holder")
	holder := d.client(t, d.signer(t, "holder", inst.key, 0))
	cli := d.cli(t)
	ctx := context.Background()

	var g localapi.Goal
	if err := holder.Call(ctx, localapi.ServiceLeases, localapi.MethodAcquire, localapi.AcquireRequest{Resource: "gpu0"}, &g); err != nil {
		t.Fatal(err)
	}
	if g.State != localapi.GoalGranted {
		t.Fatalf("goal %+v, want granted", g)
	}
	var waiting localapi.Goal
	if err := cli.Call(ctx, localapi.ServiceLeases, localapi.MethodAcquire, localapi.AcquireRequest{Resource: "gpu0"}, &waiting); err != nil || waiting.State != localapi.GoalWaiting {
		t.Fatalf("the command line's goal: %+v, %v; want waiting", waiting, err)
	}
	ref := localapi.GoalRequest{GoalID: g.GoalID}
	wantRejected(t, send(t, cli, localapi.Call{Service: localapi.ServiceLeases, Method: localapi.MethodAcquire, Kind: callsig.KindCancel, Request: ref}),
		checkGoalSender, "was sent by holder@node-a, not by nodetrust-cli@node-a")
	wantRejected(t, send(t, cli, localapi.Call{Service: localapi.ServiceLeases, Method: localapi.MethodRelease, Request: ref}), checkGoalSender)
	wantRejected(t, send(t, cli, localapi.Call{Service: localapi.ServiceLeases, Method: localapi.MethodRenew, Request: localapi.RenewRequest{GoalID: g.GoalID}}), checkGoalSender)

	var cancelled localapi.Goal
	if err := holder.Cancel(ctx, localapi.ServiceLeases, localapi.MethodAcquire, ref, &cancelled); err != nil || cancelled.State != localapi.GoalCancelled {
		t.Fatalf("the holder's cancel: %+v, %v", cancelled, err)
	}
	var list localapi.Leases
	if err := cli.Call(ctx, localapi.ServiceLeases, localapi.MethodList, nil, &list); err != nil {
		t.Fatal(err)
	}
	if h := list.Resources[0].Holder; h == nil || h.GoalID != waiting.GoalID {
		t.Fatalf("after the cancel gpu0 is held by %+v, want the command line's goal %s", h, waiting.GoalID)
	}
}

// TestFilesAndModes: the socket is 0600 in a 0700 directory, the
// credentials directory 0700 and the command line's key 0600, kept from
// one start to the next.
func TestFilesAndModes(t *testing.T) {
	fl := newFleet(t, testTD)
	d := startDaemon(t, fl.state(t, "node-a", false), nil)
	mode := func(p string) os.FileMode {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode().Perm()
	}
	creds := filepath.Join(d.dataDir, datadir.CredentialsDir)
	for p, want := range map[string]os.FileMode{
		d.Socket():                               0o600,
		filepath.Dir(d.Socket()):                 0o700,
		creds:                                    0o700,
		filepath.Join(creds, datadir.CLIKeyFile): 0o600,
		filepath.Join(d.dataDir, "run"):          0o700,
	} {
		if got := mode(p); got != want {
			t.Errorf("%s has mode %04o, want %04o", p, got, want)
		}
	}
	key := d.cliKey(t)
	d.Close()
	again, err := New(Config{State: fl.state(t, "node-a", false), DataDir: d.dataDir})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if k2 := d.cliKey(t); !k2.Equal(key) {
		t.Error("the command line's key changed from one start to the next")
	}
	if err := os.Chmod(filepath.Join(creds, datadir.CLIKeyFile), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{State: fl.state(t, "node-a", false), DataDir: d.dataDir}); err == nil || !bytes.Contains([]byte(err.Error()), []byte("chmod 600")) {
		t.Errorf("a command line key of mode 0644: %v, want a refusal saying chmod 600", err)
	}
}

func TestUnknownServiceAndBadRequestFail(t *testing.T) {
	d := startDaemon(t, newFleet(t, testTD).state(t, "node-a", false), nil)
	cli := d.cli(t)
	err := cli.Call(context.Background(), "nope", "get", nil, nil)
	var f *localapi.Failed
	if !errors.As(err, &f) || !bytes.Contains([]byte(f.Message), []byte(`no service "nope"`)) {
		t.Errorf("unknown service: %v", err)
	}
	err = cli.Call(context.Background(), localapi.ServiceLeases, localapi.MethodAcquire, json.RawMessage(`{"resourc":"gpu0"}`), nil)
	if !errors.As(err, &f) || !bytes.Contains([]byte(f.Message), []byte("unknown field")) {
		t.Errorf("misspelt field: %v", err)
	}
}

// TestLongSocketPath: a socket path longer than a socket address holds
// still serves, through /proc/self/fd.
func TestLongSocketPath(t *testing.T) {
	dir := filepath.Join(shortDir(t), strings.Repeat("d", 60), strings.Repeat("e", 60))
	sock := filepath.Join(dir, "bcd.sock")
	if len(sock) <= localapi.MaxSocketPath {
		t.Fatalf("path %s is not long", sock)
	}
	d := startDaemon(t, newFleet(t, testTD).state(t, "node-a", false), func(c *Config) { c.Socket = sock })
	if err := d.cli(t).Call(context.Background(), localapi.ServiceStatus, localapi.MethodGet, nil, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := listenSocket(sock); err == nil || !strings.Contains(err.Error(), "another bcd node serves") {
		t.Errorf("a second listener on a served socket: %v", err)
	}
}
