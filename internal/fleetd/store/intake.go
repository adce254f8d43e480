package store

import "time"

// IntakeSession is a passed intake (seed 003, "Attestation and
// admission"): the TPM it proved and the declared device it was admitted
// as, kept so that the admission step that follows can find it while it
// lasts. Nothing in it is secret.
type IntakeSession struct {
	ID string
	// Device is the declaration's name.
	Device string
	// EKPin, EKPublic (TPMT_PUBLIC) are the EK the session proved;
	// AKName and AKPublic the AK credential activation bound to it.
	EKPin    string
	EKPublic []byte
	AKName   []byte
	AKPublic []byte
	// LDevIDSerial and LAKSerial are the serials (decimal) of the
	// certificates the intake issued.
	LDevIDSerial string
	LAKSerial    string
	CreatedAt    time.Time
	// ExpiresAt ends the session: a later step refuses it from then on.
	ExpiresAt time.Time
	// BootVerdict is the verdict on the boot this session quoted:
	// IntakeBootPass, IntakeBootFail (a policy in audit mode) or
	// IntakeBootNone (no boot policy configured).
	BootVerdict string
}

// The verdicts an intake session keeps on the boot it quoted.
const (
	IntakeBootPass = "pass"
	IntakeBootFail = "fail"
	IntakeBootNone = "none"
)
