package tpm_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/nodetrust/nodetrust/tpm"
)

func TestOpen(t *testing.T) {
	t.Run("off is no TPM", func(t *testing.T) {
		if _, err := tpm.Open("off"); !errors.Is(err, tpm.ErrNoTPM) {
			t.Fatalf("Open(off): %v, want ErrNoTPM", err)
		}
	})
	t.Run("auto without a device is no TPM", func(t *testing.T) {
		if _, err := os.Stat(tpm.DefaultDevice); err == nil {
			t.Skipf("this host has %s", tpm.DefaultDevice)
		}
		if _, err := tpm.Open("auto"); !errors.Is(err, tpm.ErrNoTPM) {
			t.Fatalf("Open(auto): %v, want ErrNoTPM", err)
		}
	})
	refused := []struct{ spec, substr string }{
		{"sim", "want"},
		{"dev/tpm0", "want"},
		{"tcp://127.0.0.1", "tcp://host:port"},
		{"tcp://127.0.0.1:0", "port"},
		{"tcp://127.0.0.1:65535", "port"},
		{"tcp://127.0.0.1:2321/path", "tcp://host:port"},
		{"/nonexistent/tpm0", "open TPM /nonexistent/tpm0"},
	}
	for _, tc := range refused {
		t.Run("refuses "+tc.spec, func(t *testing.T) {
			tp, err := tpm.Open(tc.spec)
			if err == nil {
				tp.Close()
				t.Fatal("Open succeeded")
			}
			if errors.Is(err, tpm.ErrNoTPM) || !strings.Contains(err.Error(), tc.substr) {
				t.Fatalf("Open(%q): %v, want an error mentioning %q", tc.spec, err, tc.substr)
			}
		})
	}
	t.Run("nothing listens", func(t *testing.T) {
		// Port 1 on loopback: nothing listens there in a test.
		if _, err := tpm.Open("tcp://127.0.0.1:1"); err == nil || !strings.Contains(err.Error(), "tcp://127.0.0.1:1") {
			t.Fatalf("Open: %v, want a connection error naming the address", err)
		}
	})
}
