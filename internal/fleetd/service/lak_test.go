package service

import (
	"strings"
	"testing"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

func TestSubstituteAK(t *testing.T) {
	lak, other := []byte{0x00, 0x0b, 1, 2, 3}, []byte{0x00, 0x0b, 4, 5, 6}
	if err := substituteAK(store.Node{ID: "web-01"}, other); err != nil {
		t.Errorf("a node installed without intake refused AK %x: %v", other, err)
	}
	installed := store.Node{ID: "web-01", LAKName: lak}
	if err := substituteAK(installed, lak); err != nil {
		t.Errorf("a quote by the node's LAK refused: %v", err)
	}
	err := substituteAK(installed, other)
	if err == nil {
		t.Fatal("a quote by another AK than the node's LAK was taken")
	}
	for _, want := range []string{"rule " + RuleLAKSubstitute, "000b040506", "000b010203", "bcd join --attestor tpm"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
}
