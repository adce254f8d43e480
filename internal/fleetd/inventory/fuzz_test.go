package inventory

import (
	"errors"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/roles"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// FuzzParse: the parser takes any bytes an admin call carries without
// panicking; what it accepts plans to nothing once applied, and what it
// refuses it refuses with a listed error.
func FuzzParse(f *testing.F) {
	f.Add([]byte(good))
	f.Add(Sample(3))
	f.Add([]byte("version: 1\nnodes:\n  - name: a\n    class: worker\n    serial: [x]\n"))
	f.Add([]byte("version: 1\nnodes: &a [*a]\n"))
	f.Add([]byte("{version: 1, nodes: [{name: b, class: worker, product_uuid: 6a1f5c1e-0000-4000-8000-000000000001, ek_binding: {pins: [], source: x}}]}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ds, err := Parse(data, classes)
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) || len(pe.Errors) == 0 {
				t.Fatalf("a refusal without listed errors: %v", err)
			}
			return
		}
		w := Writer{Name: "alice", Role: roles.Declarer}
		p := MakePlan(nil, nil, ds, w, time.Unix(0, 0), "r", nil)
		var current []store.Declaration
		for _, wr := range p.Writes {
			d := wr.Declaration
			d.Version = 1
			current = append(current, d)
		}
		if again := MakePlan(current, nil, ds, w, time.Unix(1, 0), "r", nil); !again.Empty() {
			t.Fatalf("an applied file plans changes again: %+v", again.Devices)
		}
	})
}
