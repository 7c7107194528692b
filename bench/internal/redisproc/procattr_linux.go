//go:build linux

package redisproc

import "syscall"

// sysProcAttr has the kernel SIGKILL the server when the program dies, so a
// crashed or interrupted benchmark leaves no redis-server behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
