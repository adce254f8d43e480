//go:build !tpmsim

package tpmsim_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/nodetrust/nodetrust/tpm/tpmsim"
)

func TestOpenWithoutTag(t *testing.T) {
	if tpmsim.Enabled {
		t.Fatal("Enabled is true without the tpmsim tag")
	}
	_, err := tpmsim.Open()
	if !errors.Is(err, tpmsim.ErrDisabled) || !strings.Contains(err.Error(), "-tags tpmsim") {
		t.Fatalf("Open: %v, want ErrDisabled naming the build tag", err)
	}
	if _, err := tpmsim.OpenTransport(); !errors.Is(err, tpmsim.ErrDisabled) {
		t.Fatalf("OpenTransport: %v, want ErrDisabled", err)
	}
}
