// Package provision renders the provision script a provisioning workflow
// runs in the install environment (seed 003, "Installation and config
// release"): it wipes the device's install disk only when both the boot's
// pass marker (internal/bcd/passmarker's format, for this device and this
// boot) and the install code are present and well formed, then hands over
// to the installer with fleetd's config URL.
package provision

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"net/url"
	"path"
	"regexp"
	"strings"
	"text/template"
	"unicode"

	"github.com/nodetrust/nodetrust/pki"
)

//go:embed provision.sh.tmpl
var scriptText string

var script = template.Must(template.New("provision.sh").Option("missingkey=error").Funcs(template.FuncMap{"sh": shellQuote}).Parse(scriptText))

// Where the install environment keeps the gates' files (docs/install.md).
// /run is a tmpfs: both go with the boot they were made in.
const (
	DefaultPassMarker = "/run/nodetrust/boot-pass"
	DefaultBootIDFile = "/proc/sys/kernel/random/boot_id"
	DefaultCodeFile   = "/run/nodetrust/install-code"
	// DefaultCodePattern is the install code's text form: 256 random
	// bits in unpadded base64url, on one line.
	DefaultCodePattern = `^[A-Za-z0-9_-]{43}$`
)

// Params fill the script.
type Params struct {
	// Device is the node's declared name; ProductUUID its declared
	// product UUID, which the pass marker must name.
	Device      string
	ProductUUID string
	// Disk is the install disk to wipe (an absolute path).
	Disk string
	// FleetdURL is fleetd's HTTPS base URL; the config is at
	// FleetdURL/v1/config/<uuid>.
	FleetdURL string
	// PassMarker, BootIDFile, CodeFile and CodePattern default to the
	// Default* values.
	PassMarker  string
	BootIDFile  string
	CodeFile    string
	CodePattern string
	// Installer, when set, is the program and arguments the script runs
	// after the wipe (it reads NODETRUST_CONFIG_URL and
	// NODETRUST_INSTALL_CODE_FILE); never the code itself.
	Installer []string
}

// Render checks p and returns the script. An error names the parameter.
func Render(p Params) ([]byte, error) {
	if p.PassMarker == "" {
		p.PassMarker = DefaultPassMarker
	}
	if p.BootIDFile == "" {
		p.BootIDFile = DefaultBootIDFile
	}
	if p.CodeFile == "" {
		p.CodeFile = DefaultCodeFile
	}
	if p.CodePattern == "" {
		p.CodePattern = DefaultCodePattern
	}
	p.ProductUUID = strings.ToLower(p.ProductUUID)
	if err := p.check(); err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := script.Execute(&b, p); err != nil {
		return nil, fmt.Errorf("render the provision script: %w", err)
	}
	return b.Bytes(), nil
}

func (p Params) check() error {
	if p.Device == "" {
		return errors.New("provision script: no device name")
	}
	if !pki.IsCanonicalUUID(p.ProductUUID) {
		return fmt.Errorf("provision script: the product UUID %.64q is not 8-4-4-4-12 hex (the declaration's product_uuid)", p.ProductUUID)
	}
	for name, v := range map[string]string{"disk": p.Disk, "pass marker": p.PassMarker, "boot id file": p.BootIDFile, "code file": p.CodeFile} {
		if !path.IsAbs(v) || path.Clean(v) != v {
			return fmt.Errorf("provision script: the %s %.128q is not a clean absolute path", name, v)
		}
	}
	u, err := url.Parse(p.FleetdURL)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return fmt.Errorf("provision script: fleetd's URL %.128q is not an https URL without credentials, query or fragment", p.FleetdURL)
	}
	if _, err := regexp.Compile(p.CodePattern); err != nil || !strings.HasPrefix(p.CodePattern, "^") || !strings.HasSuffix(p.CodePattern, "$") {
		return fmt.Errorf("provision script: the code pattern %.64q is not an anchored regular expression", p.CodePattern)
	}
	all := append([]string{p.Device, p.Disk, p.FleetdURL, p.PassMarker, p.BootIDFile, p.CodeFile, p.CodePattern}, p.Installer...)
	for _, v := range all {
		for _, c := range v {
			if !unicode.IsPrint(c) {
				return fmt.Errorf("provision script: %.64q holds the unprintable character %U", v, c)
			}
		}
	}
	return nil
}

// shellQuote quotes s for bash: one single-quoted word.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
