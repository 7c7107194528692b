//go:build linux

package conformance

import "syscall"

// sysProcAttr makes the kernel SIGKILL a Node process when the test binary
// dies, so a crashed or killed `go test` leaves no reference server behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
