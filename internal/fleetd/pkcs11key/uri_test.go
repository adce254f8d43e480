package pkcs11key

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseURI(t *testing.T) {
	slot := 3
	tests := []struct {
		name string
		in   string
		want URI
	}{
		{"a token by label with an object", "pkcs11:token=fleet;object=node-ca", URI{Token: "fleet", Object: "node-ca"}},
		{"percent-encoded values and an id", "pkcs11:token=my%20token;object=a%3Bb;id=%01%02%ff;type=private", URI{Token: "my token", Object: "a;b", ID: []byte{1, 2, 0xff}}},
		{"a token by serial", "pkcs11:serial=0123abcd", URI{Serial: "0123abcd"}},
		{"a token by slot", "pkcs11:slot-id=3;object=k", URI{SlotID: &slot, Object: "k"}},
		{"module and PIN file as query attributes", "pkcs11:token=t?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=file:/etc/fleetd/pin",
			URI{Token: "t", ModulePath: "/usr/lib/softhsm/libsofthsm2.so", PINSource: "/etc/fleetd/pin"}},
		{"a PIN source as a plain path", "pkcs11:token=t?pin-source=/run/pin", URI{Token: "t", PINSource: "/run/pin"}},
	}
	for _, tt := range tests {
		t.Run(tt.name+" parses", func(t *testing.T) {
			u, err := ParseURI(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if u.Token != tt.want.Token || u.Serial != tt.want.Serial || u.Object != tt.want.Object || !bytes.Equal(u.ID, tt.want.ID) ||
				u.ModulePath != tt.want.ModulePath || u.PINSource != tt.want.PINSource || (u.SlotID == nil) != (tt.want.SlotID == nil) {
				t.Errorf("ParseURI(%q) = %+v, want %+v", tt.in, u, tt.want)
			}
			again, err := ParseURI(u.String())
			if err != nil || again.String() != u.String() {
				t.Errorf("round trip of %q: %q, %v", u.String(), again, err)
			}
		})
	}
}

func TestParseURIRefuses(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"a PIN in the URI", "pkcs11:token=t?pin-value=1234", "a PIN must not sit in a URI"},
		{"another scheme", "file:/x", `does not start with "pkcs11:"`},
		{"no token", "pkcs11:object=k", "must select its token one way"},
		{"two ways to the token", "pkcs11:token=a;serial=b", "must select its token one way"},
		{"a repeated attribute", "pkcs11:token=a;token=b", `names "token" twice`},
		{"an unsupported attribute", "pkcs11:token=a;manufacturer=x", `attribute "manufacturer" is not supported here`},
		{"a public key type", "pkcs11:token=a;object=k;type=public", "fleetd's keys are private keys"},
		{"a relative module path", "pkcs11:token=a?module-path=lib.so", "not an absolute path"},
		{"a PIN from a command", "pkcs11:token=a?pin-source=|/bin/pin", "want an absolute path or a file: URI"},
		{"a bad escape", "pkcs11:token=a%zz", "invalid URL escape"},
		{"a negative slot", "pkcs11:slot-id=-1", "not a slot number"},
		{"an attribute without a value", "pkcs11:token", "is not name=value"},
		{"a huge URI", "pkcs11:token=" + strings.Repeat("a", 3000), "more than 2048"},
	}
	for _, tt := range tests {
		t.Run(tt.name+" is refused", func(t *testing.T) {
			_, err := ParseURI(tt.in)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("ParseURI(%q) = %v, want an error containing %q", tt.in, err, tt.want)
			}
		})
	}
}

func FuzzParseURI(f *testing.F) {
	for _, s := range []string{"pkcs11:token=fleet;object=node-ca;id=%01", "pkcs11:serial=1?module-path=/m.so&pin-source=file:/p", "pkcs11:slot-id=0", "pkcs11:token=%"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := ParseURI(s)
		if err != nil {
			return
		}
		again, err := ParseURI(u.String())
		if err != nil {
			t.Fatalf("%q parses, its String %q does not: %v", s, u.String(), err)
		}
		if again.String() != u.String() {
			t.Fatalf("round trip changed %q to %q", u.String(), again.String())
		}
	})
}

func TestReadPIN(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Run("the first line is the PIN", func(t *testing.T) {
		pin, err := ReadPIN(write("ok", "1234\r\nignored\n", 0o600))
		if err != nil || pin != "1234" {
			t.Errorf("ReadPIN = %q, %v", pin, err)
		}
	})
	for _, tt := range []struct {
		name, content string
		mode          os.FileMode
		want          string
	}{
		{"a PIN file others may read", "1234\n", 0o644, "others may read the PIN; chmod 600"},
		{"an empty PIN file", "\n", 0o600, "is empty"},
		{"a PIN file too long", strings.Repeat("9", 300), 0o600, "more than a PIN of 256"},
	} {
		t.Run(tt.name+" is refused", func(t *testing.T) {
			_, err := ReadPIN(write(strings.ReplaceAll(tt.name, " ", "-"), tt.content, tt.mode))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("ReadPIN = %v, want %q", err, tt.want)
			}
		})
	}
}
