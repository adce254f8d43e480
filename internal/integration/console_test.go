package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// xssHostname is the hostname a hostile machine claims.
const xssHostname = `<script>window.__owned=1</script><img src=x onerror="window.__owned=2">`

// TestConsole drives the web console in headless Chromium against a real
// fleetd with nodes joined by the real bcd: the fleet page lists them
// with their states; a quarantine set through the CLI and released from
// the console reaches the store and the node renews again; a hostname
// claimed as <script> renders as text; a form without its CSRF token is
// refused; an auditor sees no action buttons and a forged action is
// refused by the API.
func TestConsole(t *testing.T) {
	ctx := newBrowser(t)
	cp := startControlPlane(t, "node_cert_lifetime = \"40s\"\nrenewal_limit = 1000\npending_poll = \"1s\"\nhttp_listen = \"127.0.0.1:0\"\n")
	operator, auditor := cp.credential(t, "olga", "operator"), cp.credential(t, "audrey", "auditor")

	// Two declared machines that have not joined yet: planned.
	cp.apply(t, "", inventoryFile(decl{"gpu-07", "7d0c4f3e-0000-4000-8000-000000000007", "worker", ""}, decl{"gpu-08", "7d0c4f3e-0000-4000-8000-000000000008", "control-plane", ""}))

	fast := "[renewal]\nfraction = 0.05\nbackoff_min = \"1s\"\nbackoff_max = \"1s\"\n"
	web := newMachine(t, cp, "", fast)
	webID := web.join(t, cp, "--node-id", "web-01")
	hostile := newMachine(t, cp, "", "")
	if err := os.WriteFile(filepath.Join(hostile.claims, "etc", "hostname"), []byte(xssHostname+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	hostileID := hostile.join(t, cp, "--node-id", "db-01")
	a := startAgent(t, web)
	a.waitFor(t, renewedRE, 60*time.Second)

	cp.mustFleetd(t, operator, "nodes", "quarantine", webID, "--reason", "boot check failed")
	a.waitFor(t, regexpMust(`msg="renewal failed".*quarantined`), 60*time.Second)

	owner := startConsole(t, cp, "")
	browse(t, ctx, chromedp.Navigate(owner.loginURL), chromedp.WaitVisible(chromedp.CSS("table.fleet")))

	t.Run("the fleet page lists the nodes with their states", func(t *testing.T) {
		rows := read(t, ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("table.fleet tbody tr")].map(r => r.innerText.replace(/\s+/g, " "))`))
		want := map[string]string{webID: "quarantined", hostileID: "active", "gpu-07": "planned", "gpu-08": "planned"}
		for id, st := range want {
			found := false
			for _, r := range rows {
				if strings.HasPrefix(r, id+" ") && strings.Contains(r, st) {
					found = true
				}
			}
			if !found {
				t.Errorf("no row of %s in state %s: %q", id, st, rows)
			}
		}
		counts := read(t, ctx, chromedp.Text(chromedp.CSS(".counts")))
		if !strings.Contains(counts, "quarantined") || !strings.Contains(counts, "active") {
			t.Errorf("the counts do not name the states: %q", counts)
		}
		screenshot(t, ctx, "fleet")
	})

	t.Run("a hostname claimed as a script renders as text", func(t *testing.T) {
		got := read(t, ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("table.fleet td.claimed")].map(td => td.textContent)`))
		if !contains(got, xssHostname) {
			t.Errorf("the claimed hostname is not shown as its text %q: %q", xssHostname, got)
		}
		browse(t, ctx, chromedp.Navigate(owner.base+"/nodes/"+hostileID), chromedp.WaitVisible(chromedp.CSS("#claims")))
		scripts := read(t, ctx, chromedp.Evaluate[int](`document.querySelectorAll("script, img").length`))
		owned := read(t, ctx, chromedp.Evaluate[bool](`window.__owned !== undefined`))
		if scripts != 0 || owned {
			t.Errorf("the claimed hostname became markup: %d script or img elements, page script ran: %t", scripts, owned)
		}
		if text := read(t, ctx, chromedp.Text(chromedp.CSS("dl.claimed"))); !strings.Contains(text, xssHostname) {
			t.Errorf("the node page does not show the hostname as text: %q", text)
		}
		// A node that never renewed has one certificate: its join's.
		if rows := certRows(t, ctx); len(rows) != 1 || !strings.Contains(rows[0], "(current)") || !strings.Contains(rows[0], " join ") {
			t.Errorf("the certificates of %s read %q, want its one join certificate, current", hostileID, rows)
		}
	})

	t.Run("a form without its CSRF token is refused", func(t *testing.T) {
		before := owner.refusals(t, "csrf")
		browse(t, ctx,
			chromedp.Navigate(owner.base+"/nodes/"+webID+"/confirm?action=release"),
			chromedp.WaitVisible(chromedp.CSS("form.confirm")),
			chromedp.SendKeys(chromedp.CSS("#reason"), "no token"),
		)
		read(t, ctx, chromedp.Evaluate[bool](`document.querySelector("form.confirm input[name=csrf]").remove(); true`))
		browse(t, ctx, chromedp.Click(chromedp.CSS("form.confirm button[type=submit]")), chromedp.WaitVisible(chromedp.CSS("p.message")))
		if msg := read(t, ctx, chromedp.Text(chromedp.CSS("p.message"))); !strings.Contains(msg, "no valid CSRF token") {
			t.Errorf("the refusal says %q", msg)
		}
		if st := cp.nodeState(t, webID); st != "quarantined" {
			t.Errorf("node %s is %s after a form without its token, want quarantined", webID, st)
		}
		if after := owner.refusals(t, "csrf"); after != before+1 {
			t.Errorf("console csrf refusals %v, want %v", after, before+1)
		}
	})

	t.Run("a quarantine released from the console reaches the store and the node renews", func(t *testing.T) {
		browse(t, ctx, chromedp.Navigate(owner.base+"/nodes/"+webID), chromedp.WaitVisible(chromedp.CSS("#identity")))
		screenshot(t, ctx, "node")
		// The node renewed before its quarantine: its renewed certificate
		// is current and listed first, its join certificate last.
		rows := certRows(t, ctx)
		if len(rows) < 2 || !strings.Contains(rows[0], "(current)") || !strings.Contains(rows[0], " renew ") ||
			!strings.Contains(rows[len(rows)-1], " join ") || strings.Count(strings.Join(rows, "\n"), "(current)") != 1 {
			t.Errorf("the certificates of %s read %q, want the current renewal first and the join last", webID, rows)
		}
		// The auditor reads the same list with the CLI.
		if out := cp.mustFleetd(t, auditor, "nodes", "certs", webID).stdout; strings.Count(out, "\n") != len(rows)+1 ||
			!strings.Contains(out, " renew ") || !strings.Contains(out, " join ") {
			t.Errorf("fleetd nodes certs %s printed %q, want a header and %d certificates", webID, out, len(rows))
		}
		// The boot-check section asked ListVerdicts: a token node has none.
		if v := read(t, ctx, chromedp.Text(chromedp.CSS(`section[aria-labelledby="verdicts"]`))); !strings.Contains(v, "no boot check recorded for this node yet") {
			t.Errorf("the node page's boot checks read %q, want the store's empty history", v)
		}
		// Reach the release button with the keyboard alone.
		reached := false
		for range 40 {
			browse(t, ctx, chromedp.KeyEvent(kb.Tab))
			if read(t, ctx, chromedp.Evaluate[string](`document.activeElement.textContent`)) == "Release quarantine…" {
				reached = true
				break
			}
		}
		if !reached {
			t.Fatal("Tab never reached the release button")
		}
		browse(t, ctx, chromedp.KeyEvent(kb.Enter), chromedp.WaitVisible(chromedp.CSS("form.confirm")))
		screenshot(t, ctx, "confirm")
		browse(t, ctx,
			chromedp.SendKeys(chromedp.CSS("#reason"), "firmware reflashed"),
			chromedp.Click(chromedp.CSS("form.confirm button[type=submit]")),
			chromedp.WaitVisible(chromedp.CSS("p.flash")),
		)
		if flash := read(t, ctx, chromedp.Text(chromedp.CSS("p.flash"))); !strings.Contains(flash, webID+" is active") {
			t.Errorf("the console said %q after the release", flash)
		}
		if st := cp.nodeState(t, webID); st != "active" {
			t.Fatalf("node %s is %s in the store after the release, want active", webID, st)
		}
		a.waitFor(t, renewedRE, 60*time.Second)
		if h := cp.history(t, webID); !strings.Contains(h, "firmware reflashed") || !strings.Contains(h, "admin:owner") {
			t.Errorf("the history does not record the console's release by the owner:\n%s", h)
		}
	})

	t.Run("a join approved from the console completes", func(t *testing.T) {
		app := newMachine(t, cp, "", "")
		j := startJoin(t, app, cp.token(t, "--role", "worker", "--node-id", "app-01", "--require-approval"))
		j.waitFor(t, regexpMust(`^bcd: waiting for the control plane's approval`), 30*time.Second)
		browse(t, ctx, chromedp.Navigate(owner.base+"/pending"), chromedp.WaitVisible(chromedp.CSS("#pending")))
		screenshot(t, ctx, "pending")
		browse(t, ctx, chromedp.Click(chromedp.CSS(`a.action[href="/nodes/app-01/confirm?action=approve"]`)), chromedp.WaitVisible(chromedp.CSS("form.confirm")))
		browse(t, ctx, chromedp.Click(chromedp.CSS("form.confirm button[type=submit]")), chromedp.WaitVisible(chromedp.CSS("p.flash")))
		if flash := read(t, ctx, chromedp.Text(chromedp.CSS("p.flash"))); !strings.Contains(flash, "Approved 1 pending join(s) of app-01") {
			t.Errorf("the console said %q after the approval", flash)
		}
		j.waitFor(t, regexpMust(`^joined as app-01 `), 30*time.Second)
	})

	t.Run("the figures page draws charts from the metrics", func(t *testing.T) {
		browse(t, ctx, chromedp.Navigate(owner.base+"/figures"), chromedp.WaitVisible(chromedp.CSS(".charts")))
		n := read(t, ctx, chromedp.Evaluate[int](`document.querySelectorAll("figure.chart svg").length`))
		if n != 4 {
			t.Errorf("%d charts, want 4 (sessions, joins, renewals, refusals)", n)
		}
		screenshot(t, ctx, "figures")
		text := read(t, ctx, chromedp.Text(chromedp.CSS("main")))
		if !strings.Contains(text, "Live sessions") || strings.Contains(text, "latest read failed") {
			t.Errorf("figures page: %q", text)
		}
	})

	t.Run("the pages reflow at 200% zoom", func(t *testing.T) {
		// A 1280-pixel window at 200%: 640 CSS pixels at scale 2.
		browse(t, ctx, chromedp.EmulateViewport(640, 450, chromedp.EmulateScale(2)))
		defer browse(t, ctx, chromedp.EmulateViewport(1280, 900))
		for _, page := range []string{"/nodes/" + webID, "/", "/pending", "/audit", "/figures"} {
			browse(t, ctx, chromedp.Navigate(owner.base+page), chromedp.WaitVisible(chromedp.CSS("main h1")))
			if over := read(t, ctx, chromedp.Evaluate[int](`document.documentElement.scrollWidth - window.innerWidth`)); over > 0 {
				t.Errorf("%s at 200%%: the page is %d CSS pixels wider than the window (scrolls sideways)", page, over)
			}
		}
	})

	t.Run("an auditor sees no action buttons and a forged action is refused", func(t *testing.T) {
		actx := newBrowser(t)
		aud := startConsole(t, cp, auditor)
		browse(t, actx, chromedp.Navigate(aud.loginURL), chromedp.WaitVisible(chromedp.CSS("table.fleet")))
		for i, page := range []string{"/", "/nodes/" + webID, "/nodes/" + hostileID, "/pending", "/audit"} {
			if i > 0 { // the login left the tab on the fleet page
				browse(t, actx, chromedp.Navigate(aud.base+page), chromedp.WaitVisible(chromedp.CSS("main")))
			}
			if h := read(t, actx, chromedp.Evaluate[string](`document.querySelector("main h1")?.textContent ?? document.body.innerText`)); strings.Contains(h, "Refused") || strings.Contains(h, "Not logged in") {
				t.Errorf("the auditor's %s: %q", page, h)
			}
			if n := read(t, actx, chromedp.Evaluate[int](`document.querySelectorAll(".action, form.confirm, button.danger").length`)); n != 0 {
				t.Errorf("the auditor sees %d action buttons on %s", n, page)
			}
		}
		refusedBefore := cp.auditCount(t, "admin.refused")
		// A forged form: the session's own CSRF token (from the log-out
		// form), an action the auditor's role may not take.
		browse(t, actx, chromedp.Navigate(aud.base+"/nodes/"+webID), chromedp.WaitVisible(chromedp.CSS("#identity")))
		read(t, actx, chromedp.Evaluate[bool](`(() => {
			const f = document.createElement("form");
			f.method = "post"; f.action = "/nodes/`+webID+`/action";
			for (const [k, v] of [["csrf", document.querySelector("input[name=csrf]").value], ["action", "quarantine"], ["reason", "forged"]]) {
				const i = document.createElement("input"); i.type = "hidden"; i.name = k; i.value = v; f.appendChild(i);
			}
			document.body.appendChild(f); f.submit(); return true;
		})()`))
		browse(t, actx, chromedp.WaitVisible(chromedp.CSS("p.message")))
		msg := read(t, actx, chromedp.Text(chromedp.CSS("p.message")))
		if !strings.Contains(msg, "PermissionDenied") || !strings.Contains(msg, "auditor") {
			t.Errorf("the forged action was answered %q, want the API's refusal naming the role", msg)
		}
		if st := cp.nodeState(t, webID); st != "active" {
			t.Errorf("node %s is %s after a forged quarantine, want active", webID, st)
		}
		if got := cp.auditCount(t, "admin.refused"); got != refusedBefore+1 {
			t.Errorf("%d admin.refused audit events, want %d", got, refusedBefore+1)
		}
	})
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// certRows is the text of each row of the node page's certificate table.
func certRows(t *testing.T, ctx context.Context) []string {
	t.Helper()
	return read(t, ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("table.certs tbody tr")].map(r => r.innerText.replace(/\s+/g, " "))`))
}
