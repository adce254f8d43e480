package inventory

import (
	"fmt"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/roles"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// Writer is the admin credential an apply runs as.
type Writer struct {
	Name string
	Role roles.Role
}

// What a plan does to one device.
const (
	KindAdd       = "add"
	KindUpdate    = "update"
	KindUnchanged = "unchanged"
	// KindRetired is an entry whose node is retired: nothing is written.
	KindRetired = "retired"
	// KindMissing is a declaration the file no longer has: it stays.
	KindMissing = "missing"
)

// FieldDiff is one field a plan changes.
type FieldDiff struct {
	Field    string
	Old, New string
}

// DeviceChange is what a plan does to one device.
type DeviceChange struct {
	Device string
	Kind   string
	Fields []FieldDiff
	// Warnings say what this change will not do (a binding that
	// authorizes nothing, say).
	Warnings []string
}

// Plan is what an apply of a file changes: per device, and as the writes
// and changelog entries the store takes in one transaction. Applying the
// same file twice plans nothing the second time.
type Plan struct {
	Devices []DeviceChange
	Writes  []store.DeclarationWrite
	Changes []store.FieldChange
	// Counts by kind.
	Added, Updated, Unchanged, Retired, Missing int
}

// MakePlan compares the desired declarations (a parsed file) with the
// current ones and the lifecycle states of their nodes (states[name]; a
// name without one is planned), as w writes at now in request reqID.
// Entries whose node is retired are not written: a retired machine comes
// back only declared under a new name. Declarations the file lacks stay as
// they are (an apply never removes one).
//
// unauthored names the devices whose current binding a declarer did not
// write last: when a declarer applies the same binding, the plan records
// its fields again (old and new equal) with the declarer as their writer,
// so that the binding authorizes admission from then on.
func MakePlan(current []store.Declaration, states map[string]string, desired []store.Declaration, w Writer, now time.Time, reqID string, unauthored map[string]bool) Plan {
	cur := make(map[string]store.Declaration, len(current))
	for _, d := range current {
		cur[d.Name] = d
	}
	var p Plan
	inFile := make(map[string]bool, len(desired))
	for _, d := range desired {
		inFile[d.Name] = true
		old, exists := cur[d.Name]
		state := states[d.Name]
		if state == "" {
			state = store.StatePlanned
		}
		dc := DeviceChange{Device: d.Name, Kind: KindUnchanged}
		if state == store.StateRetired {
			dc.Kind = KindRetired
			dc.Warnings = append(dc.Warnings, fmt.Sprintf("%s is retired: nothing is written; a retired machine comes back only declared under a new name", d.Name))
			p.Retired++
			p.Devices = append(p.Devices, dc)
			continue
		}
		oldFields := fieldValues(old)
		bindingChanged := false
		for i, f := range fieldValues(d) {
			o := ""
			if exists {
				o = oldFields[i][1]
			}
			if o == f[1] {
				continue
			}
			dc.Fields = append(dc.Fields, FieldDiff{Field: f[0], Old: o, New: f[1]})
			p.Changes = append(p.Changes, store.FieldChange{Time: now, Device: d.Name, Field: f[0], Old: o, New: f[1],
				Actor: w.Name, ActorRole: string(w.Role), RequestID: reqID, Source: "inventory"})
			bindingChanged = bindingChanged || isBindingField(f[0])
		}
		if !bindingChanged && exists && w.Role == roles.Declarer && unauthored[d.Name] && len(d.EKPins) > 0 {
			for _, f := range fieldValues(d) {
				if isBindingField(f[0]) && f[1] != "" {
					dc.Fields = append(dc.Fields, FieldDiff{Field: f[0], Old: f[1], New: f[1]})
					p.Changes = append(p.Changes, store.FieldChange{Time: now, Device: d.Name, Field: f[0], Old: f[1], New: f[1],
						Actor: w.Name, ActorRole: string(w.Role), RequestID: reqID, Source: "inventory"})
				}
			}
			dc.Warnings = append(dc.Warnings, fmt.Sprintf("the EK binding of %s is written again by declarer %s: it authorizes admission from now on", d.Name, w.Name))
		}
		switch {
		case !exists:
			dc.Kind = KindAdd
			p.Added++
		case len(dc.Fields) > 0:
			dc.Kind = KindUpdate
			p.Updated++
		default:
			p.Unchanged++
		}
		if bindingChanged && len(d.EKPins)+len(old.EKPins) > 0 {
			if w.Role != roles.Declarer {
				dc.Warnings = append(dc.Warnings, fmt.Sprintf("the EK binding of %s is written by %s (role %s), not by a declarer: it will authorize nothing", d.Name, w.Name, w.Role))
			}
			if state != store.StatePlanned && state != store.StateProvisioning {
				dc.Warnings = append(dc.Warnings, fmt.Sprintf("%s is %s: it is held to the EK fleetd proved, and its binding authorizes nothing", d.Name, state))
			}
		}
		if dc.Kind != KindUnchanged {
			d.UpdatedAt = now
			p.Writes = append(p.Writes, store.DeclarationWrite{Declaration: d, PrevVersion: old.Version})
		}
		p.Devices = append(p.Devices, dc)
	}
	for _, d := range current {
		if !inFile[d.Name] {
			p.Missing++
			p.Devices = append(p.Devices, DeviceChange{Device: d.Name, Kind: KindMissing,
				Warnings: []string{fmt.Sprintf("%s is not in the file: it stays declared (an apply removes nothing; retire it with fleetd nodes retire)", d.Name)}})
		}
	}
	return p
}

// Empty reports whether the plan writes nothing.
func (p Plan) Empty() bool { return len(p.Writes) == 0 && len(p.Changes) == 0 }

func isBindingField(f string) bool {
	for _, b := range BindingFields {
		if b == f {
			return true
		}
	}
	return false
}
