package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	agentv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/agent/v1"
	entryv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/entry/v1"
	"github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// spireVersion is the SPIRE the export is tested against; scripts/spire-
// deps.sh builds it into .deps/spire/<version>/bin (make deps, make test).
const spireVersion = "v1.13.3"

// spireBin returns the path of a SPIRE binary, or skips the test (fails
// it under CI) when it was not built.
func spireBin(t testing.TB, name string) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	p := filepath.Join(filepath.Dir(file), "..", "..", ".deps", "spire", spireVersion, "bin", name)
	if _, err := os.Stat(p); err != nil {
		msg := fmt.Sprintf("%s %s is not built (%s): run scripts/spire-deps.sh (make deps does)", name, spireVersion, p)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return p
}

// spireServer is a running spire-server on loopback with a SQLite
// datastore, its API on an admin Unix socket.
type spireServer struct {
	dir, socket, port, trustDomain string
	// pid is spire-server's process; stop stops it (and is called when
	// the test ends).
	pid     int
	stop    func()
	log     *syncBuffer
	conn    *grpc.ClientConn
	entries entryv1.EntryClient
	agents  agentv1.AgentClient
}

// startSPIRE starts a SPIRE server for trustDomain, logging at DEBUG for
// the tests that read its log; it stops when the test ends.
func startSPIRE(t testing.TB, trustDomain string) *spireServer {
	t.Helper()
	return startSPIREWith(t, trustDomain, spireOptions{logLevel: "DEBUG", signingLimit: true})
}

// spireOptions are what differs between the SPIRE servers the tests and
// the benchmark against SPIRE start.
type spireOptions struct {
	// logLevel is the server's log_level.
	logLevel string
	// signingLimit keeps SPIRE's per-IP limit on signing requests
	// (RenewAgent among them), on by default in SPIRE; a benchmark whose
	// every simulated agent is 127.0.0.1 turns it off, as nodetrust-load
	// lifts fleetd's per-source limits.
	signingLimit bool
}

// startSPIREWith starts a SPIRE server for trustDomain as o says.
func startSPIREWith(t testing.TB, trustDomain string, o spireOptions) *spireServer {
	t.Helper()
	server := spireBin(t, "spire-server")
	spireBin(t, "spire-agent")
	// A Unix socket path must stay under 108 bytes: not t.TempDir().
	dir, err := os.MkdirTemp("", "spire-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s := &spireServer{dir: dir, socket: filepath.Join(dir, "api.sock"), port: freePort(t), trustDomain: trustDomain, log: &syncBuffer{}}
	conf := fmt.Sprintf(`server {
	bind_address = "127.0.0.1"
	bind_port = %q
	socket_path = %q
	trust_domain = %q
	data_dir = %q
	log_level = %q
	ratelimit {
		attestation = false
		signing = %t
	}
}
plugins {
	DataStore "sql" {
		plugin_data {
			database_type = "sqlite3"
			connection_string = %q
		}
	}
	KeyManager "memory" {
		plugin_data {}
	}
	NodeAttestor "join_token" {
		plugin_data {}
	}
}
`, s.port, s.socket, trustDomain, filepath.Join(dir, "data"), o.logLevel, o.signingLimit, filepath.Join(dir, "data", "datastore.sqlite3"))
	cfg := filepath.Join(dir, "server.conf")
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	s.pid, s.stop = s.startProc(t, server, "run", "-config", cfg)
	conn, err := grpc.NewClient("unix://"+s.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	s.conn, s.entries, s.agents = conn, entryv1.NewEntryClient(conn), agentv1.NewAgentClient(conn)
	// Ready when its API answers.
	s.eventually(t, "spire-server to answer on its socket", func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		_, err := s.entries.CountEntries(ctx, &entryv1.CountEntriesRequest{})
		return err == nil
	})
	return s
}

// startProc starts a SPIRE binary, logging to s.log, and returns its
// process id and a function that stops it (interrupt, then kill after
// 10 s), called when the test ends if not before.
func (s *spireServer) startProc(t testing.TB, path string, args ...string) (pid int, stop func()) {
	t.Helper()
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = s.log, s.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	stop = sync.OnceFunc(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	t.Cleanup(stop)
	return cmd.Process.Pid, stop
}

// eventually polls cond (a state of the SPIRE server, which offers no
// event to wait on) until it holds, failing the test after 60s.
func (s *spireServer) eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 60s for %s; SPIRE's log:\n%s", what, tail(s.log.String(), 40))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func freePort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
}

// sid is a SPIFFE ID of the server's trust domain in SPIRE's form.
func (s *spireServer) sid(id string) *types.SPIFFEID {
	return &types.SPIFFEID{TrustDomain: s.trustDomain, Path: strings.TrimPrefix(id, "spiffe://"+s.trustDomain)}
}

var tokenRE = regexp.MustCompile(`Token: (\S+)`)

// startAgent makes a join token aliased to alias (SPIRE's own
// registration, as spire-server token generate -spiffeID does), starts a
// spire-agent that attests with it, waits until it has, and returns the
// agent's SPIFFE ID.
func (s *spireServer) startAgent(t *testing.T, alias string) string {
	t.Helper()
	out, err := exec.Command(spireBin(t, "spire-server"), "token", "generate", "-socketPath", s.socket, "-spiffeID", alias, "-ttl", "600").CombinedOutput()
	m := tokenRE.FindSubmatch(out)
	if err != nil || m == nil {
		t.Fatalf("spire-server token generate: %v\n%s", err, out)
	}
	token := string(m[1])
	dir, err := os.MkdirTemp("", "spire-agent-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	conf := fmt.Sprintf(`agent {
	data_dir = %q
	log_level = "DEBUG"
	server_address = "127.0.0.1"
	server_port = %q
	socket_path = %q
	trust_domain = %q
	insecure_bootstrap = true
}
plugins {
	NodeAttestor "join_token" {
		plugin_data {}
	}
	KeyManager "memory" {
		plugin_data {}
	}
	WorkloadAttestor "unix" {
		plugin_data {}
	}
}
`, dir, s.port, filepath.Join(dir, "agent.sock"), s.trustDomain)
	// The token is the agent's credential: it travels in the config
	// file (0600), not in argv.
	conf = strings.Replace(conf, "agent {\n", fmt.Sprintf("agent {\n\tjoin_token = %q\n", token), 1)
	cfg := filepath.Join(dir, "agent.conf")
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	s.startProc(t, spireBin(t, "spire-agent"), "run", "-config", cfg)
	id := "spiffe://" + s.trustDomain + "/spire/agent/join_token/" + token
	s.eventually(t, "the agent to attest", func() bool {
		a, err := s.agents.GetAgent(t.Context(), &agentv1.GetAgentRequest{Id: s.sid(id)})
		return err == nil && a != nil
	})
	return id
}

// banned says whether the agent is banned.
func (s *spireServer) banned(t *testing.T, agentID string) bool {
	t.Helper()
	a, err := s.agents.GetAgent(t.Context(), &agentv1.GetAgentRequest{Id: s.sid(agentID)})
	if err != nil {
		t.Fatalf("GetAgent %s: %v", agentID, err)
	}
	return a.Banned
}

// createEntry creates a registration nodetrust does not own and returns
// its id.
func (s *spireServer) createEntry(t *testing.T, spiffeID, parentID string, selectors ...string) string {
	t.Helper()
	e := &types.Entry{SpiffeId: s.sid(spiffeID), ParentId: s.sid(parentID)}
	for _, x := range selectors {
		typ, val, _ := strings.Cut(x, ":")
		e.Selectors = append(e.Selectors, &types.Selector{Type: typ, Value: val})
	}
	resp, err := s.entries.BatchCreateEntry(t.Context(), &entryv1.BatchCreateEntryRequest{Entries: []*types.Entry{e}})
	if err != nil || len(resp.Results) != 1 || resp.Results[0].Status.GetCode() != 0 {
		t.Fatalf("create entry %s: %v %v", spiffeID, err, resp)
	}
	return resp.Results[0].Entry.Id
}

// entriesByHint lists the entries with the hint ("" for all), as
// "id spiffe-id rev" lines keyed by id.
func (s *spireServer) entriesByHint(t *testing.T, hint string) map[string]*types.Entry {
	t.Helper()
	f := &entryv1.ListEntriesRequest_Filter{}
	if hint != "" {
		f.ByHint = wrapperspb.String(hint)
	}
	out := map[string]*types.Entry{}
	token := ""
	for {
		resp, err := s.entries.ListEntries(t.Context(), &entryv1.ListEntriesRequest{Filter: f, PageSize: 1000, PageToken: token})
		if err != nil {
			t.Fatalf("ListEntries: %v", err)
		}
		for _, e := range resp.Entries {
			out[e.Id] = e
		}
		if token = resp.NextPageToken; token == "" || len(resp.Entries) == 0 {
			return out
		}
	}
}

// notOwned are the entries without nodetrust's hint, as id → revision.
func (s *spireServer) notOwned(t *testing.T) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for id, e := range s.entriesByHint(t, "") {
		if e.Hint != "nodetrust" {
			out[id] = e.RevisionNumber
		}
	}
	return out
}
