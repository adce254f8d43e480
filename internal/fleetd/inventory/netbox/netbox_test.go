package netbox

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/nodetrust/nodetrust/internal/fleetd/inventory"
	"github.com/nodetrust/nodetrust/internal/fleetd/inventory/netbox/netboxfake"
	"github.com/nodetrust/nodetrust/internal/fleetd/lifecycle"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

const (
	token = "0123456789abcdef0123456789abcdef01234567"
	pinA  = "sha256:aaaa000000000000000000000000000000000000000000000000000000000001"
	pinB  = "sha256:bbbb000000000000000000000000000000000000000000000000000000000002"
)

// recorder keeps every URL the source asked for.
type recorder struct {
	mu   sync.Mutex
	urls []*http.Request
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	r.mu.Lock()
	r.urls = append(r.urls, req)
	r.mu.Unlock()
	return http.DefaultTransport.RoundTrip(req)
}

func start(t *testing.T) (*netboxfake.Fake, *Source, *recorder) {
	t.Helper()
	f := netboxfake.Start(token)
	t.Cleanup(f.Close)
	rec := &recorder{}
	s, err := New(Config{URL: f.URL, Token: token, DeclarerUser: "terraform", HTTPClient: &http.Client{Transport: rec}})
	if err != nil {
		t.Fatal(err)
	}
	return f, s, rec
}

func web(name, serial string, pins ...string) netboxfake.Device {
	return netboxfake.Device{Name: name, Serial: serial, Site: "rack1", Role: "worker", CustomFields: map[string]any{
		"product_uuid": "6A1F5C1E-0000-4000-8000-00000000000" + name[len(name)-1:], "class": "worker",
		"install_disk": " /dev/sda ", "ek_pins": strings.Join(pins, ","), "ek_source": "receiving-scan",
		"expected_chassis": "sw-01", "expected_port": "Gi1/0/17",
	}}
}

func TestBindingsAreHonouredOnlyFromTheDeclarerUser(t *testing.T) {
	f, s, _ := start(t)
	ctx := context.Background()
	f.Put("terraform", web("web-1", "SN1", pinA))
	f.Put("admin", web("web-2", "SN2", pinB))
	f.Put("terraform", web("web-3", "SN3", "sha256:cccc000000000000000000000000000000000000000000000000000000000003"))
	changed := web("web-3", "SN3", "sha256:dddd000000000000000000000000000000000000000000000000000000000004")
	f.Put("admin", changed)
	site := web("web-1", "SN1", pinA)
	site.Site = "rack2"
	f.Put("admin", site) // another user changes the site, not the binding

	for _, tt := range []struct {
		name   string
		device string
		want   bool
		why    string
	}{
		{"written by the declarer user", "web-1", true, "written by NetBox user terraform"},
		{"written by another user", "web-2", false, "last written by admin"},
		{"changed by another user after the declarer wrote it", "web-3", false, "last written by admin"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d, err := s.Get(ctx, tt.device)
			if err != nil {
				t.Fatal(err)
			}
			a, err := s.Binding(ctx, d)
			if err != nil || a.Honoured != tt.want || !strings.Contains(a.Why, tt.why) {
				t.Errorf("Binding(%s) = %+v, %v; want honoured %t, %q", tt.device, a, err, tt.want, tt.why)
			}
		})
	}

	d, err := s.Get(ctx, "web-1")
	if err != nil || d.Site != "rack2" || d.Class != "worker" || d.ProductUUID != "6a1f5c1e-0000-4000-8000-000000000001" || len(d.EKPins) != 1 ||
		d.InstallDisk != "/dev/sda" || d.SwitchChassis != "sw-01" || d.SwitchPort != "Gi1/0/17" {
		t.Errorf("Get(web-1) = %+v, %v", d, err)
	}
	if _, err := s.Get(ctx, "web-9"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get(unknown) = %v, want ErrNotFound", err)
	}
	ds, err := s.ByClaims(ctx, "6a1f5c1e-0000-4000-8000-000000000002", []string{"SN1"})
	if err != nil || len(ds) != 2 || ds[0].Name != "web-1" || ds[1].Name != "web-2" {
		t.Errorf("ByClaims = %+v, %v", ds, err)
	}
	ds, err = s.ByEKPin(ctx, pinB)
	if err != nil || len(ds) != 1 || ds[0].Name != "web-2" {
		t.Errorf("ByEKPin = %+v, %v", ds, err)
	}
	if ds, _ := s.ByEKPin(ctx, pinB[:20]); len(ds) != 0 {
		t.Errorf("a prefix of a pin found %+v", ds)
	}
}

// Through admission, the fake's bindings admit a planned worker only from
// the declarer user; a NetBox that cannot answer refuses.
func TestAdmissionFromNetBox(t *testing.T) {
	f, s, _ := start(t)
	st := openStore(t)
	a := &lifecycle.Admission{Store: st, Source: s, AutoProvision: true}
	f.Put("terraform", web("web-1", "SN1", pinA))
	f.Put("admin", web("web-2", "SN2", pinB))
	ctx := context.Background()

	out, err := a.Decide(ctx, lifecycle.Request{Attestor: "tpm", EKPin: pinA, Claims: store.Claims{Serials: []string{"SN1"}}})
	if err != nil || out.Kind != lifecycle.Declared || out.Decl.Name != "web-1" {
		t.Errorf("the declarer's binding: %+v, %v", out, err)
	}
	_, err = a.Decide(ctx, lifecycle.Request{Attestor: "tpm", EKPin: pinB, Claims: store.Claims{Serials: []string{"SN2"}}})
	var rf *lifecycle.Refusal
	if !errors.As(err, &rf) || !strings.Contains(rf.Reason, "not by the declarer user terraform") {
		t.Errorf("another user's binding: %v", err)
	}
	f.SetDown(true)
	_, err = a.Decide(ctx, lifecycle.Request{Attestor: "tpm", EKPin: pinA, Claims: store.Claims{Serials: []string{"SN1"}}})
	if !errors.Is(err, lifecycle.ErrSourceUnavailable) {
		t.Errorf("NetBox down: %v, want ErrSourceUnavailable", err)
	}
}

func TestTheFakeAndTheSourceFollowNetBoxsSchema(t *testing.T) {
	doc := openAPI(t)
	f, s, rec := start(t)
	f.Put("terraform", web("web-1", "SN1", pinA))
	f.Put("admin", web("web-1", "SN1", pinB))
	ctx := context.Background()
	d, err := s.Get(ctx, "web-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Binding(ctx, d); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ByClaims(ctx, "6a1f5c1e-0000-4000-8000-000000000001", []string{"SN1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ByEKPin(ctx, pinA); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/api/dcim/devices/", "/api/core/object-changes/"} {
		t.Run(path, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodGet, f.URL+path+"?limit=10", nil)
			req.Header.Set("Authorization", "Token "+token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var v any
			if err := json.Unmarshal(body, &v); err != nil {
				t.Fatal(err)
			}
			if n, _ := v.(map[string]any)["count"].(float64); n == 0 {
				t.Fatalf("the fake answered no results: %s", body)
			}
			var errs []string
			conform(doc, responseSchema(doc, path), v, "$", &errs)
			if len(errs) > 0 {
				t.Errorf("the fake's answer does not follow NetBox's schema:\n%s", strings.Join(errs, "\n"))
			}
			// The check itself finds a missing required field.
			first := v.(map[string]any)["results"].([]any)[0].(map[string]any)
			delete(first, "id")
			errs = nil
			conform(doc, responseSchema(doc, path), v, "$", &errs)
			if len(errs) != 1 || !strings.Contains(errs[0], "required id is missing") {
				t.Errorf("a result without its id: %q", errs)
			}
		})
	}
	params := map[string][]string{}
	for _, r := range rec.urls {
		params[r.URL.Path] = append(params[r.URL.Path], keys(r.URL.Query())...)
	}
	for path, used := range params {
		known := parameters(doc, path)
		if known == nil {
			t.Errorf("the source asks for %s, which NetBox's schema does not have", path)
		}
		for _, p := range used {
			// Custom-field filters (cf_<name>) are made by NetBox for each
			// custom field and are not in the static schema.
			if !strings.HasPrefix(p, "cf_") && !contains(known, p) {
				t.Errorf("the source sends %s?%s, a parameter NetBox's schema does not have", path, p)
			}
		}
	}
	for _, r := range rec.urls {
		if r.Header.Get("Authorization") != "Token "+token {
			t.Errorf("request without the token header: %s", r.URL)
		}
	}
}

func keys(m map[string][]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

var _ inventory.Source = (*Source)(nil)
