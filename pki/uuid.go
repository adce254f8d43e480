package pki

import "regexp"

// canonicalUUIDPattern is a UUID in its canonical text form: lower-case
// hex in 8-4-4-4-12 groups.
var canonicalUUIDPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// IsCanonicalUUID says whether s is a UUID in canonical lower-case form,
// as declarations, pass markers and the kernel's boot id write it.
func IsCanonicalUUID(s string) bool { return canonicalUUIDPattern.MatchString(s) }
