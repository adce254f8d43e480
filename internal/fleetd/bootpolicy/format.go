package bootpolicy

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// formatPolicy writes f as a policy file: header and the entries'
// comments as TOML comments, the top-level keys before the tables (TOML
// wants them there), then [next] when f has one. given says which keys of
// [next] to write (the others inherit the current state's).
func formatPolicy(header []string, f *policyFile, given map[string]bool, stateNotes map[string][]string) []byte {
	var b bytes.Buffer
	for _, h := range header {
		comment(&b, h)
	}
	if len(header) > 0 {
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "class = %s\n", strconv.Quote(f.Class))
	if f.Description != "" {
		fmt.Fprintf(&b, "description = %s\n", strconv.Quote(f.Description))
	}
	if f.Mode != "" {
		fmt.Fprintf(&b, "mode = %s\n", strconv.Quote(f.Mode))
	}
	writeState(&b, "", &f.stateFile, nil, stateNotes)
	if r := f.Response; r != nil {
		b.WriteString("\n[response]\n")
		if r.QuarantineAfter != nil {
			fmt.Fprintf(&b, "quarantine_after = %d\n", *r.QuarantineAfter)
		}
		if r.Critical != nil {
			q := make([]string, len(r.Critical))
			for i, c := range r.Critical {
				q[i] = strconv.Quote(c)
			}
			fmt.Fprintf(&b, "critical = [%s]\n", strings.Join(q, ", "))
		}
	}
	if n := f.Next; n != nil {
		b.WriteString("\n[next]\n")
		if n.Description != "" {
			fmt.Fprintf(&b, "description = %s\n", strconv.Quote(n.Description))
		}
		fmt.Fprintf(&b, "not_before = %s\n", n.NotBefore.UTC().Format(time.RFC3339))
		fmt.Fprintf(&b, "not_after = %s\n", n.NotAfter.UTC().Format(time.RFC3339))
		writeState(&b, "next.", &n.stateFile, given, nil)
	}
	return b.Bytes()
}

// writeState writes a state's keys; prefix is "" or "next.". With given
// not nil, only the keys it holds are written.
func writeState(b *bytes.Buffer, prefix string, s *stateFile, given map[string]bool, notes map[string][]string) {
	want := func(k string) bool { return given == nil || given[k] }
	section := func(k string) {
		for _, n := range notes[k] {
			comment(b, n)
		}
	}
	if want("secure_boot") && s.SecureBoot != nil {
		section("secure_boot")
		fmt.Fprintf(b, "secure_boot = %t\n", *s.SecureBoot)
	}
	for _, k := range []struct {
		key   string
		names []string
	}{{"intake_required_authorities", s.IntakeRequiredAuthorities}, {"renew_required_authorities", s.RenewRequiredAuthorities}} {
		if !want(k.key) || (given == nil && k.names == nil && len(notes[k.key]) == 0) {
			continue
		}
		section(k.key)
		q := make([]string, len(k.names))
		for i, n := range k.names {
			q[i] = strconv.Quote(n)
		}
		fmt.Fprintf(b, "%s = [%s]\n", k.key, strings.Join(q, ", "))
	}
	// Empty lists given in [next] are written as such, so that they stay
	// given; tables follow.
	type empty struct {
		key string
		n   int
	}
	for _, e := range []empty{{"allowed_authorities", len(s.AllowedAuthorities)}, {"boot_applications", len(s.BootApplications)}, {"pcr_values", len(s.PCRValues)}} {
		if given != nil && given[e.key] && e.n == 0 {
			fmt.Fprintf(b, "%s = []\n", e.key)
		}
	}
	if want("allowed_authorities") && len(s.AllowedAuthorities) > 0 {
		b.WriteByte('\n')
		section("allowed_authorities")
		for _, a := range s.AllowedAuthorities {
			fmt.Fprintf(b, "[[%sallowed_authorities]]\n", prefix)
			if a.comment != "" {
				comment(b, a.comment)
			}
			fmt.Fprintf(b, "name = %s\n", strconv.Quote(a.Name))
			if a.File != "" {
				fmt.Fprintf(b, "file = %s\n", strconv.Quote(a.File))
			} else {
				fmt.Fprintf(b, "sha256 = %s\n", strconv.Quote(a.SHA256))
			}
		}
	}
	if want("boot_applications") && len(s.BootApplications) > 0 {
		b.WriteByte('\n')
		section("boot_applications")
		for _, p := range s.BootApplications {
			fmt.Fprintf(b, "[[%sboot_applications]]\n", prefix)
			if p.comment != "" {
				comment(b, p.comment)
			}
			fmt.Fprintf(b, "name = %s\nsha256 = %s\n", strconv.Quote(p.Name), strconv.Quote(p.SHA256))
		}
	}
	if want("pcr_values") && (len(s.PCRValues) > 0 || len(notes["pcr_values"]) > 0) {
		b.WriteByte('\n')
		section("pcr_values")
		for _, p := range s.PCRValues {
			fmt.Fprintf(b, "[[%spcr_values]]\n", prefix)
			if p.comment != "" {
				comment(b, p.comment)
			}
			fmt.Fprintf(b, "index = %d\nsha256 = %s\n", *p.Index, strconv.Quote(p.SHA256))
		}
	}
}

// comment writes s as comment lines, control characters replaced, so
// that a value from a log (a path, a subject) cannot end the comment.
func comment(b *bytes.Buffer, s string) {
	for _, line := range strings.Split(s, "\n") {
		line = capString(line, 400)
		if line == "" {
			b.WriteString("#\n")
			continue
		}
		b.WriteString("# " + line + "\n")
	}
}
