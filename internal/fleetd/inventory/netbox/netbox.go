package netbox

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/inventory"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/pki"
)

// The custom fields of a NetBox device that declare what the inventory
// file's fields do (docs/inventory.md, "NetBox").
const (
	FieldProductUUID = "product_uuid"
	FieldClass       = "class"
	FieldInstallDisk = "install_disk"
	// FieldExpectedChassis and FieldExpectedPort are the switch chassis
	// and port the machine's network report must name (expected_port).
	FieldExpectedChassis = "expected_chassis"
	FieldExpectedPort    = "expected_port"
	FieldEKPins          = "ek_pins"
	FieldEKSource        = "ek_source"
	FieldEKReference     = "ek_reference"
)

// bindingFields are the custom fields of an EK binding.
var bindingFields = []string{FieldEKPins, FieldEKSource, FieldEKReference}

// Bounds of what is read from NetBox.
const (
	maxBody     = 8 << 20
	pageSize    = 100
	maxPages    = 20
	changesPage = 200
)

// Config configures a Source.
type Config struct {
	// URL is NetBox's base URL.
	URL string
	// Token is the API token (sent as "Authorization: Token …").
	Token string
	// DeclarerUser is the NetBox user whose writes of a binding are
	// honoured.
	DeclarerUser string
	// RootCAs verify NetBox's certificate; nil means the system's.
	RootCAs *x509.CertPool
	// Timeout bounds each call (default 10s).
	Timeout time.Duration
	// HTTPClient, when set, is used as it is (tests).
	HTTPClient *http.Client
}

// Source reads declarations from NetBox. It is safe for concurrent use.
type Source struct {
	base *url.URL
	cfg  Config
	hc   *http.Client
}

var _ inventory.Source = (*Source)(nil)

// New checks cfg and returns a Source. It does not call NetBox.
func New(cfg Config) (*Source, error) {
	u, err := url.Parse(strings.TrimSuffix(cfg.URL, "/"))
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return nil, fmt.Errorf("url %q is not an http(s) URL", cfg.URL)
	}
	if cfg.Token == "" || cfg.DeclarerUser == "" {
		return nil, errors.New("a token and a declarer user are required")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc = &http.Client{Timeout: cfg.Timeout, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: cfg.RootCAs, MinVersion: tls.VersionTLS12},
			Proxy:           http.ProxyFromEnvironment,
		}}
	}
	return &Source{base: u, cfg: cfg, hc: hc}, nil
}

// Name is "netbox".
func (s *Source) Name() string { return "netbox" }

// device is what fleetd reads of a NetBox device
// (DeviceWithConfigContext in NetBox's schema).
type device struct {
	ID     int64  `json:"id"`
	Name   string `json:"name"`
	Serial string `json:"serial"`
	Role   struct {
		Slug string `json:"slug"`
	} `json:"role"`
	Site struct {
		Slug string `json:"slug"`
	} `json:"site"`
	CustomFields map[string]any `json:"custom_fields"`
}

type page[T any] struct {
	Count   int     `json:"count"`
	Next    *string `json:"next"`
	Results []T     `json:"results"`
}

// objectChange is an entry of /api/core/object-changes/ (ObjectChange).
type objectChange struct {
	Time     time.Time `json:"time"`
	UserName string    `json:"user_name"`
	Action   struct {
		Value string `json:"value"`
	} `json:"action"`
	PreChange  *snapshot `json:"prechange_data"`
	PostChange *snapshot `json:"postchange_data"`
}

type snapshot struct {
	CustomFields map[string]any `json:"custom_fields"`
}

// get reads one JSON document of NetBox.
func (s *Source) get(ctx context.Context, path string, q url.Values, out any) error {
	u := *s.base
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	u.RawQuery = q.Encode()
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Token "+s.cfg.Token)
	req.Header.Set("Accept", "application/json")
	resp, err := s.hc.Do(req)
	if err != nil {
		return fmt.Errorf("netbox %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxBody))
		return fmt.Errorf("netbox %s: %s", path, resp.Status)
	}
	dec := json.NewDecoder(io.LimitReader(resp.Body, maxBody))
	if err := dec.Decode(out); err != nil {
		return fmt.Errorf("netbox %s: decode: %w", path, err)
	}
	return nil
}

// devices lists the devices matching q, following pages.
func (s *Source) devices(ctx context.Context, q url.Values) ([]device, error) {
	var out []device
	q.Set("limit", strconv.Itoa(pageSize))
	for i := 0; i < maxPages; i++ {
		q.Set("offset", strconv.Itoa(i*pageSize))
		var p page[device]
		if err := s.get(ctx, "/api/dcim/devices/", q, &p); err != nil {
			return nil, err
		}
		out = append(out, p.Results...)
		if p.Next == nil || len(p.Results) == 0 {
			return out, nil
		}
	}
	return nil, fmt.Errorf("netbox /api/dcim/devices/: more than %d devices match %s", maxPages*pageSize, q.Encode())
}

func (s *Source) declarations(ctx context.Context, q url.Values) ([]store.Declaration, error) {
	ds, err := s.devices(ctx, q)
	if err != nil {
		return nil, err
	}
	var out []store.Declaration
	for _, d := range ds {
		if decl, ok := toDeclaration(d); ok {
			out = append(out, decl)
		}
	}
	return out, nil
}

// toDeclaration maps a device to a declaration; a device whose name is
// not a valid node id is none.
func toDeclaration(d device) (store.Declaration, bool) {
	if pki.ValidNodeID(d.Name) != nil {
		return store.Declaration{}, false
	}
	cf := func(k string) string { s, _ := d.CustomFields[k].(string); return strings.TrimSpace(s) }
	decl := store.Declaration{Name: d.Name, Serial: d.Serial, ProductUUID: strings.ToLower(cf(FieldProductUUID)),
		Class: cf(FieldClass), InstallDisk: cf(FieldInstallDisk), Site: d.Site.Slug, Role: d.Role.Slug, EKPins: splitPins(cf(FieldEKPins)),
		EKSource: cf(FieldEKSource), EKReference: cf(FieldEKReference),
		SwitchChassis: cf(FieldExpectedChassis), SwitchPort: cf(FieldExpectedPort)}
	if decl.Class == "" {
		decl.Class = d.Role.Slug
	}
	return decl, true
}

// splitPins reads the ek_pins custom field: pins separated by commas or
// white space.
func splitPins(s string) []string {
	out := strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\t' })
	slices.Sort(out)
	return out
}

// Get returns the device named name.
func (s *Source) Get(ctx context.Context, name string) (store.Declaration, error) {
	ds, err := s.declarations(ctx, url.Values{"name": {name}})
	if err != nil {
		return store.Declaration{}, err
	}
	for _, d := range ds {
		if d.Name == name {
			return d, nil
		}
	}
	return store.Declaration{}, fmt.Errorf("netbox has no device %s: %w", name, store.ErrNotFound)
}

// ByClaims returns the devices with the serial numbers or the product UUID
// (custom field) claimed.
func (s *Source) ByClaims(ctx context.Context, productUUID string, serials []string) ([]store.Declaration, error) {
	var out []store.Declaration
	seen := map[string]bool{}
	add := func(ds []store.Declaration) {
		for _, d := range ds {
			if !seen[d.Name] {
				seen[d.Name] = true
				out = append(out, d)
			}
		}
	}
	serials = slices.DeleteFunc(slices.Clone(serials), func(s string) bool { return s == "" })
	if len(serials) > 0 {
		ds, err := s.declarations(ctx, url.Values{"serial": serials})
		if err != nil {
			return nil, err
		}
		add(ds)
	}
	if productUUID != "" {
		// NetBox's custom-field filters take lookups: __ie is exact,
		// ignoring case.
		ds, err := s.declarations(ctx, url.Values{"cf_" + FieldProductUUID + "__ie": {productUUID}})
		if err != nil {
			return nil, err
		}
		add(slices.DeleteFunc(ds, func(d store.Declaration) bool { return d.ProductUUID != productUUID }))
	}
	slices.SortFunc(out, func(a, b store.Declaration) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// ByEKPin returns the devices whose ek_pins custom field names pin.
func (s *Source) ByEKPin(ctx context.Context, pin string) ([]store.Declaration, error) {
	ds, err := s.declarations(ctx, url.Values{"cf_" + FieldEKPins + "__ic": {pin}})
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(ds, func(d store.Declaration) bool { return !slices.Contains(d.EKPins, pin) }), nil
}

// Binding reads the device's object-change log, newest first: the binding
// is honoured when the latest change that wrote any binding field was made
// by the declarer user.
func (s *Source) Binding(ctx context.Context, d store.Declaration) (inventory.Authority, error) {
	devs, err := s.devices(ctx, url.Values{"name": {d.Name}})
	if err != nil {
		return inventory.Authority{}, err
	}
	var id int64 = -1
	for _, dv := range devs {
		if dv.Name == d.Name {
			id = dv.ID
		}
	}
	if id < 0 {
		return inventory.Authority{}, fmt.Errorf("netbox has no device %s: %w", d.Name, store.ErrNotFound)
	}
	q := url.Values{"changed_object_type": {"dcim.device"}, "changed_object_id": {strconv.FormatInt(id, 10)},
		"ordering": {"-time"}, "limit": {strconv.Itoa(changesPage)}}
	for i := 0; i < maxPages; i++ {
		q.Set("offset", strconv.Itoa(i*changesPage))
		var p page[objectChange]
		if err := s.get(ctx, "/api/core/object-changes/", q, &p); err != nil {
			return inventory.Authority{}, err
		}
		for _, c := range p.Results {
			if !writesBinding(c) {
				continue
			}
			when := c.Time.UTC().Format(time.RFC3339)
			if c.UserName != s.cfg.DeclarerUser {
				return inventory.Authority{Why: fmt.Sprintf("NetBox's change log shows %s's EK binding last written by %s at %s, not by the declarer user %s: it authorizes nothing",
					d.Name, c.UserName, when, s.cfg.DeclarerUser)}, nil
			}
			return inventory.Authority{Honoured: true, Why: fmt.Sprintf("written by NetBox user %s at %s", c.UserName, when)}, nil
		}
		if p.Next == nil || len(p.Results) == 0 {
			break
		}
	}
	return inventory.Authority{Why: fmt.Sprintf("NetBox's change log shows no write of %s's EK binding", d.Name)}, nil
}

// writesBinding reports whether a change wrote a binding field: created
// the device with one set, or changed one.
func writesBinding(c objectChange) bool {
	var pre, post map[string]any
	if c.PreChange != nil {
		pre = c.PreChange.CustomFields
	}
	if c.PostChange != nil {
		post = c.PostChange.CustomFields
	}
	for _, f := range bindingFields {
		a, b := fmt.Sprint(pre[f]), fmt.Sprint(post[f])
		if pre[f] == nil {
			a = ""
		}
		if post[f] == nil {
			b = ""
		}
		if a != b {
			return true
		}
	}
	return false
}
