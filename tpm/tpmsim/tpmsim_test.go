//go:build tpmsim

package tpmsim_test

import (
	"context"
	"testing"

	"github.com/nodetrust/nodetrust/tpm/tpmsim"
)

func TestSimOpen(t *testing.T) {
	if !tpmsim.Enabled {
		t.Fatal("Enabled is false in a tpmsim build")
	}
	for i := range 2 {
		tp, err := tpmsim.Open()
		if err != nil {
			t.Fatal(err)
		}
		key, _, err := tp.NewNodeKey(context.Background())
		if err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
		if err := key.Close(); err != nil {
			t.Fatal(err)
		}
		// Close releases the simulator, or the next Open would wait.
		if err := tp.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
