package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvDSN names a running server to use instead of starting one: a URL of
// a role that may create databases, e.g. postgres://postgres@127.0.0.1:5432/postgres.
const EnvDSN = "NODETRUST_TEST_POSTGRES_DSN"

// Cluster is a PostgreSQL server for tests.
type Cluster struct {
	// admin is the URL of the maintenance database, as a superuser.
	admin *url.URL

	// For a cluster this package started; empty for EnvDSN.
	bin, data, run, logFile, port string
	asPostgres                    bool

	mu      sync.Mutex
	running bool

	schemaOnce sync.Once
	schemaDB   *url.URL
}

// errMissing marks a PostgreSQL that is not installed.
var errMissing = errors.New("PostgreSQL is not installed")

var shared struct {
	enabled bool
	once    sync.Once
	c       *Cluster
	err     error
	cleanup func()
}

// Main runs a test binary's tests with one cluster shared by every Start,
// started when the first test asks and stopped when the tests end. Call it
// from TestMain: os.Exit(pgtest.Main(m)) is not needed, Main exits.
func Main(m *testing.M) {
	shared.enabled = true
	code := m.Run()
	if shared.cleanup != nil {
		shared.cleanup()
	}
	os.Exit(code)
}

// Start returns a running cluster for t: the binary's shared one when
// TestMain called Main, else one started for t and stopped when t ends
// (or, with EnvDSN, that server). Under CI a missing PostgreSQL fails t;
// elsewhere it skips t. A shared cluster must not be stopped: use StartOwn.
func Start(t testing.TB) *Cluster {
	t.Helper()
	if !shared.enabled {
		return StartOwn(t)
	}
	shared.once.Do(func() { shared.c, shared.cleanup, shared.err = start() })
	if shared.err != nil {
		fail(t, shared.err)
	}
	return shared.c
}

// StartOwn starts a cluster for t alone, stopped when t ends, for tests
// that stop and restart it.
func StartOwn(t testing.TB) *Cluster {
	t.Helper()
	c, cleanup, err := start()
	if err != nil {
		fail(t, err)
	}
	t.Cleanup(cleanup)
	return c
}

func fail(t testing.TB, err error) {
	t.Helper()
	if errors.Is(err, errMissing) {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%v, and CI must run the PostgreSQL tests (scripts/deps.sh installs Debian's postgresql as root)", err)
		}
		t.Skipf("%v; scripts/deps.sh installs it as root", err)
	}
	t.Fatal(err)
}

// start starts a cluster (or takes EnvDSN's) and returns it with the
// function that stops it and removes its files.
func start() (*Cluster, func(), error) {
	if dsn := os.Getenv(EnvDSN); dsn != "" {
		u, err := url.Parse(dsn)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", EnvDSN, err)
		}
		return &Cluster{admin: u, running: true}, func() {}, nil
	}
	bin, err := findBin()
	if err != nil {
		return nil, nil, fmt.Errorf("%w (%v)", errMissing, err)
	}
	c := &Cluster{bin: bin}
	if os.Geteuid() == 0 {
		if _, err := user.Lookup("postgres"); err != nil {
			return nil, nil, fmt.Errorf("%w: running as root, PostgreSQL needs the postgres user to run as (%v)", errMissing, err)
		}
		c.asPostgres = true
	}
	// Not t.TempDir: as root its folder is 0700, and the postgres user
	// must reach this one.
	base, err := os.MkdirTemp("", "nodetrust-pg-")
	if err != nil {
		return nil, nil, err
	}
	cleanup := func() { os.RemoveAll(base) }
	fail := func(err error) (*Cluster, func(), error) { cleanup(); return nil, nil, err }
	if err := os.Chmod(base, 0o755); err != nil {
		return fail(err)
	}
	c.data, c.run, c.logFile = filepath.Join(base, "data"), filepath.Join(base, "run"), filepath.Join(base, "postgres.log")
	for _, d := range []string{c.data, c.run} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return fail(err)
		}
	}
	if err := os.WriteFile(c.logFile, nil, 0o600); err != nil {
		return fail(err)
	}
	if c.asPostgres {
		pw, _ := user.Lookup("postgres")
		uid, _ := strconv.Atoi(pw.Uid)
		gid, _ := strconv.Atoi(pw.Gid)
		for _, p := range []string{base, c.data, c.run, c.logFile} {
			if err := os.Chown(p, uid, gid); err != nil {
				return fail(err)
			}
		}
	}
	if out, err := c.command("initdb", "-D", c.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync").CombinedOutput(); err != nil {
		return fail(fmt.Errorf("initdb: %w\n%s", err, out))
	}
	// A few attempts: another program may take the free port first.
	for attempt := 1; ; attempt++ {
		if c.port, err = freePort(); err != nil {
			return fail(err)
		}
		if err = c.startServer(); err == nil {
			break
		}
		if attempt == 3 {
			return fail(fmt.Errorf("start PostgreSQL: %w\n%s", err, c.Log()))
		}
	}
	c.admin = &url.URL{Scheme: "postgres", User: url.User("postgres"), Host: net.JoinHostPort("127.0.0.1", c.port), Path: "/postgres", RawQuery: "sslmode=disable"}
	return c, func() {
		if err := c.stopServer(); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: stop PostgreSQL: %v\n", err)
		}
		cleanup()
	}, nil
}

// findBin returns the folder of the newest PostgreSQL server binaries.
func findBin() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "pg_ctl")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("no pg_ctl in /usr/lib/postgresql/*/bin or PATH")
}

// command runs one of the server's programs, as the postgres user when the
// tests run as root.
func (c *Cluster) command(name string, args ...string) *exec.Cmd {
	prog := filepath.Join(c.bin, name)
	if c.asPostgres {
		return exec.Command("runuser", append([]string{"-u", "postgres", "--", prog}, args...)...)
	}
	return exec.Command(prog, args...)
}

func (c *Cluster) startServer() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %s -c unix_socket_directories=%s -c fsync=off -c max_connections=200", c.port, c.run)
	out, err := c.command("pg_ctl", "-D", c.data, "-l", c.logFile, "-w", "-t", "60", "-o", opts, "start").CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl start: %w\n%s", err, out)
	}
	c.running = true
	return nil
}

func (c *Cluster) stopServer() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.running || c.data == "" {
		return nil
	}
	out, err := c.command("pg_ctl", "-D", c.data, "-w", "-t", "60", "-m", "fast", "stop").CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl stop: %w\n%s", err, out)
	}
	c.running = false
	return nil
}

// Stop stops the server (fast shutdown: connections are ended), for tests
// of a database that goes away. A cluster from EnvDSN cannot be stopped.
func (c *Cluster) Stop(t testing.TB) {
	t.Helper()
	if c.data == "" {
		t.Fatalf("the PostgreSQL of %s cannot be stopped by a test", EnvDSN)
	}
	if c == shared.c {
		t.Fatal("the shared PostgreSQL cannot be stopped by a test: start one with StartOwn")
	}
	if err := c.stopServer(); err != nil {
		t.Fatal(err)
	}
}

// Restart starts a stopped server again on the same port.
func (c *Cluster) Restart(t testing.TB) {
	t.Helper()
	if err := c.startServer(); err != nil {
		t.Fatalf("restart PostgreSQL: %v\n%s", err, c.Log())
	}
}

// Log returns the server's log file, for failure messages.
func (c *Cluster) Log() string {
	if c.logFile == "" {
		return ""
	}
	b, _ := os.ReadFile(c.logFile)
	return string(b)
}

// NewDatabase creates an empty database for t, dropped when the test
// ends, and returns its URL.
func (c *Cluster) NewDatabase(t testing.TB) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return c.NewDatabaseNamed(t, "nodetrust_"+hex.EncodeToString(b), true)
}

// NewDatabaseNamed creates the database name and returns its URL; with
// drop, it is dropped when t ends.
func (c *Cluster) NewDatabaseNamed(t testing.TB, name string, drop bool) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.admin.String())
	if err != nil {
		t.Fatalf("connect to PostgreSQL at %s: %v", c.admin.Host, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	if !drop {
		u := *c.admin
		u.Path = "/" + name
		return u.String()
	}
	t.Cleanup(func() {
		c.mu.Lock()
		running := c.running
		c.mu.Unlock()
		if !running {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, c.admin.String())
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	})
	u := *c.admin
	u.Path = "/" + name
	return u.String()
}

// NewSchema creates an empty schema for t in one database shared by the
// cluster's schemas, and returns a URL whose connections use it (its
// search_path); cheaper than a database. Notifications are per database:
// use NewDatabase for tests that watch revocations.
func (c *Cluster) NewSchema(t testing.TB) string {
	t.Helper()
	c.schemaOnce.Do(func() {
		u := c.NewDatabaseNamed(t, "nodetrust_schemas", false)
		c.schemaDB, _ = url.Parse(u)
	})
	if c.schemaDB == nil {
		t.Fatal("the shared database of schemas could not be made")
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "s_" + hex.EncodeToString(b)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.schemaDB.String())
	if err != nil {
		t.Fatalf("connect to PostgreSQL at %s: %v", c.admin.Host, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+name); err != nil {
		t.Fatalf("create schema %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if conn, err := pgx.Connect(ctx, c.schemaDB.String()); err == nil {
			_, _ = conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+name+" CASCADE")
			conn.Close(context.Background())
		}
	})
	u := *c.schemaDB
	q := u.Query()
	q.Set("search_path", name)
	u.RawQuery = q.Encode()
	return u.String()
}

// Host is the server's host:port.
func (c *Cluster) Host() string { return c.admin.Host }

func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	_, port, err := net.SplitHostPort(ln.Addr().String())
	return port, err
}
