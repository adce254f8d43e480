package inventory

import (
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/roles"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// BenchmarkPlan1000 parses a 1,000-machine inventory and plans it against
// the same inventory applied: the work of an apply that changes nothing.
func BenchmarkPlan1000(b *testing.B) {
	data := Sample(1000)
	ds, err := Parse(data, classes)
	if err != nil {
		b.Fatal(err)
	}
	current := make([]store.Declaration, len(ds))
	for i, d := range ds {
		d.Version = 1
		current[i] = d
	}
	w := Writer{Name: "alice", Role: roles.Declarer}
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		desired, err := Parse(data, classes)
		if err != nil {
			b.Fatal(err)
		}
		if p := MakePlan(current, nil, desired, w, time.Now(), "r", nil); !p.Empty() {
			b.Fatal("a plan of the applied file changes something")
		}
	}
}
