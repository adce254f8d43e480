package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

var nodeCases = []testCase{
	{"an unknown node is not found", func(t *testing.T, s store.Store) {
		mustJoin(t, s, newJoin("", "node-1", "s1", at(0)))
		_, err := s.GetNode(t.Context(), "node-2")
		wantErr(t, "GetNode(unknown)", err, store.ErrNotFound)
	}},
	{"nodes list in id order", func(t *testing.T, s store.Store) {
		ns, err := s.ListNodes(t.Context())
		if err != nil {
			t.Fatalf("ListNodes on an empty store: %v", err)
		}
		wantIDs(t, "ListNodes on an empty store", ns)
		joins := map[string]store.Join{}
		for i, id := range []string{"node-c", "node-a", "node-d", "node-b"} {
			j := newJoin("", id, "s-"+id, at(time.Duration(i)*time.Minute))
			joins[id] = j
			mustJoin(t, s, j)
		}
		ns, err = s.ListNodes(t.Context())
		if err != nil {
			t.Fatalf("ListNodes: %v", err)
		}
		wantIDs(t, "ListNodes", ns, "node-a", "node-b", "node-c", "node-d")
		for _, n := range ns {
			wantEqual(t, "listed node "+n.ID, normNode, n, joins[n.ID].Node)
		}
	}},
	{"nodes are found by product uuid", func(t *testing.T, s store.Store) {
		joinThree(t, s)
		found, err := s.NodesByClaims(t.Context(), "uuid-node-2", nil)
		if err != nil {
			t.Fatalf("NodesByClaims: %v", err)
		}
		wantIDs(t, "nodes with uuid-node-2", found, "node-2")
		if len(found) == 1 {
			wantEqual(t, "found node", normNode, found[0], mustGetNode(t, s, "node-2"))
		}
	}},
	{"nodes are found by a shared serial", func(t *testing.T, s store.Store) {
		joinThree(t, s)
		found, err := s.NodesByClaims(t.Context(), "", []string{"unrelated", "chassis-node-3"})
		if err != nil {
			t.Fatalf("NodesByClaims: %v", err)
		}
		wantIDs(t, "nodes with serial chassis-node-3", found, "node-3")
	}},
	{"nodes found by uuid and by serial come once each in id order", func(t *testing.T, s store.Store) {
		joinThree(t, s)
		found, err := s.NodesByClaims(t.Context(), "uuid-node-3", []string{"board-node-3", "chassis-node-1", "board-node-1"})
		if err != nil {
			t.Fatalf("NodesByClaims: %v", err)
		}
		wantIDs(t, "nodes", found, "node-1", "node-3")
	}},
	{"claims that match no node find nothing", func(t *testing.T, s store.Store) {
		joinThree(t, s)
		bare := store.Join{
			Now:  at(time.Hour),
			Node: store.Node{ID: "node-bare", State: store.StateActive},
			Cert: store.Cert{Serial: "s-bare", NodeID: "node-bare"},
		}
		mustJoin(t, s, bare) // no product uuid, no serials
		for _, q := range []struct {
			name    string
			uuid    string
			serials []string
		}{
			{"nothing", "", nil},
			{"an unknown uuid", "uuid-node-9", nil},
			{"an unknown serial", "", []string{"board-node-9"}},
			{"a uuid given as a serial", "", []string{"uuid-node-1"}},
			{"a serial given as a uuid", "board-node-1", nil},
			{"a prefix of a serial", "", []string{"board-node"}},
			{"a serial in another case", "", []string{"BOARD-NODE-1"}},
			{"an empty serial", "", []string{""}},
			{"a mac address", "", []string{"02:00:00:00:00:01"}},
		} {
			found, err := s.NodesByClaims(t.Context(), q.uuid, q.serials)
			if err != nil {
				t.Fatalf("NodesByClaims(%s): %v", q.name, err)
			}
			wantIDs(t, "nodes matching "+q.name, found)
		}
	}},
	{"a node is found by the pin of the EK its tpm join proved", func(t *testing.T, s store.Store) {
		j := newJoin("", "node-tpm", "serial-tpm", at(0))
		j.Node.EKPin = "sha256:ek-of-node-tpm"
		mustJoin(t, s, j)
		mustJoin(t, s, newJoin("", "node-token", "serial-token", at(time.Second)))
		n, err := s.NodeByEKPin(t.Context(), "sha256:ek-of-node-tpm")
		if err != nil || n.ID != "node-tpm" || n.EKPin != "sha256:ek-of-node-tpm" {
			t.Fatalf("NodeByEKPin = %+v, %v; want node-tpm with its pin", n, err)
		}
		for _, pin := range []string{"", "sha256:other", "sha256:EK-OF-NODE-TPM"} {
			if _, err := s.NodeByEKPin(t.Context(), pin); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("NodeByEKPin(%q) = %v, want ErrNotFound", pin, err)
			}
		}
		if got := mustGetNode(t, s, "node-token"); got.EKPin != "" {
			t.Errorf("a token node has EK pin %q", got.EKPin)
		}
	}},
}

// joinThree joins node-1, node-2 and node-3 without tokens.
func joinThree(t *testing.T, s store.Store) {
	t.Helper()
	for i, id := range []string{"node-1", "node-2", "node-3"} {
		mustJoin(t, s, newJoin("", id, "s-"+id, at(time.Duration(i)*time.Minute)))
	}
}
