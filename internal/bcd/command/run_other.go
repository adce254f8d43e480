//go:build !linux

package command

import "syscall"

// childAttrs: outside Linux there is no parent-death signal; an instance
// whose bcd run is killed runs on, and its calls are refused once the
// daemon has forgotten its key.
func childAttrs() *syscall.SysProcAttr { return nil }
