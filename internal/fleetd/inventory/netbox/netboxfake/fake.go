package netboxfake

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Device is a device as the fake keeps it.
type Device struct {
	Name         string
	Serial       string
	Site         string // slug
	Role         string // slug
	CustomFields map[string]any
}

// Fake is a running fake NetBox on loopback.
type Fake struct {
	// URL is its base URL.
	URL   string
	Token string
	srv   *httptest.Server

	mu      sync.Mutex
	down    bool
	devices map[int64]*Device
	changes []change
	nextID  int64
	now     time.Time
	// Requests counts the requests served, by path.
	requests map[string]int
}

type change struct {
	id        int64
	time      time.Time
	user      string
	action    string
	deviceID  int64
	pre, post map[string]any
}

// Start runs a fake NetBox that accepts token; Close stops it.
func Start(token string) *Fake {
	f := &Fake{Token: token, devices: map[int64]*Device{}, nextID: 1, now: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC), requests: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/dcim/devices/", f.listDevices)
	mux.HandleFunc("GET /api/core/object-changes/", f.listChanges)
	f.srv = httptest.NewServer(f.auth(mux))
	f.URL = f.srv.URL
	return f
}

// Close stops the fake.
func (f *Fake) Close() { f.srv.Close() }

// SetDown makes every request fail with 503 Service Unavailable (down) or
// be served again.
func (f *Fake) SetDown(down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = down
}

// Requests returns how many requests path was served.
func (f *Fake) Requests(path string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests[path]
}

// Put creates or updates the device named d.Name as NetBox user user, and
// records the object change NetBox would.
func (f *Fake) Put(user string, d Device) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(time.Second)
	d.CustomFields = maps.Clone(d.CustomFields)
	for id, old := range f.devices {
		if old.Name == d.Name {
			pre := snapshot(id, old)
			f.devices[id] = &d
			f.changes = append(f.changes, change{id: int64(len(f.changes) + 1), time: f.now, user: user, action: "update", deviceID: id, pre: pre, post: snapshot(id, &d)})
			return
		}
	}
	id := f.nextID
	f.nextID++
	f.devices[id] = &d
	f.changes = append(f.changes, change{id: int64(len(f.changes) + 1), time: f.now, user: user, action: "create", deviceID: id, post: snapshot(id, &d)})
}

func (f *Fake) auth(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		down := f.down
		f.requests[r.URL.Path]++
		f.mu.Unlock()
		if down {
			http.Error(w, `{"detail": "fake NetBox is down"}`, http.StatusServiceUnavailable)
			return
		}
		if r.Header.Get("Authorization") != "Token "+f.Token {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			_, _ = w.Write([]byte(`{"detail": "Invalid token"}`))
			return
		}
		h.ServeHTTP(w, r)
	})
}

func brief(kind string, id int64, base, name string) map[string]any {
	return map[string]any{"id": id, "url": fmt.Sprintf("%s/api/%s/%d/", base, kind, id), "display": name, "name": name, "slug": name}
}

// deviceJSON is a DeviceWithConfigContext.
func (f *Fake) deviceJSON(id int64, d *Device) map[string]any {
	role := brief("dcim/device-roles", 1, f.URL, d.Role)
	role["_depth"] = 0
	mfr := brief("dcim/manufacturers", 1, f.URL, "fake")
	dt := map[string]any{"id": 1, "url": f.URL + "/api/dcim/device-types/1/", "display": "fake server", "manufacturer": mfr, "model": "server", "slug": "server"}
	cf := maps.Clone(d.CustomFields)
	if cf == nil {
		cf = map[string]any{}
	}
	return map[string]any{
		"id": id, "url": fmt.Sprintf("%s/api/dcim/devices/%d/", f.URL, id), "display_url": fmt.Sprintf("%s/dcim/devices/%d/", f.URL, id),
		"display": d.Name, "name": d.Name, "serial": d.Serial, "device_type": dt, "role": role, "site": brief("dcim/sites", 1, f.URL, d.Site),
		"status": map[string]any{"value": "planned", "label": "Planned"}, "custom_fields": cf, "tags": []any{},
		"console_port_count": 0, "console_server_port_count": 0, "power_port_count": 0, "power_outlet_count": 0,
		"interface_count": 0, "front_port_count": 0, "rear_port_count": 0, "device_bay_count": 0, "module_bay_count": 0, "inventory_item_count": 0,
	}
}

func snapshot(id int64, d *Device) map[string]any {
	return map[string]any{"id": id, "name": d.Name, "serial": d.Serial, "custom_fields": maps.Clone(d.CustomFields)}
}

func (f *Fake) listDevices(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f.mu.Lock()
	var ids []int64
	for id, d := range f.devices {
		if matches(d, q) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	results := make([]any, 0, len(ids))
	for _, id := range ids {
		results = append(results, f.deviceJSON(id, f.devices[id]))
	}
	f.mu.Unlock()
	writePage(w, r, results)
}

// matches applies the filters fleetd uses: name, serial (each given value
// matches), cf_<field> (exact), cf_<field>__ie (exact, ignoring case) and
// cf_<field>__ic (contains, ignoring case).
func matches(d *Device, q map[string][]string) bool {
	for k, vs := range q {
		switch {
		case k == "limit" || k == "offset":
		case k == "name":
			if !slices.Contains(vs, d.Name) {
				return false
			}
		case k == "serial":
			if !slices.Contains(vs, d.Serial) {
				return false
			}
		case strings.HasPrefix(k, "cf_"):
			field, lookup, _ := strings.Cut(strings.TrimPrefix(k, "cf_"), "__")
			v, _ := d.CustomFields[field].(string)
			ok := false
			for _, want := range vs {
				switch lookup {
				case "ic":
					ok = ok || strings.Contains(strings.ToLower(v), strings.ToLower(want))
				case "ie":
					ok = ok || strings.EqualFold(v, want)
				default:
					ok = ok || v == want
				}
			}
			if !ok {
				return false
			}
		}
	}
	return true
}

func (f *Fake) listChanges(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f.mu.Lock()
	var out []change
	for _, c := range f.changes {
		if t := q.Get("changed_object_type"); t != "" && t != "dcim.device" {
			continue
		}
		if id := q.Get("changed_object_id"); id != "" && id != strconv.FormatInt(c.deviceID, 10) {
			continue
		}
		if u := q.Get("user_name"); u != "" && u != c.user {
			continue
		}
		out = append(out, c)
	}
	if q.Get("ordering") == "-time" {
		slices.Reverse(out)
	}
	results := make([]any, 0, len(out))
	for _, c := range out {
		label := map[string]string{"create": "Created", "update": "Updated", "delete": "Deleted"}[c.action]
		var pre, post any
		if c.pre != nil {
			pre = c.pre
		}
		if c.post != nil {
			post = c.post
		}
		results = append(results, map[string]any{
			"id": c.id, "url": fmt.Sprintf("%s/api/core/object-changes/%d/", f.URL, c.id), "display_url": fmt.Sprintf("%s/core/changelog/%d/", f.URL, c.id),
			"display": fmt.Sprintf("%s device %d", c.action, c.deviceID), "time": c.time.Format(time.RFC3339Nano),
			"user":      map[string]any{"id": 1, "url": f.URL + "/api/users/users/1/", "display": c.user, "username": c.user},
			"user_name": c.user, "request_id": fmt.Sprintf("00000000-0000-4000-8000-%012d", c.id),
			"action":              map[string]any{"value": c.action, "label": label},
			"changed_object_type": "dcim.device", "changed_object_id": c.deviceID, "changed_object": nil,
			"prechange_data": pre, "postchange_data": post,
		})
	}
	f.mu.Unlock()
	writePage(w, r, results)
}

// writePage writes a Paginated…List of results, honouring limit and
// offset.
func writePage(w http.ResponseWriter, r *http.Request, all []any) {
	limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
	offset, _ := strconv.Atoi(r.URL.Query().Get("offset"))
	if limit <= 0 {
		limit = 50
	}
	offset = min(max(offset, 0), len(all))
	end := min(offset+limit, len(all))
	var next any
	if end < len(all) {
		u := *r.URL
		q := u.Query()
		q.Set("offset", strconv.Itoa(end))
		u.RawQuery = q.Encode()
		next = "http://" + r.Host + u.String()
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"count": len(all), "next": next, "previous": nil, "results": all[offset:end]})
}
