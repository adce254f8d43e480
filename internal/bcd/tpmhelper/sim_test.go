//go:build tpmsim

package tpmhelper

import (
	"testing"

	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// The simulator tests run the test bodies of common_test.go on the
// in-process reference simulator (build tag tpmsim, cgo). The simulator is
// one per process: these tests do not run in parallel.

// openSim manufactures a fresh simulated TPM, closed when the test ends
// after checking that nothing is left loaded.
func openSim(t *testing.T) testTPM {
	t.Helper()
	tp, tr := tpmtest.OpenSim(t)
	tt := testTPM{tp: tp, tr: tr}
	// Cleanups run last-in first-out: this one before the simulator's.
	t.Cleanup(func() {
		if !t.Failed() {
			tt.requireHandles(t, 0)
		}
	})
	return tt
}

func TestSimRoundTrip(t *testing.T)     { testRoundTrip(t, openSim(t)) }
func TestSimLRU(t *testing.T)           { testLRU(t, openSim(t)) }
func TestSimHelperRestart(t *testing.T) { testHelperRestart(t, openSim(t)) }
func TestSimLyingHelper(t *testing.T)   { testLyingHelper(t, openSim(t)) }
func TestSimTimeout(t *testing.T)       { testTimeout(t, openSim(t)) }
