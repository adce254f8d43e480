//go:build tpmsim

package tpmhelper

import "testing"

func TestSimRefusesOtherUID(t *testing.T) { testRefusesOtherUID(t, openSim(t)) }
