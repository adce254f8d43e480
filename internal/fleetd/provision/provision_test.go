package provision

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const (
	uuid   = "6a1f5c1e-0000-4000-8000-000000000001"
	bootID = "0f8e2a51-6a43-4cfc-9a7c-52c2c4a3a1b9"
	code   = "q3VJ0pX6yH2mBf9sT4wLzE8cN1rA7dKgU5oYiW-_abc"
)

// goldenMarker is bcd's pass marker example (internal/bcd/passmarker
// checks that it writes exactly this), for device uuid and boot bootID.
func goldenMarker(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "bcd", "passmarker", "testdata", "boot-pass"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func needBash(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("bash is missing: the provision script's tests run it")
		}
		t.Skip("bash is not installed")
	}
}

type machine struct {
	dir                                  string
	disk, marker, bootID, code, recorded string
	script                               string
}

// newMachine lays out a stand-in install environment: the "disk" is a
// regular file, the boot id a file, and the wipe a script that records
// its arguments.
func newMachine(t *testing.T) *machine {
	t.Helper()
	needBash(t)
	d := t.TempDir()
	m := &machine{dir: d, disk: filepath.Join(d, "disk.img"), marker: filepath.Join(d, "run", "boot-pass"), bootID: filepath.Join(d, "boot_id"),
		code: filepath.Join(d, "run", "install-code"), recorded: filepath.Join(d, "wiped")}
	if err := os.MkdirAll(filepath.Join(d, "run"), 0o700); err != nil {
		t.Fatal(err)
	}
	m.write(t, m.disk, []byte("old system"), 0o600)
	m.write(t, m.bootID, []byte(bootID+"\n"), 0o444)
	m.write(t, filepath.Join(d, "wipe"), []byte("#!/bin/sh\nprintf '%s\\n' \"$@\" >> "+shellQuote(m.recorded)+"\n"), 0o755)
	script, err := Render(Params{Device: "web-01", ProductUUID: strings.ToUpper(uuid), Disk: m.disk, FleetdURL: "https://fleetd.example:8443",
		PassMarker: m.marker, BootIDFile: m.bootID, CodeFile: m.code})
	if err != nil {
		t.Fatal(err)
	}
	m.script = filepath.Join(d, "provision.sh")
	m.write(t, m.script, script, 0o755)
	return m
}

func (m *machine) write(t *testing.T, path string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// run runs the script and returns its exit status, its output and what
// the wipe recorder saw.
func (m *machine) run(t *testing.T) (int, string, string) {
	t.Helper()
	cmd := exec.Command("bash", m.script)
	cmd.Env = append(os.Environ(), "NODETRUST_WIPE_CMD="+filepath.Join(m.dir, "wipe"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	status := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		status = ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	rec, err := os.ReadFile(m.recorded)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), code) {
		t.Fatalf("the script printed the install code:\n%s", out.String())
	}
	return status, out.String(), string(rec)
}

func TestScriptGates(t *testing.T) {
	marker := goldenMarker(t)
	cases := []struct {
		name string
		prep func(t *testing.T, m *machine)
		// want is the refusal's text; "" wipes.
		want string
	}{
		{"both gates", func(t *testing.T, m *machine) {
			m.write(t, m.marker, marker, 0o600)
			m.write(t, m.code, []byte(code+"\n"), 0o600)
		}, ""},
		{"no pass marker", func(t *testing.T, m *machine) {
			m.write(t, m.code, []byte(code+"\n"), 0o600)
		}, "no boot pass marker at"},
		{"no install code", func(t *testing.T, m *machine) {
			m.write(t, m.marker, marker, 0o600)
		}, "no install code at"},
		{"neither", func(t *testing.T, m *machine) {}, "no boot pass marker at"},
		{"marker of another boot", func(t *testing.T, m *machine) {
			m.write(t, m.marker, marker, 0o600)
			m.write(t, m.code, []byte(code), 0o600)
			m.write(t, m.bootID, []byte("11111111-2222-4333-8444-555555555555\n"), 0o444)
		}, "from another boot"},
		{"marker of another device", func(t *testing.T, m *machine) {
			m.write(t, m.marker, bytes.Replace(marker, []byte(uuid), []byte("6a1f5c1e-0000-4000-8000-000000000002"), 1), 0o600)
			m.write(t, m.code, []byte(code), 0o600)
		}, "for another device"},
		{"verdict fail", func(t *testing.T, m *machine) {
			m.write(t, m.marker, bytes.Replace(marker, []byte("verdict pass"), []byte("verdict fail"), 1), 0o600)
			m.write(t, m.code, []byte(code), 0o600)
		}, "does not say verdict pass"},
		{"marker writable by others", func(t *testing.T, m *machine) {
			m.write(t, m.marker, marker, 0o602)
			m.write(t, m.code, []byte(code), 0o600)
		}, "writable by group or others"},
		{"code readable by others", func(t *testing.T, m *machine) {
			m.write(t, m.marker, marker, 0o600)
			m.write(t, m.code, []byte(code), 0o640)
		}, "readable by group or others"},
		{"marker is a link", func(t *testing.T, m *machine) {
			real := filepath.Join(m.dir, "elsewhere")
			m.write(t, real, marker, 0o600)
			if err := os.Symlink(real, m.marker); err != nil {
				t.Fatal(err)
			}
			m.write(t, m.code, []byte(code), 0o600)
		}, "is a symbolic link"},
		{"short code", func(t *testing.T, m *machine) {
			m.write(t, m.marker, marker, 0o600)
			m.write(t, m.code, []byte(code[:42]+"\n"), 0o600)
		}, "install code in"},
		{"code with a second line", func(t *testing.T, m *machine) {
			m.write(t, m.marker, marker, 0o600)
			m.write(t, m.code, []byte(code+"\n"+code+"\n"), 0o600)
		}, "more than one line"},
		{"empty code", func(t *testing.T, m *machine) {
			m.write(t, m.marker, marker, 0o600)
			m.write(t, m.code, nil, 0o600)
		}, "is empty"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := newMachine(t)
			c.prep(t, m)
			status, out, rec := m.run(t)
			if c.want == "" {
				if status != 0 || rec != m.disk+"\n" {
					t.Fatalf("status %d, the wipe recorded %q, want %q; output:\n%s", status, rec, m.disk+"\n", out)
				}
				if !strings.Contains(out, "wiping "+m.disk) {
					t.Fatalf("output does not say what it wipes:\n%s", out)
				}
				return
			}
			if status != 3 || rec != "" {
				t.Fatalf("status %d and the wipe recorded %q, want a refusal (3) and no wipe; output:\n%s", status, rec, out)
			}
			if !strings.Contains(out, "refusing to wipe "+m.disk) || !strings.Contains(out, c.want) {
				t.Fatalf("output %q does not say %q", out, c.want)
			}
		})
	}
}

// The installer runs after the wipe with the config URL and the code's
// file in its environment, never the code in its arguments.
func TestScriptRunsInstaller(t *testing.T) {
	m := newMachine(t)
	seen := filepath.Join(m.dir, "installer-saw")
	m.write(t, filepath.Join(m.dir, "installer"), []byte("#!/bin/sh\nprintf '%s|%s|%s\\n' \"$NODETRUST_CONFIG_URL\" \"$NODETRUST_INSTALL_CODE_FILE\" \"$*\" > "+shellQuote(seen)+"\n"), 0o755)
	script, err := Render(Params{Device: "web-01", ProductUUID: uuid, Disk: m.disk, FleetdURL: "https://fleetd.example:8443",
		PassMarker: m.marker, BootIDFile: m.bootID, CodeFile: m.code, Installer: []string{filepath.Join(m.dir, "installer"), "--mode", "it's metal"}})
	if err != nil {
		t.Fatal(err)
	}
	m.write(t, m.script, script, 0o755)
	m.write(t, m.marker, goldenMarker(t), 0o600)
	m.write(t, m.code, []byte(code+"\n"), 0o600)
	if status, out, rec := m.run(t); status != 0 || rec == "" {
		t.Fatalf("status %d, wipe %q:\n%s", status, rec, out)
	}
	got, err := os.ReadFile(seen)
	if err != nil {
		t.Fatal(err)
	}
	want := "https://fleetd.example:8443/v1/config/" + uuid + "|" + m.code + "|--mode it's metal\n"
	if string(got) != want {
		t.Fatalf("the installer saw %q, want %q", got, want)
	}
}

func TestRenderRefuses(t *testing.T) {
	good := Params{Device: "web-01", ProductUUID: uuid, Disk: "/dev/sda", FleetdURL: "https://fleetd.example"}
	if _, err := Render(good); err != nil {
		t.Fatal(err)
	}
	for want, edit := range map[string]func(*Params){
		"product UUID":        func(p *Params) { p.ProductUUID = "" },
		"the disk":            func(p *Params) { p.Disk = "sda" },
		"the disk \"/dev/../": func(p *Params) { p.Disk = "/dev/../etc/passwd" },
		"not an https URL":    func(p *Params) { p.FleetdURL = "http://fleetd.example" },
		"without credentials": func(p *Params) { p.FleetdURL = "https://user:pw@fleetd.example" },
		"unprintable":         func(p *Params) { p.Device = "web-01\nrm -rf /" },
		"code pattern":        func(p *Params) { p.CodePattern = "[a-z]+" },
		"no device name":      func(p *Params) { p.Device = "" },
	} {
		p := good
		edit(&p)
		if _, err := Render(p); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Render with a bad %s: %v", want, err)
		}
	}
}

// Values are single-quoted words whatever they hold.
func TestShellQuote(t *testing.T) {
	needBash(t)
	for _, s := range []string{"plain", "it's", "$(touch /tmp/x) `y` \"z\" ${HOME}", "a b\tc", ""} {
		out, err := exec.Command("bash", "-c", "printf %s "+shellQuote(s)).Output()
		if err != nil || string(out) != s {
			t.Errorf("bash read %s as %q (%v), want %q", shellQuote(s), out, err, s)
		}
	}
}
