package tinkerbell

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

func TestNewChecksSettings(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    Settings
		want string
	}{
		{"namespace", Settings{Namespace: "Tink_System", ActionImage: "i"}, "namespace"},
		{"image", Settings{Namespace: "tink-system"}, "action image"},
		{"wait", Settings{Namespace: "tink-system", ActionImage: "i", ActionTimeout: time.Minute, CodeWait: time.Minute}, "shorter"},
	} {
		if _, err := New(nil, tc.s, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
}

// The checks that come before any call to the API server (the client is
// nil: a call would panic).
func TestApplyChecksTheDeclaration(t *testing.T) {
	p, err := New(nil, Settings{Namespace: "tink-system", ActionImage: "i", FleetdURL: "https://fleetd.example"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ok := store.Declaration{Name: "web-01", ProductUUID: "6a1f5c1e-0000-4000-8000-000000000001", MACs: []string{"3c:ec:ef:4c:4f:54"}, InstallDisk: "/dev/sda"}
	for _, tc := range []struct {
		name string
		edit func(*store.Declaration)
		want string
	}{
		{"no MAC", func(d *store.Declaration) { d.MACs = nil }, "no MAC"},
		{"bad MAC", func(d *store.Declaration) { d.MACs = []string{"3c:ec:ef:4c:4f:54:00:01"} }, "not 6 bytes"},
		{"no disk", func(d *store.Declaration) { d.InstallDisk = "" }, "install disk"},
		{"name", func(d *store.Declaration) { d.Name = "Web_01" }, "cannot name"},
		{"uuid", func(d *store.Declaration) { d.ProductUUID = "x" }, "product UUID"},
	} {
		d := ok
		tc.edit(&d)
		if _, err := p.Apply(context.Background(), d); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
	if _, err := p.Start(context.Background(), ok); err == nil || !strings.Contains(err.Error(), "no BMC") {
		t.Errorf("Start without a BMC: %v", err)
	}
}
