package bootpolicy

import (
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/nodetrust/nodetrust/attest"
)

// DefaultCapturePCRs are the PCRs [Capture] pins by default: those whose
// value is the same on every machine of a class that runs the same
// firmware with the same Secure Boot databases (see pcrReasons).
var DefaultCapturePCRs = []int{0, 2, 7}

// pcrReasons say what each boot PCR measures (TCG PC Client Platform
// Firmware Profile, section 3.3.4) and why a capture pins it or leaves it
// out; the file's comments repeat them.
var pcrReasons = [8]string{
	0: "firmware code (SRTM, BIOS/UEFI): the same on every machine of the model at one firmware version; a firmware update changes it",
	1: "platform configuration: per machine (serial numbers, memory, boot order and BootXXXX variables, a NIC's MAC on network boot)",
	2: "option ROM and driver code: the same for machines with the same add-in cards",
	3: "option ROM configuration and data: can carry per-device settings (a NIC's MAC, a RAID controller's configuration)",
	4: "boot manager code: covered by boot_applications, which names the image that differs; its value also depends on boot attempts and their order",
	5: "boot manager configuration and the GPT: per disk (partition GUIDs)",
	6: "platform manufacturer specific (wake and resume events): may change from boot to boot",
	7: "Secure Boot policy (SecureBoot, PK, KEK, db, dbx, the authorities used): the same for a class under one set of Secure Boot databases; a dbx update changes it",
}

// CaptureOptions are what [Capture] writes a policy from.
type CaptureOptions struct {
	// Class and Description go into the file.
	Class, Description string
	// EventLog and PCRs are the machine's measurement log and its SHA-256
	// PCR values 0–7 (a verified quote's, or captured with tpm2_pcrread).
	EventLog []byte
	PCRs     map[int][]byte
	// Quote, when not nil, is the AK's quote over PCRs (a node's kept
	// evidence): the check of the captured policy verifies it too, so a
	// capture from evidence whose PCR values are not the quote's fails.
	Quote *Quote
	// PinPCRs are the PCRs pinned in pcr_values; nil means
	// DefaultCapturePCRs, an empty non-nil slice pins none.
	PinPCRs []int
	// Source names the evidence in the file's header ("log boot.log, PCRs
	// pcrs.txt", "node n-123's last verified boot check").
	Source string
	// Now stamps the file; time.Now by default.
	Now time.Time
}

// Capture writes a policy file for opts.Class from one machine's verified
// evidence: its log must replay to its PCRs. The file requires Secure Boot
// when the machine booted with it (and an authority verified its boot
// applications), allows the authorities that verified its boot
// applications, pins every boot application of PCR 4 and the PCRs of
// opts.PinPCRs, with comments saying what was seen, which PCRs were left
// out and why. It then checks the policy against the same evidence, at
// intake and at renewal, and fails unless both pass: the returned verdict
// is the intake one.
func Capture(opts CaptureOptions) ([]byte, *Verdict, error) {
	if !classPattern.MatchString(opts.Class) {
		return nil, nil, fmt.Errorf("class %q is not a class name (lower-case letters, digits, '.', '_' and '-', at most 63)", capString(opts.Class, 64))
	}
	if err := checkPCRs(opts.PCRs); err != nil {
		return nil, nil, err
	}
	pin := opts.PinPCRs
	if pin == nil {
		pin = DefaultCapturePCRs
	}
	for _, i := range pin {
		if i < 0 || i > 7 {
			return nil, nil, fmt.Errorf("PCR %d cannot be pinned: a boot quote covers PCRs 0 to 7", i)
		}
	}
	now := opts.Now
	if now.IsZero() {
		now = time.Now()
	}
	log, err := attest.ReplayEventLog(opts.EventLog, opts.PCRs)
	if err != nil {
		return nil, nil, fmt.Errorf("capture only from a log that replays to its PCRs: %w", err)
	}
	bs := log.BootState()

	f := &policyFile{Class: opts.Class, Description: opts.Description}
	notes := map[string][]string{}
	header := []string{
		fmt.Sprintf("Boot policy of class %q, captured by fleetd policy capture on %s", opts.Class, now.UTC().Format(time.RFC3339)),
		"from " + capString(opts.Source, 200) + ".",
		"Read it before you deploy it: it allows exactly what that machine booted (docs/boot-policy.md).",
	}

	names := map[string]bool{}
	for _, a := range bs.Authorities {
		name := uniqueName(names, authorityName(a))
		f.AllowedAuthorities = append(f.AllowedAuthorities, authorityEntry{
			Name: name, SHA256: "sha256:" + hex.EncodeToString(a.SHA256[:]),
			comment: "subject: " + capString(a.Certificate.Subject.String(), maxSubjectLen),
		})
	}
	sb := bs.SecureBootKnown && bs.SecureBoot
	switch {
	case sb && len(f.AllowedAuthorities) > 0:
		notes["secure_boot"] = []string{"The machine booted with Secure Boot on."}
	case sb:
		sb = false
		notes["secure_boot"] = []string{"The machine booted with Secure Boot on, but no authority verified a boot application in its log,", "so the policy cannot require it with an allowed authority: add one and set secure_boot = true."}
	case bs.SecureBootKnown:
		notes["secure_boot"] = []string{"The machine booted with Secure Boot OFF: this policy does not require it."}
	default:
		notes["secure_boot"] = []string{"The log does not measure PCR 7: the Secure Boot state is unknown, and this policy does not require it."}
	}
	f.SecureBoot = &sb
	if len(f.AllowedAuthorities) > 0 {
		notes["allowed_authorities"] = []string{"The authorities that verified the machine's boot applications (EV_EFI_VARIABLE_AUTHORITY after the PCR 7 separator)."}
		notes["intake_required_authorities"] = []string{"Name here the authorities that must have verified a boot at intake (the install environment's) and at renewal; empty requires none in particular."}
		f.IntakeRequiredAuthorities = []string{}
		f.RenewRequiredAuthorities = []string{}
	}

	pinNames := map[string]bool{}
	seen := map[[32]byte]bool{}
	for _, app := range bs.BootApplications {
		if seen[app.Digest] {
			continue
		}
		seen[app.Digest] = true
		c := capString(app.Type, 48)
		if app.Path != "" {
			c += " " + app.Path
		}
		f.BootApplications = append(f.BootApplications, pinEntry{
			Name: uniqueName(pinNames, applicationName(app, len(f.BootApplications))), SHA256: "sha256:" + hex.EncodeToString(app.Digest[:]), comment: c,
		})
	}
	if len(f.BootApplications) > 0 {
		notes["boot_applications"] = []string{"Every code measurement of PCR 4, in boot order: a boot with any other image fails."}
	}

	var left []string
	for i := range 8 {
		if slices.Contains(pin, i) {
			idx := i
			f.PCRValues = append(f.PCRValues, pcrEntry{Index: &idx, SHA256: "sha256:" + hex.EncodeToString(opts.PCRs[i]), comment: "PCR " + fmt.Sprint(i) + ": " + pcrReasons[i]})
			continue
		}
		left = append(left, fmt.Sprintf("  PCR %d: %s", i, pcrReasons[i]))
	}
	pcrNotes := []string{"PCR values stable for the class, pinned exactly. Left out (pin them with --pin-pcrs if your class's are stable):"}
	pcrNotes = append(pcrNotes, left...)
	notes["pcr_values"] = pcrNotes

	content := formatPolicy(header, f, nil, notes)
	p, err := parsePolicy("", "captured policy", content)
	if err != nil {
		return nil, nil, fmt.Errorf("the captured policy does not load (a bug): %w", err)
	}
	ev := Evidence{Quote: opts.Quote, PCRs: opts.PCRs, EventLog: opts.EventLog}
	var intake *Verdict
	for _, st := range []Stage{Intake, Renewal} {
		v, err := p.Evaluate(st, ev, now)
		if err != nil {
			return nil, nil, err
		}
		if !v.Pass() {
			return nil, v, fmt.Errorf("the captured policy refuses the machine it came from at %s (%s): not written", st, strings.Join(v.Failed, ", "))
		}
		if intake == nil {
			intake = v
		}
	}
	return content, intake, nil
}

var nameJunk = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// authorityName makes a name from a certificate's common name.
func authorityName(a attest.Authority) string {
	n := a.Certificate.Subject.CommonName
	if n == "" && len(a.Certificate.Subject.Organization) > 0 {
		n = a.Certificate.Subject.Organization[0]
	}
	n = strings.Trim(nameJunk.ReplaceAllString(n, "-"), "-")
	if n == "" {
		n = "authority-" + hex.EncodeToString(a.SHA256[:4])
	}
	return capString(n, 64)
}

// applicationName makes a name from an image's file name.
func applicationName(a attest.BootApplication, i int) string {
	n := strings.ReplaceAll(a.Path, `\`, "/")
	n = strings.Trim(nameJunk.ReplaceAllString(path.Base(n), "-"), "-")
	if n == "" || n == "." {
		n = fmt.Sprintf("boot-application-%d", i+1)
	}
	return capString(n, 64)
}

func uniqueName(used map[string]bool, n string) string {
	name := n
	for i := 2; used[name]; i++ {
		name = fmt.Sprintf("%s-%d", n, i)
	}
	used[name] = true
	return name
}

// errNoNext is returned by [Promote] for a policy without a next state.
var errNoNext = errors.New("no [next] state to promote")
