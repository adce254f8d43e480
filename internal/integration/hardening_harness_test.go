package integration

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	_ "modernc.org/sqlite" // the driver that reads fleetd's store

	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/pki/tlspin"
)

// The helpers of the hardening tests (docs/security.md): a gRPC client of
// the control plane, its metrics, its process's descriptors and memory,
// and its audit trail read from the store file.

var httpsRE = regexp.MustCompile(`msg="fleetd serving" grpc=\S+ https=(\S+)`)

// joinClient is a JoinService client of cp over pinned TLS, with no
// client certificate, as any caller on the network has.
func (cp *controlPlane) joinClient(t *testing.T) joinv1.JoinServiceClient {
	t.Helper()
	pin, err := pki.ParsePin(cp.bundle.ServingCASPKIPin)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("passthrough:///"+cp.addr, grpc.WithTransportCredentials(credentials.NewTLS(tlspin.Client(pin, "fleetd.test", nil))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return joinv1.NewJoinServiceClient(conn)
}

// sealedJoin is a token join with secret sealed to a new key's CSR.
func (cp *controlPlane) sealedJoin(t *testing.T, secret string) *joinv1.JoinRequest {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(cp.dir, "pki", "join-encryption.jwk"))
	if err != nil {
		t.Fatal(err)
	}
	pub, err := pki.ParseJWK(b)
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.CreateCSR(key)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(csr)
	sealed, err := pki.SealToken(pub, h[:], []byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	return &joinv1.JoinRequest{Csr: csr, Attestor: "token", SealedToken: sealed, Claims: &joinv1.HardwareClaims{Hostname: "replay"}}
}

// metric reads one sample of /metrics on cp's HTTPS listener: the line
// that starts with series (a name and its labels, as Prometheus prints
// them); 0 when there is none.
func (cp *controlPlane) metric(t *testing.T, series string) float64 {
	t.Helper()
	m := httpsRE.FindStringSubmatch(cp.log.String())
	if m == nil {
		t.Fatalf("fleetd serves no HTTPS (http_listen):\n%s", cp.log)
	}
	ca, err := os.ReadFile(filepath.Join(cp.dir, "pki", pki.ServingCACertFile))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "fleetd.test"}}}
	resp, err := c.Get("https://" + m[1] + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 4<<20))
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			v, err := strconv.ParseFloat(rest, 64)
			if err != nil {
				t.Fatalf("metric %s: %v", series, err)
			}
			return v
		}
	}
	return 0
}

// waitMetric polls a metric until it reaches at least want.
func (cp *controlPlane) waitMetric(t *testing.T, series string, want float64) float64 {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		v := cp.metric(t, series)
		if v >= want {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("metric %s is %v, want at least %v", series, v, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// procUsage is a process's open descriptors and resident memory.
type procUsage struct {
	fds        int
	rssKiB     int
	peakRSSKiB int
}

func usageOf(pid int) (procUsage, error) {
	var u procUsage
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return u, err
	}
	u.fds = len(ents)
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return u, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "VmRSS:":
			u.rssKiB, _ = strconv.Atoi(f[1])
		case "VmHWM:":
			u.peakRSSKiB, _ = strconv.Atoi(f[1])
		}
	}
	return u, nil
}

// auditCount counts the audit records of action in cp's store, read
// from the SQLite file while fleetd runs.
func (cp *controlPlane) auditCount(t *testing.T, action string) int {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(cp.dir, "data", "fleetd.db")+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRowContext(context.Background(), "SELECT count(*) FROM audit WHERE action = ?", action).Scan(&n); err != nil {
		t.Fatalf("count audit records: %v", err)
	}
	return n
}

// logLines counts the lines of cp's log.
func (cp *controlPlane) logLines() int { return strings.Count(cp.log.String(), "\n") }
