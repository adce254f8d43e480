package console

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/roles"
)

// testClock is a clock the test moves.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// unreachableAdmin is an Admin client of an address nothing serves: each
// call fails UNAVAILABLE, so a request that got that far passed every
// check of the console's own.
func unreachableAdmin(t *testing.T) adminv1.AdminClient {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///127.0.0.1:1", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return adminv1.NewAdminClient(conn)
}

const testAddr = "127.0.0.1:8799"

func newTestConsole(t *testing.T, role roles.Role) (*Console, *testClock) {
	t.Helper()
	clk := &testClock{t: time.Date(2026, 12, 2, 6, 0, 0, 0, time.UTC)}
	c, err := New(Config{Admin: unreachableAdmin(t), Credential: "olga", Role: role, Addr: testAddr, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	return c, clk
}

// do sends a request to the console's handler as a browser at testAddr.
func do(c *Console, method, target string, form url.Values, cookie *http.Cookie) *http.Response {
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	r := httptest.NewRequest(method, "http://"+testAddr+target, body)
	if form != nil {
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if cookie != nil {
		r.AddCookie(cookie)
	}
	w := httptest.NewRecorder()
	c.Handler().ServeHTTP(w, r)
	return w.Result()
}

func login(t *testing.T, c *Console) *http.Cookie {
	t.Helper()
	resp := do(c, http.MethodGet, "/login?code="+c.LoginCode(), nil, nil)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login: %s", resp.Status)
	}
	for _, ck := range resp.Cookies() {
		if ck.Name == "nodetrust_console_8799" {
			return ck
		}
	}
	t.Fatalf("login set no session cookie: %v", resp.Cookies())
	return nil
}

func bodyOf(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestLoginCodeWorksOnce(t *testing.T) {
	c, _ := newTestConsole(t, roles.Owner)
	if resp := do(c, http.MethodGet, "/login?code=wrong", nil, nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a wrong code: %s, want 401", resp.Status)
	}
	resp := do(c, http.MethodGet, "/login?code="+c.LoginCode(), nil, nil)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" {
		t.Fatalf("the code: %s to %q, want 303 to /", resp.Status, resp.Header.Get("Location"))
	}
	ck := resp.Cookies()[0]
	if !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/" || len(ck.Value) < 40 {
		t.Errorf("session cookie %+v: want HttpOnly, SameSite=Strict, path /, a long random value", ck)
	}
	if strings.Contains(ck.Value, c.LoginCode()) {
		t.Error("the session cookie carries the login code")
	}
	if resp := do(c, http.MethodGet, "/login?code="+c.LoginCode(), nil, nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("the code used again: %s, want 401", resp.Status)
	}
	if got := testutil.ToFloat64(c.refusals.WithLabelValues(reasonLogin)); got != 2 {
		t.Errorf("login refusals counted %v, want 2", got)
	}
}

func TestLoginCodeExpires(t *testing.T) {
	c, clk := newTestConsole(t, roles.Owner)
	clk.Advance(16 * time.Minute)
	resp := do(c, http.MethodGet, "/login?code="+c.LoginCode(), nil, nil)
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(bodyOf(t, resp), "restart") {
		t.Errorf("an expired code: %s, want 401 saying to restart the console", resp.Status)
	}
}

func TestSessionsEnd(t *testing.T) {
	c, clk := newTestConsole(t, roles.Owner)
	ck := login(t, c)
	clk.Advance(8*time.Hour + time.Second)
	if resp := do(c, http.MethodGet, "/pending", nil, ck); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a page after the session's end: %s, want 401", resp.Status)
	}
}

func TestPagesNeedASession(t *testing.T) {
	c, _ := newTestConsole(t, roles.Owner)
	for _, p := range []string{"/", "/nodes/web-01", "/pending", "/audit", "/figures", "/nodes/web-01/confirm?action=release"} {
		if resp := do(c, http.MethodGet, p, nil, nil); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s without a session: %s, want 401", p, resp.Status)
		}
	}
	forged := &http.Cookie{Name: "nodetrust_console_8799", Value: "made-up"}
	if resp := do(c, http.MethodGet, "/", nil, forged); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET / with a made-up cookie: %s, want 401", resp.Status)
	}
}

func TestEveryAnswerCarriesTheSecurityHeaders(t *testing.T) {
	c, _ := newTestConsole(t, roles.Owner)
	for _, p := range []string{"/login?code=x", "/static/console.css", "/", "/nope"} {
		resp := do(c, http.MethodGet, p, nil, nil)
		if got := resp.Header.Get("Content-Security-Policy"); got != ContentSecurityPolicy {
			t.Errorf("GET %s: CSP %q", p, got)
		}
		if resp.Header.Get("X-Frame-Options") != "DENY" || resp.Header.Get("Referrer-Policy") != "no-referrer" {
			t.Errorf("GET %s: headers %v", p, resp.Header)
		}
	}
	if !strings.Contains(ContentSecurityPolicy, "default-src 'none'") || strings.Contains(ContentSecurityPolicy, "unsafe") {
		t.Errorf("the CSP is not strict: %s", ContentSecurityPolicy)
	}
}

func TestFormsNeedTheCSRFToken(t *testing.T) {
	c, _ := newTestConsole(t, roles.Owner)
	ck := login(t, c)
	for _, tc := range []struct {
		name string
		form url.Values
	}{
		{"a form without a token", url.Values{"action": {"release"}, "reason": {"r"}}},
		{"a form with another token", url.Values{"action": {"release"}, "reason": {"r"}, "csrf": {"bm90IHRoZSB0b2tlbg"}}},
	} {
		t.Run(tc.name+" is refused", func(t *testing.T) {
			before := testutil.ToFloat64(c.refusals.WithLabelValues(reasonCSRF))
			resp := do(c, http.MethodPost, "/nodes/web-01/action", tc.form, ck)
			if resp.StatusCode != http.StatusForbidden || !strings.Contains(bodyOf(t, resp), "no valid CSRF token") {
				t.Errorf("%s, want 403 naming the CSRF token", resp.Status)
			}
			if got := testutil.ToFloat64(c.refusals.WithLabelValues(reasonCSRF)); got != before+1 {
				t.Errorf("csrf refusals %v, want %v", got, before+1)
			}
		})
	}
	t.Run("a form with the token reaches the Admin API", func(t *testing.T) {
		resp := do(c, http.MethodPost, "/nodes/web-01/action", url.Values{"action": {"release"}, "reason": {"r"}, "csrf": {c.auth.sessions[ck.Value].csrf}}, ck)
		if resp.StatusCode != http.StatusBadGateway || !strings.Contains(bodyOf(t, resp), "Unavailable") {
			t.Errorf("%s, want 502: the unreachable API's answer", resp.Status)
		}
	})
	t.Run("log out needs the token too", func(t *testing.T) {
		if resp := do(c, http.MethodPost, "/logout", url.Values{}, ck); resp.StatusCode != http.StatusForbidden {
			t.Errorf("log out without the token: %s, want 403", resp.Status)
		}
	})
}

func TestRequestsForAnotherHostOrOriginAreRefused(t *testing.T) {
	c, _ := newTestConsole(t, roles.Owner)
	ck := login(t, c)
	r := httptest.NewRequest(http.MethodGet, "http://rebound.example:8799/", nil)
	r.AddCookie(ck)
	w := httptest.NewRecorder()
	c.Handler().ServeHTTP(w, r)
	if w.Code != http.StatusMisdirectedRequest {
		t.Errorf("a request for Host rebound.example: %d, want 421", w.Code)
	}
	form := url.Values{"action": {"release"}, "reason": {"r"}, "csrf": {c.auth.sessions[ck.Value].csrf}}
	r = httptest.NewRequest(http.MethodPost, "http://"+testAddr+"/nodes/web-01/action", strings.NewReader(form.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.Header.Set("Origin", "http://evil.example")
	r.AddCookie(ck)
	w = httptest.NewRecorder()
	c.Handler().ServeHTTP(w, r)
	if w.Code != http.StatusForbidden {
		t.Errorf("a form from another origin: %d, want 403", w.Code)
	}
	if got := testutil.ToFloat64(c.refusals.WithLabelValues(reasonHost)) + testutil.ToFloat64(c.refusals.WithLabelValues(reasonOrigin)); got != 2 {
		t.Errorf("host and origin refusals %v, want 2", got)
	}
}

func TestActionsFollowTheRole(t *testing.T) {
	cases := []struct {
		role  roles.Role
		state string
		want  string
	}{
		{roles.Auditor, "quarantined", ""},
		{roles.Declarer, "active", ""},
		// Only the owner lifts a quarantine (docs/boot-policy.md).
		{roles.Operator, "quarantined", "revoke"},
		{roles.Operator, "active", "quarantine revoke"},
		{roles.Owner, "quarantined", "release revoke retire"},
		{roles.Owner, "retired", ""},
	}
	for _, tc := range cases {
		t.Run(string(tc.role)+" on a "+tc.state+" node", func(t *testing.T) {
			c, _ := newTestConsole(t, tc.role)
			var got []string
			for _, a := range c.actionsFor(tc.state, true) {
				got = append(got, a.Name)
			}
			if strings.Join(got, " ") != tc.want {
				t.Errorf("actions %q, want %q", got, tc.want)
			}
		})
	}
}

func TestClaimedFieldsRenderAsText(t *testing.T) {
	c, _ := newTestConsole(t, roles.Owner)
	hostile := `<script>alert(1)</script>"><img src=x onerror=alert(2)>`
	var b bytes.Buffer
	err := c.pages["fleet"].Execute(&b, layout{Title: "Fleet", CSRF: "t", Data: fleetView{Rows: []nodeRow{{ID: "web-01", Hostname: hostile, State: stateOf("active")}}}})
	if err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if strings.Contains(out, "<script>") || strings.Contains(out, "<img") {
		t.Errorf("the claimed hostname became markup:\n%s", out)
	}
	if !strings.Contains(out, "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Errorf("the claimed hostname is not shown escaped:\n%s", out)
	}
}

func TestBadFormsAreRefusedAndCounted(t *testing.T) {
	c, _ := newTestConsole(t, roles.Owner)
	ck := login(t, c)
	csrf := c.auth.sessions[ck.Value].csrf
	for _, tc := range []struct {
		name string
		form url.Values
		msg  string
	}{
		{"an unknown action", url.Values{"action": {"reboot"}, "reason": {"r"}, "csrf": {csrf}}, "no such action"},
		{"an action without a reason", url.Values{"action": {"release"}, "csrf": {csrf}}, "needs a reason"},
		{"a reason too long", url.Values{"action": {"release"}, "reason": {strings.Repeat("x", maxReason+1)}, "csrf": {csrf}}, "longer than 500"},
		{"a form over 16 KiB", url.Values{"action": {"release"}, "reason": {strings.Repeat("x", maxForm)}, "csrf": {csrf}}, "at most 16 KiB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := testutil.ToFloat64(c.refusals.WithLabelValues(reasonForm))
			resp := do(c, http.MethodPost, "/nodes/web-01/action", tc.form, ck)
			if body := bodyOf(t, resp); resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, tc.msg) {
				t.Errorf("%s, want 400 saying %q", resp.Status, tc.msg)
			}
			if got := testutil.ToFloat64(c.refusals.WithLabelValues(reasonForm)); got != before+1 {
				t.Errorf("form refusals %v, want %v", got, before+1)
			}
		})
	}
}
