package launch

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

const demo = `
name = "demo"

[machines.node-a]
address = "127.0.0.1:7443"

[machines.node-b]

[instances.trainer]
node = "node-b"

[instances.logger]
node = "node-a"
`

func TestParseAndCheck(t *testing.T) {
	l, err := Parse([]byte(demo))
	if err != nil {
		t.Fatal(err)
	}
	if l.Address("node-a") != "127.0.0.1:7443" || l.Address("node-b") != "" {
		t.Errorf("addresses %+v", l.Machines)
	}
	if err := l.Check("node-b", "trainer"); err != nil {
		t.Errorf("trainer on node-b: %v", err)
	}
	for _, tc := range []struct{ node, inst, want string }{
		{"node-c", "trainer", `places instance "trainer" on node "node-b", not on node "node-c"`},
		{"node-a", "trainer", `not on node "node-a"`},
		{"node-b", "intruder", `places no instance "intruder"`},
	} {
		err := l.Check(tc.node, tc.inst)
		if !errors.Is(err, ErrNotPlaced) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Check(%s, %s) = %v, want %q", tc.node, tc.inst, err, tc.want)
		}
	}
	if got := l.Placed("node-a"); len(got) != 1 || got[0] != "logger" {
		t.Errorf("Placed(node-a) = %v", got)
	}
	b, _ := json.Marshal(l)
	again, err := ParseJSON(b)
	if err != nil || again.Check("node-b", "trainer") != nil {
		t.Fatalf("JSON round trip: %v", err)
	}
}

func TestParseRefuses(t *testing.T) {
	for _, tc := range []struct{ name, file, want string }{
		{"no name", `[machines.node-a]`, "launch name"},
		{"a misspelt key", "name = \"x\"\n[instances.a]\nnode = \"n\"\nnodes = \"m\"\n", "unknown setting instances.a.nodes"},
		{"an instance on a machine not listed", "name = \"x\"\n[instances.a]\nnode = \"node-z\"\n", "not under [machines]"},
		{"an instance with no node", "name = \"x\"\n[instances.a]\n", "node is missing"},
		{"a reserved instance name", "name = \"x\"\n[machines.n]\n[instances.nodetrust-cli]\nnode = \"n\"\n", "kept for the command line"},
		{"a bad node id", "name = \"x\"\n[machines.Node]\n", "machines.Node"},
		{"a bad address", "name = \"x\"\n[machines.n]\naddress = \"nohost\"\n", "want host:port"},
		{"not TOML", "name = ", "launch file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.file))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse = %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

// FuzzParse: parsing never panics; what parses validates, survives a JSON
// round trip, and places each of its instances where it says.
func FuzzParse(f *testing.F) {
	f.Add([]byte(demo))
	f.Add([]byte("name = \"x\"\n"))
	f.Add([]byte("[instances.a]\nnode = 1\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		l, err := Parse(data)
		if err != nil {
			return
		}
		b, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		again, err := ParseJSON(b)
		if err != nil {
			t.Fatalf("a parsed launch does not parse back from JSON: %v", err)
		}
		for name, in := range l.Instances {
			if err := again.Check(in.Node, name); err != nil {
				t.Fatalf("instance %s: %v", name, err)
			}
		}
	})
}
