// Package bmc is fleetd's interface to a machine's baseboard management
// controller: power it on, off or through a cycle, and choose the device
// of its next boot. A provision that starts a machine from outside the
// install environment sets the next boot to PXE and power-cycles it
// (internal/fleetd/tinkerbell). The real controllers (Rufio's Machine and
// Job objects, Redfish, IPMI) are not here yet: [FakeBMC] is a fake for
// tests that only records what it was asked.
package bmc

import (
	"context"
	"fmt"
	"slices"
	"sync"
)

// BootDevice is a device a machine boots from next.
type BootDevice string

// The boot devices.
const (
	// PXE boots from the network: iPXE, then the install environment
	// (HookOS).
	PXE BootDevice = "pxe"
	// Disk boots the installed system.
	Disk BootDevice = "disk"
)

// Target names the machine whose BMC acts: the fleetd node's id and its
// declared product UUID.
type Target struct {
	NodeID      string
	ProductUUID string
}

// Controller acts on a machine's BMC. Each call returns once the BMC has
// accepted the action; an error says which action failed on which
// machine.
type Controller interface {
	PowerOn(ctx context.Context, t Target) error
	PowerOff(ctx context.Context, t Target) error
	PowerCycle(ctx context.Context, t Target) error
	// SetNextBoot makes the machine boot from dev once, at its next boot.
	SetNextBoot(ctx context.Context, t Target, dev BootDevice) error
}

// The kinds of Action.
const (
	ActionPowerOn     = "power-on"
	ActionPowerOff    = "power-off"
	ActionPowerCycle  = "power-cycle"
	ActionSetNextBoot = "set-next-boot"
)

// Action is one call a FakeBMC recorded.
type Action struct {
	Target Target
	// Kind is one of the Action* constants.
	Kind string
	// Device is the boot device of ActionSetNextBoot, "" otherwise.
	Device BootDevice
}

// FakeBMC is a fake Controller for tests: it touches no machine, records
// every call in order, and returns Err (when set) from each, after
// recording it. Safe for concurrent use.
type FakeBMC struct {
	mu      sync.Mutex
	actions []Action
	// Err, when set, is returned by every call.
	Err error
}

var _ Controller = (*FakeBMC)(nil)

func (f *FakeBMC) record(t Target, kind string, dev BootDevice) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.actions = append(f.actions, Action{Target: t, Kind: kind, Device: dev})
	if f.Err != nil {
		return fmt.Errorf("fake BMC of %s: %s: %w", t.NodeID, kind, f.Err)
	}
	return nil
}

// PowerOn records a power-on.
func (f *FakeBMC) PowerOn(_ context.Context, t Target) error { return f.record(t, ActionPowerOn, "") }

// PowerOff records a power-off.
func (f *FakeBMC) PowerOff(_ context.Context, t Target) error {
	return f.record(t, ActionPowerOff, "")
}

// PowerCycle records a power cycle.
func (f *FakeBMC) PowerCycle(_ context.Context, t Target) error {
	return f.record(t, ActionPowerCycle, "")
}

// SetNextBoot records the choice of the next boot's device.
func (f *FakeBMC) SetNextBoot(_ context.Context, t Target, dev BootDevice) error {
	return f.record(t, ActionSetNextBoot, dev)
}

// Actions returns a copy of the calls recorded so far, in order.
func (f *FakeBMC) Actions() []Action {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.actions)
}
