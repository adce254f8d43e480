package command

import "syscall"

// childAttrs make the kernel kill an instance when bcd run dies, so that
// an instance whose start the daemon ended does not run on without a key.
func childAttrs() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
