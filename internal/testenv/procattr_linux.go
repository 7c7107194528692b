//go:build linux

package testenv

import "syscall"

// sysProcAttr makes the kernel SIGKILL a server when the test binary dies, so
// a crashed or killed `go test` leaves no redis-server behind. Pdeathsig fires
// when the thread that started the child exits; the Go runtime only ends
// threads locked with runtime.LockOSThread, which this package never uses.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
